/* Layer joining in the pool: staged jobs and the groups of requests offered to them.
 *
 * The host may offer a group of requests to a staged batch that is queued or running
 * (LBCI's layer-level joining). The offer waits on the job; after each stage but the
 * last the worker polls it (join_poll, under the pool lock only) and absorbs it if
 * that boundary is no later than the offer's last_stage, else rejects it. Every offer
 * completes, absorbed or rejected, before its batch's own completion, in one drain,
 * so the host knows which requests the outputs cover.
 *
 * The fronts' requests of a model whose adaptive policy joins (native requests with a
 * Plan that has stages) join in the pool itself, in the one queue: the request that leads
 * a batch runs it stage by stage (as_pool_stage_led), and whenever requests of its model are
 * queued while none of its interpreters is free, the head of the queue is offered to its
 * running batches as batching/joining.py's LayerJoin.offer does, by the plan's planner
 * (plan_join.c). An offered request leaves the queue and waits at the batch's join point;
 * turned away, it goes back to the head of the queue. When the batch ends, those that
 * joined follow its parts, and its outputs are sliced among them all (pool_coalesce.c).
 *
 * Kept apart from the core because only staged jobs pay for it: a job that is not
 * staged never reaches this file. It calls nothing else of the pool's; the core
 * calls as_pool_finish_staged when a staged job ends.
 */
#include "pool.h"

#include <math.h>

#define JOIN_QUEUE 256 /* queued requests one offer considers (the largest batch is smaller) */

/* Caller holds p->mu: native requests offered to a batch and turned away (or left over when
 * it ended), linked newest first by next, go back to the head of the shared queue in the order
 * they were offered, as if they had never left. */
static void requeue(pool_t *p, hjob *back)
{
    for (hjob *o = back, *next; o != NULL; o = next) {
        next = o->next;
        o->next = p->head;
        p->head = o;
        if (p->tail == NULL)
            p->tail = o;
        p->queued++;
        count_queued_rows(o, 1);
    }
}

/* as_join.poll: called by the interpreter side of a running staged job after
 * `done` stages; hands over the first offered group that may still join. */
static const as_tensor *join_poll(void *ctx, int done, size_t *n_inputs, void **inputs_ctx)
{
    hjob *j = ctx;
    pool_t *p = j->pool;
    const as_tensor *in = NULL;
    int wake = 0;
    hjob *back = NULL; /* native requests turned away, newest first */
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
            if (o->native)
                unwait(o); /* it runs now */
        } else if (o->native) {
            j->join_samples -= rows_of(o);
            as_plan_turned_away(j->plan);
            o->next = back;
            back = o;
        } else {
            wake |= post_done(p, o); /* too late for this group: the host queues it again */
        }
    }
    if (back != NULL) { /* to the head of the queue, then offered again */
        requeue(p, back);
        as_pool_join_offer(p, j->plan);
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

/* Caller holds p->mu: j polls for offers at its stage boundaries from now on. */
static void stage(pool_t *p, hjob *j)
{
    j->join = (as_join){j, join_poll};
    j->job.join = &j->join;
    j->snext = p->staged;
    p->staged = j;
}

void as_pool_stage(pool_t *p, hjob *j)
{
    pthread_mutex_lock(&p->mu);
    stage(p, j);
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

/* ---- the fronts' requests of a model whose policy joins ---- */

/* When native request k must finish (its plan's rule). */
static double limit_of(const hjob *k)
{
    as_pending pending = pending_of(k, rows_of(k));
    return as_plan_limit(k->plan, &pending);
}

/* When staged batch s began running, in seconds on CLOCK_MONOTONIC. */
static double started_s(const hjob *s)
{
    return (double)s->started.tv_sec + 1e-9 * (double)s->started.tv_nsec;
}

void as_pool_stage_led(pool_t *p, hjob *j)
{
    stage(p, j);
    j->stage = 0;
    j->join_samples = j->led_rows;
    j->join_requests = 0;
    j->joined_count = 0;
    j->join_limit = INFINITY;
    for (hjob *k = j; k != NULL; k = k == j ? j->parts : k->part_next) {
        j->join_requests++;
        double limit = limit_of(k);
        if (limit < j->join_limit)
            j->join_limit = limit;
    }
}

/* The samples of each request offered to staged batch s and not turned away (joined, or
 * waiting at its join point), in the order offered; how many. */
static int offered_rows(const hjob *s, int64_t *out, int max)
{
    int n = 0;
    for (const hjob *o = s->absorbed; o != NULL && n < max; o = o->next)
        out[n++] = rows_of(o);
    for (const hjob *o = s->offers; o != NULL && n < max; o = o->next)
        out[n++] = rows_of(o);
    return n;
}

/* Caller holds p->mu: take k out of the shared queue to offer it (it still counts as waiting
 * in its model's Counter until it joins). */
static void unqueue(pool_t *p, hjob *k)
{
    hjob *prev = NULL;
    for (hjob *q = p->head; q != NULL && q != k; q = q->next)
        prev = q;
    unlink_shared(p, prev, k);
    p->queued--;
    count_queued_rows(k, -1);
}

void as_pool_join_offer(pool_t *p, as_plan *pl)
{
    int rule = as_plan_join_active(pl);
    hjob *head = NULL;
    for (hjob *k = p->head; k != NULL && head == NULL; k = k->next)
        if (k->native && k->plan == pl && k->held != NULL)
            head = k;
    if (rule == 0 || head == NULL || *as_counter_running(head->held) < pl->interpreters)
        return; /* an interpreter is free: the queue is batched, not offered */
    /* the model's running staged batches, oldest first */
    hjob *batches[MAX_WORKERS];
    int nb = 0;
    for (hjob *s = p->staged; s != NULL; s = s->snext)
        if (led_staged(s) && s->plan == pl && s->running && nb < MAX_WORKERS)
            batches[nb++] = s;
    if (nb == 0)
        return;
    int64_t now_ns = monotonic_ns(), offered[JOIN_QUEUE], sizes[JOIN_QUEUE];
    double now = (double)now_ns / 1e9, limits[JOIN_QUEUE], free_at = INFINITY;
    for (int i = nb - 1; i >= 0; i--) {
        hjob *s = batches[i];
        int n = offered_rows(s, offered, JOIN_QUEUE);
        double end = as_plan_join_own_end(pl, started_s(s), now, s->join_samples, offered, n, s->stage);
        if (end < free_at)
            free_at = end;
    }
    for (int i = nb - 1; i >= 0; i--) {
        hjob *s = batches[i];
        hjob *picks[JOIN_QUEUE];
        int n = 0;
        int64_t total = 0;
        double limit = INFINITY;
        for (hjob *k = p->head; k != NULL && n < JOIN_QUEUE; k = k->next) {
            if (!k->native || k->plan != pl)
                continue; /* another model's */
            int64_t r = rows_of(k);
            if (r < 0 || s->join_samples + total + r > s->max_rows || !compatible(s, k) || !(k->mask >> s->worker & 1))
                break;
            total += r;
            double l = limit_of(k);
            if (l < limit)
                limit = l;
            picks[n] = k;
            sizes[n] = total;
            limits[n] = limit;
            n++;
        }
        if (n == 0)
            continue;
        int n_off = offered_rows(s, offered, JOIN_QUEUE), last = 0;
        double end = 0.0;
        int take = as_plan_join_plan(pl, now, s->stage, now - started_s(s), s->join_samples, s->join_limit, sizes, limits,
                                     n, s->max_rows, offered, n_off, s->join_requests + n_off,
                                     rule == 2 ? free_at : NAN, &last, &end);
        if (take == 0 || s->stage >= last)
            continue; /* no group may join, or the batch moved past the boundary meanwhile */
        for (int t = 0; t < take; t++) {
            unqueue(p, picks[t]);
            picks[t]->last_stage = last;
            job_append(&s->offers, &s->offers_tail, picks[t]);
        }
        s->join_samples += sizes[take - 1];
        if (limits[take - 1] < s->join_limit)
            s->join_limit = limits[take - 1];
    }
}

int64_t as_pool_join_close(pool_t *p, hjob *j, const as_job *batch)
{
    for (hjob **pp = &p->staged; *pp != NULL; pp = &(*pp)->snext) {
        if (*pp == j) {
            *pp = j->snext;
            break;
        }
    }
    j->job.join = NULL; /* run alone again (a failed batch), it absorbs nothing */
    hjob *o, *back = NULL;
    while ((o = job_pop(&j->offers, &j->offers_tail)) != NULL) {
        o->next = back;
        back = o;
    }
    requeue(p, back);
    hjob **tail = &j->part_next;
    while (*tail != NULL)
        tail = &(*tail)->part_next;
    int64_t rows = 0, groups = 0;
    while ((o = job_pop(&j->absorbed, &j->absorbed_tail)) != NULL) {
        o->running = 1;
        *tail = o;
        tail = &o->part_next;
        rows += rows_of(o);
        groups++;
    }
    j->parts = j->part_next;
    j->joined_count = groups;
    if (batch->failed)
        return rows; /* its requests run again each alone: nothing joined, nothing to learn */
    if (groups > 0)
        as_plan_joined(j->plan, groups, groups);
    else
        as_plan_join_observe(j->plan, batch->stage_seconds, batch->n_stages);
    return rows;
}

int as_pool_join_cancel(pool_t *p, uint64_t id)
{
    for (hjob *s = p->staged; s != NULL; s = s->snext) {
        if (!led_staged(s))
            continue;
        hjob *prev = NULL;
        for (hjob *o = s->offers; o != NULL; prev = o, o = o->next) {
            if (o->id != id)
                continue;
            if (prev != NULL)
                prev->next = o->next;
            else
                s->offers = o->next;
            if (s->offers_tail == o)
                s->offers_tail = prev;
            o->next = NULL;
            s->join_samples -= rows_of(o);
            unwait(o);
            fail_cancelled(o);
            return post_done(p, o);
        }
    }
    return -1;
}
