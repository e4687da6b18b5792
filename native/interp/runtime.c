/* Running jobs inside one interpreter.
 *
 * Compiled twice: into the interpreter library (one copy per private libpython
 * namespace, bound to that namespace's libpython) and into the host extension
 * (for PEP 684 subinterpreters and the host-interpreter baseline). Either way it
 * uses only the public C API of the libpython it is linked with, and it only ever
 * touches the interpreter whose thread state it attaches.
 */
#include "runtime.h"

#include <string.h>

/* What keeps a job's outputs alive until the host gives them back. */
typedef struct {
    PyObject *result; /* the list the bootstrap returned */
    size_t n;
    Py_buffer *views; /* views[i].obj is NULL for raw (address, nbytes, keep) outputs */
} owner_t;

static char *host_strdup(const as_host *host, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = host->alloc(n);
    if (p != NULL)
        memcpy(p, s, n);
    return p;
}

void as_runtime_error(char *err, size_t errlen, const char *what)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value != NULL ? PyObject_Str(value) : NULL;
    const char *msg = s != NULL ? PyUnicode_AsUTF8(s) : NULL;
    snprintf(err, errlen, "%s: %s: %s", what,
             type != NULL ? ((PyTypeObject *)type)->tp_name : "error",
             msg != NULL ? msg : "(no message)");
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

int as_runtime_bind(as_interp *ip, const as_init *cfg, char *err, size_t errlen)
{
    ip->input_type = as_input_type_new();
    if (ip->input_type == NULL) {
        as_runtime_error(err, errlen, "creating the input memory type");
        return -1;
    }
    PyObject *mod = PyImport_ImportModule(cfg->bootstrap);
    if (mod == NULL) {
        as_runtime_error(err, errlen, "importing the aserve runtime");
        return -1;
    }
    ip->host = cfg->host;
    ip->interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    ip->thread_id = PyThread_get_thread_ident();
    /* guards against model code ending the process (os._exit, os.abort, sys.exit) and an
     * interruptible time.sleep; on the host's own interpreter only for its worker threads */
    PyObject *r = PyObject_CallMethod(mod, "configure", "s", cfg->engine != NULL ? cfg->engine : "");
    if (r == NULL) {
        Py_DECREF(mod);
        as_runtime_error(err, errlen, "configuring the aserve runtime");
        return -1;
    }
    Py_DECREF(r);
    ip->exc_cancel = PyObject_GetAttrString(mod, "Cancelled");
    ip->fn_load = PyObject_GetAttrString(mod, "load");
    ip->fn_unload = PyObject_GetAttrString(mod, "unload");
    ip->fn_infer = PyObject_GetAttrString(mod, "infer");
    ip->fn_exec = PyObject_GetAttrString(mod, "execute");
    ip->fn_format = PyObject_GetAttrString(mod, "format_exception");
    ip->fn_trace_begin = PyObject_GetAttrString(mod, "trace_begin");
    ip->fn_trace_end = PyObject_GetAttrString(mod, "trace_end");
    Py_DECREF(mod);
    if (!ip->fn_load || !ip->fn_unload || !ip->fn_infer || !ip->fn_exec || !ip->fn_format || !ip->fn_trace_begin ||
        !ip->fn_trace_end || !ip->exc_cancel) {
        as_runtime_error(err, errlen, "binding the aserve runtime");
        return -1;
    }
    return 0;
}

/* Record the raised exception on the job: class name and formatted traceback. */
static void fail_job(as_interp *ip, as_job *job)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    job->failed = 1;
    job->error_type = host_strdup(ip->host, type != NULL ? ((PyTypeObject *)type)->tp_name : "Error");
    PyObject *text = value != NULL ? PyObject_CallOneArg(ip->fn_format, value) : NULL;
    const char *s = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
    if (s == NULL) {
        PyErr_Clear();
        s = "the model raised an exception that could not be formatted";
    }
    job->error = host_strdup(ip->host, s);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static int set_text_result(as_interp *ip, as_job *job, PyObject *res)
{
    if (PyUnicode_Check(res)) {
        const char *s = PyUnicode_AsUTF8(res);
        if (s == NULL)
            return -1;
        job->result = host_strdup(ip->host, s);
    }
    return 0;
}

static void free_owner(owner_t *o)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->views[i].obj != NULL)
            PyBuffer_Release(&o->views[i]);
    PyMem_RawFree(o->views);
    Py_XDECREF(o->result);
    PyMem_RawFree(o);
}

static void free_outputs(as_interp *ip, as_job *job)
{
    for (size_t i = 0; i < job->n_outputs; i++) {
        ip->host->free(job->outputs[i].name);
        ip->host->free(job->outputs[i].datatype);
    }
    ip->host->free(job->outputs);
    job->outputs = NULL;
    job->n_outputs = 0;
}

/* Turn the bootstrap's list of (name, datatype, shape, data) into job->outputs. */
static int take_outputs(as_interp *ip, as_job *job, PyObject *res)
{
    if (!PyList_Check(res)) {
        PyErr_SetString(PyExc_TypeError, "aserve runtime: infer must return a list");
        return -1;
    }
    size_t n = (size_t)PyList_GET_SIZE(res);
    owner_t *o = PyMem_RawCalloc(1, sizeof(owner_t));
    as_tensor *out = ip->host->alloc(n ? n * sizeof(as_tensor) : 1);
    if (o == NULL || out == NULL || (o->views = PyMem_RawCalloc(n ? n : 1, sizeof(Py_buffer))) == NULL) {
        PyMem_RawFree(o);
        ip->host->free(out);
        PyErr_NoMemory();
        return -1;
    }
    memset(out, 0, n * sizeof(as_tensor));
    Py_INCREF(res);
    o->result = res;
    o->n = n;
    job->outputs = out;
    job->n_outputs = n;
    for (size_t i = 0; i < n; i++) {
        const char *name, *datatype;
        PyObject *shape, *data;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(res, (Py_ssize_t)i), "ssO!O;aserve runtime output", &name,
                              &datatype, &PyTuple_Type, &shape, &data))
            goto error;
        as_tensor *t = &out[i];
        t->name = host_strdup(ip->host, name);
        t->datatype = host_strdup(ip->host, datatype);
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        if (nd > AS_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "output %s has %zd dimensions; at most %d are supported", name, nd,
                         AS_MAX_DIMS);
            goto error;
        }
        t->ndim = (int)nd;
        for (Py_ssize_t d = 0; d < nd; d++) {
            t->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
            if (t->shape[d] == -1 && PyErr_Occurred())
                goto error;
        }
        Py_buffer *v = &o->views[i];
        if (PyTuple_Check(data) && PyTuple_GET_SIZE(data) == 3) {
            /* (address, nbytes, keepalive): a torch tensor's storage */
            t->data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
            t->nbytes = PyLong_AsSize_t(PyTuple_GET_ITEM(data, 1));
            if (PyErr_Occurred())
                goto error;
        } else {
            /* read-only is enough: the host only reads outputs (an output may be a view of
             * an input, which the view keeps alive) */
            if (PyObject_GetBuffer(data, v, PyBUF_C_CONTIGUOUS) < 0)
                goto error;
            t->data = v->buf;
            t->nbytes = (size_t)v->len;
            t->readonly = v->readonly;
        }
    }
    job->owner = o;
    return 0;
error:
    free_outputs(ip, job);
    free_owner(o);
    return -1;
}

/* A staged run returns (outputs, stage_seconds): keep the timings, go on with outputs. */
static int take_stages(as_job *job, PyObject **res)
{
    PyObject *outputs, *seconds;
    if (!PyArg_ParseTuple(*res, "OO!;aserve runtime: a staged infer returns (outputs, stage_seconds)", &outputs,
                          &PyTuple_Type, &seconds))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(seconds);
    if (n > AS_MAX_STAGES) {
        PyErr_Format(PyExc_ValueError, "a model has at most %d stages, this one %zd", AS_MAX_STAGES, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        job->stage_seconds[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(seconds, i));
        if (job->stage_seconds[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    job->n_stages = (int)n;
    Py_INCREF(outputs);
    Py_SETREF(*res, outputs);
    return 0;
}

static void run_attached(as_interp *ip, as_job *job)
{
    PyObject *res = NULL;
    switch (job->kind) {
    case AS_JOB_LOAD:
        res = PyObject_CallFunction(ip->fn_load, "ss", job->model, job->text);
        if (res != NULL && set_text_result(ip, job, res) < 0)
            Py_CLEAR(res);
        break;
    case AS_JOB_UNLOAD:
        res = PyObject_CallFunction(ip->fn_unload, "sz", job->model, job->text);
        break;
    case AS_JOB_EXEC:
        res = PyObject_CallFunction(ip->fn_exec, "s", job->text);
        if (res != NULL && set_text_result(ip, job, res) < 0)
            Py_CLEAR(res);
        break;
    case AS_JOB_INFER: {
        /* the inputs' hold is given back when the last view of them is gone */
        PyObject *inputs = as_input_tensors(ip, job->inputs, job->n_inputs, job->inputs_ctx);
        PyObject *join = NULL;
        if (inputs != NULL && job->join != NULL && (join = as_join_new(ip, job->join)) == NULL)
            Py_CLEAR(inputs);
        if (inputs != NULL && (job->trace || job->text != NULL)) {
            /* the W3C headers of the batch's run span (or of an untraced batch's caller), for the
             * OpenTelemetry context of the call */
            PyObject *r = PyObject_CallFunction(ip->fn_trace_begin, "z", job->text);
            if (r == NULL)
                Py_CLEAR(inputs);
            Py_XDECREF(r);
        }
        if (inputs != NULL) {
            if (join != NULL)
                res = PyObject_CallFunction(ip->fn_infer, "sOO", job->model, inputs, join);
            else
                res = PyObject_CallFunction(ip->fn_infer, "sO", job->model, inputs);
            Py_DECREF(inputs);
        }
        if (res != NULL && join != NULL && take_stages(job, &res) < 0)
            Py_CLEAR(res);
        if (res != NULL && take_outputs(ip, job, res) < 0)
            Py_CLEAR(res);
        if (job->trace || job->text != NULL) {
            /* the spans the model opened, also when it failed (an untraced job has none) */
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            PyObject *spans = PyObject_CallNoArgs(ip->fn_trace_end);
            if (spans != NULL && job->trace && PyUnicode_Check(spans) && set_text_result(ip, job, spans) < 0)
                PyErr_Clear();
            if (spans == NULL)
                PyErr_Clear();
            Py_XDECREF(spans);
            PyErr_Restore(t, v, tb);
        }
        if (join != NULL) {
            /* keep the pending exception across dropping the joiners' views */
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            as_join_end(join);
            Py_DECREF(join);
            PyErr_Restore(t, v, tb);
        }
        break;
    }
    default:
        PyErr_Format(PyExc_ValueError, "aserve runtime: unknown job kind %d", job->kind);
    }
    if (res == NULL)
        fail_job(ip, job);
    Py_XDECREF(res);
}

void as_interp_run(as_interp *ip, as_job *job)
{
    PyEval_RestoreThread(ip->ts);
    ip->running = job->id;
    run_attached(ip, job);
    ip->running = 0;
    if (ip->cancel_set) {
        /* a cancellation that landed after the job's last bytecode must not hit the next job */
        PyThreadState_SetAsyncExc(ip->thread_id, NULL);
        ip->cancel_set = 0;
    }
    ip->ts = PyEval_SaveThread();
}

/* ---- cancellation ----
 *
 * The host calls this on a thread of its own when every request of a running batch
 * has timed out. Attaching a fresh thread state of the worker's interpreter takes that
 * interpreter's GIL (its own libpython's, for a private copy), which the worker gives
 * up at the next eval-breaker check or while it blocks with the GIL released; holding
 * it, `running` says whether the job is still in its Python part. The exception is
 * raised in the worker at its next bytecode boundary: a pure-Python loop ends at once,
 * time.sleep when its current slice ends (the runtime slices it, see faults.py), but
 * a call blocked in C (a lock, I/O, ctypes, an extension) only when it returns. A
 * worker that holds its GIL in C without end keeps this thread waiting: the host
 * then marks the interpreter lost. */
int as_interp_cancel(as_interp *ip, uint64_t id)
{
    PyThreadState *ts = PyThreadState_New(ip->interp);
    if (ts == NULL)
        return 0;
    PyEval_RestoreThread(ts);
    int set = 0;
    if (id != 0 && ip->running == id) {
        set = PyThreadState_SetAsyncExc(ip->thread_id, ip->exc_cancel) == 1;
        ip->cancel_set |= set;
    }
    PyThreadState_Clear(ts);
    PyThreadState_DeleteCurrent();
    return set;
}

void as_interp_release(as_interp *ip, void *owner)
{
    PyEval_RestoreThread(ip->ts);
    free_owner(owner);
    ip->ts = PyEval_SaveThread();
}
