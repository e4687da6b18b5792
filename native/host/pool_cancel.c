/* Faults in the pool: cancelling jobs and giving up on interpreters.
 *
 * Every job has an id. `cancel` fails a queued job at once and raises the
 * interpreter's Cancelled in a running one (engine.cancel, on a thread of its own,
 * since it waits for that interpreter's GIL). A running job that does not come back
 * (blocked in native code) is given up with `lose`: its worker is marked lost and takes
 * no more jobs, the job's token completes at once (failed), and the job itself becomes
 * an orphan whose eventual completion goes to the token `lose` was given instead; the
 * worker that returns from it is no longer lost. A fatal signal in a worker is
 * reported by fault.c before the process ends.
 *
 * Kept apart from the core because none of it runs for a job that ends by itself: the
 * core only passes over lost workers and clears `lost` when their job returns. This
 * file calls the core (jobs, threads) and pool_join.c (a cancelled staged job
 * completes its offers).
 */
#include "pool.h"

#include <string.h>

typedef struct {
    worker_t *worker;
    uint64_t id;
} cancel_t;

/* A thread of its own, one per cancelled job: it may wait for the interpreter's GIL for
 * as long as the job holds it (forever, if the job spins in C without giving it up; the
 * worker never takes another job then, so such threads do not pile up). */
static void *cancel_main(void *arg)
{
    cancel_t c = *(cancel_t *)arg;
    free(arg);
    worker_t *w = c.worker;
    if (w->engine.thread_init != NULL)
        w->engine.thread_init(); /* a private namespace's libc, for this thread */
    w->engine.cancel(w->ip, c.id);
    return NULL;
}

/* Caller holds p->mu: the worker running job `id`, or NULL. */
static worker_t *running_worker(pool_t *p, uint64_t id)
{
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (w->current != NULL && w->current->id == id)
            return w;
    }
    return NULL;
}

/* Caller holds p->mu; j is unlinked from the shared queue: it never runs and completes
 * now, failed. Returns whether the loop must be woken. */
static int fail_queued(pool_t *p, hjob *j)
{
    dequeued(p, j);
    fail_cancelled(j);
    int wake = j->job.join != NULL ? as_pool_finish_staged(p, j) : 0;
    return wake | post_done(p, j);
}

/* Caller holds p->mu: what a cancellation thread for w's running job needs, or NULL if
 * its cancellation is under way already (or the worker is lost). */
static cancel_t *begin_cancel(worker_t *w)
{
    hjob *j = w->current;
    if (j == NULL || j->cancel_sent || w->lost || w->engine.cancel == NULL)
        return NULL;
    cancel_t *c = malloc(sizeof *c);
    if (c == NULL)
        return NULL; /* not cancelled: given up after the grace period all the same */
    j->cancel_sent = 1;
    *c = (cancel_t){w, j->id};
    return c;
}

/* Without p->mu: start the thread begin_cancel prepared (if it cannot start, the job is
 * given up after the grace period all the same). */
static void launch_cancel(cancel_t *c)
{
    pthread_t t;
    if (as_pool_spawn(&t, 1024 * 1024, cancel_main, c) != 0)
        free(c);
}

const char *as_pool_cancel(pool_t *p, uint64_t id)
{
    const char *state = NULL;
    cancel_t *start = NULL;
    int wake = 0;
    pthread_mutex_lock(&p->mu);
    hjob *prev = NULL;
    for (hjob *j = p->head; j != NULL; prev = j, j = j->next) {
        if (j->id != id)
            continue;
        unlink_shared(p, prev, j);
        wake = fail_queued(p, j);
        state = "queued";
        break;
    }
    if (state == NULL) { /* offered to a staged batch, not yet joined (pool_join.c) */
        int offered = as_pool_join_cancel(p, id);
        if (offered >= 0) {
            wake = offered;
            state = "queued";
        }
    }
    worker_t *w = state == NULL ? running_worker(p, id) : NULL;
    /* an orphan's token has completed: nothing to cancel; a batch coalesced with others, or
     * one that others may join, runs their requests too (pool_coalesce.c, pool_join.c): it is
     * left to finish */
    if (w != NULL && !w->current->orphan && w->current->part_next == NULL && !led_staged(w->current)) {
        state = "running";
        start = begin_cancel(w);
    }
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
    if (start != NULL)
        launch_cancel(start);
    return state;
}

int as_pool_cancel_link(pool_t *p, const void *link)
{
    int n = 0, wake = 0;
    pthread_mutex_lock(&p->mu);
    hjob *prev = NULL, *j = p->head;
    while (j != NULL) {
        hjob *next = j->next;
        if (j->link == link) {
            unlink_shared(p, prev, j);
            wake |= fail_queued(p, j);
            n++;
        } else {
            prev = j;
        }
        j = next;
    }
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
    return n;
}

int as_pool_cancel_all(pool_t *p, unsigned long long ids[MAX_WORKERS])
{
    cancel_t *starts[MAX_WORKERS];
    int n_starts = 0, n_ids = 0, wake = 0;
    pthread_mutex_lock(&p->mu);
    hjob *j;
    while ((j = job_pop(&p->head, &p->tail)) != NULL)
        wake |= fail_queued(p, j);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        if (w->current == NULL || w->lost)
            continue;
        ids[n_ids++] = w->current->id;
        cancel_t *c = begin_cancel(w);
        if (c != NULL)
            starts[n_starts++] = c;
    }
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
    for (int i = 0; i < n_starts; i++)
        launch_cancel(starts[i]);
    return n_ids;
}

int as_pool_lose(pool_t *p, uint64_t id, PyObject *on_return, running_t *out)
{
    hjob *proxy = as_pool_job_new(p, Py_None, 0);
    if (proxy == NULL)
        return -1;
    int wake = 0;
    pthread_mutex_lock(&p->mu);
    worker_t *w = running_worker(p, id);
    if (w != NULL && !w->lost && w->current->part_next == NULL) { /* never a coalesced batch (as_pool_cancel) */
        hjob *j = w->current;
        out->index = w->index;
        out->seconds = (double)(monotonic_ns() - w->since) / 1e9;
        w->lost = 1;
        j->orphan = 1;
        /* the job's token completes now, through the proxy; the orphan's completion, if it
         * ever comes, goes to on_return (references only: no Python runs under the lock) */
        PyObject *token = proxy->token;
        proxy->token = j->token;
        j->token = Py_NewRef(on_return);
        Py_DECREF(token); /* None: immortal or referenced elsewhere, never freed here */
        if (j->link != NULL) {
            /* a front's job: the proxy completes it to the front, with the job's reference to
             * the inputs (the interpreter keeps its own until it lets go of them, then they go
             * back to the front); the orphan, now the host's, completes to on_return */
            proxy->link = j->link;
            proxy->ftoken = j->ftoken;
            proxy->inputs = j->inputs;
            j->link = NULL;
            j->ftoken = NULL;
            j->inputs = NULL;
        }
        proxy->job.kind = j->job.kind;
        proxy->job.failed = 1;
        proxy->job.error_type = strdup("InterpreterLost");
        char text[256];
        snprintf(text, sizeof text,
                 "interpreter %d (engine %s) was given up: its job did not return %.1f s after it was cancelled",
                 w->index, p->engine_name, out->seconds);
        proxy->job.error = strdup(text);
        wake = j->job.join != NULL ? as_pool_finish_staged(p, j) : 0;
        wake |= post_done(p, proxy);
        proxy = NULL;
        snprintf(out->key, sizeof out->key, "%s", j->job.model != NULL ? j->job.model : "");
    }
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
    if (proxy != NULL) {
        as_pool_job_free(proxy);
        return 0;
    }
    return 1;
}

int as_pool_jobs(pool_t *p, running_t out[MAX_WORKERS])
{
    int n = 0;
    int64_t now = monotonic_ns();
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) {
        worker_t *w = p->workers[i];
        hjob *j = w->current;
        if (j == NULL)
            continue;
        out[n].index = w->index;
        out[n].lost = w->lost;
        out[n].id = j->id;
        out[n].seconds = (double)(now - w->since) / 1e9;
        snprintf(out[n].key, sizeof out[n].key, "%s", j->job.model != NULL ? j->job.model : "");
        n++;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}
