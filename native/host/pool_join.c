/* Layer joining in the pool: staged jobs and the groups of requests offered to them.
 *
 * The host may offer a group of requests to a staged batch that is queued or running
 * (LBCI's layer-level joining). The offer waits on the job; after each stage but the
 * last the worker polls it (join_poll, under the pool lock only) and absorbs it if
 * that boundary is no later than the offer's last_stage, else rejects it. Every offer
 * completes, absorbed or rejected, before its batch's own completion, in one drain,
 * so the host knows which requests the outputs cover.
 *
 * Kept apart from the core because only staged jobs pay for it: a job that is not
 * staged never reaches this file. It calls nothing else of the pool's; the core
 * calls as_pool_finish_staged when a staged job ends.
 */
#include "pool.h"

/* as_join.poll: called by the interpreter side of a running staged job after
 * `done` stages; hands over the first offered group that may still join. */
static const as_tensor *join_poll(void *ctx, int done, size_t *n_inputs, void **inputs_ctx)
{
    hjob *j = ctx;
    pool_t *p = j->pool;
    const as_tensor *in = NULL;
    int wake = 0;
    pthread_mutex_lock(&p->mu);
    j->stage = done;
    hjob *o;
    while (in == NULL && (o = job_pop(&j->offers, &j->offers_tail)) != NULL) {
        if (done <= o->last_stage) {
            o->joined = 1;
            job_append(&j->absorbed, &j->absorbed_tail, o);
            *n_inputs = o->job.n_inputs;
            o->inputs->refs++; /* the interpreter's, given back with inputs_released */
            *inputs_ctx = o->inputs;
            in = o->in;
        } else {
            wake |= post_done(p, o); /* too late for this group: the host queues it again */
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (wake)
        wake_loop(p);
    return in;
}

int as_pool_finish_staged(pool_t *p, hjob *j)
{
    int wake = 0;
    for (hjob **pp = &p->staged; *pp != NULL; pp = &(*pp)->snext) {
        if (*pp == j) {
            *pp = j->snext;
            break;
        }
    }
    hjob *o;
    while ((o = job_pop(&j->offers, &j->offers_tail)) != NULL)
        wake |= post_done(p, o);
    while ((o = job_pop(&j->absorbed, &j->absorbed_tail)) != NULL)
        wake |= post_done(p, o);
    return wake;
}

void as_pool_stage(pool_t *p, hjob *j)
{
    pthread_mutex_lock(&p->mu);
    j->join = (as_join){j, join_poll};
    j->job.join = &j->join;
    j->snext = p->staged;
    p->staged = j;
    pthread_mutex_unlock(&p->mu);
}

/* Caller holds p->mu. */
static hjob *find_staged(pool_t *p, uint64_t id)
{
    for (hjob *j = p->staged; j != NULL; j = j->snext)
        if (j->id == id)
            return j;
    return NULL;
}

hmodel *as_pool_staged_model(pool_t *p, uint64_t id)
{
    /* the staged job cannot complete meanwhile: completions are freed by drain, on this thread */
    pthread_mutex_lock(&p->mu);
    hjob *j = find_staged(p, id);
    hmodel *m = j != NULL ? j->model : NULL;
    pthread_mutex_unlock(&p->mu);
    return m;
}

int as_pool_offer(pool_t *p, uint64_t id, hjob *o)
{
    pthread_mutex_lock(&p->mu);
    hjob *j = find_staged(p, id);
    int posted = j != NULL && j->stage < o->last_stage;
    if (posted)
        job_append(&j->offers, &j->offers_tail, o);
    pthread_mutex_unlock(&p->mu);
    return posted;
}

int as_pool_progress(pool_t *p, uint64_t id, int *stage, double *elapsed)
{
    int running = 0;
    struct timespec started = {0, 0}, now;
    pthread_mutex_lock(&p->mu);
    hjob *j = find_staged(p, id);
    if (j != NULL) {
        *stage = j->stage;
        running = j->running;
        started = j->started;
    }
    pthread_mutex_unlock(&p->mu);
    if (j == NULL)
        return 0;
    *elapsed = -1.0;
    if (running) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        *elapsed = (double)(now.tv_sec - started.tv_sec) + 1e-9 * (double)(now.tv_nsec - started.tv_nsec);
    }
    return 1;
}
