/* The adaptive batching policy (plan.h): AdaptivePolicy's rules over the published curve.
 *
 * Each function mirrors the method of batching/adaptive.py (or costmodel.py) of the same
 * name, with its arithmetic in the same order, so that the two decide alike on the same
 * trace: the docstrings there say why each rule is what it is. Python's round() and float
 * floor division are reproduced (ties to even; py_floordiv).
 */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SLOWDOWN_LOW 0.5
#define SLOWDOWN_HIGH 4.0
#define CAUTION 3.0
#define OVERLOAD_SUSTAINED_S 0.5
#define PACKING 0.75
#define MAX_INTERPRETERS 64 /* as the pool's MAX_WORKERS */
#define MAX_FREES_FOR_ADMIT (MAX_INTERPRETERS + AS_PLAN_FLIGHT)

static inline double fmax2(double a, double b) { return a > b ? a : b; }
static inline double fmin2(double a, double b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t py_round(double x) { return (int64_t)nearbyint(x); } /* ties to even, as round() */

/* Python's float // float */
static double py_floordiv(double vx, double wx)
{
    double mod = fmod(vx, wx), div = (vx - mod) / wx;
    if (mod != 0.0 && ((wx < 0) != (mod < 0)))
        div -= 1.0;
    if (div == 0.0)
        return copysign(0.0, vx / wx);
    double floordiv = floor(div);
    if (div - floordiv > 0.5)
        floordiv += 1.0;
    return floordiv;
}

as_plan *as_plan_new(int interpreters, double budget, double max_queue_delay, double headroom, double rate_alpha,
                     double admit_factor, double overload_reserve, double slowdown_alpha, double contention)
{
    as_plan *pl = calloc(1, sizeof *pl);
    if (pl == NULL)
        return NULL;
    pthread_mutex_init(&pl->mu, NULL);
    atomic_init(&pl->refs, 1);
    pl->interpreters = interpreters < 1 ? 1 : interpreters > MAX_INTERPRETERS ? MAX_INTERPRETERS : interpreters;
    pl->budget = budget;
    pl->max_queue_delay = max_queue_delay;
    pl->headroom = headroom;
    pl->rate_alpha = rate_alpha;
    pl->admit_factor = admit_factor;
    pl->overload_reserve = overload_reserve;
    pl->slowdown_alpha = slowdown_alpha;
    pl->contention = contention;
    pl->mean_samples = 1.0;
    pl->keep_up = -1;
    pl->spread = fmax2(0.0, contention - 1.0);
    pl->slowdown = contention;
    pl->cautious = contention + CAUTION * pl->spread;
    return pl;
}

void as_plan_hold(as_plan *pl)
{
    atomic_fetch_add_explicit(&pl->refs, 1, memory_order_relaxed);
}

void as_plan_drop(as_plan *pl)
{
    if (atomic_fetch_sub_explicit(&pl->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&pl->mu);
    free(pl->predict);
    free(pl);
}

int as_plan_publish(as_plan *pl, const double *predict, int n, int64_t max_batch_size, int64_t best,
                    int64_t efficient)
{
    double *table = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (table == NULL)
        return -1;
    memcpy(table, predict, sizeof(double) * (size_t)n);
    pthread_mutex_lock(&pl->mu);
    double *old = pl->predict;
    pl->predict = table;
    pl->n_predict = n;
    pl->max_batch_size = max_batch_size;
    pl->best = best;
    pl->efficient = efficient;
    pl->published = n > 0;
    pthread_mutex_unlock(&pl->mu);
    free(old);
    return 0;
}

/* ---- the cost curve (CostModel) ---- */

/* Seconds one batch of b samples takes: the table, extended along its last step. */
static double predict(const as_plan *pl, int64_t b)
{
    if (b < 1)
        b = 1;
    int n = pl->n_predict;
    if (b <= n)
        return pl->predict[b - 1];
    double last = pl->predict[n - 1], step = n >= 2 ? last - pl->predict[n - 2] : 0.0;
    return last + step * (double)(b - n);
}

static double throughput(const as_plan *pl, int64_t b)
{
    b = imax(1, b);
    return (double)b / predict(pl, b);
}

static int64_t largest_batch_within(const as_plan *pl, double seconds)
{
    int64_t lo = 1, hi = pl->max_batch_size;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (predict(pl, mid) <= seconds)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* -1: none serves `rate` */
static int64_t smallest_batch_for(const as_plan *pl, double rate)
{
    if (rate <= 0.0)
        return 1;
    int64_t top = pl->best;
    if (throughput(pl, top) < rate)
        return -1;
    int64_t lo = 1, hi = top;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (throughput(pl, mid) >= rate)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* ---- arrivals ---- */

static void fold(as_plan *pl, double arrival, int64_t samples)
{
    pl->arrivals++;
    double a = fmax2(pl->rate_alpha, 1.0 / (double)pl->arrivals);
    if (pl->has_last) {
        double gap = fmax2(0.0, arrival - pl->last_arrival);
        double weight = fmax2(pl->rate_alpha, 1.0 / (double)(pl->arrivals - 1));
        pl->gap = !pl->has_gap ? gap : pl->gap + weight * (gap - pl->gap);
        pl->has_gap = 1;
    }
    pl->mean_samples += a * ((double)samples - pl->mean_samples);
    pl->last_arrival = arrival;
    pl->has_last = 1;
}

static double arrival_rate(const as_plan *pl, double now)
{
    if (!pl->has_gap || !pl->has_last)
        return 0.0;
    double silence = now - pl->last_arrival;
    double gap = silence <= pl->gap ? pl->gap : pl->gap + pl->rate_alpha * (silence - pl->gap);
    if (gap <= 0.0)
        return INFINITY;
    return pl->mean_samples / gap;
}

static void save_arrivals(const as_plan *pl, as_plan_arrivals *k)
{
    *k = (as_plan_arrivals){pl->gap, pl->mean_samples, pl->last_arrival, pl->outpaced_since, pl->has_gap,
                            pl->has_last, pl->outpaced, pl->arrivals, pl->keep_up};
}

static void restore_arrivals(as_plan *pl, const as_plan_arrivals *k)
{
    pl->gap = k->gap;
    pl->mean_samples = k->mean_samples;
    pl->last_arrival = k->last_arrival;
    pl->outpaced_since = k->outpaced_since;
    pl->has_gap = k->has_gap;
    pl->has_last = k->has_last;
    pl->outpaced = k->outpaced;
    pl->arrivals = k->arrivals;
    pl->keep_up = k->keep_up;
}

/* ---- batch sizes ---- */

static double effective(const as_plan *pl, int64_t samples, int cautious)
{
    return (cautious ? pl->cautious : pl->slowdown) * predict(pl, samples);
}

double as_plan_effective(const as_plan *pl, int64_t b)
{
    return effective(pl, b, 1);
}

static double budget_of(const as_plan *pl, const as_pending *p)
{
    return isnan(p->budget) ? pl->budget : p->budget;
}

double as_plan_limit(const as_plan *pl, const as_pending *p)
{
    double limit = p->arrival - p->waited + budget_of(pl, p);
    return isnan(p->deadline) ? limit : fmin2(limit, p->deadline);
}

static int batching_pays(const as_plan *pl)
{
    int64_t m = imax(1, py_round(pl->mean_samples));
    return predict(pl, 2 * m) < 1.5 * predict(pl, m);
}

/* G and C (AdaptivePolicy._sizes) */
static void sizes(const as_plan *pl, double budget, int64_t max_batch_size, int64_t *g, int64_t *c)
{
    int64_t top = imax(1, max_batch_size);
    double turn = 1.0 + 1.0 / (double)pl->interpreters;
    if (turn * effective(pl, 1, 1) > budget) {
        *g = *c = imin(pl->efficient, top);
        return;
    }
    *g = imin(largest_batch_within(pl, budget / (turn * pl->cautious)), top);
    *c = batching_pays(pl) ? *g : imax(1, imin(*g, pl->efficient));
}

static int64_t backlog_batch(const as_plan *pl, double budget, int64_t max_batch_size)
{
    int64_t g, c;
    sizes(pl, budget, max_batch_size, &g, &c);
    return c;
}

/* -1: none keeps up */
static int64_t keep_up_batch(const as_plan *pl, double now, int64_t max_batch_size)
{
    if ((double)pl->arrivals * pl->rate_alpha < 1.0)
        return 1;
    double rate = arrival_rate(pl, now) * pl->slowdown / (double)pl->interpreters;
    int64_t b = smallest_batch_for(pl, rate * pl->headroom);
    if (b < 0)
        b = smallest_batch_for(pl, rate);
    if (b < 0)
        return -1;
    return imin(b, imax(1, max_batch_size));
}

static int64_t update_keep_up(as_plan *pl, double now, int64_t max_batch_size)
{
    int64_t keep_up = pl->keep_up = keep_up_batch(pl, now, max_batch_size);
    if (keep_up >= 0)
        pl->outpaced = 0;
    else if (!pl->outpaced) {
        pl->outpaced = 1;
        pl->outpaced_since = now;
    }
    return keep_up;
}

/* ---- batches in flight ---- */

static void dispatched(as_plan *pl, double now, int64_t samples)
{
    if (pl->n_flight == AS_PLAN_FLIGHT) { /* more than it can know of: forget the oldest */
        memmove(pl->flight, pl->flight + 1, sizeof pl->flight[0] * (AS_PLAN_FLIGHT - 1));
        pl->n_flight--;
    }
    pl->flight[pl->n_flight++] = (as_flight){now, pl->published ? predict(pl, samples) : 0.0};
}

/* the batch predicted to end first is forgotten */
static void land(as_plan *pl)
{
    if (pl->n_flight == 0)
        return;
    int at = 0;
    for (int i = 1; i < pl->n_flight; i++)
        if (pl->flight[i].start + pl->flight[i].predicted < pl->flight[at].start + pl->flight[at].predicted)
            at = i;
    memmove(pl->flight + at, pl->flight + at + 1, sizeof pl->flight[0] * (size_t)(pl->n_flight - at - 1));
    pl->n_flight--;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* When each interpreter can start a batch, soonest first (idle < 0: those no batch holds).
 * out holds at least max(idle, interpreters) + AS_PLAN_FLIGHT; returns how many. */
static int frees(const as_plan *pl, double now, int idle, int cautious, double *out)
{
    double scale = cautious ? pl->cautious : pl->slowdown;
    int free = idle < 0 ? pl->interpreters - pl->n_flight : idle;
    int n = 0;
    for (int i = 0; i < free; i++)
        out[n++] = now;
    double *ends = out + n;
    for (int i = 0; i < pl->n_flight; i++)
        ends[i] = fmax2(now, pl->flight[i].start + scale * pl->flight[i].predicted);
    qsort(ends, (size_t)pl->n_flight, sizeof(double), cmp_double);
    return n + pl->n_flight;
}

/* AdaptivePolicy._slots: each interpreter's start at the mean slowdown and the predicted
 * seconds of the batch it ends (0 if idle), soonest first (ties: the shorter batch) */
typedef struct {
    double end, seconds;
} as_slot;

static int cmp_slot(const void *a, const void *b)
{
    const as_slot *x = a, *y = b;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->seconds > y->seconds) - (x->seconds < y->seconds);
}

static int slots(const as_plan *pl, double now, as_slot *out)
{
    int n = 0;
    for (int i = pl->n_flight; i < pl->interpreters; i++)
        out[n++] = (as_slot){now, 0.0};
    as_slot *ends = out + n;
    for (int i = 0; i < pl->n_flight; i++)
        ends[i] = (as_slot){fmax2(now, pl->flight[i].start + pl->slowdown * pl->flight[i].predicted),
                            pl->flight[i].predicted};
    qsort(ends, (size_t)pl->n_flight, sizeof(as_slot), cmp_slot);
    return n + pl->n_flight;
}

/* ---- the decision ---- */

static int prefix(const int64_t *cum, int n, int64_t limit)
{
    int take = 1;
    for (int i = 0; i < n; i++) {
        if (cum[i] > limit)
            break;
        take = i + 1;
    }
    return take;
}

/* plan queue[from, to) on the interpreter that frees first (AdaptivePolicy._close) */
static void close_batch(const as_plan *pl, const as_pending *queue, int from, int to, int64_t samples, double *avail,
                        int n_avail, int64_t *late, double *total)
{
    int i = 0;
    for (int k = 1; k < n_avail; k++)
        if (avail[k] < avail[i])
            i = k;
    double end = avail[i] + effective(pl, samples, 0);
    avail[i] = end;
    for (int k = from; k < to; k++) {
        *total += end;
        if (end > as_plan_limit(pl, &queue[k]))
            (*late)++;
    }
}

static int best_take(const as_plan *pl, const as_pending *queue, int n, const int64_t *cum, const double *fr, int nf,
                     int low, int high, int64_t floor_)
{
    if (low >= high)
        return high;
    int best = low;
    double best_late = INFINITY, best_total = INFINITY;
    int64_t horizon = 2 * (int64_t)nf * cum[high - 1];
    double *avail = malloc(sizeof(double) * (size_t)nf);
    if (avail == NULL)
        return low;
    for (int take = low; take <= high; take++) {
        int64_t first = cum[take - 1], target = imax(first, floor_);
        memcpy(avail, fr, sizeof(double) * (size_t)nf);
        double end = avail[0] + effective(pl, first, 0);
        avail[0] = end;
        int64_t late = 0;
        double total = 0.0;
        for (int k = 0; k < take; k++) {
            total += end;
            if (end > as_plan_limit(pl, &queue[k]))
                late++;
        }
        int from = take, broke = 0;
        int64_t filled = 0, seen = first;
        for (int k = take; k < n; k++) {
            if (k > from && filled + queue[k].samples > target) {
                close_batch(pl, queue, from, k, filled, avail, nf, &late, &total);
                from = k;
                filled = 0;
                if (seen >= horizon) {
                    broke = 1;
                    break;
                }
            }
            filled += queue[k].samples;
            seen += queue[k].samples;
        }
        if (!broke && n > from)
            close_batch(pl, queue, from, n, filled, avail, nf, &late, &total);
        if ((double)late < best_late || ((double)late == best_late && total < best_total)) {
            best = take;
            best_late = (double)late;
            best_total = total;
        }
    }
    free(avail);
    return best;
}

/* 0: dispatch now; else when to dispatch (AdaptivePolicy._fill_by) */
static double fill_by(const as_plan *pl, double now, const as_pending *queue, int n, int64_t queued, int64_t target)
{
    double rate = arrival_rate(pl, now);
    if (rate <= 0.0)
        return NAN;
    double limit = INFINITY;
    for (int k = 0; k < n; k++)
        limit = fmin2(limit, as_plan_limit(pl, &queue[k]));
    double latest = fmin2(queue[0].arrival + pl->max_queue_delay, limit - effective(pl, target, 0));
    double fill = (double)(target - queued) / rate;
    double saving = predict(pl, queued) + predict(pl, target - queued) - predict(pl, target);
    if (now >= latest || now + fill > latest || fill * (double)n > saving)
        return NAN;
    return latest;
}

void as_plan_dispatched(as_plan *pl, double now, int64_t samples)
{
    pthread_mutex_lock(&pl->mu);
    dispatched(pl, now, samples);
    pthread_mutex_unlock(&pl->mu);
}

static int dispatch(as_plan *pl, double now, int take, int64_t samples)
{
    dispatched(pl, now, samples);
    return take;
}

int as_plan_decide(as_plan *pl, double now, const as_pending *queue, int n, int idle, int running,
                   int64_t max_batch_size, double *wake_at)
{
    *wake_at = NAN;
    pthread_mutex_lock(&pl->mu);
    int take = 0;
    while (pl->n_flight > running) /* batches that ended without being observed */
        land(pl);
    if (idle <= 0 || n == 0)
        goto out;
    if (!pl->published || max_batch_size <= 0) {
        take = dispatch(pl, now, 1, queue[0].samples);
        goto out;
    }
    if (n == 1 && (running == 0 || !batching_pays(pl))) {
        update_keep_up(pl, now, max_batch_size);
        take = dispatch(pl, now, 1, queue[0].samples);
        goto out;
    }
    int64_t *cum = malloc(sizeof(int64_t) * (size_t)n);
    double *fr = malloc(sizeof(double) * (size_t)(idle + AS_PLAN_FLIGHT + 1));
    if (cum == NULL || fr == NULL) {
        free(cum);
        free(fr);
        take = dispatch(pl, now, 1, queue[0].samples);
        goto out;
    }
    double budget = budget_of(pl, &queue[0]);
    int64_t queued = 0, total = 0;
    int fit = 0;
    for (int k = 0; k < n; k++)
        queued += queue[k].samples;
    for (int k = 0; k < n; k++) {
        if (fit && total + queue[k].samples > max_batch_size)
            break;
        total += queue[k].samples;
        cum[fit++] = total;
    }
    int64_t backlog = backlog_batch(pl, budget, max_batch_size);
    int64_t keep_up = update_keep_up(pl, now, max_batch_size);
    if (batching_pays(pl) && running > 0 && keep_up >= 0 && queued < keep_up && pl->mean_samples < (double)keep_up) {
        double wake = fill_by(pl, now, queue, n, queued, keep_up);
        if (!isnan(wake)) {
            *wake_at = wake;
            free(cum);
            free(fr);
            goto out;
        }
    }
    int top = prefix(cum, fit, backlog);
    int low = keep_up < 0 ? top : (int)imin(top, prefix(cum, fit, imin(keep_up, backlog)));
    int64_t floor_ = keep_up < 0 ? backlog : imax(1, imin(keep_up, backlog));
    int nf = frees(pl, now, idle, 0, fr);
    take = best_take(pl, queue, n, cum, fr, nf, low, top, floor_);
    take = dispatch(pl, now, take, cum[take - 1]);
    free(cum);
    free(fr);
out:
    pthread_mutex_unlock(&pl->mu);
    return take;
}

/* ---- admission ---- */

static double predicted_finish(const as_plan *pl, double now, int64_t queued_samples, int64_t samples, double within)
{
    int64_t c = backlog_batch(pl, pl->budget, pl->max_batch_size);
    int64_t low = pl->keep_up < 0 ? c : imin(pl->keep_up, c);
    as_slot sl[MAX_FREES_FOR_ADMIT];
    int n = slots(pl, now, sl);
    int64_t position = queued_samples + samples;
    double finish = INFINITY, mean = fmax2(1.0, pl->mean_samples);
    double margin = pl->cautious - pl->slowdown;
    for (int64_t b = low; b <= c; b++) {
        double per = fmax2(mean, (double)b - PACKING * (mean - 1.0));
        int64_t m = (int64_t)py_floordiv((double)(position - 1), per);
        int64_t k = m / n; /* the batches before its own on its interpreter */
        double before = predict(pl, (int64_t)ceil(per)); /* as full as whole requests fill b */
        double own = predict(pl, imax(b, (int64_t)ceil(per)));
        const as_slot *s = &sl[m % n];
        /* one caution over the summed variance of the batch ahead, those k and its own */
        finish = s->end + ((double)k * before + own) * pl->slowdown +
                 margin * sqrt(s->seconds * s->seconds + (double)k * before * before + own * own);
        if (finish <= within)
            break;
    }
    return finish;
}

static int admits_surely(const as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget,
                         double waited)
{
    double factor = pl->admit_factor * (1.0 - pl->overload_reserve);
    double limit = now - waited + factor * (isnan(budget) ? pl->budget : budget);
    double fr[MAX_FREES_FOR_ADMIT];
    int n = frees(pl, now, -1, 1, fr);
    int64_t g, c;
    sizes(pl, pl->budget, pl->max_batch_size, &g, &c);
    double m = fmax2(fmax2(1.0, pl->mean_samples), (double)samples);
    double batch = effective(pl, imax(g, (int64_t)ceil(m)), 1);
    int64_t turns = (queued_samples + samples - 1) / n + 1;
    return fr[n - 1] + (double)turns * batch <= limit;
}

static void arrive(as_plan *pl, double now, int64_t samples)
{
    fold(pl, now, samples);
    update_keep_up(pl, now, pl->max_batch_size);
}

static double admit(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget, double waited,
                    int count)
{
    if (!count) {
        if (admits_surely(pl, now, queued_samples, samples, budget, waited))
            return NAN;
        as_plan_arrivals kept;
        save_arrivals(pl, &kept);
        double wait = admit(pl, now, queued_samples, samples, budget, waited, 1);
        restore_arrivals(pl, &kept);
        return wait;
    }
    arrive(pl, now, samples);
    double factor = pl->admit_factor;
    if (pl->outpaced && now - pl->outpaced_since >= OVERLOAD_SUSTAINED_S)
        factor *= 1.0 - pl->overload_reserve;
    double limit = now - waited + factor * (isnan(budget) ? pl->budget : budget);
    double finish = predicted_finish(pl, now, queued_samples, samples, limit);
    if (finish <= limit)
        return NAN;
    int64_t c = backlog_batch(pl, pl->budget, pl->max_batch_size);
    return fmax2(finish - limit, effective(pl, c, 0) / (double)pl->interpreters);
}

double as_plan_admit(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget, double waited,
                     int count)
{
    pthread_mutex_lock(&pl->mu);
    double wait = pl->published ? admit(pl, now, queued_samples, samples, budget, waited, count) : NAN;
    if (!pl->published && count)
        fold(pl, now, samples);
    pthread_mutex_unlock(&pl->mu);
    return wait;
}

int as_plan_admits_surely(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget,
                          double waited)
{
    pthread_mutex_lock(&pl->mu);
    int surely = !pl->published || admits_surely(pl, now, queued_samples, samples, budget, waited);
    pthread_mutex_unlock(&pl->mu);
    return surely;
}

double as_plan_refuses(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget,
                       double waited)
{
    pthread_mutex_lock(&pl->mu);
    double wait = NAN;
    if (pl->published) {
        as_plan_arrivals kept;
        save_arrivals(pl, &kept);
        wait = admit(pl, now, queued_samples, samples, budget, waited, 1);
        if (isnan(wait))
            restore_arrivals(pl, &kept);
    }
    pthread_mutex_unlock(&pl->mu);
    return wait;
}

void as_plan_arrive(as_plan *pl, double now, int64_t samples)
{
    pthread_mutex_lock(&pl->mu);
    if (pl->published)
        arrive(pl, now, samples);
    else
        fold(pl, now, samples);
    pthread_mutex_unlock(&pl->mu);
}

static double admission_rate(const as_plan *pl)
{
    int64_t c = backlog_batch(pl, pl->budget, pl->max_batch_size);
    return (double)pl->interpreters * (double)c / effective(pl, c, 0) / fmax2(1.0, pl->mean_samples);
}

double as_plan_admission_rate(as_plan *pl)
{
    pthread_mutex_lock(&pl->mu);
    double rate = pl->published ? admission_rate(pl) : NAN;
    pthread_mutex_unlock(&pl->mu);
    return rate;
}

/* ---- what the batches took ---- */

void as_plan_finish(as_plan *pl, int ok, int64_t samples, double seconds)
{
    pthread_mutex_lock(&pl->mu);
    land(pl);
    if (ok && pl->published && samples >= 1 && seconds > 0.0 && isfinite(seconds)) {
        double ratio = fmin2(SLOWDOWN_HIGH, fmax2(SLOWDOWN_LOW, seconds / predict(pl, samples)));
        pl->observed++;
        double weight = fmax2(pl->slowdown_alpha, 1.0 / (double)pl->observed);
        pl->spread += fmax2(weight / 4, 1.0 / (double)pl->observed) * (fabs(ratio - pl->slowdown) - pl->spread);
        pl->slowdown += weight * (ratio - pl->slowdown);
        pl->cautious = pl->slowdown + CAUTION * pl->spread;
    }
    if (ok && samples >= 1 && seconds > 0.0 && isfinite(seconds)) {
        int at = (pl->done_at + pl->n_done) % AS_PLAN_OBSERVED;
        pl->done[at].samples = samples;
        pl->done[at].seconds = seconds;
        if (pl->n_done < AS_PLAN_OBSERVED)
            pl->n_done++;
        else
            pl->done_at = (pl->done_at + 1) % AS_PLAN_OBSERVED;
    }
    pthread_mutex_unlock(&pl->mu);
}

int as_plan_take_observed(as_plan *pl, int64_t *samples, double *seconds, int max)
{
    pthread_mutex_lock(&pl->mu);
    int n = pl->n_done < max ? pl->n_done : max;
    for (int i = 0; i < n; i++) {
        int at = (pl->done_at + i) % AS_PLAN_OBSERVED;
        samples[i] = pl->done[at].samples;
        seconds[i] = pl->done[at].seconds;
    }
    pl->done_at = (pl->done_at + n) % AS_PLAN_OBSERVED;
    pl->n_done -= n;
    pthread_mutex_unlock(&pl->mu);
    return n;
}

void as_plan_read(as_plan *pl, double now, as_plan_view *out)
{
    pthread_mutex_lock(&pl->mu);
    memset(out, 0, sizeof *out);
    out->arrival_rate = arrival_rate(pl, now);
    out->slowdown = pl->slowdown;
    out->cautious = pl->cautious;
    out->keep_up = pl->keep_up;
    out->in_flight = pl->n_flight;
    if (pl->published) {
        sizes(pl, pl->budget, pl->max_batch_size, &out->largest, &out->backlog);
        out->pays = batching_pays(pl);
        out->drain_rate = (double)pl->interpreters * (double)out->backlog / effective(pl, out->backlog, 0);
    }
    out->stages = pl->stages;
    out->join_active = pl->stages > 0 && (!pl->benefit || pl->may_pay);
    memcpy(out->shares, pl->shares, sizeof out->shares);
    out->profile_observations = pl->profile_observations;
    out->joins = pl->joins;
    out->joined_requests = pl->joined_requests;
    out->turned_away = pl->turned_away;
    pthread_mutex_unlock(&pl->mu);
}
