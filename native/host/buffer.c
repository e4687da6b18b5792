/* OutputBuffer: host-side object exporting memory an interpreter owns.
 *
 * Created for each output tensor of a job; the interpreter keeps the memory alive
 * until every buffer of that job's result is gone, then the owner is given back to
 * the interpreter's worker, which frees it under that interpreter's own GIL.
 */
#include "common.h"

typedef struct {
    PyObject_HEAD
    struct as_result *result; /* owner in an interpreter, or NULL */
    PyObject *keep;           /* host object keeping the memory alive, or NULL */
    void *data;
    Py_ssize_t nbytes;
    int readonly;
} bufobj;

PyObject *as_buffer_new(PyTypeObject *tp, struct as_result *r, PyObject *keep, void *data, size_t nbytes,
                        int readonly)
{
    bufobj *b = PyObject_New(bufobj, tp);
    if (b == NULL)
        return NULL;
    b->result = r;
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
    if (b->result != NULL)
        as_result_decref(b->result);
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
    return as_buffer_new(st->buffer_type, NULL, keep, p, (size_t)nbytes, readonly);
}
