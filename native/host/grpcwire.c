/* ModelInferRequest and ModelInferResponse on the wire, for the gRPC codec's common case
 * (protocol/grpc/codec.py): every input's data in raw_input_contents, every output's in
 * raw_output_contents.
 *
 * grpc_split(message) reads a request's top-level fields without decoding them: the model's
 * name and version, the id, where each raw_input_contents entry lies, and the bytes of every
 * other field in order (the "key"). A client sends the same key on every request of one
 * shape (names, datatypes, shapes, parameters, outputs asked for): the codec decodes and
 * checks a key once and reuses what it found for the next request with the same key, as it
 * does for a binary HTTP request's JSON header. None for a message this cannot read (the
 * codec's full decoder then names what is wrong).
 *
 * grpc_response(model_name, model_version, id, outputs) writes a ModelInferResponse whose
 * outputs ([(name, datatype, shape, data)]) are all in raw_output_contents.
 */
#include "common.h"

#include <string.h>

#define GW_MAX_RAW 64

static int varint(const unsigned char *p, Py_ssize_t len, Py_ssize_t *at, unsigned long long *out)
{
    unsigned long long v = 0;
    for (int shift = 0; shift < 64 && *at < len; shift += 7) {
        unsigned char b = p[(*at)++];
        v |= (unsigned long long)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* grpc_split(message) -> (model_name, model_version, id, key, [(start, end), ...]) | None */
PyObject *as_grpc_split(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t len = view.len, at = 0;
    Py_ssize_t name[2] = {0, 0}, version[2] = {0, 0}, id[2] = {0, 0}, raw[GW_MAX_RAW][2];
    int nraw = 0, seen_name = 0;
    char *key = PyMem_Malloc(len > 0 ? (size_t)len : 1);
    Py_ssize_t keylen = 0;
    PyObject *result = NULL;
    if (key == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    while (at < len) {
        Py_ssize_t start = at;
        unsigned long long tag, size;
        if (varint(p, len, &at, &tag) < 0)
            goto none;
        unsigned field = (unsigned)(tag >> 3), wire = (unsigned)(tag & 7);
        if (wire == 0) {
            if (varint(p, len, &at, &size) < 0)
                goto none;
        } else if (wire == 2) {
            if (varint(p, len, &at, &size) < 0 || size > (unsigned long long)(len - at))
                goto none;
            Py_ssize_t s = at, e = at + (Py_ssize_t)size;
            at = e;
            if (field == 1 || field == 2 || field == 3) {
                Py_ssize_t *slot = field == 1 ? name : field == 2 ? version : id;
                slot[0] = s, slot[1] = e;
                seen_name |= field == 1;
                if (field == 3)
                    continue; /* the id differs from request to request: not in the key */
            } else if (field == 7) {
                if (nraw == GW_MAX_RAW)
                    goto none;
                raw[nraw][0] = s, raw[nraw][1] = e;
                nraw++;
                continue;
            }
        } else if (wire == 1) {
            at += 8;
        } else if (wire == 5) {
            at += 4;
        } else {
            goto none; /* groups: no field of this message is one */
        }
        if (at > len || field == 0)
            goto none;
        memcpy(key + keylen, p + start, (size_t)(at - start));
        keylen += at - start;
    }
    if (!seen_name)
        goto none;
    PyObject *ranges = PyList_New(nraw);
    if (ranges == NULL)
        goto done;
    for (int i = 0; i < nraw; i++) {
        PyObject *pair = Py_BuildValue("(nn)", raw[i][0], raw[i][1]);
        if (pair == NULL) {
            Py_DECREF(ranges);
            goto done;
        }
        PyList_SET_ITEM(ranges, i, pair);
    }
    PyObject *n = NULL, *v = NULL, *i = NULL, *k = NULL; /* each made only once those before it were */
    if ((n = PyUnicode_DecodeUTF8((const char *)p + name[0], name[1] - name[0], NULL)) != NULL &&
        (v = PyUnicode_DecodeUTF8((const char *)p + version[0], version[1] - version[0], NULL)) != NULL &&
        (i = PyUnicode_DecodeUTF8((const char *)p + id[0], id[1] - id[0], NULL)) != NULL &&
        (k = PyBytes_FromStringAndSize(key, keylen)) != NULL)
        result = PyTuple_Pack(5, n, v, i, k, ranges);
    else if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear(); /* not UTF-8: the full decoder says so */
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(n);
    Py_XDECREF(v);
    Py_XDECREF(i);
    Py_XDECREF(k);
    Py_DECREF(ranges);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(key);
    PyBuffer_Release(&view);
    return result;
}

/* ---- writing ---- */

typedef struct {
    char *buf;
    size_t len, cap;
} wbuf;

static int wgrow(wbuf *w, size_t more)
{
    if (w->len + more <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + more)
        cap *= 2;
    char *b = PyMem_Realloc(w->buf, cap);
    if (b == NULL)
        return -1;
    w->buf = b, w->cap = cap;
    return 0;
}

static int wvarint(wbuf *w, unsigned long long v)
{
    if (wgrow(w, 10) < 0)
        return -1;
    do {
        unsigned char b = v & 0x7f;
        v >>= 7;
        w->buf[w->len++] = (char)(b | (v ? 0x80 : 0));
    } while (v);
    return 0;
}

static int wbytes(wbuf *w, unsigned field, const void *data, size_t n)
{
    if (wvarint(w, (unsigned long long)field << 3 | 2) < 0 || wvarint(w, n) < 0 || wgrow(w, n) < 0)
        return -1;
    memcpy(w->buf + w->len, data, n);
    w->len += n;
    return 0;
}

static int wstr(wbuf *w, unsigned field, PyObject *s, int always)
{
    Py_ssize_t n;
    const char *c = PyUnicode_AsUTF8AndSize(s, &n);
    if (c == NULL)
        return -1;
    return n == 0 && !always ? 0 : wbytes(w, field, c, (size_t)n);
}

static size_t varint_size(unsigned long long v)
{
    size_t n = 1;
    while (v >= 0x80)
        v >>= 7, n++;
    return n;
}

/* grpc_response(model_name, model_version, id, [(name, datatype, shape, data), ...]) -> bytes */
PyObject *as_grpc_response(PyObject *module, PyObject *args)
{
    PyObject *name, *version, *id, *outputs;
    if (!PyArg_ParseTuple(args, "UUUO!:grpc_response", &name, &version, &id, &PyList_Type, &outputs))
        return NULL;
    wbuf w = {0}, t = {0};
    Py_ssize_t n = PyList_GET_SIZE(outputs);
    if (wstr(&w, 1, name, 0) < 0 || wstr(&w, 2, version, 0) < 0 || wstr(&w, 3, id, 0) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) { /* outputs (5): name, datatype, shape (packed int64) */
        PyObject *o = PyList_GET_ITEM(outputs, i), *shape;
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 4 || !PyTuple_Check(shape = PyTuple_GET_ITEM(o, 2))) {
            PyErr_SetString(PyExc_TypeError, "grpc_response: expected (name, datatype, shape tuple, data)");
            goto fail;
        }
        t.len = 0;
        if (wstr(&t, 1, PyTuple_GET_ITEM(o, 0), 1) < 0 || wstr(&t, 2, PyTuple_GET_ITEM(o, 1), 1) < 0)
            goto fail;
        Py_ssize_t dims = PyTuple_GET_SIZE(shape);
        if (dims > 0) {
            size_t packed = 0;
            for (Py_ssize_t d = 0; d < dims; d++) {
                long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
                if (v == -1 && PyErr_Occurred())
                    goto fail;
                packed += varint_size((unsigned long long)v);
            }
            if (wvarint(&t, 3 << 3 | 2) < 0 || wvarint(&t, packed) < 0)
                goto fail;
            for (Py_ssize_t d = 0; d < dims; d++)
                if (wvarint(&t, (unsigned long long)PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d))) < 0)
                    goto fail;
        }
        if (wbytes(&w, 5, t.buf ? t.buf : "", t.len) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* raw_output_contents (6) */
        Py_buffer data;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(PyList_GET_ITEM(outputs, i), 3), &data, PyBUF_SIMPLE) < 0)
            goto fail;
        int rv = wbytes(&w, 6, data.buf, (size_t)data.len);
        PyBuffer_Release(&data);
        if (rv < 0)
            goto fail;
    }
    PyObject *out = PyBytes_FromStringAndSize(w.buf ? w.buf : "", (Py_ssize_t)w.len);
    PyMem_Free(w.buf);
    PyMem_Free(t.buf);
    return out;
fail:
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    PyMem_Free(w.buf);
    PyMem_Free(t.buf);
    return NULL;
}
