/* V2 binary-extension requests whose JSON header was decoded before, found in C.
 *
 * A client of the binary tensor extension sends the same JSON header on every request
 * (same names, shapes and byte sizes; only the data after it changes). The Python codec
 * decodes and checks a header once, and hands V2Binary what it found: where each input
 * lies in the data after the header, and its own record of the rest (parameters, outputs
 * asked for). V2Binary.find compares a request's header with those it holds, byte for
 * byte, and answers the inputs as views of the request's body, with that record; None
 * when no header matches (the codec decodes it). So this path decides nothing the codec
 * has not decided for the same bytes.
 */
#include "common.h"

#include <string.h>

#define BIN_MAX_PLANS 64  /* aserve.inference.MAX_REMEMBERED */
#define BIN_MAX_INPUTS 64

typedef struct {
    PyObject *header;  /* bytes: the JSON header, as it came */
    Py_ssize_t size;   /* bytes of binary data after it */
    int n;             /* inputs, in the model's order */
    PyObject *datatype[BIN_MAX_INPUTS];
    PyObject *shape[BIN_MAX_INPUTS];
    PyObject *slice[BIN_MAX_INPUTS]; /* the input's bytes in the whole body */
    PyObject *record;  /* what the codec keeps with the header */
} bin_plan;

typedef struct {
    PyObject_HEAD
    PyObject *tensor_type;
    int count, next; /* plans held; the one a new plan replaces when full */
    bin_plan plans[BIN_MAX_PLANS];
} v2binary;

static void plan_clear(bin_plan *p)
{
    Py_CLEAR(p->header);
    Py_CLEAR(p->record);
    for (int i = 0; i < p->n; i++) {
        Py_CLEAR(p->datatype[i]);
        Py_CLEAR(p->shape[i]);
        Py_CLEAR(p->slice[i]);
    }
    p->n = 0;
}

static void binary_dealloc(PyObject *self)
{
    v2binary *b = (v2binary *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(b->tensor_type);
    for (int i = 0; i < b->count; i++)
        plan_clear(&b->plans[i]);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* V2Binary(tensor_type) */
static PyObject *binary_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    PyObject *tensor_type;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "V2Binary takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:V2Binary", &tensor_type))
        return NULL;
    v2binary *b = (v2binary *)tp->tp_alloc(tp, 0);
    if (b == NULL)
        return NULL;
    b->tensor_type = Py_NewRef(tensor_type);
    return (PyObject *)b;
}

/* remember(header: bytes, size, [(datatype, shape, start, end), ...], record): the codec's
 * reading of a header; start and end count from the end of the header. */
static PyObject *binary_remember(PyObject *self, PyObject *args)
{
    v2binary *b = (v2binary *)self;
    PyObject *header, *inputs, *record;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "O!nO!O:remember", &PyBytes_Type, &header, &size, &PyList_Type, &inputs, &record))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(inputs), offset = PyBytes_GET_SIZE(header);
    if (n > BIN_MAX_INPUTS || size < 0) {
        PyErr_SetString(PyExc_ValueError, "remember: too many inputs, or a negative size");
        return NULL;
    }
    bin_plan fresh = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *datatype, *shape;
        Py_ssize_t start, end;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(inputs, i), "UO!nn:remember", &datatype, &PyTuple_Type, &shape,
                              &start, &end))
            goto fail;
        if (start < 0 || end < start || end > size) {
            PyErr_SetString(PyExc_ValueError, "remember: an input's bytes lie outside the binary data");
            goto fail;
        }
        PyObject *lo = PyLong_FromSsize_t(offset + start), *hi = PyLong_FromSsize_t(offset + end);
        PyObject *slice = lo != NULL && hi != NULL ? PySlice_New(lo, hi, NULL) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        if (slice == NULL)
            goto fail;
        fresh.datatype[i] = Py_NewRef(datatype);
        fresh.shape[i] = Py_NewRef(shape);
        fresh.slice[i] = slice;
        fresh.n = (int)i + 1;
    }
    fresh.header = Py_NewRef(header);
    fresh.size = size;
    fresh.record = Py_NewRef(record);
    bin_plan *slot;
    if (b->count < BIN_MAX_PLANS) {
        slot = &b->plans[b->count++];
    } else {
        slot = &b->plans[b->next];
        b->next = (b->next + 1) % BIN_MAX_PLANS;
        plan_clear(slot);
    }
    *slot = fresh;
    Py_RETURN_NONE;
fail:
    plan_clear(&fresh);
    return NULL;
}

/* find(body, header_length) -> ([Tensor, ...], record) | None */
static PyObject *binary_find(PyObject *self, PyObject *args)
{
    v2binary *b = (v2binary *)self;
    PyObject *body, *length;
    if (!PyArg_ParseTuple(args, "OO!:find", &body, &PyLong_Type, &length))
        return NULL;
    Py_ssize_t header_length = PyLong_AsSsize_t(length);
    if (header_length == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* past any body: the codec names it */
        Py_RETURN_NONE;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    bin_plan *hit = NULL;
    if (header_length > 0 && header_length <= view.len) {
        const char *data = view.buf;
        for (int i = 0; i < b->count; i++) {
            bin_plan *p = &b->plans[i];
            if (PyBytes_GET_SIZE(p->header) == header_length && p->size == view.len - header_length &&
                memcmp(PyBytes_AS_STRING(p->header), data, (size_t)header_length) == 0) {
                hit = p;
                break;
            }
        }
    }
    PyBuffer_Release(&view);
    if (hit == NULL)
        Py_RETURN_NONE;
    /* the inputs are views of the body, as the codec's are: a flat byte view sliced */
    PyObject *whole = PyMemoryView_FromObject(body);
    if (whole == NULL)
        return NULL;
    Py_buffer *mv = PyMemoryView_GET_BUFFER(whole);
    if (mv->ndim != 1 || (mv->format != NULL && strcmp(mv->format, "B") != 0)) {
        Py_DECREF(whole);
        Py_RETURN_NONE; /* the codec casts it */
    }
    PyObject *inputs = PyList_New(hit->n);
    if (inputs == NULL) {
        Py_DECREF(whole);
        return NULL;
    }
    for (int i = 0; i < hit->n; i++) {
        PyObject *part = PyObject_GetItem(whole, hit->slice[i]);
        PyObject *tensor = part != NULL ? PyObject_CallFunctionObjArgs(b->tensor_type, hit->datatype[i],
                                                                       hit->shape[i], part, NULL)
                                        : NULL;
        Py_XDECREF(part);
        if (tensor == NULL) {
            Py_DECREF(whole);
            Py_DECREF(inputs);
            return NULL;
        }
        PyList_SET_ITEM(inputs, i, tensor);
    }
    Py_DECREF(whole);
    PyObject *result = PyTuple_Pack(2, inputs, hit->record);
    Py_DECREF(inputs);
    return result;
}

static Py_ssize_t binary_len(PyObject *self)
{
    return ((v2binary *)self)->count;
}

static PyObject *binary_clear(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    v2binary *b = (v2binary *)self;
    for (int i = 0; i < b->count; i++)
        plan_clear(&b->plans[i]);
    b->count = b->next = 0;
    Py_RETURN_NONE;
}

static PyMethodDef binary_methods[] = {
    {"clear", binary_clear, METH_NOARGS, "clear(): forget every header"},
    {"find", binary_find, METH_VARARGS,
     "find(body, header_length) -> ([Tensor, ...] in the model's input order, record) | None: the inputs of a "
     "binary request whose header and data size match one remembered; None for any other"},
    {"remember", binary_remember, METH_VARARGS,
     "remember(header, size, [(datatype, shape, start, end), ...], record): a header the codec decoded and "
     "checked, with `size` bytes of data after it, where each input lies in them, and the codec's record"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot binary_slots[] = {
    {Py_tp_new, binary_new},
    {Py_tp_dealloc, binary_dealloc},
    {Py_tp_methods, binary_methods},
    {Py_sq_length, binary_len},
    {Py_tp_doc, "V2Binary(tensor_type): one model's binary-request headers the codec decoded, found in C"},
    {0, NULL},
};

PyType_Spec as_v2binary_spec = {
    .name = "aserve._native.V2Binary",
    .basicsize = sizeof(v2binary),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = binary_slots,
};
