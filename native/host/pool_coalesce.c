/* Batching in the pool: front loops' batches of one model run as one batch, and fronts'
 * requests queued natively are batched here, by the window rule.
 *
 * Each front loop batches its own requests, so N fronts split a model's traffic into N
 * streams of smaller batches. When a worker takes a front's job and others of the same
 * model wait in the shared queue (the interpreters were busy), it takes those too, up to
 * the model's largest batch: their inputs are copied one after another into one block,
 * the model runs once, and each job gets its rows of every output, as views of the one
 * output memory. That memory goes back to the interpreter when the last of those jobs'
 * buffers is gone (a shared owner, counted under p->mu).
 *
 * Only fronts' jobs (link != NULL) that say how many rows a batch may hold (max_rows, set
 * by the front for a model that batches), are not traced and carry no caller's context
 * (job.text) coalesce; two coalesce when every input has the same datatype and the same
 * shape but for the first (batch) dimension. BYTES tensors coalesce too: their layout (each
 * element a 4-byte length, then its bytes) has no header, so the rows of several jobs
 * concatenate, and a BYTES output is sliced where the elements of each job's rows end. If
 * the batch fails, or an output's first dimension is not the batch's rows (or a BYTES
 * output's elements do not fill them), each job runs again alone: a request that makes the
 * model fail fails only its own job, as the batcher's retry makes it fail only itself.
 *
 * Native requests (hjob.native: Link.infer with a window) are one request each: every
 * front queues its requests here, so one queue per model holds every loop's, and they
 * join the same batches. A worker looking for a job passes over a native request while
 * the window rule (as_window_rule, the Python WindowPolicy's rule) says its batch should
 * wait for more, and sleeps until the earliest window closes; an arrival or a completion
 * wakes it sooner. The one it takes leads the batch of the queued requests that fit
 * (coalesced as above) and counts it as running until it completes.
 */
#include "pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *owner;
    int worker;
    int refs; /* p->mu */
} shared_owner_t;

int as_pool_coalesce(pool_t *p, hjob *j, int index)
{
    if (j->link == NULL || j->max_rows <= 0 || j->job.trace || j->job.text != NULL)
        return 0;
    int64_t rows = rows_of(j);
    if (rows < 0)
        return 0;
    int64_t limit = j->take_rows > 0 ? j->take_rows : j->max_rows; /* the adaptive policy's batch, or the largest */
    int n = 0;
    hjob **tail = &j->part_next; /* j, then its parts, in the order they were queued */
    hjob *prev = NULL;
    for (hjob *k = p->head; k != NULL;) {
        hjob *next = k->next;
        int64_t more = k->link != NULL && k->max_rows == j->max_rows && !k->job.trace && k->job.text == NULL &&
                               k->native == j->native &&
                               (k->mask >> index & 1) && compatible(j, k)
                           ? rows_of(k)
                           : -1;
        if (more >= 0 && rows + more <= limit) {
            unlink_shared(p, prev, k);
            dequeued(p, k);
            k->running = 1;
            *tail = k;
            tail = &k->part_next;
            rows += more;
            n++;
        } else
            prev = k;
        k = next;
    }
    j->parts = j->part_next;
    p->coalesced += n ? (uint64_t)n + 1 : 0;
    return n;
}

int as_window_rule(int64_t now, int64_t queued, int64_t deadline, int64_t rows, int more, int64_t running,
                   int64_t max_rows, int64_t window_ns, int64_t *close)
{
    /* more than one batch is queued, or exactly one, or nothing of the model runs (a lone
     * request never waits: only running batches bring more requests before the window ends) */
    if (max_rows <= 0 || more || rows >= max_rows || running <= 0)
        return 1;
    int64_t at = queued + window_ns;
    if (now >= at || (deadline != 0 && deadline <= at)) /* window closed, or waiting would time it out */
        return 1;
    *close = at;
    return 0;
}

int as_pool_window_open(pool_t *p, hjob *j, int index, int64_t *now, int64_t *wake_at)
{
    if (j->max_rows <= 0 || j->held == NULL)
        return 1;
    int64_t rows = rows_of(j), limit = j->max_rows;
    int more = 0;
    if (rows < 0)
        return 1;
    for (hjob *k = j->next; k != NULL && !more && rows < limit; k = k->next) {
        if (!k->native || k->max_rows != limit || !(k->mask >> index & 1) || !compatible(j, k))
            continue;
        int64_t r = rows_of(k);
        if (r < 0)
            continue;
        if (rows + r > limit)
            more = 1;
        else
            rows += r;
    }
    if (*now == 0)
        *now = monotonic_ns();
    int64_t close = 0;
    if (as_window_rule(*now, j->queued_ns, j->deadline_ns, rows, more, *as_counter_running(j->held), limit,
                       j->window_ns, &close))
        return 1;
    if (close < *wake_at)
        *wake_at = close;
    (void)p;
    return 0;
}

int as_pool_plan_open(pool_t *p, hjob *j, int index, int64_t *now, int64_t *wake_at)
{
    (void)p;
    if (j->max_rows <= 0 || j->held == NULL || rows_of(j) < 0)
        return 1;
    /* the model's queue as the policy sees it: j and the requests that may join its batch */
    int cap = 64, n = 0;
    as_pending local[64], *queue = local;
    for (hjob *k = j; k != NULL; k = k->next) {
        if (k != j && (k->plan != j->plan || !k->native || k->max_rows != j->max_rows || !(k->mask >> index & 1) ||
                       !compatible(j, k)))
            continue;
        int64_t r = rows_of(k);
        if (r < 0)
            continue;
        if (n == cap) {
            as_pending *grown = malloc(sizeof *grown * (size_t)cap * 2);
            if (grown == NULL)
                break; /* the policy decides on the queue's first `cap` */
            memcpy(grown, queue, sizeof *grown * (size_t)n);
            if (queue != local)
                free(queue);
            queue = grown;
            cap *= 2;
        }
        queue[n++] = pending_of(k, r);
    }
    if (*now == 0)
        *now = monotonic_ns();
    int64_t running = *as_counter_running(j->held);
    int idle = j->plan->interpreters - (int)running;
    double wake = NAN;
    int take = as_plan_decide(j->plan, (double)*now / 1e9, queue, n, idle, (int)running, j->max_rows, &wake);
    if (take > 0) {
        int64_t rows = 0;
        for (int i = 0; i < take && i < n; i++)
            rows += queue[i].samples;
        j->take_rows = rows;
    } else if (!isnan(wake)) {
        int64_t at = (int64_t)(wake * 1e9);
        if (at < *wake_at)
            *wake_at = at;
    }
    if (queue != local)
        free(queue);
    return take > 0;
}

void as_pool_lead(hjob *j)
{
    int64_t rows = 0;
    for (hjob *k = j; k != NULL; k = k->part_next) { /* j, then its parts */
        int64_t r = rows_of(k);
        rows += r > 0 ? r : 1;
    }
    j->led_rows = rows;
    if (j->held != NULL) {
        ++*as_counter_running(j->held);
        if (j->run_slot >= 0)
            as_counter_add(j->held, j->run_slot, 1);
    }
}

void as_pool_shared_release(pool_t *p, void *shared)
{
    shared_owner_t *so = shared;
    pthread_mutex_lock(&p->mu);
    int last = --so->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (last) {
        as_pool_give_back(p, p->workers[so->worker], so->owner);
        free(so);
    }
}

static void free_outputs(as_job *job)
{
    for (size_t i = 0; i < job->n_outputs; i++) {
        free(job->outputs[i].name);
        free(job->outputs[i].datatype);
    }
    free(job->outputs);
    job->outputs = NULL;
    job->n_outputs = 0;
}

/* Each job runs alone, as if it had never been coalesced. */
static void run_each(pool_t *p, worker_t *w, hjob *j)
{
    for (hjob *k = j; k != NULL; k = k->part_next) {
        pthread_mutex_lock(&p->mu);
        k->worker = w->index;
        if (k->inputs != NULL)
            k->inputs->refs++; /* the interpreter's, given back with inputs_released */
        pthread_mutex_unlock(&p->mu);
        w->engine.run(w->ip, &k->job);
    }
}

/* The byte offset at which each of `parts` jobs' rows begin in BYTES tensor t (V2's binary
 * layout: each element a 4-byte little-endian length, then its bytes), and its end at
 * starts[parts]: found by walking the elements, `per` to a row. 0 when the elements do not
 * fill the jobs' rows exactly. */
static int bytes_starts(const as_tensor *t, const hjob *j, int64_t per, size_t *starts)
{
    const unsigned char *data = t->data;
    size_t at = 0, nbytes = t->nbytes;
    int part = 0;
    for (const hjob *k = j; k != NULL; k = k->part_next) {
        starts[part++] = at;
        for (int64_t e = rows_of(k) * per; e > 0; e--) {
            if (nbytes - at < 4)
                return 0;
            uint32_t len = (uint32_t)data[at] | (uint32_t)data[at + 1] << 8 | (uint32_t)data[at + 2] << 16 |
                           (uint32_t)data[at + 3] << 24;
            at += 4;
            if (nbytes - at < len)
                return 0;
            at += len;
        }
    }
    starts[part] = at;
    return at == nbytes;
}

/* Give each job its rows of every output; 0 (nothing given) when an output cannot be sliced. */
static int slice(pool_t *p, worker_t *w, hjob *j, as_job *batch, int64_t total)
{
    size_t n = batch->n_outputs;
    int parts = 0;
    for (hjob *k = j; k != NULL; k = k->part_next)
        parts++;
    /* BYTES outputs: where each job's rows begin (`parts` + 1 offsets per output), else NULL */
    size_t **starts = calloc(n ? n : 1, sizeof(size_t *));
    if (starts == NULL)
        return 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        const as_tensor *t = &batch->outputs[i];
        if (t->ndim < 1 || t->shape[0] != total) {
            ok = 0;
        } else if (strcmp(t->datatype, "BYTES") == 0) {
            int64_t per = 1;
            for (int d = 1; d < t->ndim; d++)
                per *= t->shape[d];
            starts[i] = malloc(sizeof(size_t) * (size_t)(parts + 1));
            ok = starts[i] != NULL && bytes_starts(t, j, per, starts[i]);
        } else if (total > 0 && t->nbytes % (size_t)total != 0) {
            ok = 0;
        }
    }
    shared_owner_t *so = ok ? malloc(sizeof *so) : NULL;
    if (so == NULL) {
        for (size_t i = 0; i < n; i++)
            free(starts[i]);
        free(starts);
        return 0;
    }
    /* every job's outputs first, so that a failed allocation leaves no job half done */
    for (hjob *k = j; k != NULL; k = k->part_next) {
        k->job.outputs = calloc(n ? n : 1, sizeof(as_tensor));
        if (k->job.outputs == NULL)
            goto no_memory;
        k->job.n_outputs = n;
        for (size_t i = 0; i < n; i++) {
            k->job.outputs[i].name = strdup(batch->outputs[i].name);
            k->job.outputs[i].datatype = strdup(batch->outputs[i].datatype);
            if (k->job.outputs[i].name == NULL || k->job.outputs[i].datatype == NULL)
                goto no_memory;
        }
    }
    so->owner = batch->owner;
    so->worker = w->index;
    so->refs = parts;
    int64_t offset = 0;
    int part = 0;
    for (hjob *k = j; k != NULL; k = k->part_next, part++) {
        int64_t rows = rows_of(k);
        for (size_t i = 0; i < n; i++) {
            const as_tensor *t = &batch->outputs[i];
            as_tensor *o = &k->job.outputs[i];
            o->ndim = t->ndim;
            memcpy(o->shape, t->shape, sizeof o->shape);
            o->shape[0] = rows;
            if (starts[i] != NULL) {
                o->data = (char *)t->data + starts[i][part];
                o->nbytes = starts[i][part + 1] - starts[i][part];
            } else {
                size_t row = total > 0 ? t->nbytes / (size_t)total : 0;
                o->data = (char *)t->data + (size_t)offset * row;
                o->nbytes = (size_t)rows * row;
            }
            o->readonly = t->readonly;
        }
        offset += rows;
        k->job.owner = so;
        k->shared = 1;
        k->worker = w->index;
        k->job.failed = 0;
    }
    for (size_t i = 0; i < n; i++)
        free(starts[i]);
    free(starts);
    (void)p;
    return 1;
no_memory:
    for (hjob *k = j; k != NULL; k = k->part_next)
        free_outputs(&k->job);
    for (size_t i = 0; i < n; i++)
        free(starts[i]);
    free(starts);
    free(so);
    return 0;
}

void as_pool_run_coalesced(pool_t *p, worker_t *w, hjob *j)
{
    size_t n = j->job.n_inputs;
    int64_t total = 0;
    for (hjob *k = j; k != NULL; k = k->part_next)
        total += rows_of(k);
    /* the batch's inputs: one block holding each input's rows of every job, in order */
    size_t bytes = 0;
    for (hjob *k = j; k != NULL; k = k->part_next)
        for (size_t i = 0; i < n; i++)
            bytes += k->in[i].nbytes;
    as_tensor *in = calloc(n ? n : 1, sizeof(as_tensor));
    hinputs *held = calloc(1, sizeof *held);
    char *block = malloc(bytes ? bytes : 1);
    if (in == NULL || held == NULL || block == NULL) {
        free(in);
        free(held);
        free(block);
        run_each(p, w, j);
        return;
    }
    char *at = block;
    for (size_t i = 0; i < n; i++) {
        in[i] = j->in[i];
        in[i].shape[0] = total;
        in[i].data = at;
        in[i].nbytes = 0;
        for (hjob *k = j; k != NULL; k = k->part_next) {
            memcpy(at, k->in[i].data, k->in[i].nbytes);
            at += k->in[i].nbytes;
            in[i].nbytes += k->in[i].nbytes;
        }
    }
    held->pool = p;
    held->own = block;
    held->refs = 1; /* the interpreter's: the last view of the block gone frees it */
    as_job batch = j->job;
    batch.inputs = in;
    batch.inputs_ctx = held;
    batch.failed = 0;
    batch.error_type = batch.error = batch.result = NULL;
    batch.outputs = NULL;
    batch.n_outputs = 0;
    batch.owner = NULL;
    w->engine.run(w->ip, &batch);
    free(in);
    if (led_staged(j)) { /* the requests that joined it follow its parts */
        pthread_mutex_lock(&p->mu);
        total += as_pool_join_close(p, j, &batch);
        j->led_rows = total;
        pthread_mutex_unlock(&p->mu);
    }
    int sliced = !batch.failed && slice(p, w, j, &batch, total);
    if (!batch.failed && !sliced && batch.owner != NULL)
        w->engine.release(w->ip, batch.owner);
    free(batch.error_type);
    free(batch.error);
    free(batch.result);
    free_outputs(&batch);
    if (!sliced)
        run_each(p, w, j);
}
