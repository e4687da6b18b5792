/* Rows: a batch's inputs made of its requests' inputs, and its outputs given back per
 * request, for the host's batcher (aserve/tensor.py concat_inputs, split_outputs).
 *
 * Both run on the event loop once per batch; in Python each request cost a flat view, a
 * slice assignment, a slice and a Tensor per input and output. Here the copy is one
 * memcpy per request and the split one slice and one Tensor per request.
 */
#include "common.h"

#include <string.h>

/* concat_rows(buffers) -> bytearray: the buffers' bytes one after another. */
PyObject *as_concat_rows(PyObject *Py_UNUSED(module), PyObject *buffers)
{
    if (!PyList_Check(buffers))
        return PyErr_Format(PyExc_TypeError, "concat_rows: expected a list of buffers, got %.100s",
                            Py_TYPE(buffers)->tp_name);
    Py_ssize_t n = PyList_GET_SIZE(buffers);
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    if (views == NULL)
        return PyErr_NoMemory();
    Py_ssize_t held = 0, total = 0;
    PyObject *out = NULL;
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(buffers, held), &views[held], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (views[held].len > PY_SSIZE_T_MAX - total) {
            PyErr_SetString(PyExc_OverflowError, "concat_rows: the buffers are too large together");
            held++;
            goto done;
        }
        total += views[held].len;
    }
    out = PyByteArray_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    char *at = PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (views[i].len > 0)
            memcpy(at, views[i].buf, (size_t)views[i].len);
        at += views[i].len;
    }
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    return out;
}

/* split_rows(results, name, tensor_type, datatype, rest, view, samples, stride) -> None:
 * results[i][name] = tensor_type(datatype, (samples[i], *rest), view[a:b]) for each
 * request i, its rows a zero-copy slice of view (a flat byte memoryview), stride bytes
 * per sample. The caller checked that view holds sum(samples) * stride bytes. */
PyObject *as_split_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError, "split_rows: expected 8 arguments, got %zd", nargs);
    PyObject *results = args[0], *name = args[1], *tensor_type = args[2], *datatype = args[3], *rest = args[4],
             *view = args[5], *samples = args[6];
    Py_ssize_t stride = PyLong_AsSsize_t(args[7]);
    if (stride == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_Check(results) || !PyList_Check(samples) || !PyTuple_Check(rest) || !PyMemoryView_Check(view) ||
        PyList_GET_SIZE(results) != PyList_GET_SIZE(samples) || stride < 0)
        return PyErr_Format(PyExc_TypeError, "split_rows: expected results and samples (lists of one length), "
                                             "rest (a tuple), view (a memoryview) and stride >= 0");
    Py_ssize_t n = PyList_GET_SIZE(samples), rank = PyTuple_GET_SIZE(rest), offset = 0;
    PyObject *last_rows = NULL, *shape = NULL; /* the shape made for the last row count: requests mostly share it */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rows = PyList_GET_ITEM(samples, i);
        Py_ssize_t s = PyLong_AsSsize_t(rows);
        if (s < 0 || (s > 0 && stride > (PY_SSIZE_T_MAX - offset) / s)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "split_rows: request %zd: %zd samples", i, s);
            goto error;
        }
        if (shape == NULL || rows != last_rows) {
            Py_XDECREF(shape);
            shape = PyTuple_New(rank + 1);
            if (shape == NULL)
                goto error;
            PyTuple_SET_ITEM(shape, 0, Py_NewRef(rows));
            for (Py_ssize_t k = 0; k < rank; k++)
                PyTuple_SET_ITEM(shape, k + 1, Py_NewRef(PyTuple_GET_ITEM(rest, k)));
            last_rows = rows;
        }
        Py_ssize_t end = offset + s * stride;
        PyObject *part = PySequence_GetSlice(view, offset, end);
        if (part == NULL)
            goto error;
        PyObject *targs[3] = {datatype, shape, part};
        PyObject *tensor = PyObject_Vectorcall(tensor_type, targs, 3, NULL);
        Py_DECREF(part);
        if (tensor == NULL)
            goto error;
        int rc = PyObject_SetItem(PyList_GET_ITEM(results, i), name, tensor);
        Py_DECREF(tensor);
        if (rc < 0)
            goto error;
        offset = end;
    }
    Py_XDECREF(shape);
    Py_RETURN_NONE;
error:
    Py_XDECREF(shape);
    return NULL;
}
