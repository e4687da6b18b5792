/* The pool: native worker threads, one interpreter each, fed from the host.
 *
 * The host thread (holding the host GIL) submits jobs; a worker thread never
 * touches the host GIL. Shared jobs wait in one pool queue and go to the first
 * idle worker (idle-first dispatch); targeted jobs (load, exec) wait in a
 * worker's own queue. Finished jobs go on one completion list and the eventfd is
 * written only when that list goes from empty to non-empty, so one wake-up of the
 * event loop drains many completions.
 *
 * Staged jobs (layer-level joining): the host may offer a group of requests to a
 * staged batch that is queued or running. The offer waits on the job; after each
 * stage but the last the worker polls it (join_poll, under the pool lock only) and
 * absorbs it if that boundary is no later than the offer's last_stage, else rejects
 * it. Every offer completes, absorbed or rejected, before its batch's own
 * completion, in one drain, so the host knows which requests the outputs cover.
 *
 * Workers live as long as the process: an interpreter holding torch cannot be torn
 * down and recreated in the same namespace, so a pool that is closed keeps its
 * interpreters parked and a later pool of the same engine reuses them.
 */
#include "common.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define AS_JOB_START 100 /* host-only kind: a worker's interpreter is ready (or failed) */
#define MAX_WORKERS 64

struct pool;

typedef struct hjob {
    as_job job;
    struct hjob *next;
    PyObject *future;
    int host_kind;
    int worker;
    uint64_t mask; /* shared jobs: bit i set if interpreter i may run it */
    char *model, *text;
    as_tensor *in;
    Py_buffer *views;
    size_t n_views;
    char start_error[1024];
    /* staged jobs: their join point, progress and groups offered / absorbed */
    struct pool *pool;
    uint64_t id;
    as_join join;
    int stage;   /* stages done at the last join point */
    int running; /* a worker took it */
    struct timespec started;
    struct hjob *offers, *offers_tail;
    struct hjob *absorbed, *absorbed_tail;
    struct hjob *snext; /* the pool's list of staged jobs not yet complete */
    /* offers */
    int is_offer;
    int last_stage; /* the latest boundary at which the group may join */
    int joined;
} hjob;

typedef struct release {
    void *owner;
    struct release *next;
} release_t;

typedef struct worker {
    struct pool *pool;
    int index;
    pthread_t thread;
    pthread_cond_t cv;
    as_engine engine;
    as_interp *ip;
    hjob *head, *tail;   /* targeted jobs */
    release_t *releases; /* outputs the host gave back */
    int waiting;         /* blocked on cv with nothing to do */
    int active;          /* takes jobs from the pool queue */
    int ready, dead;
    int busy;            /* running a job */
    int stop, exited;
    hjob *start_job;
} worker_t;

typedef struct pool {
    PyObject_HEAD
    char engine_name[16];
    as_engine engine; /* template: private workers open their own namespace */
    char *library;
    as_init init;
    char **path;
    char *executable, *bootstrap;
    pthread_mutex_t mu;
    pthread_cond_t exit_cv;
    hjob *head, *tail; /* shared queue */
    size_t queued;
    hjob *done;        /* completions, newest first */
    hjob *staged;      /* staged jobs not yet complete */
    uint64_t next_id;
    int efd;
    int n_workers;
    worker_t *workers[MAX_WORKERS];
} pool_t;

struct as_result {
    pool_t *pool;
    worker_t *worker;
    void *owner;
    Py_ssize_t refs;
};

static const as_host host_alloc = {malloc, free};

/* ---- helpers on the host side (host GIL held) ---- */

static void job_free(hjob *j)
{
    for (size_t i = 0; i < j->n_views; i++) {
        if (j->views[i].obj != NULL)
            PyBuffer_Release(&j->views[i]);
        free(j->in[i].name);
        free(j->in[i].datatype);
    }
    free(j->views);
    free(j->in);
    free(j->model);
    free(j->text);
    free(j->job.error_type);
    free(j->job.error);
    free(j->job.result);
    for (size_t i = 0; i < j->job.n_outputs; i++) {
        free(j->job.outputs[i].name);
        free(j->job.outputs[i].datatype);
    }
    free(j->job.outputs);
    Py_XDECREF(j->future);
    free(j);
}

static char *dup_or_null(const char *s) { return s != NULL ? strdup(s) : NULL; }

/* ---- worker thread (no host GIL) ---- */

/* Caller holds p->mu. */
static void post_done(pool_t *p, hjob *j)
{
    int was_empty = p->done == NULL;
    j->next = p->done;
    p->done = j;
    if (was_empty) {
        uint64_t one = 1;
        ssize_t rc;
        do
            rc = write(p->efd, &one, sizeof one);
        while (rc < 0 && errno == EINTR);
    }
}

static void append(hjob **head, hjob **tail, hjob *j)
{
    j->next = NULL;
    if (*tail != NULL)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static hjob *pop(hjob **head, hjob **tail)
{
    hjob *j = *head;
    if (j != NULL) {
        *head = j->next;
        if (*head == NULL)
            *tail = NULL;
        j->next = NULL;
    }
    return j;
}

/* First shared job interpreter `index` may run (models can be loaded on a subset). */
static hjob *pop_shared(pool_t *p, int index)
{
    hjob *prev = NULL;
    for (hjob *j = p->head; j != NULL; prev = j, j = j->next) {
        if (!(j->mask >> index & 1))
            continue;
        if (prev != NULL)
            prev->next = j->next;
        else
            p->head = j->next;
        if (p->tail == j)
            p->tail = prev;
        j->next = NULL;
        p->queued--;
        return j;
    }
    return NULL;
}

/* as_join.poll: called by the interpreter side of a running staged job after
 * `done` stages; hands over the first offered group that may still join. */
static const as_tensor *join_poll(void *ctx, int done, size_t *n_inputs)
{
    hjob *j = ctx;
    pool_t *p = j->pool;
    const as_tensor *in = NULL;
    pthread_mutex_lock(&p->mu);
    j->stage = done;
    hjob *o;
    while (in == NULL && (o = pop(&j->offers, &j->offers_tail)) != NULL) {
        if (done <= o->last_stage) {
            o->joined = 1;
            append(&j->absorbed, &j->absorbed_tail, o);
            *n_inputs = o->job.n_inputs;
            in = o->in;
        } else {
            post_done(p, o); /* too late for this group: the host queues it again */
        }
    }
    pthread_mutex_unlock(&p->mu);
    return in;
}

/* Caller holds p->mu: a staged job finished; complete its offers, then itself. */
static void finish_staged(pool_t *p, hjob *j)
{
    for (hjob **pp = &p->staged; *pp != NULL; pp = &(*pp)->snext) {
        if (*pp == j) {
            *pp = j->snext;
            break;
        }
    }
    hjob *o;
    while ((o = pop(&j->offers, &j->offers_tail)) != NULL)
        post_done(p, o);
    while ((o = pop(&j->absorbed, &j->absorbed_tail)) != NULL)
        post_done(p, o);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    pool_t *p = w->pool;
    hjob *sj = w->start_job;
    int rc = 0;
    if (p->library != NULL)
        rc = as_private_open(p->library, &w->engine, sj->start_error, sizeof sj->start_error);
    if (rc == 0 && w->engine.thread_init != NULL)
        w->engine.thread_init();
    if (rc == 0)
        rc = w->engine.create(&p->init, &w->ip, sj->start_error, sizeof sj->start_error);

    pthread_mutex_lock(&p->mu);
    sj->job.failed = rc != 0;
    w->start_job = NULL;
    w->ready = rc == 0;
    w->dead = rc != 0;
    post_done(p, sj);
    if (rc != 0) {
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    for (;;) {
        if (w->releases != NULL) {
            release_t *r = w->releases;
            w->releases = NULL;
            pthread_mutex_unlock(&p->mu);
            while (r != NULL) {
                release_t *next = r->next;
                w->engine.release(w->ip, r->owner);
                free(r);
                r = next;
            }
            pthread_mutex_lock(&p->mu);
            continue;
        }
        hjob *j = pop(&w->head, &w->tail);
        if (j == NULL && w->active)
            j = pop_shared(p, w->index);
        if (j != NULL) {
            w->busy = 1;
            j->running = 1;
            j->worker = w->index;
            if (j->job.join != NULL)
                clock_gettime(CLOCK_MONOTONIC, &j->started);
            pthread_mutex_unlock(&p->mu);
            w->engine.run(w->ip, &j->job);
            pthread_mutex_lock(&p->mu);
            w->busy = 0;
            if (j->job.join != NULL)
                finish_staged(p, j);
            post_done(p, j);
            continue;
        }
        if (w->stop)
            break;
        w->waiting = 1;
        pthread_cond_wait(&w->cv, &p->mu);
        w->waiting = 0;
    }
    w->ready = 0;
    pthread_mutex_unlock(&p->mu);
    if (w->engine.destroy != NULL)
        w->engine.destroy(w->ip);
    pthread_mutex_lock(&p->mu);
    w->exited = 1;
    pthread_cond_broadcast(&p->exit_cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Caller holds p->mu: wake one idle worker that may take a job with this mask. */
static void wake_idle(pool_t *p, uint64_t mask)
{
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (w->waiting && w->active && w->ready && (mask >> i & 1)) {
            w->waiting = 0;
            pthread_cond_signal(&w->cv);
            return;
        }
    }
}

/* ---- results handed to the host ---- */

void as_result_decref(struct as_result *r)
{
    if (--r->refs > 0)
        return;
    release_t *rel = malloc(sizeof *rel);
    pool_t *p = r->pool;
    if (rel != NULL) {
        rel->owner = r->owner;
        pthread_mutex_lock(&p->mu);
        rel->next = r->worker->releases;
        r->worker->releases = rel;
        r->worker->waiting = 0;
        pthread_cond_signal(&r->worker->cv);
        pthread_mutex_unlock(&p->mu);
    }
    /* else: the owner leaks; better than freeing it from the wrong thread */
    Py_DECREF(p);
    free(r);
}

/* ---- Python type ---- */

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
    char err[512] = "";
    int rc = 0;
    if (strcmp(engine, "private") == 0) {
        if (library == NULL) {
            err[0] = 0;
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
                        &host_alloc};
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
    tp->tp_free(p);
    Py_DECREF(tp);
}

static PyObject *pool_add_interpreter(pool_t *p, PyObject *future)
{
    if (p->n_workers >= MAX_WORKERS)
        return as_engine_error(Py_TYPE(p), "Pool.add_interpreter: at most %d interpreters per pool", MAX_WORKERS);
    if (p->library != NULL && as_private_namespaces_in_use() >= AS_MAX_NAMESPACES)
        return as_engine_error(Py_TYPE(p),
                               "Pool.add_interpreter: glibc allows at most %d private interpreters per process "
                               "(%d in use); use fewer interpreters or engine='subinterp'",
                               AS_MAX_NAMESPACES, as_private_namespaces_in_use());
    worker_t *w = calloc(1, sizeof *w);
    hjob *sj = calloc(1, sizeof *sj);
    if (w == NULL || sj == NULL) {
        free(w);
        free(sj);
        return PyErr_NoMemory();
    }
    sj->host_kind = AS_JOB_START;
    sj->future = Py_NewRef(future);
    w->pool = p;
    w->index = p->n_workers;
    w->engine = p->engine;
    w->active = 1;
    w->start_job = sj;
    pthread_cond_init(&w->cv, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16 * 1024 * 1024); /* model code recurses like the main thread */
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&p->mu);
    p->workers[p->n_workers++] = w;
    pthread_mutex_unlock(&p->mu);
    Py_INCREF(p); /* the worker's reference: the pool outlives its threads */
    int rc = pthread_create(&w->thread, &attr, worker_main, w);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_lock(&p->mu);
        w->dead = 1;
        snprintf(sj->start_error, sizeof sj->start_error, "pthread_create: %s", strerror(rc));
        sj->job.failed = 1;
        post_done(p, sj);
        pthread_mutex_unlock(&p->mu);
    }
    return PyLong_FromLong(w->index);
}

static int fill_input(as_tensor *t, Py_buffer *v, PyObject *item)
{
    const char *name, *datatype;
    PyObject *shape, *data;
    if (!PyArg_ParseTuple(item, "ssOO;Pool.submit: inputs are (name, datatype, shape, buffer) tuples", &name,
                          &datatype, &shape, &data))
        return -1;
    PyObject *dims = PySequence_Fast(shape, "Pool.submit: shape must be a sequence of int");
    if (dims == NULL)
        return -1;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(dims);
    if (nd > AS_MAX_DIMS) {
        Py_DECREF(dims);
        PyErr_Format(PyExc_ValueError, "Pool.submit: input %s has %zd dimensions; at most %d", name, nd,
                     AS_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    for (Py_ssize_t d = 0; d < nd; d++) {
        t->shape[d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, d));
        if (t->shape[d] == -1 && PyErr_Occurred()) {
            Py_DECREF(dims);
            return -1;
        }
    }
    Py_DECREF(dims);
    if (PyObject_GetBuffer(data, v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        if (PyObject_GetBuffer(data, v, PyBUF_C_CONTIGUOUS) < 0)
            return -1;
    }
    t->data = v->buf;
    t->nbytes = (size_t)v->len;
    t->readonly = v->readonly;
    t->name = strdup(name);
    t->datatype = strdup(datatype);
    if (t->name == NULL || t->datatype == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int fill_inputs(hjob *j, PyObject *inputs)
{
    PyObject *seq = PySequence_Fast(inputs, "Pool.submit: inputs must be a sequence");
    if (seq == NULL)
        return -1;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
    j->in = calloc(n ? n : 1, sizeof(as_tensor));
    j->views = calloc(n ? n : 1, sizeof(Py_buffer));
    if (j->in == NULL || j->views == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        j->n_views = i + 1;
        if (fill_input(&j->in[i], &j->views[i], PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i)) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    j->job.inputs = j->in;
    j->job.n_inputs = n;
    return 0;
}

static PyObject *pool_submit(pool_t *p, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"future", "kind", "model", "text", "inputs", "target", "mask", "staged", NULL};
    PyObject *future, *inputs = Py_None;
    int kind, target = -1, staged = 0;
    unsigned long long mask = ~0ULL;
    const char *model = NULL, *text = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|zzOiKp:submit", kwlist, &future, &kind, &model, &text, &inputs,
                                     &target, &mask, &staged))
        return NULL;
    if (staged && (kind != AS_JOB_INFER || target >= 0)) {
        PyErr_SetString(PyExc_ValueError, "Pool.submit: only shared INFER jobs can be staged");
        return NULL;
    }
    if (kind < AS_JOB_LOAD || kind > AS_JOB_EXEC) {
        PyErr_Format(PyExc_ValueError, "Pool.submit: unknown job kind %d", kind);
        return NULL;
    }
    if (target >= p->n_workers || (target >= 0 && p->workers[target]->dead))
        return as_engine_error(Py_TYPE(p), "Pool.submit: no live interpreter %d", target);
    hjob *j = calloc(1, sizeof *j);
    if (j == NULL)
        return PyErr_NoMemory();
    j->pool = p;
    j->job.kind = kind;
    j->mask = mask;
    j->future = Py_NewRef(future);
    j->model = dup_or_null(model);
    j->text = dup_or_null(text);
    j->job.model = j->model;
    j->job.text = j->text;
    if (inputs != Py_None && fill_inputs(j, inputs) < 0)
        goto error;
    PyObject *id = Py_NewRef(Py_None);
    pthread_mutex_lock(&p->mu);
    if (staged) {
        j->id = ++p->next_id;
        j->join = (as_join){j, join_poll};
        j->job.join = &j->join;
        j->snext = p->staged;
        p->staged = j;
        Py_SETREF(id, PyLong_FromUnsignedLongLong(j->id));
    }
    if (target >= 0) {
        worker_t *w = p->workers[target];
        if (w->tail != NULL)
            w->tail->next = j;
        else
            w->head = j;
        w->tail = j;
        w->waiting = 0;
        pthread_cond_signal(&w->cv);
    } else {
        if (p->tail != NULL)
            p->tail->next = j;
        else
            p->head = j;
        p->tail = j;
        p->queued++;
        wake_idle(p, j->mask);
    }
    pthread_mutex_unlock(&p->mu);
    return id; /* NULL only if the id could not be made: the job runs all the same */
error:
    job_free(j);
    return NULL;
}

/* Caller holds p->mu. */
static hjob *find_staged(pool_t *p, uint64_t id)
{
    for (hjob *j = p->staged; j != NULL; j = j->snext)
        if (j->id == id)
            return j;
    return NULL;
}

static PyObject *pool_offer(pool_t *p, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"job", "future", "inputs", "last_stage", NULL};
    unsigned long long id;
    PyObject *future, *inputs;
    int last_stage;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KOOi:offer", kwlist, &id, &future, &inputs, &last_stage))
        return NULL;
    hjob *o = calloc(1, sizeof *o);
    if (o == NULL)
        return PyErr_NoMemory();
    o->pool = p;
    o->is_offer = 1;
    o->job.kind = AS_JOB_INFER;
    o->last_stage = last_stage;
    o->future = Py_NewRef(future);
    if (fill_inputs(o, inputs) < 0) {
        job_free(o);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    hjob *j = find_staged(p, id);
    int posted = j != NULL && j->stage < last_stage;
    if (posted)
        append(&j->offers, &j->offers_tail, o);
    pthread_mutex_unlock(&p->mu);
    if (!posted)
        job_free(o);
    return PyBool_FromLong(posted);
}

static PyObject *pool_progress(pool_t *p, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int stage = 0, running = 0;
    struct timespec started = {0, 0}, now;
    pthread_mutex_lock(&p->mu);
    hjob *j = find_staged(p, id);
    if (j != NULL) {
        stage = j->stage;
        running = j->running;
        started = j->started;
    }
    pthread_mutex_unlock(&p->mu);
    if (j == NULL)
        Py_RETURN_NONE;
    double elapsed = -1.0;
    if (running) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        elapsed = (double)(now.tv_sec - started.tv_sec) + 1e-9 * (double)(now.tv_nsec - started.tv_nsec);
    }
    return Py_BuildValue("(id)", stage, elapsed);
}

static PyObject *make_outputs(pool_t *p, hjob *j)
{
    module_state *st = as_state_of_type(Py_TYPE(p));
    size_t n = j->job.n_outputs;
    PyObject *list = PyList_New((Py_ssize_t)n);
    struct as_result *r = calloc(1, sizeof *r);
    if (list == NULL || r == NULL) {
        Py_XDECREF(list);
        free(r);
        return PyErr_NoMemory();
    }
    r->pool = (pool_t *)Py_NewRef(p);
    r->worker = p->workers[j->worker];
    r->owner = j->job.owner;
    r->refs = 1; /* held while building; dropped below */
    j->job.owner = NULL;
    for (size_t i = 0; i < n; i++) {
        as_tensor *t = &j->job.outputs[i];
        PyObject *shape = PyTuple_New(t->ndim);
        if (shape == NULL)
            goto error;
        for (int d = 0; d < t->ndim; d++)
            PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t->shape[d]));
        r->refs++;
        PyObject *buf = as_buffer_new(st->buffer_type, r, NULL, t->data, t->nbytes, t->readonly);
        if (buf == NULL) {
            r->refs--;
            Py_DECREF(shape);
            goto error;
        }
        PyObject *item = Py_BuildValue("(ssNN)", t->name, t->datatype, shape, buf);
        if (item == NULL)
            goto error;
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    as_result_decref(r);
    return list;
error:
    Py_DECREF(list);
    as_result_decref(r);
    return NULL;
}

static PyObject *completion(pool_t *p, hjob *j)
{
    if (j->is_offer)
        return Py_BuildValue("(OOO)", j->future, Py_True, j->joined ? Py_True : Py_False);
    if (j->host_kind == AS_JOB_START) {
        if (j->job.failed)
            return Py_BuildValue("(OO(ss))", j->future, Py_False, "EngineError", j->start_error);
        return Py_BuildValue("(OOO)", j->future, Py_True, Py_None);
    }
    if (j->job.failed) {
        if (j->job.owner != NULL) /* cannot happen: the runtime frees it on failure */
            j->job.owner = NULL;
        return Py_BuildValue("(OO(ss))", j->future, Py_False, j->job.error_type ? j->job.error_type : "Error",
                             j->job.error ? j->job.error : "");
    }
    PyObject *payload;
    if (j->job.kind == AS_JOB_INFER && j->job.join != NULL) {
        PyObject *outputs = make_outputs(p, j);
        PyObject *seconds = outputs != NULL ? PyTuple_New(j->job.n_stages) : NULL;
        for (int i = 0; seconds != NULL && i < j->job.n_stages; i++)
            PyTuple_SET_ITEM(seconds, i, PyFloat_FromDouble(j->job.stage_seconds[i]));
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
    return Py_BuildValue("(OON)", j->future, Py_True, payload);
}

static PyObject *pool_drain(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    uint64_t count;
    if (read(p->efd, &count, sizeof count) < 0 && errno != EAGAIN)
        return PyErr_SetFromErrno(PyExc_OSError);
    pthread_mutex_lock(&p->mu);
    hjob *j = p->done;
    p->done = NULL;
    pthread_mutex_unlock(&p->mu);
    /* the list is newest first: reverse it so completions come in order */
    hjob *ordered = NULL;
    while (j != NULL) {
        hjob *next = j->next;
        j->next = ordered;
        ordered = j;
        j = next;
    }
    PyObject *out = PyList_New(0);
    int failed = out == NULL;
    for (j = ordered; j != NULL;) {
        hjob *next = j->next;
        if (!failed) {
            PyObject *item = completion(p, j);
            if (item == NULL || PyList_Append(out, item) < 0)
                failed = 1;
            Py_XDECREF(item);
        }
        job_free(j);
        j = next;
    }
    if (failed) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *pool_fileno(pool_t *p, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLong(p->efd); }

static PyObject *pool_set_active(pool_t *p, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++)
        p->workers[i]->active = i < n;
    for (hjob *j = p->head; j != NULL; j = j->next)
        wake_idle(p, j->mask);
    pthread_mutex_unlock(&p->mu);
    Py_RETURN_NONE;
}

static PyObject *pool_stats(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    int ready = 0, busy = 0, active = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        ready += w->ready;
        busy += w->busy;
        active += w->active && w->ready;
    }
    size_t queued = p->queued;
    pthread_mutex_unlock(&p->mu);
    return Py_BuildValue("{sisisisisn}", "interpreters", p->n_workers, "ready", ready, "active", active, "busy",
                         busy, "queued", (Py_ssize_t)queued);
}

/* End the interpreters that can end (subinterpreters) once their queues are empty.
 * Called at host exit: a host that finalizes with live subinterpreters aborts. */
static PyObject *pool_shutdown(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (w->engine.destroy == NULL || w->dead)
            continue;
        w->active = 0;
        w->stop = 1;
        pthread_cond_signal(&w->cv);
    }
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        while (w->stop && !w->exited)
            pthread_cond_wait(&p->exit_cv, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *pool_get_engine(pool_t *p, void *Py_UNUSED(closure)) { return PyUnicode_FromString(p->engine_name); }

static PyMethodDef pool_methods[] = {
    {"add_interpreter", (PyCFunction)pool_add_interpreter, METH_O,
     "add_interpreter(future) -> index: start one more interpreter; future resolves when it is ready"},
    {"submit", (PyCFunction)(void (*)(void))pool_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(future, kind, model=None, text=None, inputs=None, target=-1, mask=all, staged=False) -> "
     "job id | None: queue a job for interpreter target, or for the first idle interpreter whose bit is "
     "set in mask; a staged INFER job gets an id for offer/progress and completes with "
     "(outputs, stage_seconds)"},
    {"offer", (PyCFunction)(void (*)(void))pool_offer, METH_VARARGS | METH_KEYWORDS,
     "offer(job, future, inputs, last_stage) -> bool: offer a group of requests to staged job `job`; it "
     "joins at the first stage boundary <= last_stage, else it is rejected. future resolves True "
     "(absorbed: the job's outputs cover it, after the job's own samples and earlier groups) or False. "
     "False: the job is gone or already past last_stage"},
    {"progress", (PyCFunction)pool_progress, METH_O,
     "progress(job) -> (stages_done, seconds_running or -1 if queued) | None once it completed"},
    {"drain", (PyCFunction)pool_drain, METH_NOARGS, "drain() -> [(future, ok, payload)]: finished jobs"},
    {"fileno", (PyCFunction)pool_fileno, METH_NOARGS, "fileno() -> the eventfd that signals completions"},
    {"set_active", (PyCFunction)pool_set_active, METH_O,
     "set_active(n): only the first n interpreters take shared jobs"},
    {"shutdown", (PyCFunction)pool_shutdown, METH_NOARGS,
     "shutdown(): end subinterpreters once their queues are empty (at host exit)"},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, "stats() -> dict of interpreter and queue counts"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
    {"engine", (getter)pool_get_engine, NULL, "engine name", NULL},
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
