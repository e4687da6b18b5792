/* Raising aserve._native.EngineError with a formatted message. */
#include "common.h"

PyObject *as_engine_error(PyTypeObject *tp, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg == NULL)
        return NULL;
    module_state *st = as_state_of_type(tp);
    PyErr_SetObject(st != NULL ? st->engine_error : PyExc_RuntimeError, msg);
    Py_DECREF(msg);
    return NULL;
}
