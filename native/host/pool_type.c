/* The Python type aserve._native.Pool: what crosses between Python objects and the pool.
 *
 * Every method parses its arguments here, builds the jobs it queues (their inputs
 * read through the buffer protocol) and turns what the pool hands back into Python
 * objects (completions, output buffers, stats). The work under the pool's lock is
 * done by pool.c, pool_join.c and pool_cancel.c; this file never takes p->mu, so
 * what runs under the lock and what runs Python stay in different files.
 */
#include "pool.h"

#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MODEL_CAPSULE "aserve.model"

static void model_capsule_free(PyObject *capsule)
{
    as_pool_model_decref(PyCapsule_GetPointer(capsule, MODEL_CAPSULE));
}

static PyObject *pool_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"engine", "executable", "path", "bootstrap", "library", NULL};
    const char *engine, *executable = NULL, *bootstrap = NULL, *library = NULL;
    PyObject *path = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|$sOsz:Pool", kwlist, &engine, &executable, &path, &bootstrap,
                                     &library))
        return NULL;
    if (executable == NULL || path == NULL || bootstrap == NULL) {
        PyErr_SetString(PyExc_TypeError, "Pool: executable, path and bootstrap are required");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(path, "Pool: path must be a sequence of str");
    if (seq == NULL)
        return NULL;
    pool_t *p = (pool_t *)tp->tp_alloc(tp, 0);
    if (p == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    p->efd = -1;
    snprintf(p->engine_name, sizeof p->engine_name, "%s", engine);
    snprintf(p->thread_name, sizeof p->thread_name, "aserve-%.4s", engine); /* until name_threads */
    char err[512] = "";
    int rc = 0;
    if (strcmp(engine, "private") == 0) {
        if (library == NULL) {
            snprintf(err, sizeof err, "the private engine needs the interpreter library path");
            rc = -1;
        } else {
            p->library = strdup(library);
        }
    } else if (strcmp(engine, "subinterp") == 0) {
        rc = as_subinterp_engine(&p->engine, err, sizeof err);
    } else if (strcmp(engine, "main") == 0) {
        as_main_engine(&p->engine);
    } else {
        snprintf(err, sizeof err, "unknown engine %.40s: expected private, subinterp or main", engine);
        rc = -1;
    }
    if (rc != 0) {
        Py_DECREF(seq);
        Py_DECREF(p);
        return as_engine_error(tp, "%s", err);
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    p->path = calloc((size_t)n + 1, sizeof(char *));
    for (Py_ssize_t i = 0; i < n && p->path != NULL; i++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (s == NULL) {
            Py_DECREF(seq);
            Py_DECREF(p);
            return NULL;
        }
        p->path[i] = strdup(s);
    }
    Py_DECREF(seq);
    p->executable = strdup(executable);
    p->bootstrap = strdup(bootstrap);
    p->init = (as_init){AS_ABI_VERSION, p->executable, (const char *const *)p->path, (size_t)n, p->bootstrap,
                        &as_pool_host, p->engine_name};
    p->str_shape = PyUnicode_InternFromString("shape");
    p->str_data = PyUnicode_InternFromString("data");
    if (p->str_shape == NULL || p->str_data == NULL) {
        Py_DECREF(p);
        return NULL;
    }
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0 || p->path == NULL) {
        Py_DECREF(p);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->exit_cv, NULL);
    return (PyObject *)p;
}

static void pool_dealloc(pool_t *p)
{
    /* Only reached for pools that never started a worker: workers hold a reference. */
    PyTypeObject *tp = Py_TYPE(p);
    if (p->efd >= 0)
        close(p->efd);
    if (p->path != NULL)
        for (char **s = p->path; *s != NULL; s++)
            free(*s);
    free(p->path);
    free(p->library);
    free(p->executable);
    free(p->bootstrap);
    Py_XDECREF(p->str_shape);
    Py_XDECREF(p->str_data);
    tp->tp_free(p);
    Py_DECREF(tp);
}

static PyObject *pool_add_interpreter(pool_t *p, PyObject *token)
{
    int index = as_pool_add_worker(p, token);
    return index < 0 ? NULL : PyLong_FromLong(index);
}

static PyObject *pool_register(pool_t *p, PyObject *args)
{
    const char *key;
    PyObject *inputs;
    if (!PyArg_ParseTuple(args, "sO:register", &key, &inputs))
        return NULL;
    PyObject *seq = PySequence_Fast(inputs, "Pool.register: inputs must be a sequence of (name, datatype)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    hmodel *m = calloc(1, sizeof *m);
    if (m == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    m->refs = 1;
    m->key = strdup(key);
    m->names = calloc((size_t)n + 1, sizeof(char *));
    m->datatypes = calloc((size_t)n + 1, sizeof(char *));
    if (m->key == NULL || m->names == NULL || m->datatypes == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name, *datatype;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ss;Pool.register: an input is (name, datatype)",
                              &name, &datatype))
            goto error;
        m->n_inputs = (size_t)i + 1;
        m->names[i] = strdup(name);
        m->datatypes[i] = strdup(datatype);
        if (m->names[i] == NULL || m->datatypes[i] == NULL) {
            PyErr_NoMemory();
            goto error;
        }
    }
    Py_DECREF(seq);
    PyObject *capsule = PyCapsule_New(m, MODEL_CAPSULE, model_capsule_free);
    if (capsule == NULL)
        as_pool_model_decref(m);
    return capsule;
error:
    Py_DECREF(seq);
    as_pool_model_decref(m);
    return NULL;
}

/* Fill j->in and j->inputs from input tensors (objects with .shape and .data) given
 * in the model's registered order. */
static int fill_inputs(pool_t *p, hjob *j, PyObject *inputs)
{
    hmodel *m = j->model;
    PyObject *seq = PySequence_Fast(inputs, "Pool.infer: inputs must be a sequence of tensors");
    if (seq == NULL)
        return -1;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
    if (n != m->n_inputs) {
        PyErr_Format(PyExc_ValueError, "Pool.infer: model %s takes %zu inputs, got %zu", m->key, m->n_inputs, n);
        Py_DECREF(seq);
        return -1;
    }
    j->in = calloc(n ? n : 1, sizeof(as_tensor));
    j->inputs = calloc(1, sizeof(hinputs) + n * sizeof(Py_buffer));
    if (j->in == NULL || j->inputs == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    j->inputs->pool = p;
    j->inputs->refs = 1; /* the host's */
    for (size_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i);
        as_tensor *t = &j->in[i];
        t->name = m->names[i];
        t->datatype = m->datatypes[i];
        PyObject *shape = PyObject_GetAttr(item, p->str_shape);
        if (shape == NULL || !PyTuple_Check(shape)) {
            if (shape != NULL)
                PyErr_Format(PyExc_TypeError, "Pool.infer: input %s: shape must be a tuple", t->name);
            Py_XDECREF(shape);
            goto error;
        }
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        if (nd > AS_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "Pool.infer: input %s has %zd dimensions; at most %d", t->name, nd,
                         AS_MAX_DIMS);
            Py_DECREF(shape);
            goto error;
        }
        t->ndim = (int)nd;
        for (Py_ssize_t d = 0; d < nd; d++) {
            t->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
            if (t->shape[d] == -1 && PyErr_Occurred()) {
                Py_DECREF(shape);
                goto error;
            }
        }
        Py_DECREF(shape);
        PyObject *data = PyObject_GetAttr(item, p->str_data);
        if (data == NULL)
            goto error;
        /* read-only: models get read-only views, so a read-only exporter (bytes) is asked
         * for nothing more */
        int rc = PyObject_GetBuffer(data, &j->inputs->views[i], PyBUF_C_CONTIGUOUS);
        Py_DECREF(data);
        if (rc < 0)
            goto error;
        j->inputs->n = i + 1;
        t->data = j->inputs->views[i].buf;
        t->nbytes = (size_t)j->inputs->views[i].len;
        t->readonly = 1;
    }
    Py_DECREF(seq);
    j->job.inputs = j->in;
    j->job.n_inputs = n;
    j->job.inputs_ctx = j->inputs;
    return 0;
error:
    Py_DECREF(seq);
    return -1;
}

static hmodel *model_of(PyObject *capsule)
{
    return PyCapsule_GetPointer(capsule, MODEL_CAPSULE);
}

static PyObject *pool_submit(pool_t *p, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"token", "kind", "model", "text", "target", NULL};
    PyObject *token;
    int kind, target = -1;
    const char *model = NULL, *text = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|zzi:submit", kwlist, &token, &kind, &model, &text, &target))
        return NULL;
    if (kind != AS_JOB_LOAD && kind != AS_JOB_UNLOAD && kind != AS_JOB_EXEC) {
        PyErr_Format(PyExc_ValueError, "Pool.submit: job kind %d: expected JOB_LOAD, JOB_UNLOAD or JOB_EXEC "
                                       "(infer jobs go through Pool.infer)", kind);
        return NULL;
    }
    if (target >= p->n_workers || (target >= 0 && p->workers[target]->dead))
        return as_engine_error(Py_TYPE(p), "Pool.submit: no live interpreter %d", target);
    if (target >= 0 && p->workers[target]->lost)
        return as_engine_error(Py_TYPE(p),
                               "Pool.submit: interpreter %d is lost (stuck in a job it was asked to give up) and "
                               "takes no jobs until that job returns", target);
    hjob *j = as_pool_job_new(p, token, kind);
    if (j == NULL)
        return NULL;
    j->mask = ~0ULL;
    if ((model != NULL && (j->key = strdup(model)) == NULL) || (text != NULL && (j->text = strdup(text)) == NULL)) {
        as_pool_job_free(j);
        return PyErr_NoMemory();
    }
    j->job.model = j->key;
    j->job.text = j->text;
    as_pool_enqueue(p, j, target);
    Py_RETURN_NONE;
}

static PyObject *pool_infer(pool_t *p, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "token", "inputs", "mask", "staged", "trace", "context", NULL};
    PyObject *capsule, *token, *inputs;
    unsigned long long mask = ~0ULL;
    int staged = 0, trace = 0;
    const char *context = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|Kppz:infer", kwlist, &capsule, &token, &inputs, &mask, &staged,
                                     &trace, &context))
        return NULL;
    hmodel *m = model_of(capsule);
    if (m == NULL)
        return NULL;
    hjob *j = as_pool_job_new(p, token, AS_JOB_INFER);
    if (j == NULL)
        return NULL;
    j->model = m;
    m->refs++;
    j->mask = mask;
    j->job.model = m->key;
    j->job.trace = trace;
    /* the context model code runs in (W3C headers: a traced job's run span, or an untraced
     * job's caller), read by trace_begin */
    if (context != NULL) {
        if ((j->text = strdup(context)) == NULL) {
            as_pool_job_free(j);
            return PyErr_NoMemory();
        }
        j->job.text = j->text;
    }
    if (fill_inputs(p, j, inputs) < 0) {
        as_pool_job_free(j);
        return NULL;
    }
    j->id = __atomic_add_fetch(&p->next_id, 1, __ATOMIC_RELAXED); /* fronts number theirs too */
    PyObject *id = PyLong_FromUnsignedLongLong(j->id);
    if (id == NULL) {
        as_pool_job_free(j);
        return NULL;
    }
    if (staged)
        as_pool_stage(p, j);
    as_pool_enqueue(p, j, -1);
    return id;
}

static PyObject *pool_offer(pool_t *p, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"job", "token", "inputs", "last_stage", NULL};
    unsigned long long id;
    PyObject *token, *inputs;
    int last_stage;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KOOi:offer", kwlist, &id, &token, &inputs, &last_stage))
        return NULL;
    hmodel *m = as_pool_staged_model(p, id);
    if (m == NULL)
        Py_RETURN_FALSE;
    hjob *o = as_pool_job_new(p, token, AS_JOB_INFER);
    if (o == NULL)
        return NULL;
    o->is_offer = 1;
    o->last_stage = last_stage;
    o->model = m;
    m->refs++;
    if (fill_inputs(p, o, inputs) < 0) {
        as_pool_job_free(o);
        return NULL;
    }
    int posted = as_pool_offer(p, id, o);
    if (!posted)
        as_pool_job_free(o);
    return PyBool_FromLong(posted);
}

static PyObject *pool_progress(pool_t *p, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int stage;
    double elapsed;
    if (!as_pool_progress(p, id, &stage, &elapsed))
        Py_RETURN_NONE;
    return Py_BuildValue("(id)", stage, elapsed);
}

static PyObject *make_outputs(pool_t *p, hjob *j)
{
    module_state *st = as_state_of_type(Py_TYPE(p));
    if (st == NULL)
        return NULL;
    struct as_result *r = calloc(1, sizeof *r);
    if (r == NULL)
        return PyErr_NoMemory(); /* as_pool_job_free gives the owner back */
    r->pool = (pool_t *)Py_NewRef(p);
    r->worker = p->workers[j->worker];
    r->owner = j->job.owner;
    r->refs = 1; /* held while building; dropped below */
    j->job.owner = NULL;
    PyObject *list = as_output_list(st->buffer_type, &j->job, as_pool_result_decref, r, &r->refs);
    as_pool_result_decref(r);
    return list;
}

/* (token, ok, payload) for one finished job, or NULL with an exception set. */
static PyObject *completion(pool_t *p, hjob *j)
{
    if (j->is_offer)
        return Py_BuildValue("(OOO)", j->token, Py_True, j->joined ? Py_True : Py_False);
    if (j->host_kind == AS_JOB_START) {
        if (j->job.failed)
            return Py_BuildValue("(OO(ss))", j->token, Py_False, "EngineError", j->start_error);
        return Py_BuildValue("(OOO)", j->token, Py_True, Py_None);
    }
    if (j->job.failed)
        return Py_BuildValue("(OO(ss))", j->token, Py_False, j->job.error_type ? j->job.error_type : "Error",
                             j->job.error ? j->job.error : "");
    PyObject *payload;
    if (j->job.kind == AS_JOB_INFER && j->job.join != NULL) {
        PyObject *outputs = make_outputs(p, j);
        PyObject *seconds = outputs != NULL ? PyTuple_New(j->job.n_stages) : NULL;
        for (int i = 0; seconds != NULL && i < j->job.n_stages; i++) {
            PyObject *s = PyFloat_FromDouble(j->job.stage_seconds[i]);
            if (s == NULL)
                Py_CLEAR(seconds);
            else
                PyTuple_SET_ITEM(seconds, i, s);
        }
        payload = seconds != NULL ? Py_BuildValue("(NN)", outputs, seconds) : NULL;
        if (seconds == NULL)
            Py_XDECREF(outputs);
    } else if (j->job.kind == AS_JOB_INFER)
        payload = make_outputs(p, j);
    else if (j->job.result != NULL)
        payload = PyUnicode_FromString(j->job.result);
    else
        payload = Py_NewRef(Py_None);
    if (payload == NULL)
        return NULL;
    if (j->job.kind == AS_JOB_INFER && j->job.trace) /* traced: where and when it ran, the model's spans */
        return Py_BuildValue("(OO(NiLLz))", j->token, Py_True, payload, j->worker, (long long)j->ran_from,
                             (long long)j->ran_to, j->job.result);
    return Py_BuildValue("(OON)", j->token, Py_True, payload);
}

/* A completion that could not be built: the job fails with the reason instead. If
 * even that cannot be built (no memory), the bare token stands for the job and the
 * host fails it with a fixed message. */
static PyObject *failed_completion(hjob *j)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
    PyErr_Clear();
    PyObject *item = Py_BuildValue("(OO(sO))", j->token, Py_False, "EngineError",
                                   text != NULL ? text : Py_None);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (item == NULL) {
        PyErr_Clear();
        item = Py_NewRef(j->token);
    }
    return item;
}

static PyObject *pool_drain(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    hjob *ordered;
    Py_ssize_t n;
    if (as_pool_take_done(p, &ordered, &n) < 0)
        return NULL;
    /* Every finished job is answered: a completion that cannot be built fails its
     * own job and no other, and the list is allocated before anything is freed. */
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        as_pool_put_back(p, ordered); /* for the next drain rather than lose them */
        return NULL;
    }
    Py_ssize_t i = 0;
    for (hjob *j = ordered; j != NULL; i++) {
        hjob *next = j->next;
        PyObject *item = completion(p, j);
        if (item == NULL)
            item = failed_completion(j);
        PyList_SET_ITEM(out, i, item);
        as_pool_job_free(j);
        j = next;
    }
    return out;
}

/* drain() if a job finished, else None: cheap enough to call on every turn of the loop. */
static PyObject *pool_poll(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    if (__atomic_load_n(&p->done, __ATOMIC_ACQUIRE) == NULL)
        Py_RETURN_NONE;
    return pool_drain(p, NULL);
}

static PyObject *pool_set_spin(pool_t *p, PyObject *args)
{
    long long us;
    int spinners;
    if (!PyArg_ParseTuple(args, "Li:set_spin", &us, &spinners))
        return NULL;
    as_pool_set_spin(p, us, spinners);
    Py_RETURN_NONE;
}

static PyObject *pool_set_spin_paused(pool_t *p, PyObject *arg)
{
    int paused = PyObject_IsTrue(arg);
    if (paused < 0)
        return NULL;
    as_pool_set_spin_paused(p, paused);
    Py_RETURN_NONE;
}

static PyObject *pool_name_threads(pool_t *p, PyObject *arg)
{
    Py_ssize_t n;
    const char *prefix = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &n) : NULL;
    if (prefix == NULL || n < 1 || (size_t)n >= sizeof p->thread_name) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "Pool.name_threads: expected a str of 1 to %d bytes",
                         (int)sizeof p->thread_name - 1);
        return NULL;
    }
    as_pool_name_threads(p, prefix);
    Py_RETURN_NONE;
}

static PyObject *pool_fileno(pool_t *p, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLong(p->efd); }

static PyObject *pool_set_active(pool_t *p, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    as_pool_set_active(p, n);
    Py_RETURN_NONE;
}

static PyObject *pool_thread_ids(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(p->n_workers);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < p->n_workers; i++) {
        PyObject *tid = PyLong_FromLong(__atomic_load_n(&p->workers[i]->tid, __ATOMIC_ACQUIRE));
        if (tid == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, tid);
    }
    return out;
}

static PyObject *pool_stats(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    pool_stats_t st;
    as_pool_stats(p, &st);
    return Py_BuildValue("{sisisisisnsisisisdsKsKsKsKsKsd}", "interpreters", p->n_workers, "ready", st.ready, "active",
                         st.active, "busy", st.busy, "queued", (Py_ssize_t)st.queued, "lost", st.lost, "spinning",
                         st.spinning, "waiting", st.waiting, "spin_s", (double)st.spin_ns / 1e9, "polled",
                         (unsigned long long)st.polled,
                         "woke_napping", (unsigned long long)st.woke_napping, "woke_blocked",
                         (unsigned long long)st.woke_blocked, "coalesced", (unsigned long long)st.coalesced, "answered",
                         (unsigned long long)st.answered, "flight_s", st.flight_s);
}

/* End the interpreters that can end (subinterpreters) once their queues are empty.
 * Called at host exit: a host that finalizes with live subinterpreters aborts. */
static PyObject *pool_shutdown(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS
    as_pool_shutdown(p);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *pool_cancel(pool_t *p, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    const char *state = as_pool_cancel(p, id);
    if (state == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(state);
}

/* Shutting down: every queued job fails, every running one is cancelled. */
static PyObject *pool_cancel_all(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    unsigned long long ids[MAX_WORKERS];
    int n_ids = as_pool_cancel_all(p, ids);
    PyObject *out = PyList_New(n_ids);
    for (int i = 0; out != NULL && i < n_ids; i++) {
        PyObject *id = PyLong_FromUnsignedLongLong(ids[i]);
        if (id == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, id);
    }
    return out;
}

static PyObject *pool_lose(pool_t *p, PyObject *args)
{
    unsigned long long id;
    PyObject *on_return;
    if (!PyArg_ParseTuple(args, "KO:lose", &id, &on_return))
        return NULL;
    running_t lost;
    int rc = as_pool_lose(p, id, on_return, &lost);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(isd)", lost.index, lost.key, lost.seconds);
}

static PyObject *pool_jobs(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    running_t running[MAX_WORKERS];
    int n = as_pool_jobs(p, running);
    PyObject *out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        PyObject *item = Py_BuildValue("(iKsdO)", running[i].index, running[i].id, running[i].key, running[i].seconds,
                                       running[i].lost ? Py_True : Py_False);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *pool_get_engine(pool_t *p, void *Py_UNUSED(closure)) { return PyUnicode_FromString(p->engine_name); }

static PyObject *pool_get_address(pool_t *p, void *Py_UNUSED(closure)) { return PyLong_FromVoidPtr(p); }

static PyMethodDef pool_methods[] = {
    {"add_interpreter", (PyCFunction)pool_add_interpreter, METH_O,
     "add_interpreter(token) -> index: start one more interpreter; drain reports (token, ok, error) when it is "
     "ready or failed"},
    {"register", (PyCFunction)pool_register, METH_VARARGS,
     "register(key, inputs) -> model: intern a loaded model's key and its inputs' (name, datatype) in the "
     "order infer takes them"},
    {"submit", (PyCFunction)(void (*)(void))pool_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(token, kind, model=None, text=None, target=-1): queue a load, unload or exec job for interpreter "
     "target (or the first idle one)"},
    {"infer", (PyCFunction)(void (*)(void))pool_infer, METH_VARARGS | METH_KEYWORDS,
     "infer(model, token, inputs, mask=all, staged=False, trace=False, context=None) -> job id: queue a batch (tensors "
     "with .shape and .data, in the registered order) for the first idle interpreter whose bit is set in mask; a "
     "staged job gets an id for offer/progress and completes with (outputs, stage_seconds); a traced job completes "
     "with (payload, interpreter, ran_from_ns, ran_to_ns, model_spans_json | None)"},
    {"offer", (PyCFunction)(void (*)(void))pool_offer, METH_VARARGS | METH_KEYWORDS,
     "offer(job, token, inputs, last_stage) -> bool: offer a group of requests to staged job `job`; it "
     "joins at the first stage boundary <= last_stage, else it is rejected. drain reports (token, True, joined): "
     "joined True (absorbed: the job's outputs cover it, after the job's own samples and earlier groups) or "
     "False. Returns False: the job is gone or already past last_stage"},
    {"progress", (PyCFunction)pool_progress, METH_O,
     "progress(job) -> (stages_done, seconds_running or -1 if queued) | None once it completed"},
    {"drain", (PyCFunction)pool_drain, METH_NOARGS,
     "drain() -> [(token, ok, payload) | token]: finished jobs, each exactly once (a bare token: a job whose "
     "completion could not be built)"},
    {"poll", (PyCFunction)pool_poll, METH_NOARGS, "poll() -> drain() if a job finished since the last drain, else None"},
    {"set_spin", (PyCFunction)pool_set_spin, METH_VARARGS,
     "set_spin(us, spinners): an idle worker polls for its next job for `us` microseconds before it blocks; "
     "at most `spinners` poll at once (0: never)"},
    {"name_threads", (PyCFunction)pool_name_threads, METH_O,
     "name_threads(prefix): the interpreters' threads are named prefix + their index, now and from their start"},
    {"set_spin_paused", (PyCFunction)pool_set_spin_paused, METH_O,
     "set_spin_paused(paused): no worker polls while paused; what set_spin set and the pace learned are kept"},
    {"fileno", (PyCFunction)pool_fileno, METH_NOARGS, "fileno() -> the eventfd that signals completions"},
    {"set_active", (PyCFunction)pool_set_active, METH_O,
     "set_active(n): only the first n interpreters take shared jobs"},
    {"shutdown", (PyCFunction)pool_shutdown, METH_NOARGS,
     "shutdown(): end subinterpreters once their queues are empty (at host exit)"},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, "stats() -> dict of interpreter and queue counts"},
    {"thread_ids", (PyCFunction)pool_thread_ids, METH_NOARGS,
     "thread_ids() -> [int]: each interpreter's thread id (gettid; 0 before its thread runs), by index"},
    {"cancel", (PyCFunction)pool_cancel, METH_O,
     "cancel(job) -> 'queued' | 'running' | None: a queued job completes at once, failed (Cancelled); a running "
     "one gets Cancelled raised in its interpreter at the next bytecode boundary (from a thread of its own); "
     "None: the job already completed"},
    {"cancel_all", (PyCFunction)pool_cancel_all, METH_NOARGS,
     "cancel_all() -> [job]: every queued job completes at once, failed (Cancelled); every running one is "
     "cancelled as cancel does; returns the ids of those running"},
    {"lose", (PyCFunction)pool_lose, METH_VARARGS,
     "lose(job, on_return) -> (interpreter, model key, seconds running) | None: give up on running job `job`: "
     "its interpreter is marked lost and takes no jobs, the job's token completes now (failed, "
     "InterpreterLost), and if the job ever returns, on_return(ok, payload) is called instead and the "
     "interpreter takes jobs again. None: the job is not running (any more)"},
    {"jobs", (PyCFunction)pool_jobs, METH_NOARGS,
     "jobs() -> [(interpreter, job, model key, seconds running, lost)]: the jobs running now"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
    {"engine", (getter)pool_get_engine, NULL, "engine name", NULL},
    {"address", (getter)pool_get_address, NULL,
     "the pool's address, for a front's Link.infer (valid while this object lives)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot pool_slots[] = {
    {Py_tp_new, pool_new},
    {Py_tp_dealloc, pool_dealloc},
    {Py_tp_methods, pool_methods},
    {Py_tp_getset, pool_getset},
    {Py_tp_doc, "Pool(engine, *, executable, path, bootstrap, library=None): native interpreter pool"},
    {0, NULL},
};

PyType_Spec as_pool_spec = {
    .name = "aserve._native.Pool",
    .basicsize = sizeof(pool_t),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = pool_slots,
};
