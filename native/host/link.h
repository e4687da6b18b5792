/* Links: how a front (an event loop in an interpreter of its own, with its own copy of
 * this extension) submits batches to a pool and gets their completions back.
 *
 * A front cannot call the host's Python objects: the link is plain C. The host hands a
 * front the address of as_link_api (aserve._native.link_api()) and of each pool it may
 * submit to (Pool.address); the front's own copy of this extension calls through the
 * table, so every function below runs the host's code with the host's libc, whichever
 * namespace calls it. None of them takes a GIL or calls the Python API.
 *
 * Locks: p->mu, then l->mu (a worker posts a completion under p->mu).
 */
#ifndef ASERVE_HOST_LINK_H
#define ASERVE_HOST_LINK_H

#include "pool.h"

#define AS_LINK_API_VERSION 8

typedef struct as_link {
    pthread_mutex_t mu;
    int efd;            /* written when something arrives and nothing was pending */
    int signalled;
    hjob *done;         /* finished jobs, newest first */
    hinputs *released;  /* inputs the interpreters no longer reference: the front releases them */
    /* the front's alone (its thread, no lock): between hold and release, jobs are kept here,
     * in the order given, and queued together by release */
    int holding;
    hjob *held_head, *held_tail;
} as_link;

/* What a front's batch counts while it waits in the pool's queue (pool.h, unwait): its
 * samples, its requests and itself, in slots[0], [1] and [2] of the Counter whose slots
 * are at `counter` (counter.c; NULL: not counted). */
typedef struct as_wait {
    void *counter;
    int slots[3];
    int64_t samples, requests;
    /* a batch (not a native request) of a model with the adaptive policy: while it runs, the
     * policy counts it in flight and the Counter in the model's running batches; or NULL */
    as_plan *plan;
} as_wait;

/* A request the pool batches itself (pool_coalesce.c, the window rule): its batch may wait
 * window_ns after it was queued for more requests, not past deadline_ns (CLOCK_MONOTONIC;
 * 0: none); a batch it leads counts in the Counter's slot run_slot (-1: none) while it runs. */
typedef struct as_window {
    int64_t window_ns, deadline_ns;
    int run_slot;
    /* a model with the adaptive policy: its plan (plan.h) decides the batch instead of the
     * window rule, with the request's budget (NAN: the policy's) and the seconds it waited */
    as_plan *plan;
    double budget, waited;
} as_window;

typedef struct as_link_api {
    int version;
    size_t job_size, link_size; /* sizeof(hjob), sizeof(as_link): the two copies must agree */
    /* a new link and its eventfd; NULL when out of memory or descriptors (errno) */
    as_link *(*open)(void);
    void (*close)(as_link *l);
    /* Queue a batch of `key` (loaded on the interpreters in `mask`) on pool p. in[i].name
     * and .datatype are copied; .data must stay valid until the inputs come back through
     * take (cookie). The job completes to l with `token`. context: the W3C headers model code
     * runs in (copied), or NULL. max_rows > 0: it may run in one
     * batch with other fronts' jobs of the model, of that many rows in all (pool_coalesce.c).
     * wait: what it counts while queued, or NULL. window: a request the pool batches with
     * others (then wait is required and counts it as a request, not a batch), or NULL.
     * 0 and *id, or -1 (errno). While the link holds (hold), the job is numbered and kept,
     * not queued. */
    int (*infer)(as_link *l, pool_t *p, const char *key, uint64_t mask, size_t n, const as_tensor *in,
                 void *token, void *cookie, int trace, const char *context, int64_t max_rows,
                 const as_wait *wait, const as_window *window, uint64_t *id);
    /* Hold the jobs infer makes from now on; release queues every held one, each pool's
     * under one lock, and only then wakes the workers that take them: a front that queues
     * the requests of one loop iteration together has them batched together. */
    void (*hold)(as_link *l);
    void (*release)(as_link *l);
    /* The jobs finished since the last take, oldest first (linked by next), and the inputs
     * no longer referenced (linked by next; release their cookie, then inputs_free). */
    hjob *(*take)(as_link *l, hinputs **released);
    /* Free a taken job (its outputs' owner taken out first, or given back here); returns
     * its inputs when the front's reference was the last one (release, then inputs_free). */
    hinputs *(*job_free)(hjob *j);
    void (*inputs_free)(hinputs *in);
    /* An output owner no buffer exports any more: back to the worker that made it. */
    void (*give_back)(pool_t *p, int worker, void *owner);
    /* The same for a job's shared owner (hjob.shared: it ran coalesced with others). */
    void (*shared_release)(pool_t *p, void *owner);
    /* Cancel job `id` of pool p (as_pool_cancel): "queued" (it completes now, failed with
     * Cancelled), "running" (Cancelled is raised in its interpreter), or NULL (finished, or
     * running in one batch with other jobs, whose rows must still come). */
    const char *(*cancel)(pool_t *p, uint64_t id);
    /* Cancel every job of l still queued on p (as_pool_cancel_link): its front's loop ends. */
    int (*cancel_link)(pool_t *p, const void *l);
    /* The adaptive policy's admission over a model's plan (plan.h), run with the host's code:
     * mode 0 asks from a request's head (as_plan_admit, nothing counted), 1 admits (counted),
     * 2 refuses only (as_plan_refuses). NAN to admit, else the Retry-After in seconds. */
    double (*plan_admit)(as_plan *plan, double now, int64_t queued, int64_t samples, double budget, double waited,
                         int mode);
    void (*plan_arrive)(as_plan *plan, double now, int64_t samples);
    double (*plan_rate)(as_plan *plan); /* requests/s admission lets in while overloaded */
} as_link_api;

extern const as_link_api as_link_api_table;

#endif
