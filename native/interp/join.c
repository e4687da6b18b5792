/* The join point as model code sees it (layer-level joining).
 *
 * For a staged batch that may absorb joiners, the bootstrap's infer gets a callable
 * join(done) -> inputs | None. The runtime calls it after each stage but the last;
 * it asks the host (as_join.poll, which takes only the pool's lock) for a group of
 * requests to absorb at this boundary and hands their inputs over as memoryviews in
 * the (name, datatype, shape, view) form infer itself receives. Their memory stays
 * alive as long as a view of it does, like the batch's own inputs; the join state
 * drops its references to them when the job finishes.
 */
#include "runtime.h"

#define JOIN_CAPSULE "aserve.join"

typedef struct {
    as_interp *ip;
    const as_join *join;
    PyObject *views; /* list: every group of inputs handed out */
} join_state;

static void join_state_free(PyObject *capsule)
{
    join_state *st = PyCapsule_GetPointer(capsule, JOIN_CAPSULE);
    if (st == NULL) {
        PyErr_Clear();
        return;
    }
    Py_XDECREF(st->views);
    PyMem_RawFree(st);
}

static PyObject *join_call(PyObject *self, PyObject *arg)
{
    join_state *st = PyCapsule_GetPointer(self, JOIN_CAPSULE);
    if (st == NULL)
        return NULL;
    long done = PyLong_AsLong(arg);
    if (done == -1 && PyErr_Occurred())
        return NULL;
    if (done < 1 || done >= AS_MAX_STAGES) {
        PyErr_Format(PyExc_ValueError, "join: stages done must be in 1..%d, got %ld", AS_MAX_STAGES - 1, done);
        return NULL;
    }
    size_t n = 0;
    void *inputs_ctx = NULL;
    const as_tensor *in = st->join->poll(st->join->ctx, (int)done, &n, &inputs_ctx);
    if (in == NULL)
        Py_RETURN_NONE;
    PyObject *list = as_input_tensors(st->ip, in, n, inputs_ctx);
    /* the state keeps each group so that the job drops its views when it ends */
    if (list != NULL && PyList_Append(st->views, list) < 0)
        Py_CLEAR(list);
    return list;
}

static PyMethodDef join_def = {
    "join", join_call, METH_O,
    "join(done) -> [(name, datatype, shape, view)] | None: inputs of requests joining after `done` stages",
};

PyObject *as_join_new(as_interp *ip, const as_join *join)
{
    join_state *st = PyMem_RawCalloc(1, sizeof *st);
    if (st == NULL)
        return PyErr_NoMemory();
    st->ip = ip;
    st->join = join;
    st->views = PyList_New(0);
    PyObject *capsule = st->views != NULL ? PyCapsule_New(st, JOIN_CAPSULE, join_state_free) : NULL;
    if (capsule == NULL) {
        Py_XDECREF(st->views);
        PyMem_RawFree(st);
        return NULL;
    }
    PyObject *fn = PyCFunction_New(&join_def, capsule);
    Py_DECREF(capsule);
    return fn;
}

void as_join_end(PyObject *fn)
{
    join_state *st = PyCapsule_GetPointer(PyCFunction_GetSelf(fn), JOIN_CAPSULE);
    if (st == NULL) {
        PyErr_Clear();
        return;
    }
    Py_ssize_t n = PyList_GET_SIZE(st->views);
    if (PyList_SetSlice(st->views, 0, n, NULL) < 0)
        PyErr_Clear();
}
