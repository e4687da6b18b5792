/* Host input memory inside an interpreter: read-only, alive as long as a view of it is.
 *
 * Every input tensor is handed to model code as a memoryview over an InputMemory
 * object. The objects of one job (or one joining group) share a hold on the host's
 * reference to the input buffers; when the last of them is gone the hold gives that
 * reference back (host->inputs_released). A model that keeps an array over an
 * input past its call therefore keeps the host memory alive instead of reading
 * freed memory, and exporting the objects read-only makes in-place writes fail.
 *
 * Both a job's own inputs (runtime.c) and the groups a staged job absorbs (join.c)
 * are made here; this file calls neither of them.
 */
#include "runtime.h"

typedef struct {
    Py_ssize_t refs; /* under this interpreter's GIL */
    const as_host *host;
    void *ctx;
} hold_t;

typedef struct {
    PyObject_HEAD
    hold_t *hold;
    void *data;
    Py_ssize_t nbytes;
} inmem_t;

static void hold_drop(hold_t *h)
{
    if (--h->refs > 0)
        return;
    if (h->ctx != NULL)
        h->host->inputs_released(h->ctx);
    PyMem_RawFree(h);
}

static int inmem_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    static char empty[1];
    inmem_t *m = (inmem_t *)self;
    return PyBuffer_FillInfo(view, self, m->nbytes ? m->data : empty, m->nbytes, 1, flags);
}

static void inmem_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    hold_t *h = ((inmem_t *)self)->hold;
    tp->tp_free(self);
    Py_DECREF(tp);
    hold_drop(h);
}

static PyType_Slot inmem_slots[] = {
    {Py_bf_getbuffer, inmem_getbuffer},
    {Py_tp_dealloc, inmem_dealloc},
    {Py_tp_doc, "Read-only host memory of an input tensor; the host keeps it alive while this object lives."},
    {0, NULL},
};

static PyType_Spec inmem_spec = {
    .name = "aserve.InputMemory",
    .basicsize = sizeof(inmem_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = inmem_slots,
};

PyTypeObject *as_input_type_new(void) { return (PyTypeObject *)PyType_FromSpec(&inmem_spec); }

PyObject *as_input_tensors(as_interp *ip, const as_tensor *tensors, size_t n, void *inputs_ctx)
{
    hold_t *h = PyMem_RawMalloc(sizeof *h);
    if (h == NULL) {
        /* the reference must still come back exactly once */
        if (inputs_ctx != NULL)
            ip->host->inputs_released(inputs_ctx);
        return PyErr_NoMemory();
    }
    *h = (hold_t){1, ip->host, inputs_ctx}; /* this call's own reference, dropped on return */
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        const as_tensor *t = &tensors[i];
        PyObject *shape = PyTuple_New(t->ndim);
        inmem_t *m = shape != NULL ? PyObject_New(inmem_t, ip->input_type) : NULL;
        if (m == NULL) {
            Py_XDECREF(shape);
            Py_CLEAR(list);
            break;
        }
        h->refs++;
        m->hold = h;
        m->data = t->data;
        m->nbytes = (Py_ssize_t)t->nbytes;
        for (int d = 0; d < t->ndim; d++)
            PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t->shape[d]));
        PyObject *view = PyMemoryView_FromObject((PyObject *)m);
        Py_DECREF(m); /* the view holds it */
        PyObject *item = view != NULL ? Py_BuildValue("(ssNN)", t->name, t->datatype, shape, view) : NULL;
        if (item == NULL) {
            if (view == NULL)
                Py_DECREF(shape);
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    hold_drop(h);
    return list;
}
