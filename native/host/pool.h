/* The pool's private header: what its files share, and nothing else includes.
 *
 *   pool.c         the core: queues, worker threads, dispatch, completions; its opening
 *                  comment has the lock order and who owns what, for all of them
 *   pool_join.c    layer joining: staged jobs, the offers they absorb, their progress
 *   pool_cancel.c  faults: cancelling jobs, the cancellation thread, giving jobs up
 *   pool_coalesce.c  fronts' batches of one model run as one batch
 *   pool_type.c    the Python type Pool: argument parsing, jobs built from Python
 *                  objects, results as Python objects
 *
 * Who calls whom: pool_type.c calls pool.c, pool_join.c and pool_cancel.c; pool_cancel.c
 * calls pool.c and pool_join.c; pool.c calls pool_join.c and pool_coalesce.c, which calls
 * back into pool.c only to give a finished batch's output memory back (as_pool_give_back);
 * pool_join.c calls none of them. pool.c and pool_coalesce.c call plan.c (a model's adaptive
 * policy, plan.h: its own lock, taken under p->mu, never the other way). The fronts' side
 * (link.c, through the Link API) calls pool.c, pool_cancel.c and plan.c. pool_type.c never takes p->mu. The queue and wake-up helpers
 * are inline here because the worker loop runs them on every job.
 */
#ifndef ASERVE_HOST_POOL_H
#define ASERVE_HOST_POOL_H

#include "common.h"
#include "plan.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define AS_JOB_START 100 /* host-only kind: a worker's interpreter is ready (or failed) */
#define MAX_WORKERS 64

struct pool;
struct as_link;

/* A model's names, interned once per load: every infer job of it points here. */
typedef struct hmodel {
    Py_ssize_t refs; /* host GIL */
    char *key;
    size_t n_inputs;
    char **names, **datatypes;
} hmodel;

/* The host buffers of one job's (or one offered group's) inputs. */
typedef struct hinputs {
    struct pool *pool;
    struct as_link *link; /* a front's job: its buffers are the front's, released there (cookie) */
    void *cookie;
    void *own;    /* a coalesced batch's inputs: one block the pool allocated (no buffers to release) */
    int refs; /* p->mu */
    size_t n;
    struct hinputs *next; /* p->released */
    Py_buffer views[];
} hinputs;

typedef struct hjob {
    as_job job;
    struct hjob *next;
    PyObject *token; /* called with (ok, payload) by the host when the job completes */
    struct as_link *link; /* a front's job: it completes to that front (link.c), never to the host */
    void *ftoken;         /* a front's job: the front's own object for it (never touched here) */
    /* coalescing (pool_coalesce.c): a front's job of a model that batches may run in one
     * batch with other fronts' queued jobs of the same model (max_rows > 0: at most that many
     * rows in all); the job a worker took lists the others in `parts` and is itself the
     * first of the chain by part_next (it, then its parts, in the order they were queued).
     * A part's outputs are slices of the batch's: its owner is then a shared owner (`shared`). */
    int64_t max_rows;
    struct hjob *parts, *part_next;
    int shared;
    int host_kind;
    int worker;
    uint64_t mask; /* shared jobs: bit i set if interpreter i may run it */
    char *key, *text; /* load/unload/exec: owned copies */
    hmodel *model;    /* infer jobs and offers */
    as_tensor *in;
    hinputs *inputs;
    char *start_error; /* start jobs */
    /* staged jobs: their join point, progress and groups offered / absorbed */
    struct pool *pool;
    uint64_t id;
    as_join join;
    int stage;   /* stages done at the last join point */
    int running; /* a worker took it */
    struct timespec started;
    int64_t ran_from, ran_to; /* traced jobs: CLOCK_MONOTONIC ns around the run in the interpreter */
    int64_t queued_ns;        /* shared jobs: CLOCK_MONOTONIC ns when queued (a worker's idle gap ends) */
    struct hjob *offers, *offers_tail;
    struct hjob *absorbed, *absorbed_tail;
    struct hjob *snext; /* the pool's list of staged jobs not yet complete */
    /* offers */
    int is_offer;
    int last_stage; /* the latest boundary at which the group may join */
    int joined;
    /* faults (p->mu) */
    int cancel_sent; /* a cancellation of it was started */
    int orphan;      /* given up (lose): its token is the one lose was given */
    /* a front's job while it waits in the shared queue: its samples, its requests and itself
     * count in slots wait_slots[0], [1] and [2] of its model's Counter (counter.c), which it holds */
    void *waiting;
    int wait_slots[3];
    int64_t wait_samples, wait_requests, wait_batches;
    /* a front's request the pool batches itself (pool_coalesce.c, the window rule): it waits
     * in the shared queue until its batch is full, no batch of its model runs, its window
     * closed or its deadline would pass; then the worker that takes it leads a batch of the
     * queued requests that fit. It holds its model's Counter (`held`) until it completes: a
     * leader counts its batch in the Counter's running batches (the head's, and slot
     * run_slot, its front's) from its start to its end. */
    int native;
    int64_t window_ns, deadline_ns; /* CLOCK_MONOTONIC ns; deadline 0: none */
    /* a native request of a model with the adaptive policy: the policy decides its batch
     * instead of the window rule (as_plan_decide), from each request's budget and the seconds
     * it spent in the server before it was queued (NAN budget: the policy's); its plan is held
     * until the job is freed. take_rows: the rows of the batch the policy chose for its leader. */
    as_plan *plan;
    double budget, waited;
    int64_t take_rows;
    int run_slot;
    void *held;
    int64_t led_rows; /* the rows of the batch it led (0: it ran as a part of another's) */
    /* a native request leading a staged batch of a model whose policy joins (pool_join.c):
     * its samples and requests with the requests offered to it, its earliest finish limit,
     * and the requests that joined it */
    int64_t join_samples, join_requests, joined_count;
    double join_limit;
    int64_t flight_rows; /* an infer job's rows, in flight from queued to posted (p->flying) */
} hjob;

typedef struct release {
    void *owner;
    struct release *next;
} release_t;

/* Idle gaps each worker remembers to place its polling window (pool.c, poll_window). */
#define AS_GAPS 8

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
    int spinning;        /* polling for a job before it blocks (p->spin_ns) */
    int spun;            /* has polled since its last job: blocks next time */
    int64_t idle_from;   /* CLOCK_MONOTONIC ns: when it last ran out of jobs (0: not idle) */
    int64_t gaps[AS_GAPS]; /* ns from running out of jobs to the next shared job being queued */
    int n_gaps;          /* gaps recorded, all told (the ring's next slot: n_gaps % AS_GAPS) */
    int named;           /* has taken p->thread_name (p->mu): as_pool_name_threads renames it */
    int napping;         /* waiting on cv until its polling window opens */
    int gathering;       /* waiting on cv until a native request's batching window closes */
    int64_t owners_out;  /* output owners it handed the host, not yet given back (p->mu) */
    int lingering;       /* waiting on cv, at most RELEASE_LINGER_NS, for owners out to come back */
    int between;         /* between jobs, p->mu released (freeing outputs, waking the loop): looks at the queue next */
    int64_t late_ns;     /* how late its naps end past the time asked (moving average) */
    int kick;            /* atomic: set to end a spin (a job for it, stop) */
    int64_t spin_from;   /* CLOCK_MONOTONIC ns: when the current spin began */
    int64_t spin_total;  /* ns spent polling for jobs, all told (who ends a spin adds it) */
    int active;          /* takes jobs from the pool queue */
    int ready, dead;
    int busy;            /* running a job */
    int stop, exited;
    hjob *start_job;
    hjob *current;       /* the job it runs now */
    int64_t since;       /* CLOCK_MONOTONIC ns: when it took `current` */
    int lost;            /* stuck in a job it was asked to give up: takes no jobs until it returns */
    int fault_slot;      /* fault.c's slot, -1 if none */
    int tid;             /* atomic: its thread's id (gettid), 0 until it runs: what sched_setaffinity takes */
} worker_t;

typedef struct pool {
    PyObject_HEAD
    char engine_name[16];
    char thread_name[12]; /* its workers' thread names: this and their index (top -H, perf, /proc/.../comm) */
    as_engine engine; /* template: private workers open their own namespace */
    char *library;
    as_init init;
    char **path;
    char *executable, *bootstrap;
    PyObject *str_shape, *str_data; /* interned attribute names of input tensors */
    pthread_mutex_t mu;
    pthread_cond_t exit_cv;
    hjob *head, *tail; /* shared queue */
    size_t queued;
    hjob *done;         /* completions, newest first */
    hinputs *released;  /* input buffers the interpreters gave back last */
    int signalled;      /* the eventfd was written since the last drain */
    int64_t spin_ns;    /* how long an idle worker polls for a job before it blocks */
    int spin_paused;    /* set_spin_paused: no worker polls, the gaps they learn are kept */
    int spinners, max_spinners;
    uint64_t polled;    /* shared jobs that found a worker polling for them */
    uint64_t woke_napping, woke_blocked; /* shared jobs that had to wake a worker napping toward its window, or blocked */
    uint64_t coalesced; /* fronts' jobs that ran in a batch with another front's job (pool_coalesce.c) */
    /* infer jobs' rows (samples) in flight, queued to posted, and answered; and the
     * sample-seconds spent in flight, as of flight_at (what engine/polling.py weighs) */
    int64_t flying, flight_at;
    uint64_t answered;
    double flight_s;
    hjob *staged;       /* staged jobs not yet complete */
    uint64_t next_id;
    int efd;
    int n_workers;
    worker_t *workers[MAX_WORKERS];
} pool_t;

/* The outputs of one finished infer job, shared by the OutputBuffers over them. */
struct as_result {
    pool_t *pool;
    worker_t *worker;
    void *owner;
    Py_ssize_t refs; /* host GIL */
};

/* ---- the pool lock's helpers (caller holds p->mu) ----
 *
 * Nothing that wakes another thread happens under the lock: a thread woken while the
 * waker still holds p->mu would only block on it again. Callers note what to wake
 * under the lock and wake it after unlocking (the eventfd: wake_loop; a worker:
 * pthread_cond_signal). */

/* Whether the event loop must be woken: nothing was pending since its last drain. */
static inline int must_wake_loop(pool_t *p)
{
    if (p->signalled)
        return 0;
    p->signalled = 1;
    return 1;
}

/* Without p->mu: write the eventfd the event loop watches. */
static inline void wake_loop(pool_t *p)
{
    uint64_t one = 1;
    ssize_t rc;
    do
        rc = write(p->efd, &one, sizeof one);
    while (rc < 0 && errno == EINTR);
}

/* link.c, caller holds p->mu: a front's job finished, or its inputs are no longer
 * referenced; each goes to that front's list and wakes its loop. */
void as_link_post(hjob *j);
void as_link_post_inputs(hinputs *in);

static inline int64_t monotonic_ns(void);

/* counter.c: a Counter's memory (its slots' address) held by a queued job, added to,
 * let go of (freed with the last holder). */
void as_counter_hold(void *slots);
void as_counter_add(void *slots, int slot, int64_t d);
void as_counter_drop(void *slots);
int as_counter_slots(void *slots);
/* The batches of the Counter's model running now, led by native requests, and the rows of
 * its native requests in the pool's queue (both under p->mu of its pool). */
int64_t *as_counter_running(void *slots);
int64_t *as_counter_queued(void *slots);

/* A native request's leader has completed (or a native request left without leading): its
 * batch stops counting as running and it lets go of its Counter. Caller holds p->mu. */
static inline void unhold(hjob *j)
{
    if (j->held == NULL)
        return;
    if (j->led_rows > 0) {
        --*as_counter_running(j->held);
        if (j->run_slot >= 0)
            as_counter_add(j->held, j->run_slot, -1);
    }
    as_counter_drop(j->held);
    j->held = NULL;
}

/* Caller holds p->mu: `rows` more (or fewer) samples in flight from now. */
static inline void fly(pool_t *p, int64_t rows)
{
    int64_t now = monotonic_ns();
    p->flight_s += (double)p->flying * (double)(now - p->flight_at) / 1e9;
    p->flight_at = now;
    p->flying += rows;
}

/* Returns whether the loop must be woken (wake_loop after unlocking). */
static inline int post_done(pool_t *p, hjob *j)
{
    unhold(j);
    if (j->flight_rows > 0) {
        fly(p, -j->flight_rows);
        p->answered += (uint64_t)j->flight_rows;
        j->flight_rows = 0;
    }
    if (j->link != NULL) {
        as_link_post(j);
        return 0;
    }
    j->next = p->done;
    __atomic_store_n(&p->done, j, __ATOMIC_RELEASE); /* pool_poll reads it without the lock */
    return must_wake_loop(p);
}

static inline void job_append(hjob **head, hjob **tail, hjob *j)
{
    j->next = NULL;
    if (*tail != NULL)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static inline hjob *job_pop(hjob **head, hjob **tail)
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

/* Take j, which follows prev (NULL: j is the head), out of the shared queue; the caller
 * counts it out of p->queued. Caller holds p->mu. */
static inline void unlink_shared(pool_t *p, hjob *prev, hjob *j)
{
    if (prev != NULL)
        prev->next = j->next;
    else
        p->head = j->next;
    if (p->tail == j)
        p->tail = prev;
    j->next = NULL;
}

/* Add (sign 1) or take off (-1) what waiting job j counts in its model's Counter. */
static inline void wait_count(const hjob *j, int64_t sign)
{
    as_counter_add(j->waiting, j->wait_slots[0], sign * j->wait_samples);
    as_counter_add(j->waiting, j->wait_slots[1], sign * j->wait_requests);
    if (j->wait_batches)
        as_counter_add(j->waiting, j->wait_slots[2], sign * j->wait_batches);
}

/* j no longer waits in the shared queue (taken, joined to another's batch, failed there):
 * it stops counting in its model's Counter. */
static inline void unwait(hjob *j)
{
    if (j->waiting == NULL)
        return;
    wait_count(j, -1);
    as_counter_drop(j->waiting);
    j->waiting = NULL;
}

/* Add (sign 1) or take off (-1) a native request's rows in its model's count of rows in
 * the pool's queue, which the window rule's wake-up reads (pool.c, window_may_end). Caller
 * holds p->mu. */
static inline void count_queued_rows(const hjob *j, int64_t sign)
{
    if (j->native && j->held != NULL && j->max_rows > 0)
        *as_counter_queued(j->held) += sign * j->flight_rows;
}

/* j was taken out of the shared queue (unlink_shared, job_pop). Caller holds p->mu. */
static inline void dequeued(pool_t *p, hjob *j)
{
    p->queued--;
    unwait(j);
    count_queued_rows(j, -1);
}

/* The rows (first dimension) of every input of j, or -1 when they differ or j has none. */
static inline int64_t rows_of(const hjob *j)
{
    if (j->job.n_inputs == 0 || j->in[0].ndim < 1)
        return -1;
    int64_t rows = j->in[0].shape[0];
    for (size_t i = 1; i < j->job.n_inputs; i++)
        if (j->in[i].ndim < 1 || j->in[i].shape[0] != rows)
            return -1;
    return rows;
}

/* Whether a and b may run in one batch: the same model, inputs and datatypes, and shapes but
 * for the first (batch) dimension. */
static inline int compatible(const hjob *a, const hjob *b)
{
    if (a->job.n_inputs != b->job.n_inputs || strcmp(a->key, b->key) != 0)
        return 0;
    for (size_t i = 0; i < a->job.n_inputs; i++) {
        const as_tensor *x = &a->in[i], *y = &b->in[i];
        if (x->ndim != y->ndim || strcmp(x->datatype, y->datatype) != 0 || strcmp(x->name, y->name) != 0)
            return 0;
        for (int d = 1; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d])
                return 0;
    }
    return 1;
}

/* Native request k (of `rows` rows) as its model's policy sees it queued (plan.h). */
static inline as_pending pending_of(const hjob *k, int64_t rows)
{
    return (as_pending){
        .arrival = (double)k->queued_ns / 1e9,
        .deadline = k->deadline_ns != 0 ? (double)k->deadline_ns / 1e9 : NAN,
        .budget = k->budget,
        .waited = k->waited,
        .samples = rows,
    };
}

/* j never runs: it completes failed, as cancelled before it ran. */
static inline void fail_cancelled(hjob *j)
{
    j->job.failed = 1;
    j->job.error_type = strdup("Cancelled"); /* NULL without memory: a generic failure */
    j->job.error = strdup("cancelled before it ran");
}

static inline int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- pool.c: the core (host GIL held unless said otherwise) ---- */

/* The calls an interpreter makes into the host (as_init.host). */
extern const as_host as_pool_host;

/* A job completing to token, not yet queued; NULL with MemoryError. */
hjob *as_pool_job_new(pool_t *p, PyObject *token, int kind);
/* Free a job the host holds (not queued, or taken back by drain), with what it owns. */
void as_pool_job_free(hjob *j);
/* Any thread, no GIL: drop the submitter's reference to a job's inputs; returns them
 * when that was the last one and they are a front's (the front releases its buffers). */
hinputs *as_pool_inputs_drop(hinputs *in);
/* Any thread: free inputs whose buffers were released (a front's), or release them (the host's, host GIL). */
void as_pool_inputs_free(hinputs *in);
/* Any thread, no GIL: give an output owner back to the worker that made it. */
void as_pool_give_back(pool_t *p, worker_t *w, void *owner);
void as_pool_model_decref(hmodel *m);
/* Queue j, targeted at worker `target` or shared (-1), and wake the worker that takes it. */
void as_pool_enqueue(pool_t *p, hjob *j, int target);
/* Give j its id (once) and its rows in flight, as queuing it does; a front numbers a job it
 * holds (link.c) so that it can be cancelled by id once queued. */
void as_pool_number_job(pool_t *p, hjob *j);
/* Host GIL not needed, p->mu not held: queue shared jobs (linked by next) under one lock,
 * then wake the workers that will take them: a worker woken finds every one queued. */
void as_pool_enqueue_many(pool_t *p, hjob *jobs);
/* as_buffer_free_fn of output buffers over a struct as_result, and its builder's own
 * reference: the last one gives the owner back to its worker. */
void as_pool_result_decref(void *ctx);

/* Start one more worker and its interpreter; its start job completes to token when
 * the interpreter is ready or failed. Returns its index, or -1 with an exception set. */
int as_pool_add_worker(pool_t *p, PyObject *token);
/* Any thread, no lock: start a detached thread with every asynchronous signal blocked. */
int as_pool_spawn(pthread_t *thread, size_t stack, void *(*fn)(void *), void *arg);

/* drain's first half: the jobs finished since the last drain, oldest first, and how
 * many; frees the input buffers the interpreters gave back. 0, or -1 with OSError. */
int as_pool_take_done(pool_t *p, hjob **ordered, Py_ssize_t *n);
/* Give back what as_pool_take_done took (for the next drain), when it cannot be answered now. */
void as_pool_put_back(pool_t *p, hjob *ordered);

/* Idle workers poll for a job, at most `us` microseconds after they ran out, before they
 * block, at most `spinners` at once; each relearns its clients' pace. */
void as_pool_set_spin(pool_t *p, long long us, int spinners);
void as_pool_set_spin_paused(pool_t *p, int paused);
void as_pool_name_threads(pool_t *p, const char *prefix);
/* Only the first n workers take shared jobs. */
void as_pool_set_active(pool_t *p, long n);

/* ---- pool_coalesce.c: fronts' jobs run as one batch (no GIL but the worker's interpreter's) ---- */

/* Caller holds p->mu: take the queued jobs worker `index` may run that can join j (a front's
 * job just taken) into j->parts; returns how many. */
int as_pool_coalesce(pool_t *p, hjob *j, int index);
/* Without p->mu, on w's thread: run j and its parts as one batch and give each its slice of
 * the outputs; if the batch fails, or its outputs cannot be sliced by rows, run each alone. */
void as_pool_run_coalesced(pool_t *p, worker_t *w, hjob *j);
/* A part's shared owner is no longer needed by it: the last one gives the owner back. */
void as_pool_shared_release(pool_t *p, void *shared);
/* Caller holds p->mu: whether native request j (queued, worker `index` may run it) may lead a
 * batch now by the window rule; if not, *wake_at is lowered to when its window closes.
 * *now: 0, or the time already read for this scan. */
int as_pool_window_open(pool_t *p, hjob *j, int index, int64_t *now, int64_t *wake_at);
/* Caller holds p->mu: the same for native request j of a model with the adaptive policy
 * (j->plan): the policy decides on the model's queued requests from j on, once per scan. */
int as_pool_plan_open(pool_t *p, hjob *j, int index, int64_t *now, int64_t *wake_at);
/* Caller holds p->mu: native request j, just taken with its parts, leads their batch. */
void as_pool_lead(hjob *j);
/* The window rule on a model's queue, as the pool applies it (and _native.window_rule): the
 * head request queued at `queued` (deadline 0: none), `rows` queued rows fitting one batch of
 * at most max_rows (`more`: others do not fit), `running` batches of the model running.
 * 1: dispatch now; 0: wait until *close (or the next arrival or completion). */
int as_window_rule(int64_t now, int64_t queued, int64_t deadline, int64_t rows, int more, int64_t running,
                   int64_t max_rows, int64_t window_ns, int64_t *close);

typedef struct {
    int ready, busy, active, lost, spinning;
    int waiting; /* workers blocked or napping until a job comes: one queued now is theirs at once */
    size_t queued;
    int64_t spin_ns; /* time spent polling for jobs, all workers together */
    uint64_t polled; /* shared jobs that found a worker polling for them */
    uint64_t woke_napping, woke_blocked; /* ... that woke a worker napping before its window, or blocked */
    uint64_t coalesced;
    uint64_t answered; /* infer jobs' samples answered */
    double flight_s;   /* their sample-seconds in flight, queued to posted */
} pool_stats_t;
void as_pool_stats(pool_t *p, pool_stats_t *out);

/* Without the host GIL: end the workers whose interpreters can end, once their queues are empty. */
void as_pool_shutdown(pool_t *p);

/* ---- pool_join.c: layer joining (host GIL held unless said otherwise) ---- */

/* Make j, an infer job not yet queued, a staged job that offers may join. */
void as_pool_stage(pool_t *p, hjob *j);
/* The model of staged job `id` while it has not completed, else NULL. */
hmodel *as_pool_staged_model(pool_t *p, uint64_t id);
/* Post offer o to staged job `id`; returns 1, or 0 (the caller keeps o) when the job
 * is gone or already past o->last_stage. */
int as_pool_offer(pool_t *p, uint64_t id, hjob *o);
/* Returns 1 and the stages done and seconds running (-1: queued) of staged job `id`,
 * or 0 once it completed. */
int as_pool_progress(pool_t *p, uint64_t id, int *stage, double *elapsed);
/* Caller holds p->mu: staged job j finished; complete its offers (before itself).
 * Returns whether the loop must be woken. */
int as_pool_finish_staged(pool_t *p, hjob *j);

/* A native request leads a staged batch (as_pool_stage_led): it runs through
 * as_pool_run_coalesced, whatever joins it. */
static inline int led_staged(const hjob *j)
{
    return j->native && j->job.join != NULL;
}

/* Caller holds p->mu: native request j, just taken to lead a batch of a model whose policy
 * joins now, runs it stage by stage; queued requests of its model may join it. */
void as_pool_stage_led(pool_t *p, hjob *j);
/* Caller holds p->mu: no interpreter is free for the model of plan pl: offer its queued native
 * requests to its running staged batches, where the plan says they may join. */
void as_pool_join_offer(pool_t *p, as_plan *pl);
/* Caller holds p->mu: staged batch j's run ended (`batch`: how): it takes no more offers, the
 * requests that joined it follow its parts (part_next), those still offered go back to the
 * head of the queue. Returns the rows that joined. */
int64_t as_pool_join_close(pool_t *p, hjob *j, const as_job *batch);
/* Caller holds p->mu: cancel the request `id` offered to a staged batch and not yet joined.
 * -1: none is; else whether the loop must be woken. */
int as_pool_join_cancel(pool_t *p, uint64_t id);

/* ---- pool_cancel.c: faults (host GIL held) ---- */

/* A running job, as jobs() and lose() report it. */
typedef struct {
    int index, lost;
    unsigned long long id;
    double seconds;
    char key[256]; /* the model's key, cut short */
} running_t;

/* Cancel job `id`: "queued" (it completed at once, failed), "running" (Cancelled is
 * raised in its interpreter from a thread of its own) or NULL (it already completed). */
const char *as_pool_cancel(pool_t *p, uint64_t id);

/* Cancel every job of front link `link` still queued on p (its loop ended: nobody waits
 * for them): each completes now, failed with Cancelled, and what it counted in its model's
 * queue is given back. Running ones finish. Returns how many were queued. */
int as_pool_cancel_link(pool_t *p, const void *link);
/* Fail every queued job and cancel every running one; returns how many ran, their ids in ids. */
int as_pool_cancel_all(pool_t *p, unsigned long long ids[MAX_WORKERS]);
/* Give up on running job `id` (see pool_cancel.c): 1 with out's index, key and seconds
 * filled, 0 if it is not running (any more), -1 with MemoryError. */
int as_pool_lose(pool_t *p, uint64_t id, PyObject *on_return, running_t *out);
/* The jobs running now, copied under the lock: the caller builds Python objects only
 * after it, since allocating them may collect garbage and a collected output buffer
 * takes the lock. Returns how many. */
int as_pool_jobs(pool_t *p, running_t out[MAX_WORKERS]);

#endif
