/* V2 JSON infer messages of numeric tensors, decoded and encoded in C.
 *
 * The common request, {"inputs": [{"name", "shape", "datatype", "data": list}, ...]} with
 * nothing else but its "id" and parameters of "binary_data_output" alone (and input
 * parameters the codec ignores), its data a flat list or nested one list per dimension
 * (after the shape, as numpy's tolist() writes it), is decoded by V2Json.decode straight
 * into each input's little-endian bytes, checked against the model's inputs as
 * aserve.protocol.validate checks them. The common answer of integer and boolean outputs, every output's data as a
 * flat JSON list, is written by v2_json_encode byte for byte as the Python codec writes it.
 * Float outputs are left to the codec: msgspec writes the shortest text of a double
 * several times faster than CPython's repr, the only shortest formatting at hand here.
 * Reading a float is done here (json_double), several times faster than msgspec on long
 * lists. v2_binary_encode writes the binary extension's answer: the JSON header, each
 * output's data after it as the tensor's own buffer (any datatype: nothing to format).
 *
 * All answer None for anything else (another field, an escaped string, nested data before
 * its shape, a value out of range, a datatype they do not carry, any error): the Python
 * codec then decodes or encodes the message, and names what is wrong with it. So the fast
 * path never decides what is valid; it only skips work for what the codec would accept as is.
 */
#include "common.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define V2_MAX_RANK 32 /* aserve.protocol.arrays.MAX_RANK */
#define V2_MAX_INPUTS 64

typedef enum { E_BOOL, E_I8, E_I16, E_I32, E_I64, E_U8, E_U16, E_U32, E_U64, E_F32, E_F64 } etype;

static const struct {
    const char *name;
    etype type;
    int size;
} KINDS[] = {
    {"BOOL", E_BOOL, 1}, {"INT8", E_I8, 1},   {"INT16", E_I16, 2}, {"INT32", E_I32, 4},
    {"INT64", E_I64, 8}, {"UINT8", E_U8, 1},  {"UINT16", E_U16, 2}, {"UINT32", E_U32, 4},
    {"UINT64", E_U64, 8}, {"FP32", E_F32, 4}, {"FP64", E_F64, 8},
};
#define N_KINDS (sizeof(KINDS) / sizeof(KINDS[0]))

static int kind_of(const char *s, Py_ssize_t n)
{
    for (size_t k = 0; k < N_KINDS; k++)
        if ((Py_ssize_t)strlen(KINDS[k].name) == n && memcmp(KINDS[k].name, s, (size_t)n) == 0)
            return (int)k;
    return -1;
}

/* ---- a growable byte buffer ---- */

typedef struct {
    char *data;
    size_t len, cap;
    char local[2048];
} buf_t;

static void buf_init(buf_t *b)
{
    b->data = b->local;
    b->len = 0;
    b->cap = sizeof(b->local);
}

static void buf_free(buf_t *b)
{
    if (b->data != b->local)
        PyMem_Free(b->data);
}

static int buf_reserve(buf_t *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap * 2;
    while (cap < b->len + more)
        cap *= 2;
    char *data = PyMem_Malloc(cap);
    if (data == NULL)
        return -1;
    memcpy(data, b->data, b->len);
    if (b->data != b->local)
        PyMem_Free(b->data);
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_put(buf_t *b, const char *s, size_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

#define PUT_LIT(b, s) buf_put((b), (s), sizeof(s) - 1)

/* ---- the plan: one model's inputs ---- */

typedef struct {
    PyObject *name;     /* str */
    const char *name_utf8;
    Py_ssize_t name_len;
    PyObject *datatype; /* str */
    int kind;
    int rank;
    int64_t dims[V2_MAX_RANK]; /* -1: any */
} v2_input;

typedef struct {
    PyObject_HEAD
    PyObject *tensor_type;
    long max_batch_size;
    int n;
    v2_input inputs[V2_MAX_INPUTS];
} v2plan;

static void plan_dealloc(PyObject *self)
{
    v2plan *p = (v2plan *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(p->tensor_type);
    for (int i = 0; i < p->n; i++) {
        Py_CLEAR(p->inputs[i].name);
        Py_CLEAR(p->inputs[i].datatype);
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* V2Json(tensor_type, max_batch_size, [(name, datatype, shape), ...]): ValueError when an
 * input's datatype is not one it decodes (the caller then keeps the Python codec). */
static PyObject *plan_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    PyObject *tensor_type, *inputs;
    long max_batch_size;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "V2Json takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OlO!:V2Json", &tensor_type, &max_batch_size, &PyList_Type, &inputs))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(inputs);
    if (n < 1 || n > V2_MAX_INPUTS) {
        PyErr_Format(PyExc_ValueError, "V2Json: 1..%d inputs, got %zd", V2_MAX_INPUTS, n);
        return NULL;
    }
    v2plan *p = (v2plan *)tp->tp_alloc(tp, 0);
    if (p == NULL)
        return NULL;
    p->tensor_type = Py_NewRef(tensor_type);
    p->max_batch_size = max_batch_size;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *datatype, *shape;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(inputs, i), "UUO!;V2Json: each input is (name, datatype, shape)",
                              &name, &datatype, &PyTuple_Type, &shape))
            goto fail;
        v2_input *in = &p->inputs[p->n];
        in->name = Py_NewRef(name);
        in->datatype = Py_NewRef(datatype);
        p->n++;
        in->name_utf8 = PyUnicode_AsUTF8AndSize(name, &in->name_len);
        if (in->name_utf8 == NULL)
            goto fail;
        Py_ssize_t dlen;
        const char *d = PyUnicode_AsUTF8AndSize(datatype, &dlen);
        if (d == NULL)
            goto fail;
        in->kind = kind_of(d, dlen);
        if (in->kind < 0) {
            PyErr_Format(PyExc_ValueError, "V2Json: input %R: datatype %R is not decoded here", name, datatype);
            goto fail;
        }
        Py_ssize_t rank = PyTuple_GET_SIZE(shape);
        if (rank < 1 || rank > V2_MAX_RANK) {
            PyErr_Format(PyExc_ValueError, "V2Json: input %R: rank 1..%d, got %zd", name, V2_MAX_RANK, rank);
            goto fail;
        }
        in->rank = (int)rank;
        for (Py_ssize_t k = 0; k < rank; k++) {
            long long dim = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k));
            if (dim == -1 && PyErr_Occurred())
                goto fail;
            in->dims[k] = dim;
        }
    }
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

/* ---- the decoder ---- */

typedef struct {
    const char *p, *end;
} scan_t;

static inline void ws(scan_t *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static inline int eat(scan_t *s, char c)
{
    ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* A string with no escapes and no control characters: its bytes between the quotes. */
static int plain_string(scan_t *s, const char **out, Py_ssize_t *len)
{
    if (!eat(s, '"'))
        return 0;
    const char *start = s->p;
    while (s->p < s->end) {
        unsigned char c = (unsigned char)*s->p;
        if (c == '"') {
            *out = start;
            *len = s->p - start;
            s->p++;
            return 1;
        }
        if (c == '\\' || c < 0x20)
            return 0;
        s->p++;
    }
    return 0;
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* A JSON integer (no fraction or exponent) as a sign and magnitude, the magnitude < 2^64. */
static int json_integer(scan_t *s, int *negative, uint64_t *magnitude)
{
    ws(s);
    const char *p = s->p;
    *negative = 0;
    if (p < s->end && *p == '-') {
        *negative = 1;
        p++;
    }
    if (p >= s->end || !is_digit(*p))
        return 0;
    uint64_t v = 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < s->end && is_digit(*p)) {
            unsigned d = (unsigned)(*p - '0');
            if (v > (UINT64_MAX - d) / 10)
                return 0;
            v = v * 10 + d;
            p++;
        }
    }
    if (p < s->end && (*p == '.' || *p == 'e' || *p == 'E' || is_digit(*p)))
        return 0; /* a float, or a leading zero: the codec's to judge */
    s->p = p;
    *magnitude = v;
    return 1;
}

#include "pow10.h"

/* 10^0 .. 10^22: exact as doubles (Clinger's fast path). */
static const double EXACT10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* w * 10^q rounded to the nearest double, by the Eisel-Lemire algorithm (one or two 64x64-bit
 * products with a truncated 128-bit 10^q); 0 where that cannot decide (a product too close to
 * a rounding boundary, a subnormal or infinite result): the caller asks CPython's strtod. */
static int eisel_lemire(uint64_t w, int q, int negative, double *out)
{
    if (w == 0 || q < POW10_MIN || q > POW10_MAX)
        return 0;
    int lz = __builtin_clzll(w);
    w <<= lz;
    const uint64_t *m = POW10[q - POW10_MIN];
    unsigned __int128 x = (unsigned __int128)w * m[0];
    uint64_t hi = (uint64_t)(x >> 64), lo = (uint64_t)x;
    if ((hi & 0x1FF) == 0x1FF && lo + w < w) {
        /* the low bits of 10^q may carry into the 54 that decide: add their product */
        unsigned __int128 y = (unsigned __int128)w * m[1];
        uint64_t y_hi = (uint64_t)(y >> 64), y_lo = (uint64_t)y;
        uint64_t sum_lo = lo + y_hi, sum_hi = hi + (sum_lo < lo);
        if ((sum_hi & 0x1FF) == 0x1FF && sum_lo + 1 == 0 && y_lo + w < w)
            return 0;
        hi = sum_hi;
        lo = sum_lo;
    }
    uint64_t top = hi >> 63;
    uint64_t mantissa = hi >> (top + 9); /* 54 bits */
    int64_t exp2 = ((217706 * (int64_t)q) >> 16) + 64 + 1023 - lz - (int64_t)(1 ^ top);
    if (lo == 0 && (hi & 0x1FF) == 0 && (mantissa & 3) == 1)
        return 0; /* exactly half-way between two doubles, as far as the product tells */
    mantissa = (mantissa + (mantissa & 1)) >> 1;
    if (mantissa >> 53) {
        mantissa >>= 1;
        exp2++;
    }
    if (exp2 <= 0 || exp2 >= 0x7FF)
        return 0;
    uint64_t bits = ((uint64_t)exp2 << 52) | (mantissa & ((UINT64_C(1) << 52) - 1)) | ((uint64_t)negative << 63);
    memcpy(out, &bits, sizeof bits);
    return 1;
}

/* A JSON number, as the double Python would read: its decimal digits and exponent read
 * here, the nearest double found by Clinger's fast path or Eisel-Lemire, and CPython's
 * correctly rounded strtod asked for what neither decides (more than 19 significant
 * digits, subnormals, a half-way product). */
static int json_double(scan_t *s, double *out)
{
    ws(s);
    const char *start = s->p, *p = s->p, *end = s->end;
    int negative = 0, integral = 1, digits = 0, exact = 1;
    uint64_t w = 0;
    int64_t q = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || !is_digit(*p))
        return 0;
    if (*p == '0') {
        p++;
    } else {
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                w = w * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                q++;
                exact &= *p == '0';
            }
        }
    }
    if (p < end && *p == '.') {
        integral = 0;
        p++;
        if (p >= end || !is_digit(*p))
            return 0;
        for (; p < end && is_digit(*p); p++) {
            if (w == 0 && *p == '0') {
                q--; /* a leading zero of the fraction: not significant */
            } else if (digits < 19) {
                w = w * 10 + (uint64_t)(*p - '0');
                digits++;
                q--;
            } else {
                exact &= *p == '0';
            }
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        int exp_negative = 0;
        if (p < end && (*p == '+' || *p == '-'))
            exp_negative = *p++ == '-';
        if (p >= end || !is_digit(*p))
            return 0;
        int64_t e = 0;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000)
                e = e * 10 + (*p - '0');
        q += exp_negative ? -e : e;
    }
    double v;
    if (w == 0) {
        v = negative ? -0.0 : 0.0;
    } else if (exact && w <= (UINT64_C(1) << 53) && q >= -22 && q <= 22) {
        v = (double)w; /* exact, and one correctly rounded operation */
        v = q >= 0 ? v * EXACT10[q] : v / EXACT10[-q];
        v = negative ? -v : v;
    } else if (!exact || !eisel_lemire(w, (int)(q < -100000 ? -100000 : q > 100000 ? 100000 : q), negative, &v)) {
        char text[64];
        size_t n = (size_t)(p - start);
        if (n >= sizeof(text))
            return 0; /* the codec's */
        memcpy(text, start, n);
        text[n] = '\0';
        char *stop;
        v = PyOS_string_to_double(text, &stop, NULL);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (stop != text + n)
            return 0;
    }
    if (!isfinite(v))
        return 0;
    s->p = p;
    *out = integral && v == 0.0 ? 0.0 : v; /* an integer is read as an int first: -0 is 0 */
    return 1;
}

/* One element of `kind`, appended to b. */
static int element(scan_t *s, int kind, buf_t *b)
{
    etype t = KINDS[kind].type;
    if (t == E_BOOL) {
        ws(s);
        unsigned char v;
        if (s->end - s->p >= 4 && memcmp(s->p, "true", 4) == 0) {
            v = 1;
            s->p += 4;
        } else if (s->end - s->p >= 5 && memcmp(s->p, "false", 5) == 0) {
            v = 0;
            s->p += 5;
        } else {
            return 0;
        }
        return buf_put(b, (const char *)&v, 1) == 0;
    }
    if (t == E_F32 || t == E_F64) {
        double d;
        if (!json_double(s, &d))
            return 0;
        if (t == E_F64)
            return buf_put(b, (const char *)&d, 8) == 0;
        if (fabs(d) > FLT_MAX)
            return 0;
        float f = (float)d;
        return buf_put(b, (const char *)&f, 4) == 0;
    }
    int negative;
    uint64_t m;
    if (!json_integer(s, &negative, &m))
        return 0;
    if (t == E_U8 || t == E_U16 || t == E_U32 || t == E_U64) {
        if (negative && m != 0)
            return 0;
        uint64_t limit = t == E_U8 ? UINT8_MAX : t == E_U16 ? UINT16_MAX : t == E_U32 ? UINT32_MAX : UINT64_MAX;
        if (m > limit)
            return 0;
        int size = KINDS[kind].size;
        return buf_put(b, (const char *)&m, (size_t)size) == 0; /* little-endian: the low bytes */
    }
    int64_t lo = t == E_I8 ? INT8_MIN : t == E_I16 ? INT16_MIN : t == E_I32 ? INT32_MIN : INT64_MIN;
    int64_t hi = t == E_I8 ? INT8_MAX : t == E_I16 ? INT16_MAX : t == E_I32 ? INT32_MAX : INT64_MAX;
    int64_t v;
    if (negative) {
        if (m > (uint64_t)INT64_MAX + 1)
            return 0;
        v = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    } else {
        if (m > (uint64_t)INT64_MAX)
            return 0;
        v = (int64_t)m;
    }
    if (v < lo || v > hi)
        return 0;
    return buf_put(b, (const char *)&v, (size_t)KINDS[kind].size) == 0;
}

static int literal(scan_t *s, const char *word, size_t n)
{
    ws(s);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return 0;
    s->p += n;
    return 1;
}

/* An input's parameters that change nothing the codec does (MLServer's codecs send
 * {"content_type": "np"}): an object of plain keys, none of those the codec reads
 * (binary_data_size, shared_memory_region), each valued a plain string, a number, true,
 * false or null. Anything else is the codec's. */
static int ignored_parameters(scan_t *s)
{
    if (!eat(s, '{'))
        return 0;
    if (eat(s, '}'))
        return 1;
    do {
        const char *key, *text;
        Py_ssize_t klen, tlen;
        double number;
        if (!plain_string(s, &key, &klen) || !eat(s, ':'))
            return 0;
        if ((klen == 16 && memcmp(key, "binary_data_size", 16) == 0) ||
            (klen == 20 && memcmp(key, "shared_memory_region", 20) == 0))
            return 0;
        ws(s);
        if (s->p < s->end && *s->p == '"') {
            if (!plain_string(s, &text, &tlen))
                return 0;
        } else if (!literal(s, "true", 4) && !literal(s, "false", 5) && !literal(s, "null", 4) &&
                   !json_double(s, &number)) {
            return 0;
        }
    } while (eat(s, ','));
    return eat(s, '}');
}

/* Nested data from `level` down (numpy's tolist() writes a tensor so): a list of shape[level]
 * items, each a list one level down, or at the last level an element. The codec's rule
 * (aserve.protocol.arrays.flatten): exactly one list per dimension, each as long as its
 * dimension. */
static int nested_data(scan_t *s, int kind, buf_t *b, const Py_ssize_t *shape, int rank, int level, int64_t *count)
{
    if (!eat(s, '['))
        return 0;
    Py_ssize_t n = 0;
    do {
        if (level + 1 < rank) {
            if (!nested_data(s, kind, b, shape, rank, level + 1, count))
                return 0;
        } else {
            if (!element(s, kind, b))
                return 0;
            (*count)++;
        }
        n++;
    } while (eat(s, ','));
    return eat(s, ']') && n == shape[level];
}

/* One input object; fills its position's shape and bytes. */
static int input_object(v2plan *p, scan_t *s, int *seen, Py_ssize_t *shape_out, int *rank_out, buf_t *data,
                        int *index_out, int64_t *count_out)
{
    if (!eat(s, '{'))
        return 0;
    int has_name = 0, has_datatype = 0, has_shape = 0, has_data = 0, has_parameters = 0, index = -1;
    int64_t count = 0;
    for (;;) {
        const char *key;
        Py_ssize_t klen;
        if (!plain_string(s, &key, &klen) || !eat(s, ':'))
            return 0;
        if (klen == 4 && memcmp(key, "name", 4) == 0 && !has_name) {
            const char *name;
            Py_ssize_t nlen;
            if (!plain_string(s, &name, &nlen))
                return 0;
            for (int i = 0; i < p->n; i++)
                if (p->inputs[i].name_len == nlen && memcmp(p->inputs[i].name_utf8, name, (size_t)nlen) == 0)
                    index = i;
            if (index < 0 || seen[index])
                return 0;
            has_name = 1;
        } else if (klen == 8 && memcmp(key, "datatype", 8) == 0 && !has_datatype) {
            const char *dt;
            Py_ssize_t dlen;
            if (!has_name || !plain_string(s, &dt, &dlen))
                return 0;
            const char *want = KINDS[p->inputs[index].kind].name;
            if ((Py_ssize_t)strlen(want) != dlen || memcmp(want, dt, (size_t)dlen) != 0)
                return 0;
            has_datatype = 1;
        } else if (klen == 5 && memcmp(key, "shape", 5) == 0 && !has_shape) {
            if (!eat(s, '['))
                return 0;
            int rank = 0;
            if (!eat(s, ']')) {
                do {
                    int negative;
                    uint64_t dim;
                    if (rank >= V2_MAX_RANK || !json_integer(s, &negative, &dim) || negative || dim == 0 ||
                        dim > ((uint64_t)1 << 40))
                        return 0;
                    shape_out[rank++] = (Py_ssize_t)dim;
                } while (eat(s, ','));
                if (!eat(s, ']'))
                    return 0;
            }
            *rank_out = rank;
            has_shape = 1;
        } else if (klen == 4 && memcmp(key, "data", 4) == 0 && !has_data) {
            if (!has_datatype)
                return 0;
            ws(s);
            const char *open = s->p;
            if (!eat(s, '['))
                return 0;
            int kind = p->inputs[index].kind;
            ws(s);
            if (s->p < s->end && *s->p == '[') { /* nested: its shape must come first */
                if (!has_shape || *rank_out < 2)
                    return 0;
                s->p = open;
                if (!nested_data(s, kind, data, shape_out, *rank_out, 0, &count))
                    return 0;
            } else if (!eat(s, ']')) {
                do {
                    if (!element(s, kind, data))
                        return 0;
                    count++;
                } while (eat(s, ','));
                if (!eat(s, ']'))
                    return 0;
            }
            has_data = 1;
        } else if (klen == 10 && memcmp(key, "parameters", 10) == 0 && !has_parameters) {
            if (!ignored_parameters(s))
                return 0;
            has_parameters = 1;
        } else {
            return 0; /* another field, or one given twice: the codec's */
        }
        if (eat(s, '}'))
            break;
        if (!eat(s, ','))
            return 0;
    }
    if (!(has_name && has_datatype && has_shape && has_data))
        return 0;
    *index_out = index;
    *count_out = count;
    return 1;
}

/* The request's "id": a plain string (*id, a new reference) or null (*id stays NULL).
 * 1, 0 (the codec's), or -1 with a Python error. */
static int read_id(scan_t *s, PyObject **id)
{
    if (literal(s, "null", 4))
        return 1;
    const char *text;
    Py_ssize_t tlen;
    if (!plain_string(s, &text, &tlen))
        return 0;
    *id = PyUnicode_DecodeUTF8(text, tlen, NULL);
    return *id != NULL ? 1 : -1;
}

/* The request's "parameters" when they are {"binary_data_output": true | false} alone, as
 * tritonclient sends them with JSON inputs: *binary 1 or 0. 1, or 0 (the codec's). */
static int read_binary_output(scan_t *s, int *binary)
{
    const char *name;
    Py_ssize_t nlen;
    if (!eat(s, '{') || !plain_string(s, &name, &nlen) || nlen != 18 || memcmp(name, "binary_data_output", 18) != 0 ||
        !eat(s, ':'))
        return 0;
    if (literal(s, "true", 4))
        *binary = 1;
    else if (literal(s, "false", 5))
        *binary = 0;
    else
        return 0;
    return eat(s, '}');
}

/* The request's "inputs" array: each input's Tensor in tensors[] at the model's position,
 * the batch's rows in *samples, the inputs read in *found. 1, 0 (the codec's), or -1 with
 * a Python error. */
static int read_inputs(v2plan *p, scan_t *s, PyObject **tensors, int *seen, buf_t *data, long *samples, int *found)
{
    if (!eat(s, '['))
        return 0;
    do {
        Py_ssize_t shape[V2_MAX_RANK];
        int rank = 0, index = -1;
        int64_t count = 0;
        data->len = 0;
        if (!input_object(p, s, seen, shape, &rank, data, &index, &count))
            return 0;
        v2_input *in = &p->inputs[index];
        if (rank != in->rank)
            return 0;
        int64_t elements = 1;
        for (int k = 0; k < rank; k++) {
            if (in->dims[k] != -1 && in->dims[k] != shape[k])
                return 0;
            elements *= shape[k];
            if (elements > ((int64_t)1 << 40))
                return 0;
        }
        if (elements != count)
            return 0;
        if (p->max_batch_size > 0) {
            if (shape[0] > p->max_batch_size || (*found > 0 && shape[0] != *samples))
                return 0;
            *samples = (long)shape[0];
        }
        PyObject *dims = PyTuple_New(rank);
        if (dims == NULL)
            return -1;
        for (int k = 0; k < rank; k++) {
            PyObject *d = PyLong_FromSsize_t(shape[k]);
            if (d == NULL) {
                Py_DECREF(dims);
                return -1;
            }
            PyTuple_SET_ITEM(dims, k, d);
        }
        PyObject *bytes = PyBytes_FromStringAndSize(data->data, (Py_ssize_t)data->len);
        if (bytes == NULL) {
            Py_DECREF(dims);
            return -1;
        }
        tensors[index] = PyObject_CallFunctionObjArgs(p->tensor_type, in->datatype, dims, bytes, NULL);
        Py_DECREF(dims);
        Py_DECREF(bytes);
        if (tensors[index] == NULL)
            return -1;
        seen[index] = 1;
        ++*found;
    } while (eat(s, ','));
    return eat(s, ']');
}

/* decode(body) -> ([Tensor, ...] in the model's order, samples, id or None,
 * binary_data_output or None) | None */
static PyObject *plan_decode(PyObject *self, PyObject *body)
{
    v2plan *p = (v2plan *)self;
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    scan_t s = {.p = view.buf, .end = (const char *)view.buf + view.len};
    PyObject *tensors[V2_MAX_INPUTS] = {NULL};
    int seen[V2_MAX_INPUTS] = {0};
    PyObject *result = NULL;
    long samples = 0;
    buf_t data;
    buf_init(&data);
    PyObject *id = NULL; /* the request's id, once read (NULL: none, or null) */
    int found = 0, has_inputs = 0, has_id = 0, binary_output = -1; /* -1: no parameters */
    if (!eat(&s, '{'))
        goto none;
    do {
        const char *key;
        Py_ssize_t klen;
        int rc;
        if (!plain_string(&s, &key, &klen) || !eat(&s, ':'))
            goto none;
        if (klen == 2 && memcmp(key, "id", 2) == 0 && !has_id) {
            has_id = 1;
            rc = read_id(&s, &id);
        } else if (klen == 10 && memcmp(key, "parameters", 10) == 0 && binary_output < 0) {
            rc = read_binary_output(&s, &binary_output);
        } else if (klen == 6 && memcmp(key, "inputs", 6) == 0 && !has_inputs) {
            has_inputs = 1;
            rc = read_inputs(p, &s, tensors, seen, &data, &samples, &found);
        } else {
            rc = 0; /* another field, or one given twice: the codec's */
        }
        if (rc < 0)
            goto error;
        if (rc == 0)
            goto none;
    } while (eat(&s, ','));
    if (!eat(&s, '}'))
        goto none;
    ws(&s);
    if (s.p != s.end || !has_inputs || found != p->n)
        goto none;
    PyObject *list = PyList_New(p->n);
    if (list == NULL)
        goto error;
    for (int i = 0; i < p->n; i++) {
        PyList_SET_ITEM(list, i, tensors[i]);
        tensors[i] = NULL;
    }
    result = Py_BuildValue("(NlOO)", list, p->max_batch_size > 0 ? samples : 1L, id != NULL ? id : Py_None,
                           binary_output < 0 ? Py_None : binary_output ? Py_True : Py_False);
    goto done;
none:
    result = Py_NewRef(Py_None);
    goto done;
error:
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
        goto done; /* result NULL: the MemoryError propagates */
    PyErr_Clear();
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(id);
    for (int i = 0; i < V2_MAX_INPUTS; i++)
        Py_XDECREF(tensors[i]);
    buf_free(&data);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef plan_methods[] = {
    {"decode", plan_decode, METH_O,
     "decode(body) -> ([Tensor, ...] in the model's input order, samples, id or None, binary_data_output or "
     "None) | None: a V2 JSON infer request of inputs, an id and parameters of binary_data_output alone, each "
     "input's data a flat list or nested after its shape, valid for the model; None for any other body (the "
     "codec decodes it)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_new, plan_new},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_methods, plan_methods},
    {Py_tp_doc, "V2Json(tensor_type, max_batch_size, [(name, datatype, shape), ...]): one model's inputs, "
                "for decoding its common V2 JSON requests in C"},
    {0, NULL},
};

PyType_Spec as_v2json_spec = {
    .name = "aserve._native.V2Json",
    .basicsize = sizeof(v2plan),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = plan_slots,
};

/* ---- the encoder ---- */

/* A str that JSON carries as its UTF-8 bytes (nothing to escape), in quotes. */
static int put_string(buf_t *b, PyObject *str)
{
    if (!PyUnicode_Check(str))
        return 0;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(str, &n);
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\' || c < 0x20)
            return 0;
    }
    return buf_reserve(b, (size_t)n + 2) == 0 && buf_put(b, "\"", 1) == 0 && buf_put(b, s, (size_t)n) == 0 &&
           buf_put(b, "\"", 1) == 0;
}

/* Decimal digits two at a time, written backwards from end; the first digit's address. */
static const char DIGIT_PAIRS[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                  "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                  "8081828384858687888990919293949596979899";

static char *digits(char *end, uint64_t m)
{
    while (m >= 100) {
        unsigned r = (unsigned)(m % 100);
        m /= 100;
        end -= 2;
        memcpy(end, DIGIT_PAIRS + 2 * r, 2);
    }
    if (m >= 10) {
        end -= 2;
        memcpy(end, DIGIT_PAIRS + 2 * m, 2);
    } else {
        *--end = (char)('0' + m);
    }
    return end;
}

/* The longest integer text: "-9223372036854775808" or "18446744073709551615". */
#define INT_TEXT 20

/* Writes v at out (at least INT_TEXT bytes free); the bytes written. */
static size_t int_text(char *out, int64_t v, int is_signed)
{
    char tmp[INT_TEXT + 1];
    uint64_t m = (uint64_t)v;
    int negative = is_signed && v < 0;
    if (negative)
        m = (uint64_t)0 - m;
    char *p = digits(tmp + sizeof(tmp), m);
    if (negative)
        *--p = '-';
    size_t n = (size_t)(tmp + sizeof(tmp) - p);
    memcpy(out, p, n);
    return n;
}

static int put_int(buf_t *b, int64_t v)
{
    if (buf_reserve(b, INT_TEXT) < 0)
        return 0;
    b->len += int_text(b->data + b->len, v, 1);
    return 1;
}

/* A flat JSON list of count values of an integer or boolean kind; 0 when the codec must
 * write it (a bool byte other than 0 or 1). Room for the longest text is reserved once. */
static int put_values(buf_t *b, int kind, const char *p, Py_ssize_t count)
{
    etype t = KINDS[kind].type;
    size_t widest = t == E_BOOL ? 5 : INT_TEXT;
    if ((size_t)count > (SIZE_MAX - 2) / (widest + 1) || buf_reserve(b, (size_t)count * (widest + 1) + 2) < 0)
        return 0;
    char *out = b->data + b->len, *start = out;
    *out++ = '[';
    for (Py_ssize_t i = 0; i < count; i++) {
        if (i > 0)
            *out++ = ',';
        int64_t v;
        int is_signed = 1;
        switch (t) {
        case E_BOOL: {
            unsigned char c = (unsigned char)p[i];
            if (c > 1)
                return 0; /* not a bool: the codec's */
            memcpy(out, c ? "true" : "false", c ? 4 : 5);
            out += c ? 4 : 5;
            continue;
        }
        case E_I8: v = ((const int8_t *)p)[i]; break;
        case E_I16: { int16_t x; memcpy(&x, p + 2 * i, 2); v = x; break; }
        case E_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); v = x; break; }
        case E_I64: memcpy(&v, p + 8 * i, 8); break;
        case E_U8: v = ((const uint8_t *)p)[i]; is_signed = 0; break;
        case E_U16: { uint16_t x; memcpy(&x, p + 2 * i, 2); v = x; is_signed = 0; break; }
        case E_U32: { uint32_t x; memcpy(&x, p + 4 * i, 4); v = x; is_signed = 0; break; }
        case E_U64: memcpy(&v, p + 8 * i, 8); is_signed = 0; break;
        default: return 0;
        }
        out += int_text(out, v, is_signed);
    }
    *out++ = ']';
    b->len += (size_t)(out - start);
    return 1;
}

/* The item size of a datatype a binary answer carries: 0 for BYTES (its elements are
 * length-prefixed, the size is what the data holds), -1 for one the codec must judge. */
static int binary_itemsize(const char *dt, Py_ssize_t n)
{
    int kind = kind_of(dt, n);
    if (kind >= 0)
        return KINDS[kind].size;
    if ((n == 4 && memcmp(dt, "FP16", 4) == 0) || (n == 4 && memcmp(dt, "BF16", 4) == 0))
        return 2;
    if (n == 5 && memcmp(dt, "BYTES", 5) == 0)
        return 0;
    return -1;
}

/* The object a binary answer writes for a tensor's data: the data itself when it is bytes
 * or a flat unsigned-byte view, else a flat view of it; NULL (no error) when the codec
 * must judge it (not contiguous, no buffer). */
static PyObject *flat_chunk(PyObject *data, Py_buffer *view)
{
    if (PyBytes_CheckExact(data))
        return Py_NewRef(data);
    if (PyMemoryView_Check(data)) {
        Py_buffer *mv = PyMemoryView_GET_BUFFER(data);
        if (mv->ndim == 1 && (mv->format == NULL || strcmp(mv->format, "B") == 0) &&
            (mv->strides == NULL || mv->strides[0] == 1))
            return Py_NewRef(data);
    }
    /* view was taken PyBUF_SIMPLE: contiguous bytes; a flat view of them keeps data alive */
    PyObject *whole = PyMemoryView_FromObject(data);
    if (whole == NULL)
        return NULL;
    Py_buffer *mv = PyMemoryView_GET_BUFFER(whole);
    if (mv->ndim == 1 && (mv->format == NULL || strcmp(mv->format, "B") == 0) && mv->len == view->len)
        return whole;
    PyObject *flat = PyObject_CallMethod(whole, "cast", "s", "B");
    Py_DECREF(whole);
    return flat;
}

/* One output, {"name", "datatype", "shape", "data"} or, for a binary answer (chunks not
 * NULL), {"name", "datatype", "shape", "parameters": {"binary_data_size"}} with its data
 * appended to chunks; 0 when the codec must write it. */
static int put_output(buf_t *b, const module_state *st, PyObject *name, PyObject *tensor, PyObject *chunks)
{
    PyObject *datatype = PyObject_GetAttr(tensor, st->str_datatype);
    PyObject *shape = datatype != NULL ? PyObject_GetAttr(tensor, st->str_shape) : NULL;
    PyObject *data = shape != NULL ? PyObject_GetAttr(tensor, st->str_data) : NULL;
    int ok = 0, have_view = 0;
    Py_buffer view;
    if (data == NULL) {
        PyErr_Clear();
        goto done;
    }
    Py_ssize_t dlen;
    const char *dt = PyUnicode_Check(datatype) ? PyUnicode_AsUTF8AndSize(datatype, &dlen) : NULL;
    if (dt == NULL || !PyTuple_Check(shape)) {
        PyErr_Clear();
        goto done;
    }
    int kind = -1, itemsize;
    if (chunks != NULL) {
        itemsize = binary_itemsize(dt, dlen);
        if (itemsize < 0)
            goto done;
    } else {
        kind = kind_of(dt, dlen);
        if (kind < 0 || KINDS[kind].type == E_F32 || KINDS[kind].type == E_F64)
            goto done; /* floats: msgspec writes the shortest text faster than CPython's repr */
        itemsize = KINDS[kind].size;
    }
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        goto done;
    }
    have_view = 1;
    if (PUT_LIT(b, "{\"name\":") < 0 || !put_string(b, name) || PUT_LIT(b, ",\"datatype\":") < 0 ||
        !put_string(b, datatype) || PUT_LIT(b, ",\"shape\":[") < 0)
        goto done;
    Py_ssize_t rank = PyTuple_GET_SIZE(shape), elements = 1;
    for (Py_ssize_t k = 0; k < rank; k++) {
        PyObject *d = PyTuple_GET_ITEM(shape, k);
        if (!PyLong_CheckExact(d))
            goto done;
        long long dim = PyLong_AsLongLong(d);
        if (dim < 0 || dim > ((long long)1 << 40)) {
            PyErr_Clear();
            goto done;
        }
        elements *= (Py_ssize_t)dim;
        if (elements > ((Py_ssize_t)1 << 40) || (k > 0 && buf_put(b, ",", 1) < 0) || !put_int(b, dim))
            goto done;
    }
    if (itemsize > 0 && view.len != elements * itemsize) /* the codec names the mismatch */
        goto done;
    if (chunks == NULL) {
        ok = PUT_LIT(b, "],\"data\":") == 0 && put_values(b, kind, view.buf, elements) && PUT_LIT(b, "}") == 0;
        goto done;
    }
    PyObject *chunk = flat_chunk(data, &view);
    if (chunk == NULL) {
        PyErr_Clear();
        goto done;
    }
    ok = PUT_LIT(b, "],\"parameters\":{\"binary_data_size\":") == 0 && put_int(b, view.len) &&
         PUT_LIT(b, "}}") == 0 && PyList_Append(chunks, chunk) == 0;
    Py_DECREF(chunk);
done:
    if (have_view)
        PyBuffer_Release(&view);
    Py_XDECREF(datatype);
    Py_XDECREF(shape);
    Py_XDECREF(data);
    return ok;
}

/* The answer's JSON: its envelope and each output in `names` order (NULL: the dict's);
 * a binary answer's data goes to chunks. 0 when the codec must write it. */
static int put_answer(buf_t *b, const module_state *st, PyObject *model_name, PyObject *model_version, PyObject *id, PyObject *outputs,
                      PyObject *names, PyObject *chunks)
{
    int ok = PUT_LIT(b, "{\"model_name\":") == 0 && put_string(b, model_name);
    if (ok && model_version != Py_None)
        ok = PUT_LIT(b, ",\"model_version\":") == 0 && put_string(b, model_version);
    if (ok && id != Py_None)
        ok = PUT_LIT(b, ",\"id\":") == 0 && put_string(b, id);
    Py_ssize_t count = names != NULL ? PyList_GET_SIZE(names) : PyDict_GET_SIZE(outputs);
    if (ok && count > 0) {
        ok = PUT_LIT(b, ",\"outputs\":[") == 0;
        if (names != NULL) {
            for (Py_ssize_t i = 0; ok && i < count; i++) {
                PyObject *name = PyList_GET_ITEM(names, i);
                PyObject *tensor = PyDict_GetItemWithError(outputs, name); /* borrowed */
                ok = tensor != NULL && (i == 0 || buf_put(b, ",", 1) == 0) && put_output(b, st, name, tensor, chunks);
            }
        } else {
            Py_ssize_t pos = 0, i = 0;
            PyObject *name, *tensor;
            while (ok && PyDict_Next(outputs, &pos, &name, &tensor))
                ok = (i++ == 0 || buf_put(b, ",", 1) == 0) && put_output(b, st, name, tensor, chunks);
        }
        ok = ok && PUT_LIT(b, "]") == 0;
    }
    return ok && PUT_LIT(b, "}") == 0;
}

/* What an encoder answers once its buffer is written (ok) or given up: None unless memory ran out. */
static PyObject *given_up(void)
{
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_MemoryError))
        return NULL;
    PyErr_Clear();
    return Py_NewRef(Py_None);
}

/* v2_json_encode(model_name, model_version, id, outputs) -> bytes | None */
PyObject *as_v2_json_encode(PyObject *module, PyObject *args)
{
    PyObject *model_name, *model_version, *id, *outputs;
    if (!PyArg_ParseTuple(args, "OOOO!:v2_json_encode", &model_name, &model_version, &id, &PyDict_Type, &outputs))
        return NULL;
    buf_t b;
    buf_init(&b);
    PyObject *result = put_answer(&b, PyModule_GetState(module), model_name, model_version, id, outputs, NULL, NULL)
                           ? PyBytes_FromStringAndSize(b.data, (Py_ssize_t)b.len)
                           : given_up();
    buf_free(&b);
    return result;
}

/* v2_binary_encode(model_name, model_version, id, outputs, names) -> [header, data...] | None */
PyObject *as_v2_binary_encode(PyObject *module, PyObject *args)
{
    PyObject *model_name, *model_version, *id, *outputs, *names;
    if (!PyArg_ParseTuple(args, "OOOO!O:v2_binary_encode", &model_name, &model_version, &id, &PyDict_Type,
                          &outputs, &names))
        return NULL;
    if (names != Py_None && !PyList_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "v2_binary_encode: names must be a list or None");
        return NULL;
    }
    if ((names == Py_None ? PyDict_GET_SIZE(outputs) : PyList_GET_SIZE(names)) == 0)
        Py_RETURN_NONE; /* no binary data: the codec's plain JSON answer */
    PyObject *chunks = PyList_New(1);
    if (chunks == NULL)
        return NULL;
    Py_INCREF(Py_None);
    PyList_SET_ITEM(chunks, 0, Py_None);
    buf_t b;
    buf_init(&b);
    PyObject *header = NULL;
    if (put_answer(&b, PyModule_GetState(module), model_name, model_version, id, outputs, names == Py_None ? NULL : names, chunks))
        header = PyBytes_FromStringAndSize(b.data, (Py_ssize_t)b.len);
    buf_free(&b);
    if (header == NULL) {
        Py_DECREF(chunks);
        return given_up();
    }
    PyList_SetItem(chunks, 0, header); /* steals header, drops the None */
    return chunks;
}
