/* The pool: native worker threads, one interpreter each, fed from the host.
 *
 * Shared jobs wait in one pool queue and go to the first idle worker (idle-first
 * dispatch); targeted jobs (load, exec) wait in a worker's own queue. Finished jobs
 * go on one completion list and the eventfd is written only when nothing was
 * pending, so one wake-up of the event loop drains many completions.
 *
 * Polling. A thread that blocks on a futex or in epoll on an idle virtual CPU takes
 * tens of microseconds to wake, more than a small model runs. So a worker that runs
 * out of jobs polls for the next one a while (set_spin; at most max_spinners workers
 * at once) before it blocks: a job queued meanwhile goes straight to the polling
 * worker (idle_worker prefers it and sets its `kick` instead of signalling). Polling
 * pays only when the job comes while it polls, so each worker remembers how long its
 * last idle gaps lasted (from running out of jobs to the next job being queued) and
 * polls over the window they predict (poll_window): it sleeps until just before the
 * earliest, then polls until about the latest, at most spin_ns after it went idle and at most
 * half the typical gap. A client in a closed loop then finds a worker polling without
 * one burnt for the whole gap; gaps longer than spin_ns block at once; arrivals at
 * random burn at most about half the idle time. The host's loop, likewise, may poll the
 * completion list (poll()) while a batch runs instead of waiting for the eventfd.
 * Polling ends after spin_ns at most, so an idle pool uses no CPU; stats() reports the
 * time spent in it (spin_s). A polling worker yields its CPU every few dozen polls: a
 * thread woken there (the client of a request just answered, the loop) would otherwise
 * wait out the scheduler's slice behind it.
 *
 * Locks, outermost first. Never take one while holding a later one.
 *   0. engines.c's subinterpreter lifecycle mutex: a worker creating or ending a PEP
 *      684 subinterpreter, before it takes any GIL (one at a time in the process).
 *   1. A GIL: the host's (any method of the Python type, pool_type.c, drain too) or an
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
 *     worker's release list and that worker frees it under its own GIL, when it next
 *     wakes: for its next job, or at most RELEASE_LINGER_NS after it went idle (an
 *     idle worker with owners out is not woken for each one that comes back).
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
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* First shared job interpreter `index` may run (models can be loaded on a subset) and
 * that may start now: a native request waits while the window rule says so, and
 * *wake_at is lowered to when the earliest such window closes (wake_at NULL: none waits,
 * the worker is stopping). */
static hjob *pop_shared(pool_t *p, int index, int64_t *wake_at)
{
    hjob *prev = NULL;
    int64_t now = 0;
    as_plan *waiting[16]; /* models whose adaptive policy said their queue waits: asked once per scan */
    int n_waiting = 0;
    for (hjob *j = p->head; j != NULL; prev = j, j = j->next) {
        if (!(j->mask >> index & 1))
            continue;
        if (j->native && wake_at != NULL && j->plan != NULL) {
            int asked = 0;
            for (int i = 0; i < n_waiting && !asked; i++)
                asked = waiting[i] == j->plan;
            if (asked)
                continue;
            if (!as_pool_plan_open(p, j, index, &now, wake_at)) {
                if (n_waiting < 16)
                    waiting[n_waiting++] = j->plan;
                continue;
            }
        } else if (j->native && wake_at != NULL && !as_pool_window_open(p, j, index, &now, wake_at))
            continue;
        unlink_shared(p, prev, j);
        dequeued(p, j);
        return j;
    }
    return NULL;
}

/* Hand an interpreter's output owner back to its worker, which frees it under its GIL: when it
 * next wakes, for its next job or at the end of its linger (worker_main), whichever is first.
 * A worker blocked with no owner counted out (one it handed out on a path that does not count)
 * is woken for it, as is one that must stop. */
void as_pool_give_back(pool_t *p, worker_t *w, void *owner)
{
    release_t *rel = malloc(sizeof *rel);
    if (rel == NULL)
        return; /* the owner leaks; better than freeing it from the wrong thread */
    rel->owner = owner;
    pthread_mutex_lock(&p->mu);
    rel->next = w->releases;
    w->releases = rel;
    if (w->owners_out > 0)
        w->owners_out--;
    int wake = !w->lingering || w->stop;
    if (wake)
        w->waiting = 0;
    pthread_mutex_unlock(&p->mu);
    if (wake)
        pthread_cond_signal(&w->cv);
}

/* The output owners a finished job and the jobs that ran in its batch hand the host: one
 * for a batch sliced among them (a shared owner), else one per job with outputs. Caller
 * holds p->mu. */
static int64_t owners_of(const hjob *j)
{
    int64_t n = 0;
    int shared = 0;
    for (const hjob *k = j; k != NULL; k = k == j ? j->parts : k->part_next) {
        if (k->job.owner == NULL)
            continue;
        if (k->shared)
            shared = 1;
        else
            n++;
    }
    return n + shared;
}

/* ---- input buffers ---- */

void as_pool_inputs_free(hinputs *in)
{
    for (size_t i = 0; i < in->n; i++)
        if (in->views[i].obj != NULL)
            PyBuffer_Release(&in->views[i]);
    free(in->own);
    free(in);
}

/* as_host.inputs_released: an interpreter holds no view of these inputs any more. */
static void inputs_released(void *ctx)
{
    hinputs *in = ctx;
    pool_t *p = in->pool;
    int wake = 0, own = 0;
    pthread_mutex_lock(&p->mu);
    if (--in->refs == 0) {
        if (in->own != NULL) /* a coalesced batch's block: no Python buffer, freed here */
            own = 1;
        else if (in->link != NULL) /* a front's: that front releases its buffers on its loop */
            as_link_post_inputs(in);
        else { /* the host is done too: drain releases them under its GIL */
            in->next = p->released;
            p->released = in;
            wake = must_wake_loop(p);
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (own)
        as_pool_inputs_free(in);
    if (wake)
        wake_loop(p);
}

hinputs *as_pool_inputs_drop(hinputs *in)
{
    pool_t *p = in->pool;
    pthread_mutex_lock(&p->mu);
    int last = --in->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last)
        return NULL;
    if (in->link != NULL)
        return in;
    as_pool_inputs_free(in); /* the host's: host GIL held */
    return NULL;
}

const as_host as_pool_host = {malloc, free, inputs_released};

/* ---- models ---- */

void as_pool_model_decref(hmodel *m)
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

/* ---- jobs (host GIL held) ---- */

void as_pool_job_free(hjob *j)
{
    if (j->inputs != NULL)
        as_pool_inputs_drop(j->inputs);
    if (j->job.owner != NULL && j->worker >= 0 && j->pool != NULL) {
        if (j->shared)
            as_pool_shared_release(j->pool, j->job.owner);
        else
            as_pool_give_back(j->pool, j->pool->workers[j->worker], j->job.owner);
    }
    if (j->held != NULL) /* a native request that was never queued */
        as_counter_drop(j->held);
    if (j->plan != NULL)
        as_plan_drop(j->plan);
    free(j->in);
    as_pool_model_decref(j->model);
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

/* A nap shorter than this is not worth a timer: poll instead. */
#define NAP_MIN_NS 20000
/* Longest an idle worker with outputs out sleeps before it frees those the host gave back
 * meanwhile (as_pool_give_back wakes none that lingers) */
#define RELEASE_LINGER_NS 20000000

/* Caller holds p->mu: the window, in ns after w went idle, over which w polls for its
 * next job: [*from, *to). 0 when polling would not pay (the next job is expected after
 * spin_ns). Until it has seen AS_GAPS gaps it polls from the start for spin_ns. */
static int poll_window(pool_t *p, worker_t *w, int64_t *from, int64_t *to)
{
    if (w->n_gaps < AS_GAPS) {
        *from = 0;
        *to = p->spin_ns;
        return 1;
    }
    int64_t s[AS_GAPS];
    memcpy(s, w->gaps, sizeof s);
    for (int i = 1; i < AS_GAPS; i++) /* insertion sort: eight numbers */
        for (int k = i; k > 0 && s[k - 1] > s[k]; k--) {
            int64_t t = s[k];
            s[k] = s[k - 1];
            s[k - 1] = t;
        }
    /* from the earliest gap to the second latest (one outlier does not widen it), polling
     * at most half the typical gap, and never past spin_ns */
    int64_t lo = s[0], hi = s[AS_GAPS - 2], cap = s[AS_GAPS / 2] / 2;
    if (lo >= p->spin_ns)
        return 0;
    *from = lo;
    *to = hi + (hi - lo) / 4 + 2000;
    if (*to - *from > cap)
        *to = *from + cap;
    if (*to > p->spin_ns)
        *to = p->spin_ns;
    return *to > *from;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    pool_t *p = w->pool;
    hjob *sj = w->start_job;
    const size_t errlen = 1024;
    int rc = 0;
    __atomic_store_n(&w->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
    /* SCHED_BATCH: a worker woken by the loop's submit never preempts the loop (the
     * kernel skips wake-up preemption for batch threads), so the submit never
     * waits out the woken worker's batch when every CPU is busy. Threads the model
     * starts inherit it. Best effort: where the policy is refused the worker stays
     * a normal thread. */
    struct sched_param batch = {.sched_priority = 0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
    /* its naps toward a polling window end within a microsecond of the time asked,
     * not the default 50 */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    /* "aserve-priv3": whose thread this is, in top -H, perf and /proc; threads the model
     * starts take the name too */
    char name[16];
    pthread_mutex_lock(&p->mu);
    snprintf(name, sizeof name, "%s%d", p->thread_name, w->index);
    (void)pthread_setname_np(pthread_self(), name);
    w->named = 1;
    pthread_mutex_unlock(&p->mu);
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
            w->between = 1;
            pthread_mutex_unlock(&p->mu);
            while (r != NULL) {
                release_t *next = r->next;
                w->engine.release(w->ip, r->owner);
                free(r);
                r = next;
            }
            pthread_mutex_lock(&p->mu);
            w->between = 0;
            continue;
        }
        hjob *j = job_pop(&w->head, &w->tail);
        int64_t window_at = INT64_MAX; /* the earliest window of a native request left waiting */
        if (j == NULL && w->active)
            j = pop_shared(p, w->index, w->stop ? NULL : &window_at);
        if (j != NULL) {
            if (w->idle_from != 0 && j->queued_ns != 0 && j->queued_ns >= w->idle_from)
                w->gaps[w->n_gaps++ % AS_GAPS] = j->queued_ns - w->idle_from;
            w->idle_from = 0;
            w->busy = 1;
            w->spun = 0;
            w->current = j;
            w->since = monotonic_ns();
            j->running = 1;
            j->worker = w->index;
            if (j->link != NULL && j->max_rows > 0)
                as_pool_coalesce(p, j, w->index); /* other fronts' jobs of its model join it */
            if (j->native) {
                as_pool_lead(j);
                if (j->plan != NULL && as_plan_join_active(j->plan))
                    as_pool_stage_led(p, j); /* its model's queued requests may join it */
            }
            else if (j->plan != NULL) { /* a batch the model's adaptive policy did not choose: it counts it all the same */
                as_pool_lead(j);
                as_plan_dispatched(j->plan, (double)w->since / 1e9, j->led_rows);
            }
            if (j->inputs != NULL && j->parts == NULL && !led_staged(j))
                j->inputs->refs++; /* the interpreter's, given back with inputs_released */
            if (j->job.join != NULL)
                clock_gettime(CLOCK_MONOTONIC, &j->started);
            pthread_mutex_unlock(&p->mu);
            if (j->job.trace || j->native)
                j->ran_from = monotonic_ns();
            as_fault_job(w->fault_slot, j->job.model, j->job.kind);
            if (j->parts != NULL || led_staged(j))
                as_pool_run_coalesced(p, w, j);
            else
                w->engine.run(w->ip, &j->job);
            as_fault_job(w->fault_slot, NULL, 0);
            if (j->job.trace || j->native) {
                j->ran_to = monotonic_ns();
                for (hjob *k = j->parts; k != NULL; k = k->part_next) {
                    k->ran_from = j->ran_from;
                    k->ran_to = j->ran_to;
                }
            }
            pthread_mutex_lock(&p->mu);
            w->busy = 0;
            w->current = NULL;
            w->lost = 0; /* back from a job it was given up in: it takes jobs again */
            w->owners_out += owners_of(j);
            if (j->plan != NULL && j->led_rows > 0) /* the batch the adaptive policy chose ended */
                as_plan_finish(j->plan, !j->job.failed && j->joined_count == 0, j->led_rows,
                               (double)(monotonic_ns() - w->since) / 1e9);
            wake = j->job.join != NULL ? as_pool_finish_staged(p, j) : 0;
            for (hjob *k = j->parts, *next; k != NULL; k = next) {
                next = k->part_next;
                wake |= post_done(p, k);
            }
            wake |= post_done(p, j);
            if (wake) {
                w->between = 1;
                pthread_mutex_unlock(&p->mu);
                wake_loop(p);
                pthread_mutex_lock(&p->mu);
                w->between = 0;
            }
            continue;
        }
        if (w->stop)
            break;
        int64_t now = monotonic_ns(), from, to;
        if (w->idle_from == 0)
            w->idle_from = now;
        if (window_at != INT64_MAX) {
            /* a native request's batch gathers until its window closes; an arrival (it may
             * fill the batch) wakes this worker sooner, as any queued job does, and a worker
             * whose batch of the model ends looks at the queue itself */
            struct timespec ts = {.tv_sec = window_at / 1000000000, .tv_nsec = window_at % 1000000000};
            w->waiting = w->gathering = 1;
            pthread_cond_timedwait(&w->cv, &p->mu, &ts);
            w->waiting = w->gathering = 0;
            continue;
        }
        if (p->spin_ns > 0 && !p->spin_paused && !w->spun && p->spinners < p->max_spinners &&
            poll_window(p, w, &from, &to) && w->idle_from + to > now) {
            int64_t at = w->idle_from + from - w->late_ns;
            if (at - now > NAP_MIN_NS) {
                /* sleep toward the window: a job queued meanwhile wakes it as usual */
                struct timespec ts = {.tv_sec = at / 1000000000, .tv_nsec = at % 1000000000};
                w->waiting = w->napping = 1;
                int rc = pthread_cond_timedwait(&w->cv, &p->mu, &ts);
                w->waiting = w->napping = 0;
                if (rc == ETIMEDOUT) /* how late timers end here: the next nap ends that much sooner */
                    w->late_ns += (monotonic_ns() - at - w->late_ns) / 4;
                continue;
            }
            /* poll for the next job until the window closes: a wake-up from the condition
             * variable costs tens of microseconds on a virtual CPU that went idle */
            w->spinning = w->spun = 1;
            p->spinners++;
            __atomic_store_n(&w->kick, 0, __ATOMIC_RELAXED);
            w->spin_from = now;
            int64_t until = w->idle_from + to;
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
        if (w->owners_out > 0) {
            /* outputs it made are still out: the host gives them back without waking it (a
             * wake-up on a virtual CPU costs about as much as a small model's batch); it
             * frees them when it wakes for its next job, or after RELEASE_LINGER_NS */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t at = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + RELEASE_LINGER_NS;
            ts.tv_sec = at / 1000000000;
            ts.tv_nsec = at % 1000000000;
            w->lingering = 1;
            pthread_cond_timedwait(&w->cv, &p->mu, &ts);
            w->lingering = 0;
        } else {
            pthread_cond_wait(&w->cv, &p->mu);
        }
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
 * job is preferred and kicked instead: it needs no signal (NULL too). Of the waiting
 * ones, one napping toward its polling window comes first: it expects the job. A worker
 * gathering a batch (waiting for a window to close) is left to its timer unless `gather`
 * says the job may end the wait. */
static worker_t *idle_worker(pool_t *p, uint64_t mask, int gather)
{
    worker_t *sleeper = NULL;
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (!w->active || !w->ready || w->lost || !(mask >> i & 1) || (w->gathering && !gather))
            continue;
        if (w->spinning) {
            kick(p, w);
            p->polled++;
            return NULL;
        }
        if (w->waiting && (sleeper == NULL || (w->napping && !sleeper->napping)))
            sleeper = w;
    }
    if (sleeper != NULL) {
        sleeper->waiting = 0;
        if (sleeper->napping)
            p->woke_napping++;
        else
            p->woke_blocked++;
    }
    return sleeper;
}

/* Caller holds p->mu; j was just queued (and counted: count_queued_rows): whether it may
 * end a window some worker waits out (a job that is no native request, or one that fills a
 * batch of its model, or comes while none of its model runs, or cannot wait out its own
 * window). Otherwise a worker gathering a batch is not woken for it: its timer ends the
 * wait, and the rule would only send it back to wait (every arrival would cost a wake-up). */
static int window_may_end(const hjob *j)
{
    if (!j->native || j->held == NULL || j->max_rows <= 0 || j->plan != NULL)
        return 1; /* the adaptive policy decides again at every arrival, as a batcher does */
    return *as_counter_queued(j->held) >= j->max_rows || *as_counter_running(j->held) <= 0 ||
           (j->deadline_ns != 0 && j->deadline_ns <= j->queued_ns + j->window_ns);
}

/* Caller holds p->mu: whether a worker that may run `mask`'s jobs is between jobs with the
 * lock released (freeing outputs given back, waking the loop), after which it looks at the
 * shared queue without being woken. */
static int worker_between_jobs(const pool_t *p, uint64_t mask)
{
    for (int i = 0; i < p->n_workers; i++) {
        const worker_t *w = p->workers[i];
        if (w->between && w->active && w->ready && !w->lost && (mask >> i & 1))
            return 1;
    }
    return 0;
}

/* Caller holds p->mu: put j on the shared queue; the idle worker to signal for it, or NULL.
 * A job at the head of the queue that an idle worker is woken (or a polling one kicked) for,
 * or that one between jobs finds next, is taken as soon as that worker runs: it stops
 * counting as waiting in its model's Counter now, so that another loop's admission does not
 * count it as queued meanwhile (only a front's jobs count so: the host's batcher counts its own). */
static worker_t *queue_shared(pool_t *p, hjob *j)
{
    if (j->flight_rows > 0)
        fly(p, j->flight_rows);
    j->queued_ns = monotonic_ns();
    job_append(&p->head, &p->tail, j);
    p->queued++;
    count_queued_rows(j, 1);
    uint64_t polled = p->polled;
    worker_t *w = idle_worker(p, j->mask, window_may_end(j));
    if (j->waiting != NULL && p->head == j &&
        (w != NULL || p->polled != polled || worker_between_jobs(p, j->mask)))
        unwait(j);
    return w;
}

void as_pool_number_job(pool_t *p, hjob *j)
{
    if (j->id == 0) /* fronts number their jobs too, without the host GIL */
        j->id = __atomic_add_fetch(&p->next_id, 1, __ATOMIC_RELAXED);
    j->job.id = j->id;
    if (j->job.kind == AS_JOB_INFER)
        j->flight_rows = j->job.n_inputs > 0 && j->in[0].ndim >= 1 && j->in[0].shape[0] > 0 ? j->in[0].shape[0] : 1;
}

/* Host GIL held, p->mu not: queue a job (targeted at a worker, or shared) and wake the
 * worker that will take it. */
void as_pool_enqueue(pool_t *p, hjob *j, int target)
{
    if (target < 0) {
        j->next = NULL;
        as_pool_enqueue_many(p, j);
        return;
    }
    as_pool_number_job(p, j);
    pthread_mutex_lock(&p->mu);
    if (j->flight_rows > 0)
        fly(p, j->flight_rows);
    worker_t *w = p->workers[target];
    job_append(&w->head, &w->tail, j);
    w->waiting = 0;
    kick(p, w);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_signal(&w->cv);
}

void as_pool_enqueue_many(pool_t *p, hjob *jobs)
{
    worker_t *wake[MAX_WORKERS];
    int n = 0;
    for (hjob *j = jobs; j != NULL; j = j->next)
        as_pool_number_job(p, j);
    as_plan *joins[4]; /* models whose policy joins, among the jobs: their queue is offered to running batches */
    int n_joins = 0;
    pthread_mutex_lock(&p->mu);
    for (hjob *j = jobs, *next; j != NULL; j = next) {
        next = j->next; /* job_append relinks it */
        worker_t *w = queue_shared(p, j);
        if (w != NULL && n < MAX_WORKERS)
            wake[n++] = w;
        if (j->native && j->plan != NULL && p->staged != NULL) {
            int seen = 0;
            for (int i = 0; i < n_joins && !seen; i++)
                seen = joins[i] == j->plan;
            if (!seen && n_joins < 4)
                joins[n_joins++] = j->plan;
        }
    }
    for (int i = 0; i < n_joins; i++)
        as_pool_join_offer(p, joins[i]);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n; i++)
        pthread_cond_signal(&wake[i]->cv);
}

/* ---- results handed to the host ---- */

void as_pool_result_decref(void *ctx)
{
    struct as_result *r = ctx;
    if (--r->refs > 0)
        return;
    pool_t *p = r->pool;
    as_pool_give_back(p, r->worker, r->owner);
    Py_DECREF(p);
    free(r);
}

/* ---- starting workers (host GIL held) ---- */

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

int as_pool_add_worker(pool_t *p, PyObject *token)
{
    if (p->n_workers >= MAX_WORKERS) {
        as_engine_error(Py_TYPE(p), "Pool.add_interpreter: at most %d interpreters per pool", MAX_WORKERS);
        return -1;
    }
    if (p->library != NULL && as_private_namespaces_in_use() >= AS_MAX_NAMESPACES) {
        as_engine_error(Py_TYPE(p),
                        "Pool.add_interpreter: glibc allows at most %d private interpreters per process, "
                        "front loops (--loops) included (%d in use); use fewer interpreters or loops, or "
                        "engine='subinterp'",
                        AS_MAX_NAMESPACES, as_private_namespaces_in_use());
        return -1;
    }
    worker_t *w = calloc(1, sizeof *w);
    hjob *sj = as_pool_job_new(p, token, 0);
    char *start_error = calloc(1, 1024);
    if (w == NULL || sj == NULL || start_error == NULL) {
        free(w);
        free(start_error);
        if (sj != NULL)
            as_pool_job_free(sj);
        PyErr_NoMemory();
        return -1;
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
    pthread_condattr_t cva; /* naps are timed on CLOCK_MONOTONIC, like every time here */
    pthread_condattr_init(&cva);
    pthread_condattr_setclock(&cva, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &cva);
    pthread_condattr_destroy(&cva);
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
    return w->index;
}

/* ---- completions and settings (host GIL held) ---- */

int as_pool_take_done(pool_t *p, hjob **ordered, Py_ssize_t *n)
{
    uint64_t count;
    if (read(p->efd, &count, sizeof count) < 0 && errno != EAGAIN && errno != EINTR) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_lock(&p->mu);
    hjob *j = p->done;
    hinputs *released = p->released;
    __atomic_store_n(&p->done, NULL, __ATOMIC_RELAXED);
    p->released = NULL;
    p->signalled = 0;
    pthread_mutex_unlock(&p->mu);
    while (released != NULL) {
        hinputs *next = released->next;
        as_pool_inputs_free(released);
        released = next;
    }
    /* the list is newest first: reverse it so completions come in order */
    *ordered = NULL;
    *n = 0;
    while (j != NULL) {
        hjob *next = j->next;
        j->next = *ordered;
        *ordered = j;
        j = next;
        (*n)++;
    }
    return 0;
}

void as_pool_put_back(pool_t *p, hjob *ordered)
{
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
}

void as_pool_set_spin(pool_t *p, long long us, int spinners)
{
    pthread_mutex_lock(&p->mu);
    p->spin_ns = us > 0 ? us * 1000 : 0;
    p->max_spinners = spinners > 0 ? spinners : 0;
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        w->n_gaps = 0; /* a pool set up anew learns its clients' pace anew */
        if (p->spin_ns == 0 || p->max_spinners == 0)
            kick(p, w); /* a pool put away stops polling at once */
    }
    pthread_mutex_unlock(&p->mu);
}

/* Workers' thread names from now on, and those of the running ones now (a parked pool's
 * reused under another name). */
void as_pool_name_threads(pool_t *p, const char *prefix)
{
    pthread_mutex_lock(&p->mu);
    snprintf(p->thread_name, sizeof p->thread_name, "%s", prefix);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (w->named && !w->dead) {
            char name[16];
            snprintf(name, sizeof name, "%s%d", p->thread_name, w->index);
            (void)pthread_setname_np(w->thread, name);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

/* Polling off (and back on) without forgetting the pace learned: a napping worker is woken
 * to block instead, a polling one kicked. */
void as_pool_set_spin_paused(pool_t *p, int paused)
{
    int n = 0;
    worker_t *nappers[MAX_WORKERS];
    pthread_mutex_lock(&p->mu);
    p->spin_paused = paused;
    for (int i = 0; paused && i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        kick(p, w);
        if (w->napping)
            nappers[n++] = w;
    }
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n; i++)
        pthread_cond_signal(&nappers[i]->cv);
}

void as_pool_set_active(pool_t *p, long n)
{
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++)
        p->workers[i]->active = i < n;
    for (hjob *j = p->head; j != NULL; j = j->next) {
        worker_t *w = idle_worker(p, j->mask, 1);
        if (w != NULL)
            pthread_cond_signal(&w->cv); /* rare: under the lock is simpler */
    }
    pthread_mutex_unlock(&p->mu);
}

void as_pool_stats(pool_t *p, pool_stats_t *out)
{
    *out = (pool_stats_t){0};
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        out->ready += w->ready;
        out->busy += w->busy && !w->lost;
        out->active += w->active && w->ready && !w->lost;
        out->lost += w->lost;
        out->waiting += w->waiting && !w->gathering && w->active && w->ready && !w->lost;
        out->spin_ns += w->spin_total;
    }
    out->queued = p->queued;
    out->spinning = p->spinners;
    out->polled = p->polled;
    out->woke_napping = p->woke_napping;
    out->woke_blocked = p->woke_blocked;
    out->coalesced = p->coalesced;
    fly(p, 0);
    out->answered = p->answered;
    out->flight_s = p->flight_s;
    pthread_mutex_unlock(&p->mu);
}

void as_pool_shutdown(pool_t *p)
{
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
}
