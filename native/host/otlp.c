/* OTLP encoding: spans as the tracer records them, to an ExportTraceServiceRequest (protobuf).
 *
 * The OpenTelemetry SDK builds a Python object per span and encodes it in Python, and a
 * traced request has five spans. This writes the protobuf wire format directly from
 * what the recorder made (aserve/tracing/recorder.py): spans as lists, and the numeric
 * records of requests and batches as arrays of unsigned 64-bit numbers, read in place,
 * with no Python object per span. Messages are written depth-first into one growing
 * buffer: each nested message reserves five bytes for its length, and when it ends the
 * length is written and the body moved up over the unused bytes.
 *
 * Field numbers are those of opentelemetry/proto/trace/v1/trace.proto,
 * common/v1/common.proto, resource/v1/resource.proto and
 * collector/trace/v1/trace_service.proto.
 */
#include "common.h"

#include <math.h>
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

/* AnyValue: str, bool, int (int64), float, a list or tuple of them (an ArrayValue, as the
 * OpenTelemetry API's sequence attributes); anything else as its str(). */
static int put_value(buf_t *b, int field, PyObject *v)
{
    size_t at = open_msg(b, field);
    int rc = 0;
    if (PyList_Check(v) || PyTuple_Check(v)) {
        size_t array = open_msg(b, 5);
        for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(v); i++)
            rc = put_value(b, 1, PySequence_Fast_GET_ITEM(v, i));
        close_msg(b, array);
    } else if (PyUnicode_Check(v)) {
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

#define SPAN_FIELDS 15
#define REQUEST_SPAN_FIELDS 21

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

/* The W3C tracestate of a span (field 3), when it has one (a non-empty str). */
static int put_trace_state(buf_t *b, PyObject *state)
{
    return PyUnicode_Check(state) && PyUnicode_GET_LENGTH(state) > 0 ? put_str(b, 3, state) : 0;
}

/* A child span of a request: name, start and end only (start 0: the request never got there). */
static int put_child(buf_t *b, uint64_t hi, uint64_t lo, uint64_t parent, uint64_t k, const char *name,
                     uint64_t start, uint64_t end, PyObject *state)
{
    if (start == 0)
        return 0;
    size_t at = open_msg(b, 2);
    put_id(b, 1, hi, lo, 1);
    put_id(b, 2, 0, child_id(parent, k), 0);
    if (put_trace_state(b, state) < 0)
        return -1;
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

static int put_children(buf_t *b, uint64_t hi, uint64_t lo, uint64_t id, const uint64_t t[6], PyObject *state)
{
    return put_child(b, hi, lo, id, 0, "decode", t[0], t[1], state) < 0 ||
                   put_child(b, hi, lo, id, 1, "queue", t[2], t[3], state) < 0 ||
                   put_child(b, hi, lo, id, 2, "encode", t[4], t[5], state) < 0
               ? -1
               : 0;
}

/* One recorded span: [trace_hi, trace_lo, span_id, parent_id, remote, name, kind (API value), start_ns,
 * end_ns, attributes, status, message, events [[name, ns, attrs]], links [[trace_hi, trace_lo, span_id,
 * attrs]], trace_state (W3C tracestate, "" for none)]. */
static int put_span(buf_t *b, PyObject *span)
{
    Py_ssize_t n = PyList_Check(span) || PyTuple_Check(span) ? PySequence_Fast_GET_SIZE(span) : -1;
    if (n != SPAN_FIELDS && n != REQUEST_SPAN_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "otlp_encode: a span is a sequence of 15 fields, a request of 21 "
                                          "(see aserve.tracing.recorder)");
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(span);
    if (n == REQUEST_SPAN_FIELDS) {
        /* a request: its server span (fields 0-14, as a span's) and the children decode, queue
         * and encode timed by fields 15-20 */
        uint64_t hi, lo, id, t[6];
        if (u64(f[0], &hi) < 0 || u64(f[1], &lo) < 0 || u64(f[2], &id) < 0)
            return -1;
        for (int i = 0; i < 6; i++)
            if (u64(f[15 + i], &t[i]) < 0)
                return -1;
        if (put_children(b, hi, lo, id, t, f[14]) < 0)
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
    if (put_trace_state(b, f[14]) < 0)
        return -1;
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

/* ---- the numeric records (common.h: AS_TRACE_*_FIELDS) ---- */


/* A table entry (span name, attributes) with its attributes encoded once per call, as a
 * span's repeated KeyValue (field 9), to be copied into every span that names it. */
typedef struct {
    PyObject *name; /* borrowed from the table */
    buf_t attrs;
    int ready;
} entry_t;

static entry_t *table_entry(PyObject *table, entry_t *cache, uint64_t index)
{
    if (index >= (uint64_t)PyList_GET_SIZE(table)) {
        PyErr_Format(PyExc_ValueError, "otlp_encode: a record names table entry %llu; the table has %zd",
                     (unsigned long long)index, PyList_GET_SIZE(table));
        return NULL;
    }
    entry_t *e = &cache[index];
    if (e->ready)
        return e;
    PyObject *item = PyList_GET_ITEM(table, (Py_ssize_t)index);
    if (!(PyList_Check(item) || PyTuple_Check(item)) || PySequence_Fast_GET_SIZE(item) != 2 ||
        !PyUnicode_Check(PySequence_Fast_GET_ITEM(item, 0))) {
        PyErr_SetString(PyExc_ValueError, "otlp_encode: a table entry is [span name, attributes]");
        return NULL;
    }
    e->name = PySequence_Fast_GET_ITEM(item, 0);
    if (put_attributes(&e->attrs, 9, PySequence_Fast_GET_ITEM(item, 1)) < 0 || e->attrs.failed)
        return NULL;
    e->ready = 1;
    return e;
}

static void put_raw(buf_t *b, const buf_t *from)
{
    if (from->len && grow(b, from->len) == 0) {
        memcpy(b->data + b->len, from->data, from->len);
        b->len += from->len;
    }
}

/* A span attribute (field 9) with an int64 or a double value. */
static void put_int_attr(buf_t *b, const char *key, int64_t v)
{
    size_t at = open_msg(b, 9);
    put_bytes(b, 1, key, strlen(key));
    size_t val = open_msg(b, 2);
    put_tag(b, 3, 0);
    put_varint(b, (uint64_t)v);
    close_msg(b, val);
    close_msg(b, at);
}

static void put_double_attr(buf_t *b, const char *key, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    size_t at = open_msg(b, 9);
    put_bytes(b, 1, key, strlen(key));
    size_t val = open_msg(b, 2);
    put_fixed64(b, 4, bits);
    close_msg(b, val);
    close_msg(b, at);
}

/* The span fields every record's span starts with: ids, parent, name, kind, times. */
static int put_head(buf_t *b, uint64_t hi, uint64_t lo, uint64_t id, uint64_t parent, PyObject *name,
                    const char *cname, int kind, uint64_t start, uint64_t end)
{
    put_id(b, 1, hi, lo, 1);
    put_id(b, 2, 0, id, 0);
    if (parent != 0)
        put_id(b, 4, 0, parent, 0);
    if (name != NULL ? put_str(b, 5, name) < 0 : (put_bytes(b, 5, cname, strlen(cname)), 0))
        return -1;
    put_tag(b, 6, 0);
    put_varint(b, (uint64_t)kind); /* the protocol's: INTERNAL 1, SERVER 2 */
    put_fixed64(b, 7, start);
    put_fixed64(b, 8, end);
    return 0;
}

/* A request record: its decode, queue and encode spans, then its server span. */
static int put_request(buf_t *b, const uint64_t *v, PyObject *table, entry_t *cache)
{
    uint64_t hi = v[0], lo = v[1], id = v[2];
    entry_t *e = table_entry(table, cache, v[14]);
    if (e == NULL || put_children(b, hi, lo, id, v + 8, Py_None) < 0)
        return -1;
    size_t at = open_msg(b, 2);
    if (put_head(b, hi, lo, id, v[3], e->name, NULL, 2, v[6], v[7]) < 0)
        return -1;
    put_raw(b, &e->attrs);
    put_int_attr(b, "http.response.status_code", (int64_t)v[5]);
    if (v[15]) { /* batched: its batch's facts, its time in the queue */
        put_int_attr(b, "aserve.batch_size", (int64_t)v[15]);
        put_int_attr(b, "aserve.batch_samples", (int64_t)v[16]);
        put_double_attr(b, "aserve.compute_us", (double)v[17] / 10);
        if (v[18])
            put_int_attr(b, "aserve.interpreter", (int64_t)v[18] - 1);
        put_double_attr(b, "aserve.queue_us", round((double)(int64_t)(v[11] - v[10]) / 100.0) / 10);
    }
    put_fixed32(b, 16, 0x1 | 0x100 | (v[4] ? 0x200 : 0));
    close_msg(b, at);
    return b->failed ? -1 : 0;
}

/* A batch record: the batch's span, linked to the requests it served (the link records of a
 * batch come together, as Recorder.batch appends them), and the run in the interpreter. */
static int put_batch(buf_t *b, const uint64_t *v, const uint64_t *links, size_t n_links, PyObject *table,
                     entry_t *cache)
{
    uint64_t hi = v[0], lo = v[1], id = v[2], run = v[3], interpreter = v[8];
    entry_t *e = table_entry(table, cache, v[11]);
    if (e == NULL)
        return -1;
    size_t at = open_msg(b, 2);
    if (put_head(b, hi, lo, id, 0, e->name, NULL, 1, v[4], v[5]) < 0)
        return -1;
    put_raw(b, &e->attrs);
    put_int_attr(b, "aserve.batch_size", (int64_t)v[9]);
    put_int_attr(b, "aserve.batch_samples", (int64_t)v[10]);
    if (interpreter)
        put_int_attr(b, "aserve.interpreter", (int64_t)interpreter - 1);
    for (size_t i = 0; i < n_links; i++) {
        const uint64_t *l = links + i * AS_TRACE_LINK_FIELDS;
        size_t lk = open_msg(b, 13);
        put_id(b, 1, l[1], l[2], 1);
        put_id(b, 2, 0, l[3], 0);
        put_fixed32(b, 6, 0x100 | 0x1);
        close_msg(b, lk);
    }
    put_fixed32(b, 16, 0x1 | 0x100);
    close_msg(b, at);
    if (run) {
        at = open_msg(b, 2);
        put_head(b, hi, lo, run, id, NULL, "run in interpreter", 1, v[6], v[7]);
        if (interpreter)
            put_int_attr(b, "aserve.interpreter", (int64_t)interpreter - 1);
        put_raw(b, &e->attrs);
        put_fixed32(b, 16, 0x1 | 0x100);
        close_msg(b, at);
    }
    return b->failed ? -1 : 0;
}

/* records = (table, requests, batches, links): the arrays as bytes, the table as a list of
 * [span name, attributes]. */
static int put_records(buf_t *b, PyObject *records)
{
    PyObject *table;
    Py_buffer req = {0}, bat = {0}, lnk = {0};
    if (!PyArg_ParseTuple(records, "O!y*y*y*:otlp_encode records (table, requests, batches, links)", &PyList_Type,
                          &table, &req, &bat, &lnk))
        return -1;
    int rc = -1;
    Py_ssize_t n_table = PyList_GET_SIZE(table);
    entry_t *cache = PyMem_Calloc(n_table ? (size_t)n_table : 1, sizeof(entry_t));
    if (cache == NULL) {
        PyErr_NoMemory();
        goto finally;
    }
    if (req.len % (AS_TRACE_REQUEST_FIELDS * 8) || bat.len % (AS_TRACE_BATCH_FIELDS * 8) || lnk.len % (AS_TRACE_LINK_FIELDS * 8)) {
        PyErr_SetString(PyExc_ValueError, "otlp_encode: the record arrays are not whole records");
        goto finally;
    }
    const uint64_t *r = req.buf, *a = bat.buf, *l = lnk.buf;
    size_t n_req = (size_t)req.len / (AS_TRACE_REQUEST_FIELDS * 8), n_bat = (size_t)bat.len / (AS_TRACE_BATCH_FIELDS * 8);
    size_t n_lnk = (size_t)lnk.len / (AS_TRACE_LINK_FIELDS * 8), k = 0;
    for (size_t i = 0; i < n_req; i++)
        if (put_request(b, r + i * AS_TRACE_REQUEST_FIELDS, table, cache) < 0)
            goto finally;
    for (size_t i = 0; i < n_bat; i++) {
        const uint64_t *v = a + i * AS_TRACE_BATCH_FIELDS;
        size_t from = k;
        while (k < n_lnk && l[k * AS_TRACE_LINK_FIELDS] == v[2])
            k++;
        if (put_batch(b, v, l + from * AS_TRACE_LINK_FIELDS, k - from, table, cache) < 0)
            goto finally;
    }
    rc = 0;
finally:
    if (cache != NULL)
        for (Py_ssize_t i = 0; i < n_table; i++)
            PyMem_Free(cache[i].attrs.data);
    PyMem_Free(cache);
    PyBuffer_Release(&req);
    PyBuffer_Release(&bat);
    PyBuffer_Release(&lnk);
    return rc;
}

PyObject *as_otlp_encode(PyObject *module, PyObject *args)
{
    PyObject *resource, *scope_name, *scope_version, *spans, *records = Py_None;
    if (!PyArg_ParseTuple(args, "O!UUO!|O:otlp_encode", &PyDict_Type, &resource, &scope_name, &scope_version,
                          &PyList_Type, &spans, &records))
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
    if (rc == 0 && records != Py_None)
        rc = put_records(&b, records);
    close_msg(&b, ss);
    close_msg(&b, rs);
    PyObject *out = rc == 0 && !b.failed ? PyBytes_FromStringAndSize(b.data, (Py_ssize_t)b.len) : NULL;
    PyMem_Free(b.data);
    return out;
}
