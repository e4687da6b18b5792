/* Interpreter side: what runs inside one interpreter, on its worker thread. */
#ifndef ASERVE_RUNTIME_H
#define ASERVE_RUNTIME_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../abi.h"

struct as_interp {
    PyThreadState *ts;     /* detached between jobs */
    const as_host *host;
    PyObject *fn_load, *fn_unload, *fn_infer, *fn_exec, *fn_format, *fn_trace_begin, *fn_trace_end;
    PyTypeObject *input_type; /* read-only exporter of host input memory, one type per interpreter */
    /* cancellation: read and written under this interpreter's GIL */
    PyObject *exc_cancel;        /* the bootstrap's Cancelled class */
    PyInterpreterState *interp;  /* the interpreter the worker's thread state belongs to */
    unsigned long thread_id;     /* the worker thread, as PyThreadState_SetAsyncExc names it */
    uint64_t running;            /* id of the job running Python now, 0 between jobs */
    int cancel_set;              /* an asynchronous Cancelled was set during this job */
};

/* Import the bootstrap module and keep its entry points. Needs an attached thread
 * state; returns 0, or -1 with a message in err. */
int as_runtime_bind(as_interp *ip, const as_init *cfg, char *err, size_t errlen);

/* Format the current Python exception into err (clearing it). */
void as_runtime_error(char *err, size_t errlen, const char *what);

/* inputs.c: the type of read-only host input memory (one per interpreter: as_interp's
 * input_type), or NULL with an exception set. */
PyTypeObject *as_input_type_new(void);

/* inputs.c: host input tensors as a list of (name, datatype, shape, memoryview) tuples.
 * Each memoryview is read-only and exports an object that keeps the host's reference
 * `inputs_ctx`: once every such object of the list is gone (at the end of the job,
 * or later if the model kept a view), the interpreter gives the reference back with
 * host->inputs_released, so host memory outlives every view of it. */
PyObject *as_input_tensors(as_interp *ip, const as_tensor *tensors, size_t n, void *inputs_ctx);

/* The join(done) callable of a staged job (join.c), and dropping the views it handed out. */
PyObject *as_join_new(as_interp *ip, const as_join *join);
void as_join_end(PyObject *join);

/* Run one job / give back one result's owner; attach and detach ip->ts. */
void as_interp_run(as_interp *ip, as_job *job);
void as_interp_release(as_interp *ip, void *owner);

/* as_cancel_fn: called on a thread of the host that holds no thread state. */
int as_interp_cancel(as_interp *ip, uint64_t id);

#endif
