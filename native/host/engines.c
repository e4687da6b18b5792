/* Interpreters in the host's own libpython: PEP 684 subinterpreters with their own
 * GIL (Python >= 3.12), and threads of the host interpreter (the baseline). */
#include "../interp/runtime.h"
#include "common.h"

#include <string.h>

/* ---- threads of the host interpreter: every job takes the one host GIL ---- */

static int main_create(const as_init *cfg, as_interp **out, char *err, size_t errlen)
{
    as_interp *ip = PyMem_RawCalloc(1, sizeof(as_interp));
    if (ip == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    PyThreadState *ts = PyThreadState_New(PyInterpreterState_Main());
    PyEval_RestoreThread(ts);
    int rc = as_runtime_bind(ip, cfg, err, errlen);
    ip->ts = PyEval_SaveThread();
    if (rc < 0) {
        PyEval_RestoreThread(ip->ts);
        PyThreadState_Clear(ip->ts);
        PyThreadState_DeleteCurrent();
        PyMem_RawFree(ip);
        return -1;
    }
    *out = ip;
    return 0;
}

void as_main_engine(as_engine *out)
{
    memset(out, 0, sizeof *out);
    out->name = "main";
    out->create = main_create;
    out->run = as_interp_run;
    out->release = as_interp_release;
    out->cancel = as_interp_cancel;
}

/* ---- PEP 684 subinterpreters ---- */

#if PY_VERSION_HEX >= 0x030C0000

static int set_sys_path(const as_init *cfg)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return -1;
    for (size_t i = 0; i < cfg->n_path; i++) {
        PyObject *s = PyUnicode_DecodeFSDefault(cfg->path[i]);
        if (s == NULL || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(list);
            return -1;
        }
        Py_DECREF(s);
    }
    int rc = PySys_SetObject("path", list);
    Py_DECREF(list);
    return rc;
}

/* Subinterpreters start and end one at a time in the process. CPython 3.13 creating
 * several at once from different threads intermittently fails ("Failed to import
 * encodings module", python/cpython#128381, #131485): a pool starts its workers'
 * interpreters in parallel, and several pools may start together. Taken before any
 * GIL (workers call create and destroy holding none), so it is the outermost lock. */
static pthread_mutex_t sub_lifecycle = PTHREAD_MUTEX_INITIALIZER;

static int sub_create_locked(const as_init *cfg, as_interp **out, char *err, size_t errlen)
{
    as_interp *ip = PyMem_RawCalloc(1, sizeof(as_interp));
    if (ip == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* A thread state of the main interpreter to create from; the new interpreter
     * gets its own GIL and obmalloc and refuses single-phase extension modules. */
    PyThreadState *main_ts = PyThreadState_New(PyInterpreterState_Main());
    PyEval_RestoreThread(main_ts);
    const PyInterpreterConfig config = {
        .use_main_obmalloc = 0,
        .allow_fork = 0,
        .allow_exec = 0,
        .allow_threads = 1,
        .allow_daemon_threads = 0,
        .check_multi_interp_extensions = 1,
        .gil = PyInterpreterConfig_OWN_GIL,
    };
    PyThreadState *ts = NULL;
    PyStatus st = Py_NewInterpreterFromConfig(&ts, &config);
    if (PyStatus_Exception(st)) {
        snprintf(err, errlen, "Py_NewInterpreterFromConfig: %s", st.err_msg ? st.err_msg : "failed");
        PyThreadState_Swap(main_ts);
        goto fail;
    }
    /* ts is now attached (its GIL held); the main GIL was released by the swap */
    if (set_sys_path(cfg) < 0) {
        as_runtime_error(err, errlen, "setting sys.path in the subinterpreter");
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
        goto fail;
    }
    if (as_runtime_bind(ip, cfg, err, errlen) < 0) {
        Py_EndInterpreter(ts);
        PyThreadState_Swap(main_ts);
        goto fail;
    }
    ip->ts = PyEval_SaveThread();
    PyEval_RestoreThread(main_ts);
    PyThreadState_Clear(main_ts);
    PyThreadState_DeleteCurrent();
    *out = ip;
    return 0;
fail:
    PyThreadState_Clear(main_ts);
    PyThreadState_DeleteCurrent();
    PyMem_RawFree(ip);
    return -1;
}

static int sub_create(const as_init *cfg, as_interp **out, char *err, size_t errlen)
{
    pthread_mutex_lock(&sub_lifecycle);
    int rc = sub_create_locked(cfg, out, err, errlen);
    pthread_mutex_unlock(&sub_lifecycle);
    return rc;
}

/* Drop the record `threading` keeps of this thread (made where model code asked for the
 * current thread: the worker's thread was not started by `threading`) while the interpreter's
 * modules live. Py_EndInterpreter would drop it after they are cleared, and 3.13's record then
 * fails in its __del__ ("Exception ignored in: _DeleteDummyThreadOnDel.__del__"). */
static void drop_thread_record(void)
{
    PyObject *name = PyUnicode_FromString("threading");
    PyObject *threading = name != NULL ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    PyObject *info = threading != NULL ? PyObject_GetAttrString(threading, "_thread_local_info") : NULL;
    if (info != NULL && PyObject_DelAttrString(info, "_track_dummy_thread_ref") < 0)
        PyErr_Clear(); /* no record: the thread never asked */
    Py_XDECREF(info);
    Py_XDECREF(threading);
    PyErr_Clear(); /* no `threading`, or one without the record (3.12) */
}

/* Subinterpreters must end before the host finalizes (3.12 aborts otherwise). */
static void sub_destroy(as_interp *ip)
{
    pthread_mutex_lock(&sub_lifecycle);
    PyEval_RestoreThread(ip->ts);
    drop_thread_record();
    Py_CLEAR(ip->fn_load);
    Py_CLEAR(ip->fn_unload);
    Py_CLEAR(ip->fn_infer);
    Py_CLEAR(ip->fn_exec);
    Py_CLEAR(ip->fn_format);
    Py_CLEAR(ip->fn_trace_begin);
    Py_CLEAR(ip->fn_trace_end);
    Py_CLEAR(ip->input_type);
    Py_CLEAR(ip->exc_cancel);
    Py_EndInterpreter(ip->ts);
    pthread_mutex_unlock(&sub_lifecycle);
    PyMem_RawFree(ip);
}

int as_subinterp_engine(as_engine *out, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    memset(out, 0, sizeof *out);
    out->name = "subinterp";
    out->create = sub_create;
    out->run = as_interp_run;
    out->release = as_interp_release;
    out->cancel = as_interp_cancel;
    out->destroy = sub_destroy;
    return 0;
}

#else

int as_subinterp_engine(as_engine *out, char *err, size_t errlen)
{
    (void)out;
    snprintf(err, errlen,
             "engine 'subinterp' needs PEP 684 subinterpreters (Python >= 3.12); this is Python %s: "
             "use engine 'private'",
             PY_VERSION);
    return -1;
}

#endif
