/* OTLP encoding: spans as the tracer records them, to an ExportTraceServiceRequest (protobuf).
 *
 * The OpenTelemetry SDK builds a Python object per span and encodes it in Python, about
 * 40 us per span; a traced request has five. This writes the protobuf wire format
 * directly from the recorder's lists (aserve/tracing/recorder.py) at about a
 * microsecond per span. Messages are written depth-first into one growing buffer: each
 * nested message reserves five bytes for its length, and when it ends the length is
 * written and the body moved up over the unused bytes.
 *
 * Field numbers are those of opentelemetry/proto/trace/v1/trace.proto,
 * common/v1/common.proto, resource/v1/resource.proto and
 * collector/trace/v1/trace_service.proto.
 */
#include "common.h"

#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
    int failed;
} buf_t;

static int grow(buf_t *b, size_t more)
{
    if (b->failed)
        return -1;
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *d = PyMem_Realloc(b->data, cap);
    if (d == NULL) {
        b->failed = 1;
        PyErr_NoMemory();
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

static size_t varint_into(char *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (char)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (char)v;
    return n;
}

static void put_varint(buf_t *b, uint64_t v)
{
    if (grow(b, 10) == 0)
        b->len += varint_into(b->data + b->len, v);
}

static void put_tag(buf_t *b, int field, int wire) { put_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void put_bytes(buf_t *b, int field, const void *p, size_t n)
{
    put_tag(b, field, 2);
    put_varint(b, n);
    if (grow(b, n) == 0) {
        memcpy(b->data + b->len, p, n);
        b->len += n;
    }
}

static void put_fixed64(buf_t *b, int field, uint64_t v)
{
    put_tag(b, field, 1);
    if (grow(b, 8) == 0) {
        for (int i = 0; i < 8; i++)
            b->data[b->len++] = (char)(v >> (8 * i));
    }
}

static void put_fixed32(buf_t *b, int field, uint32_t v)
{
    put_tag(b, field, 5);
    if (grow(b, 4) == 0) {
        for (int i = 0; i < 4; i++)
            b->data[b->len++] = (char)(v >> (8 * i));
    }
}

static void put_id(buf_t *b, int field, uint64_t hi, uint64_t lo, int wide)
{
    unsigned char id[16];
    int n = wide ? 16 : 8;
    for (int i = 0; i < 8; i++) {
        if (wide)
            id[i] = (unsigned char)(hi >> (56 - 8 * i));
        id[(wide ? 8 : 0) + i] = (unsigned char)(lo >> (56 - 8 * i));
    }
    put_bytes(b, field, id, (size_t)n);
}

/* A nested message: open reserves room for its length, close writes it. */
static size_t open_msg(buf_t *b, int field)
{
    put_tag(b, field, 2);
    if (grow(b, 5) < 0)
        return 0;
    size_t at = b->len;
    b->len += 5;
    return at;
}

static void close_msg(buf_t *b, size_t at)
{
    if (b->failed)
        return;
    size_t body = b->len - at - 5;
    char len[10];
    size_t n = varint_into(len, body);
    memmove(b->data + at + n, b->data + at + 5, body);
    memcpy(b->data + at, len, n);
    b->len -= 5 - n;
}

static int put_str(buf_t *b, int field, PyObject *s)
{
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL)
        return -1;
    put_bytes(b, field, u, (size_t)n);
    return 0;
}

/* AnyValue: str, bool, int (int64), float; anything else as its str(). */
static int put_value(buf_t *b, int field, PyObject *v)
{
    size_t at = open_msg(b, field);
    int rc = 0;
    if (PyUnicode_Check(v)) {
        rc = put_str(b, 1, v);
    } else if (PyBool_Check(v)) {
        put_tag(b, 2, 0);
        put_varint(b, v == Py_True);
    } else if (PyLong_Check(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred())
            rc = -1;
        else if (overflow) {
            PyObject *s = PyObject_Str(v);
            rc = s != NULL ? put_str(b, 1, s) : -1;
            Py_XDECREF(s);
        } else {
            put_tag(b, 3, 0);
            put_varint(b, (uint64_t)x);
        }
    } else if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        put_fixed64(b, 4, bits);
    } else {
        PyObject *s = PyObject_Str(v);
        rc = s != NULL ? put_str(b, 1, s) : -1;
        Py_XDECREF(s);
    }
    close_msg(b, at);
    return rc;
}

/* repeated KeyValue `field` from a dict of str -> value, None, or a sequence of such (a
 * shared dict of what many spans have in common, then the span's own). */
static int put_attributes(buf_t *b, int field, PyObject *attrs)
{
    if (attrs == Py_None)
        return 0;
    if (PyTuple_Check(attrs) || PyList_Check(attrs)) {
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(attrs); i++)
            if (put_attributes(b, field, PySequence_Fast_GET_ITEM(attrs, i)) < 0)
                return -1;
        return 0;
    }
    if (!PyDict_Check(attrs)) {
        PyErr_SetString(PyExc_TypeError, "otlp_encode: attributes must be a dict, None or a tuple of them");
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        size_t at = open_msg(b, field);
        PyObject *key = PyUnicode_Check(k) ? Py_NewRef(k) : PyObject_Str(k);
        int rc = key != NULL ? put_str(b, 1, key) : -1;
        Py_XDECREF(key);
        if (rc < 0 || put_value(b, 2, v) < 0)
            return -1;
        close_msg(b, at);
    }
    return 0;
}

static int u64(PyObject *o, uint64_t *out)
{
    *out = PyLong_AsUnsignedLongLong(o);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

#define SPAN_FIELDS 14
#define REQUEST_FIELDS 20

/* The span id of a request's k-th child: derived from the request's (splitmix64), so the
 * loop records one tuple per request instead of one per span. */
static uint64_t child_id(uint64_t parent, uint64_t k)
{
    uint64_t z = parent + 0x9E3779B97F4A7C15ULL * (k + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z ? z : 1;
}

/* A child span of a request: name, start and end only. */
static int put_child(buf_t *b, uint64_t hi, uint64_t lo, uint64_t parent, uint64_t k, const char *name,
                     PyObject *from, PyObject *to)
{
    uint64_t start, end;
    if (u64(from, &start) < 0 || u64(to, &end) < 0)
        return -1;
    if (start == 0)
        return 0; /* the request never got there */
    size_t at = open_msg(b, 2);
    put_id(b, 1, hi, lo, 1);
    put_id(b, 2, 0, child_id(parent, k), 0);
    put_id(b, 4, 0, parent, 0);
    put_bytes(b, 5, name, strlen(name));
    put_tag(b, 6, 0);
    put_varint(b, 1); /* INTERNAL */
    put_fixed64(b, 7, start);
    put_fixed64(b, 8, end);
    put_fixed32(b, 16, 0x1 | 0x100);
    close_msg(b, at);
    return b->failed ? -1 : 0;
}

/* One recorded span: [trace_hi, trace_lo, span_id, parent_id, remote, name, kind (API value), start_ns,
 * end_ns, attributes, status, message, events [[name, ns, attrs]], links [[trace_hi, trace_lo, span_id,
 * attrs]]]. */
static int put_span(buf_t *b, PyObject *span)
{
    Py_ssize_t n = PyList_Check(span) || PyTuple_Check(span) ? PySequence_Fast_GET_SIZE(span) : -1;
    if (n != SPAN_FIELDS && n != REQUEST_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "otlp_encode: a span is a sequence of 14 fields, a request of 20 "
                                          "(see aserve.tracing.recorder)");
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(span);
    if (n == REQUEST_FIELDS) {
        /* a request: its server span (fields 0-13, as a span's) and the children decode, queue
         * and encode timed by fields 14-19 */
        uint64_t hi, lo, id;
        if (u64(f[0], &hi) < 0 || u64(f[1], &lo) < 0 || u64(f[2], &id) < 0)
            return -1;
        if (put_child(b, hi, lo, id, 0, "decode", f[14], f[15]) < 0 ||
            put_child(b, hi, lo, id, 1, "queue", f[16], f[17]) < 0 ||
            put_child(b, hi, lo, id, 2, "encode", f[18], f[19]) < 0)
            return -1;
    }
    uint64_t hi, lo, id, parent, start, end;
    if (u64(f[0], &hi) < 0 || u64(f[1], &lo) < 0 || u64(f[2], &id) < 0 || u64(f[3], &parent) < 0 ||
        u64(f[7], &start) < 0 || u64(f[8], &end) < 0)
        return -1;
    long kind = PyLong_AsLong(f[6]), status = PyLong_AsLong(f[10]);
    if ((kind == -1 || status == -1) && PyErr_Occurred())
        return -1;
    size_t at = open_msg(b, 2); /* ScopeSpans.spans */
    put_id(b, 1, hi, lo, 1);
    put_id(b, 2, 0, id, 0);
    if (parent != 0)
        put_id(b, 4, 0, parent, 0);
    if (put_str(b, 5, f[5]) < 0)
        return -1;
    put_tag(b, 6, 0);
    put_varint(b, (uint64_t)(kind + 1)); /* the API's INTERNAL = 0 is the protocol's 1 */
    put_fixed64(b, 7, start);
    put_fixed64(b, 8, end);
    if (put_attributes(b, 9, f[9]) < 0)
        return -1;
    PyObject *events = f[12];
    Py_ssize_t n_events = PyList_Check(events) || PyTuple_Check(events) ? PySequence_Fast_GET_SIZE(events) : 0;
    for (Py_ssize_t i = 0; i < n_events; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(events, i);
        uint64_t t;
        if (!(PyList_Check(e) || PyTuple_Check(e)) || PySequence_Fast_GET_SIZE(e) != 3 ||
            u64(PySequence_Fast_GET_ITEM(e, 1), &t) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "otlp_encode: an event is [name, time_ns, attributes]");
            return -1;
        }
        size_t ev = open_msg(b, 11);
        put_fixed64(b, 1, t);
        if (put_str(b, 2, PySequence_Fast_GET_ITEM(e, 0)) < 0 || put_attributes(b, 3, PySequence_Fast_GET_ITEM(e, 2)) < 0)
            return -1;
        close_msg(b, ev);
    }
    PyObject *links = f[13];
    Py_ssize_t n_links = PyList_Check(links) || PyTuple_Check(links) ? PySequence_Fast_GET_SIZE(links) : 0;
    for (Py_ssize_t i = 0; i < n_links; i++) {
        PyObject *l = PySequence_Fast_GET_ITEM(links, i);
        uint64_t lhi, llo, lid;
        if (!(PyList_Check(l) || PyTuple_Check(l)) || PySequence_Fast_GET_SIZE(l) != 4 ||
            u64(PySequence_Fast_GET_ITEM(l, 0), &lhi) < 0 || u64(PySequence_Fast_GET_ITEM(l, 1), &llo) < 0 ||
            u64(PySequence_Fast_GET_ITEM(l, 2), &lid) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "otlp_encode: a link is [trace_hi, trace_lo, span_id, attributes]");
            return -1;
        }
        size_t lk = open_msg(b, 13);
        put_id(b, 1, lhi, llo, 1);
        put_id(b, 2, 0, lid, 0);
        if (put_attributes(b, 4, PySequence_Fast_GET_ITEM(l, 3)) < 0)
            return -1;
        put_fixed32(b, 6, 0x100 | 0x1); /* sampled; is_remote known (false) */
        close_msg(b, lk);
    }
    if (status != 0) {
        size_t st = open_msg(b, 15);
        if (PyUnicode_Check(f[11]) && PyUnicode_GET_LENGTH(f[11]) > 0 && put_str(b, 2, f[11]) < 0)
            return -1;
        put_tag(b, 3, 0);
        put_varint(b, (uint64_t)status);
        close_msg(b, st);
    }
    /* flags: sampled; the parent's remoteness is known (bit 8) and, for a caller's span, set (bit 9) */
    put_fixed32(b, 16, 0x1 | 0x100 | (PyObject_IsTrue(f[4]) ? 0x200 : 0));
    close_msg(b, at);
    return b->failed ? -1 : 0;
}

PyObject *as_otlp_encode(PyObject *module, PyObject *args)
{
    PyObject *resource, *scope_name, *scope_version, *spans;
    if (!PyArg_ParseTuple(args, "O!UUO!:otlp_encode", &PyDict_Type, &resource, &scope_name, &scope_version,
                          &PyList_Type, &spans))
        return NULL;
    buf_t b = {0};
    size_t rs = open_msg(&b, 1); /* ExportTraceServiceRequest.resource_spans */
    size_t res = open_msg(&b, 1); /* ResourceSpans.resource */
    int rc = put_attributes(&b, 1, resource);
    close_msg(&b, res);
    size_t ss = open_msg(&b, 2); /* ResourceSpans.scope_spans */
    size_t sc = open_msg(&b, 1); /* ScopeSpans.scope */
    if (rc == 0)
        rc = put_str(&b, 1, scope_name);
    if (rc == 0)
        rc = put_str(&b, 2, scope_version);
    close_msg(&b, sc);
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(spans); i++)
        rc = put_span(&b, PyList_GET_ITEM(spans, i));
    close_msg(&b, ss);
    close_msg(&b, rs);
    PyObject *out = rc == 0 && !b.failed ? PyBytes_FromStringAndSize(b.data, (Py_ssize_t)b.len) : NULL;
    PyMem_Free(b.data);
    return out;
}
