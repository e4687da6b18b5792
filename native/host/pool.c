/* The pool: native worker threads, one interpreter each, fed from the host.
 *
 * Shared jobs wait in one pool queue and go to the first idle worker (idle-first
 * dispatch); targeted jobs (load, exec) wait in a worker's own queue. Finished jobs
 * go on one completion list and the eventfd is written only when nothing was
 * pending, so one wake-up of the event loop drains many completions.
 *
 * Polling. A thread that blocks on a futex or in epoll on an idle virtual CPU takes
 * tens of microseconds to wake, more than a small model runs. So a worker that runs
 * out of jobs first polls for the next one for spin_ns (set_spin; at most max_spinners
 * workers at once) and only then blocks: a job queued meanwhile goes straight to the
 * polling worker (idle_worker prefers it and sets its `kick` instead of signalling).
 * The host's loop, likewise, may poll the completion list (poll()) while a batch runs
 * instead of waiting for the eventfd. Polling ends after spin_ns at most, so an idle
 * pool uses no CPU; stats() reports the time spent in it (spin_s). A polling worker
 * yields its CPU every few dozen polls: a thread woken there (the client of a request
 * just answered, the loop) would otherwise wait out the scheduler's slice, which at one
 * connection put a ~90 us step into the latency for seconds at a time.
 *
 * Locks, outermost first. Never take one while holding a later one.
 *   0. engines.c's subinterpreter lifecycle mutex: a worker creating or ending a PEP
 *      684 subinterpreter, before it takes any GIL (one at a time in the process).
 *   1. A GIL: the host's (any Python-facing method here, and drain) or an
 *      interpreter's (a worker running a job or giving back an owner). A worker of
 *      the `main` engine and subinterpreter creation (engines.c) take the host GIL
 *      on a worker thread; private and PEP 684 workers never touch the host GIL.
 *   2. p->mu, the pool mutex: queues, worker flags, the completion and release
 *      lists, staged-job progress, and the reference counts of input buffers
 *      (hinputs.refs). It is always the innermost lock: no Python runs under it.
 *
 * Who owns what:
 *   - hjob: the host until it is queued, then the queue, then the worker running
 *     it, then the completion list, then the host again (drain frees it).
 *   - hmodel (a model's interned key, input names and datatypes): reference
 *     counted under the host GIL; held by its registration object and by every job
 *     of the model, so the strings a worker reads outlive the job.
 *   - hinputs (the Py_buffers of a job's inputs): two references under p->mu, the
 *     host's (dropped when drain frees the job) and the interpreter's (taken when a
 *     worker starts the job or absorbs the group, given back by the interpreter when
 *     no view of the inputs is left there). The last one releases the buffers: the
 *     host directly, or, if the interpreter's was last, drain after the worker put
 *     it on the release list, since only the host GIL may release host buffers.
 *   - outputs: the interpreter's owner object until every OutputBuffer over it is
 *     gone (as_result, refs under the host GIL); then the owner goes back to its
 *     worker's release list and that worker frees it under its own GIL.
 *
 * Staged jobs (layer-level joining) and the groups offered to them: pool_join.c.
 *
 * Workers live as long as the process: an interpreter holding torch cannot be torn
 * down and recreated in the same namespace, so a pool that is closed keeps its
 * interpreters parked and a later pool of the same engine reuses them. Worker
 * threads block every asynchronous signal: signals belong to the host's loop. They
 * run as SCHED_BATCH, so that waking one never preempts the loop's thread.
 *
 * Faults (cancelling jobs, giving up on stuck interpreters): pool_cancel.c. A fatal
 * signal in a worker is reported by fault.c before the process ends.
 */
#include "pool.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define MODEL_CAPSULE "aserve.model"

/* First shared job interpreter `index` may run (models can be loaded on a subset). */
static hjob *pop_shared(pool_t *p, int index)
{
    hjob *prev = NULL;
    for (hjob *j = p->head; j != NULL; prev = j, j = j->next) {
        if (!(j->mask >> index & 1))
            continue;
        unlink_shared(p, prev, j);
        p->queued--;
        return j;
    }
    return NULL;
}

/* Hand an interpreter's output owner back to its worker, which frees it under its GIL. */
static void give_back_owner(pool_t *p, worker_t *w, void *owner)
{
    release_t *rel = malloc(sizeof *rel);
    if (rel == NULL)
        return; /* the owner leaks; better than freeing it from the wrong thread */
    rel->owner = owner;
    pthread_mutex_lock(&p->mu);
    rel->next = w->releases;
    w->releases = rel;
    w->waiting = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_cond_signal(&w->cv);
}

/* ---- input buffers ---- */

static void inputs_free(hinputs *in)
{
    for (size_t i = 0; i < in->n; i++)
        if (in->views[i].obj != NULL)
            PyBuffer_Release(&in->views[i]);
    free(in);
}

/* as_host.inputs_released: an interpreter holds no view of these inputs any more. */
static void inputs_released(void *ctx)
{
    hinputs *in = ctx;
    pool_t *p = in->pool;
    int wake = 0;
    pthread_mutex_lock(&p->mu);
    if (--in->refs == 0) { /* the host is done too: drain releases them under its GIL */
        in->next = p->released;
        p->released = in;
        wake = must_wake_loop(p);
    }
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
}

/* Host GIL held: drop the host's reference. */
static void inputs_drop_host(hinputs *in)
{
    pool_t *p = in->pool;
    pthread_mutex_lock(&p->mu);
    int last = --in->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        inputs_free(in);
}

/* ---- models ---- */

static void model_decref(hmodel *m)
{
    if (m == NULL || --m->refs > 0)
        return;
    for (size_t i = 0; i < m->n_inputs; i++) {
        free(m->names[i]);
        free(m->datatypes[i]);
    }
    free(m->names);
    free(m->datatypes);
    free(m->key);
    free(m);
}

static void model_capsule_free(PyObject *capsule)
{
    model_decref(PyCapsule_GetPointer(capsule, MODEL_CAPSULE));
}

/* ---- jobs (host GIL held) ---- */

void as_pool_job_free(hjob *j)
{
    if (j->inputs != NULL)
        inputs_drop_host(j->inputs);
    if (j->job.owner != NULL && j->worker >= 0 && j->pool != NULL)
        give_back_owner(j->pool, j->pool->workers[j->worker], j->job.owner);
    free(j->in);
    model_decref(j->model);
    free(j->key);
    free(j->text);
    free(j->start_error);
    free(j->job.error_type);
    free(j->job.error);
    free(j->job.result);
    for (size_t i = 0; i < j->job.n_outputs; i++) {
        free(j->job.outputs[i].name);
        free(j->job.outputs[i].datatype);
    }
    free(j->job.outputs);
    Py_XDECREF(j->token);
    free(j);
}

hjob *as_pool_job_new(pool_t *p, PyObject *token, int kind)
{
    hjob *j = calloc(1, sizeof *j);
    if (j == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    j->pool = p;
    j->worker = -1;
    j->job.kind = kind;
    j->token = Py_NewRef(token);
    return j;
}

/* ---- worker thread (no host GIL, unless the engine is `main`) ---- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    pool_t *p = w->pool;
    hjob *sj = w->start_job;
    const size_t errlen = 1024;
    int rc = 0;
    /* SCHED_BATCH: a worker woken by the loop's submit never preempts the loop (the
     * kernel skips wake-up preemption for batch threads), so the submit returns at once
     * instead of, now and then, after the woken worker's whole batch when both CPUs
     * are busy. Threads the model starts inherit it. Best effort: where the policy is
     * refused the worker runs as before. */
    struct sched_param batch = {.sched_priority = 0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
    if (p->library != NULL)
        rc = as_private_open(p->library, &w->engine, sj->start_error, errlen);
    if (rc == 0 && w->engine.thread_init != NULL)
        w->engine.thread_init();
    w->fault_slot = rc == 0 ? as_fault_register(w->index, w->engine.name) : -1;
    if (rc == 0)
        rc = w->engine.create(&p->init, &w->ip, sj->start_error, errlen);
    if (rc == 0)
        as_fault_bind(w->fault_slot, w->ip);

    pthread_mutex_lock(&p->mu);
    sj->job.failed = rc != 0;
    w->start_job = NULL;
    w->ready = rc == 0;
    w->dead = rc != 0;
    int wake = post_done(p, sj);
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
    if (rc != 0) {
        as_fault_unregister(w->fault_slot);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
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
        hjob *j = job_pop(&w->head, &w->tail);
        if (j == NULL && w->active)
            j = pop_shared(p, w->index);
        if (j != NULL) {
            w->busy = 1;
            w->spun = 0;
            w->current = j;
            w->since = monotonic_ns();
            j->running = 1;
            j->worker = w->index;
            if (j->inputs != NULL)
                j->inputs->refs++; /* the interpreter's, given back with inputs_released */
            if (j->job.join != NULL)
                clock_gettime(CLOCK_MONOTONIC, &j->started);
            pthread_mutex_unlock(&p->mu);
            if (j->job.trace)
                j->ran_from = monotonic_ns();
            as_fault_job(w->fault_slot, j->job.model, j->job.kind);
            w->engine.run(w->ip, &j->job);
            as_fault_job(w->fault_slot, NULL, 0);
            if (j->job.trace)
                j->ran_to = monotonic_ns();
            pthread_mutex_lock(&p->mu);
            w->busy = 0;
            w->current = NULL;
            w->lost = 0; /* back from a job it was given up in: it takes jobs again */
            wake = j->job.join != NULL ? as_pool_finish_staged(p, j) : 0;
            wake |= post_done(p, j);
            if (wake) {
                pthread_mutex_unlock(&p->mu);
                wake_loop(p);
                pthread_mutex_lock(&p->mu);
            }
            continue;
        }
        if (w->stop)
            break;
        if (p->spin_ns > 0 && !w->spun && p->spinners < p->max_spinners) {
            /* poll for the next job a while before blocking: a wake-up from the condition
             * variable costs tens of microseconds on a virtual CPU that went idle */
            w->spinning = w->spun = 1;
            p->spinners++;
            __atomic_store_n(&w->kick, 0, __ATOMIC_RELAXED);
            w->spin_from = monotonic_ns();
            int64_t until = w->spin_from + p->spin_ns;
            pthread_mutex_unlock(&p->mu);
            for (unsigned n = 1; !__atomic_load_n(&w->kick, __ATOMIC_ACQUIRE); n++) {
                cpu_relax();
                if ((n & 31) == 0) {
                    if (monotonic_ns() >= until)
                        break;
                    /* a thread woken on this CPU (the client, the loop) runs now rather
                     * than after the scheduler's slice: polling must not delay them */
                    sched_yield();
                }
            }
            pthread_mutex_lock(&p->mu);
            if (w->spinning) { /* not kicked: it ran out of time */
                w->spin_total += monotonic_ns() - w->spin_from;
                w->spinning = 0;
                p->spinners--;
            }
            continue;
        }
        w->waiting = 1;
        pthread_cond_wait(&w->cv, &p->mu);
        w->waiting = 0;
    }
    w->ready = 0;
    pthread_mutex_unlock(&p->mu);
    if (w->engine.destroy != NULL)
        w->engine.destroy(w->ip);
    as_fault_unregister(w->fault_slot);
    pthread_mutex_lock(&p->mu);
    w->exited = 1;
    pthread_cond_broadcast(&p->exit_cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Caller holds p->mu: end w's spin, if it polls for a job. */
static void kick(pool_t *p, worker_t *w)
{
    if (w->spinning) {
        w->spinning = 0;
        p->spinners--;
        w->spin_total += monotonic_ns() - w->spin_from;
        __atomic_store_n(&w->kick, 1, __ATOMIC_RELEASE);
    }
}

/* Caller holds p->mu: the idle worker that may take a job with this mask, marked as
 * no longer waiting (signal its cv after unlocking), or NULL. A worker polling for a
 * job is preferred and kicked instead: it needs no signal (NULL too). */
static worker_t *idle_worker(pool_t *p, uint64_t mask)
{
    worker_t *sleeper = NULL;
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (!w->active || !w->ready || w->lost || !(mask >> i & 1))
            continue;
        if (w->spinning) {
            kick(p, w);
            return NULL;
        }
        if (w->waiting && sleeper == NULL)
            sleeper = w;
    }
    if (sleeper != NULL)
        sleeper->waiting = 0;
    return sleeper;
}

/* Host GIL held, p->mu not: queue a job (targeted at a worker, or shared) and wake the
 * worker that will take it. */
static void enqueue(pool_t *p, hjob *j, int target)
{
    worker_t *w;
    if (j->id == 0) /* host GIL: next_id is the host's */
        j->id = ++p->next_id;
    j->job.id = j->id;
    pthread_mutex_lock(&p->mu);
    if (target >= 0) {
        w = p->workers[target];
        job_append(&w->head, &w->tail, j);
        w->waiting = 0;
        kick(p, w);
    } else {
        job_append(&p->head, &p->tail, j);
        p->queued++;
        w = idle_worker(p, j->mask);
    }
    pthread_mutex_unlock(&p->mu);
    if (w != NULL)
        pthread_cond_signal(&w->cv);
}

/* ---- results handed to the host ---- */

/* as_buffer_free_fn of output buffers, and the builder's own reference. */
static void result_decref(void *ctx)
{
    struct as_result *r = ctx;
    if (--r->refs > 0)
        return;
    pool_t *p = r->pool;
    give_back_owner(p, r->worker, r->owner);
    Py_DECREF(p);
    free(r);
}

/* ---- Python type ---- */

static const as_host host_calls = {malloc, free, inputs_released};

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
                        &host_calls, p->engine_name};
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

/* Start a worker thread with every asynchronous signal blocked (the host's loop
 * handles SIGINT, SIGTERM, SIGHUP ...); faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGABRT, SIGTRAP, SIGSYS) stay deliverable so that they are reported where they
 * happen. */
int as_pool_spawn(pthread_t *thread, size_t stack, void *(*fn)(void *), void *arg)
{
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};
    sigset_t blocked, old;
    sigfillset(&blocked);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        sigdelset(&blocked, faults[i]);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_BLOCK, &blocked, &old);
    int rc = pthread_create(thread, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

static int start_thread(worker_t *w)
{
    return as_pool_spawn(&w->thread, 16 * 1024 * 1024, worker_main, w); /* model code recurses like the main thread */
}

static PyObject *pool_add_interpreter(pool_t *p, PyObject *token)
{
    if (p->n_workers >= MAX_WORKERS)
        return as_engine_error(Py_TYPE(p), "Pool.add_interpreter: at most %d interpreters per pool", MAX_WORKERS);
    if (p->library != NULL && as_private_namespaces_in_use() >= AS_MAX_NAMESPACES)
        return as_engine_error(Py_TYPE(p),
                               "Pool.add_interpreter: glibc allows at most %d private interpreters per process "
                               "(%d in use); use fewer interpreters or engine='subinterp'",
                               AS_MAX_NAMESPACES, as_private_namespaces_in_use());
    worker_t *w = calloc(1, sizeof *w);
    hjob *sj = as_pool_job_new(p, token, 0);
    char *start_error = calloc(1, 1024);
    if (w == NULL || sj == NULL || start_error == NULL) {
        free(w);
        free(start_error);
        if (sj != NULL)
            as_pool_job_free(sj);
        return PyErr_NoMemory();
    }
    sj->host_kind = AS_JOB_START;
    sj->start_error = start_error;
    as_fault_install();
    w->pool = p;
    w->fault_slot = -1;
    w->index = p->n_workers;
    w->engine = p->engine;
    w->active = 1;
    w->start_job = sj;
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_lock(&p->mu);
    p->workers[p->n_workers++] = w;
    pthread_mutex_unlock(&p->mu);
    Py_INCREF(p); /* the worker's reference: the pool outlives its threads */
    int rc = start_thread(w);
    if (rc != 0) {
        pthread_mutex_lock(&p->mu);
        w->dead = 1;
        snprintf(sj->start_error, 1024, "pthread_create: %s", strerror(rc));
        sj->job.failed = 1;
        int wake = post_done(p, sj);
        pthread_mutex_unlock(&p->mu);
        if (wake)
            wake_loop(p);
    }
    return PyLong_FromLong(w->index);
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
        model_decref(m);
    return capsule;
error:
    Py_DECREF(seq);
    model_decref(m);
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
    enqueue(p, j, target);
    Py_RETURN_NONE;
}

static PyObject *pool_infer(pool_t *p, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "token", "inputs", "mask", "staged", "trace", NULL};
    PyObject *capsule, *token, *inputs;
    unsigned long long mask = ~0ULL;
    int staged = 0, trace = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|Kpp:infer", kwlist, &capsule, &token, &inputs, &mask, &staged,
                                     &trace))
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
    if (fill_inputs(p, j, inputs) < 0) {
        as_pool_job_free(j);
        return NULL;
    }
    j->id = p->next_id + 1; /* host GIL: next_id is the host's */
    PyObject *id = PyLong_FromUnsignedLongLong(j->id);
    if (id == NULL) {
        as_pool_job_free(j);
        return NULL;
    }
    p->next_id = j->id;
    if (staged)
        as_pool_stage(p, j);
    enqueue(p, j, -1);
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
    size_t n = j->job.n_outputs;
    PyObject *list = PyList_New((Py_ssize_t)n);
    struct as_result *r = list != NULL ? calloc(1, sizeof *r) : NULL;
    if (r == NULL) {
        Py_XDECREF(list);
        return PyErr_NoMemory(); /* job_free gives the owner back */
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
        PyObject *buf = as_buffer_new(st->buffer_type, result_decref, r, NULL, t->data, t->nbytes, t->readonly);
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
    result_decref(r);
    return list;
error:
    Py_DECREF(list);
    result_decref(r);
    return NULL;
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
    uint64_t count;
    if (read(p->efd, &count, sizeof count) < 0 && errno != EAGAIN && errno != EINTR)
        return PyErr_SetFromErrno(PyExc_OSError);
    pthread_mutex_lock(&p->mu);
    hjob *j = p->done;
    hinputs *released = p->released;
    __atomic_store_n(&p->done, NULL, __ATOMIC_RELAXED);
    p->released = NULL;
    p->signalled = 0;
    pthread_mutex_unlock(&p->mu);
    while (released != NULL) {
        hinputs *next = released->next;
        inputs_free(released);
        released = next;
    }
    /* the list is newest first: reverse it so completions come in order */
    hjob *ordered = NULL;
    Py_ssize_t n = 0;
    while (j != NULL) {
        hjob *next = j->next;
        j->next = ordered;
        ordered = j;
        j = next;
        n++;
    }
    /* Every finished job is answered: a completion that cannot be built fails its
     * own job and no other, and the list is allocated before anything is freed. */
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        /* put them back for the next drain rather than lose them */
        pthread_mutex_lock(&p->mu);
        while (ordered != NULL) {
            hjob *next = ordered->next;
            ordered->next = p->done;
            __atomic_store_n(&p->done, ordered, __ATOMIC_RELEASE);
            ordered = next;
        }
        int wake = must_wake_loop(p);
        pthread_mutex_unlock(&p->mu);
        if (wake)
            wake_loop(p);
        return NULL;
    }
    Py_ssize_t i = 0;
    for (j = ordered; j != NULL; i++) {
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
    pthread_mutex_lock(&p->mu);
    p->spin_ns = us > 0 ? us * 1000 : 0;
    p->max_spinners = spinners > 0 ? spinners : 0;
    if (p->spin_ns == 0 || p->max_spinners == 0)
        for (int i = 0; i < p->n_workers; i++)
            kick(p, p->workers[i]); /* a pool put away stops polling at once */
    pthread_mutex_unlock(&p->mu);
    Py_RETURN_NONE;
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
    for (hjob *j = p->head; j != NULL; j = j->next) {
        worker_t *w = idle_worker(p, j->mask);
        if (w != NULL)
            pthread_cond_signal(&w->cv); /* rare: under the lock is simpler */
    }
    pthread_mutex_unlock(&p->mu);
    Py_RETURN_NONE;
}

static PyObject *pool_stats(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    int ready = 0, busy = 0, active = 0, lost = 0;
    int64_t spin = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        ready += w->ready;
        busy += w->busy && !w->lost;
        active += w->active && w->ready && !w->lost;
        lost += w->lost;
        spin += w->spin_total;
    }
    size_t queued = p->queued;
    int spinning = p->spinners;
    pthread_mutex_unlock(&p->mu);
    return Py_BuildValue("{sisisisisnsisisd}", "interpreters", p->n_workers, "ready", ready, "active", active, "busy",
                         busy, "queued", (Py_ssize_t)queued, "lost", lost, "spinning", spinning, "spin_s",
                         (double)spin / 1e9);
}

/* End the interpreters that can end (subinterpreters) once their queues are empty.
 * Called at host exit: a host that finalizes with live subinterpreters aborts. */
static PyObject *pool_shutdown(pool_t *p, PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (w->engine.destroy == NULL || w->dead || w->lost) /* a lost one may never return: not waited for */
            continue;
        w->active = 0;
        w->stop = 1;
        kick(p, w);
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
     "infer(model, token, inputs, mask=all, staged=False, trace=False) -> job id: queue a batch (tensors "
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
    {"fileno", (PyCFunction)pool_fileno, METH_NOARGS, "fileno() -> the eventfd that signals completions"},
    {"set_active", (PyCFunction)pool_set_active, METH_O,
     "set_active(n): only the first n interpreters take shared jobs"},
    {"shutdown", (PyCFunction)pool_shutdown, METH_NOARGS,
     "shutdown(): end subinterpreters once their queues are empty (at host exit)"},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, "stats() -> dict of interpreter and queue counts"},
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
