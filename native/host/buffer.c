/* OutputBuffer: host-side object exporting memory someone else owns.
 *
 * Created for each output tensor of a job; the interpreter keeps the memory alive
 * until every buffer of that job's result is gone, then the owner is given back to
 * the interpreter's worker, which frees it under that interpreter's own GIL. The
 * buffer knows nothing of pools: its maker passes what to call when it is gone
 * (on_free), so this file depends on no other.
 */
#include "common.h"

typedef struct {
    PyObject_HEAD
    as_buffer_free_fn on_free; /* called with ctx when the buffer is gone, or NULL */
    void *ctx;
    PyObject *keep;            /* host object keeping the memory alive, or NULL */
    void *data;
    Py_ssize_t nbytes;
    int readonly;
} bufobj;

PyObject *as_buffer_new(PyTypeObject *tp, as_buffer_free_fn on_free, void *ctx, PyObject *keep, void *data,
                        size_t nbytes, int readonly)
{
    bufobj *b = PyObject_New(bufobj, tp);
    if (b == NULL)
        return NULL;
    b->on_free = on_free;
    b->ctx = ctx;
    b->keep = Py_XNewRef(keep);
    b->data = data;
    b->nbytes = (Py_ssize_t)nbytes;
    b->readonly = readonly;
    return (PyObject *)b;
}

static int buffer_getbuffer(bufobj *b, Py_buffer *view, int flags)
{
    static char empty[1];
    return PyBuffer_FillInfo(view, (PyObject *)b, b->nbytes ? b->data : empty, b->nbytes, b->readonly, flags);
}

static void buffer_dealloc(bufobj *b)
{
    PyTypeObject *tp = Py_TYPE(b);
    if (b->on_free != NULL)
        b->on_free(b->ctx);
    Py_XDECREF(b->keep);
    PyObject_Free(b);
    Py_DECREF(tp);
}

static PyObject *buffer_address(bufobj *b, void *Py_UNUSED(c)) { return PyLong_FromVoidPtr(b->data); }

static PyObject *buffer_repr(bufobj *b)
{
    return PyUnicode_FromFormat("<aserve OutputBuffer %zd bytes at %p%s>", b->nbytes, b->data,
                                b->readonly ? ", read-only" : "");
}

static PyGetSetDef buffer_getset[] = {
    {"address", (getter)buffer_address, NULL, "address of the first byte", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_bf_getbuffer, buffer_getbuffer},
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_getset, buffer_getset},
    {Py_tp_repr, buffer_repr},
    {Py_tp_doc, "Memory of an interpreter's output tensor, exported with the buffer protocol."},
    {0, NULL},
};

PyType_Spec as_buffer_spec = {
    .name = "aserve._native.OutputBuffer",
    .basicsize = sizeof(bufobj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = buffer_slots,
};

/* One output's shape tuple and buffer (taking one reference on *refs); 0, or -1 with an
 * exception set and nothing made. */
static int output_parts(PyTypeObject *tp, const as_tensor *t, as_buffer_free_fn on_free, void *ctx,
                        Py_ssize_t *refs, PyObject **shape_out, PyObject **buf_out)
{
    PyObject *shape = PyTuple_New(t->ndim);
    if (shape == NULL)
        return -1;
    for (int d = 0; d < t->ndim; d++) {
        PyObject *size = PyLong_FromLongLong(t->shape[d]);
        if (size == NULL) {
            Py_DECREF(shape);
            return -1;
        }
        PyTuple_SET_ITEM(shape, d, size);
    }
    (*refs)++;
    PyObject *buf = as_buffer_new(tp, on_free, ctx, NULL, t->data, t->nbytes, t->readonly);
    if (buf == NULL) {
        (*refs)--;
        Py_DECREF(shape);
        return -1;
    }
    *shape_out = shape;
    *buf_out = buf;
    return 0;
}

PyObject *as_output_list(PyTypeObject *tp, const as_job *job, as_buffer_free_fn on_free, void *ctx, Py_ssize_t *refs)
{
    size_t n = job->n_outputs;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const as_tensor *t = &job->outputs[i];
        PyObject *shape, *buf;
        if (output_parts(tp, t, on_free, ctx, refs, &shape, &buf) < 0)
            goto error;
        PyObject *item = Py_BuildValue("(ssNN)", t->name, t->datatype, shape, buf);
        if (item == NULL)
            goto error;
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
error:
    Py_DECREF(list); /* the buffers made so far drop their references as they go */
    return NULL;
}

PyObject *as_output_dict(PyTypeObject *tp, const as_job *job, as_buffer_free_fn on_free, void *ctx,
                         Py_ssize_t *refs, PyObject *tensor_type)
{
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    for (size_t i = 0; i < job->n_outputs; i++) {
        const as_tensor *t = &job->outputs[i];
        PyObject *shape, *buf, *tensor = NULL;
        if (output_parts(tp, t, on_free, ctx, refs, &shape, &buf) < 0)
            goto error;
        PyObject *name = PyUnicode_FromString(t->name);
        PyObject *datatype = name != NULL ? PyUnicode_FromString(t->datatype) : NULL;
        if (datatype != NULL) {
            PyObject *args[3] = {datatype, shape, buf};
            tensor = PyObject_Vectorcall(tensor_type, args, 3, NULL);
        }
        Py_XDECREF(datatype);
        Py_DECREF(shape);
        Py_DECREF(buf);
        int rc = tensor != NULL ? PyDict_SetItem(dict, name, tensor) : -1;
        Py_XDECREF(name);
        Py_XDECREF(tensor);
        if (rc < 0)
            goto error;
    }
    return dict;
error:
    Py_DECREF(dict);
    return NULL;
}

PyObject *as_buffer_from_address(PyObject *module, PyObject *args)
{
    PyObject *addr, *keep;
    Py_ssize_t nbytes;
    int readonly = 0;
    if (!PyArg_ParseTuple(args, "OnO|p:buffer_from_address", &addr, &nbytes, &keep, &readonly))
        return NULL;
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "buffer_from_address: nbytes must be >= 0");
        return NULL;
    }
    module_state *st = PyModule_GetState(module);
    return as_buffer_new(st->buffer_type, NULL, NULL, keep, p, (size_t)nbytes, readonly);
}
