/* Layer joining's planner over a Plan's curve (plan.h): JoinPlanner and StageProfile.
 *
 * batching/join.py is the reference: the same formulas in the same order of arithmetic,
 * held to it on the same traces in virtual time (tests/batching). Its module docstring
 * says why each one is what it is. Every batch is as long as the curve times the cautious
 * slowdown (as_plan_effective), as JoinPlanner's with the policy's scale. The pool (pool_join.c) asks as_plan_join_plan when no
 * interpreter is free for a model's queued requests, and reports back what joined and what
 * each batch that ran as dispatched took per stage.
 */
#include "plan.h"

#include <math.h>
#include <string.h>

static inline double fmax2(double a, double b) { return a > b ? a : b; }

int as_plan_join_setup(as_plan *pl, int stages, const double *shares, int benefit, double alpha)
{
    if (stages < 1 || stages > AS_PLAN_STAGES || !(alpha > 0.0 && alpha <= 1.0))
        return -1;
    pthread_mutex_lock(&pl->mu);
    pl->stages = stages;
    memcpy(pl->shares, shares, sizeof(double) * (size_t)stages);
    pl->benefit = benefit;
    pl->profile_alpha = alpha;
    pthread_mutex_unlock(&pl->mu);
    return 0;
}

void as_plan_join_may_pay(as_plan *pl, int may_pay)
{
    pthread_mutex_lock(&pl->mu);
    pl->may_pay = may_pay;
    pthread_mutex_unlock(&pl->mu);
}

int as_plan_join_active(as_plan *pl)
{
    pthread_mutex_lock(&pl->mu);
    int active = pl->stages > 0 && pl->published && (!pl->benefit || pl->may_pay) ? 1 + (pl->benefit != 0) : 0;
    pthread_mutex_unlock(&pl->mu);
    return active;
}

/* StageProfile.done: the share of a batch's time spent in stages 1..k */
static double done_share(const as_plan *pl, int k)
{
    double s = 0.0;
    for (int i = 0; i < k && i < pl->stages; i++)
        s += pl->shares[i];
    return s < 1.0 ? s : 1.0;
}

static double offered_seconds(const as_plan *pl, const int64_t *offered, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += as_plan_effective(pl, offered[i]);
    return s;
}

/* JoinPlanner.finish */
static double finish(const as_plan *pl, double start, double now, int64_t samples, int64_t joining, int k,
                     const int64_t *offered, int n_offered)
{
    double f = done_share(pl, k);
    double boundary =
        fmax2(now, start + f * (as_plan_effective(pl, samples) + offered_seconds(pl, offered, n_offered)));
    return boundary + f * as_plan_effective(pl, joining) + (1.0 - f) * as_plan_effective(pl, samples + joining);
}

/* JoinPlanner.own_end */
static double own_end(const as_plan *pl, double start, double now, int64_t samples, const int64_t *offered,
                      int n_offered, int done)
{
    double f = done_share(pl, done + 1);
    return fmax2(now, start + as_plan_effective(pl, samples) + f * offered_seconds(pl, offered, n_offered));
}

double as_plan_join_own_end(as_plan *pl, double start, double now, int64_t samples, const int64_t *offered,
                            int n_offered, int done)
{
    pthread_mutex_lock(&pl->mu);
    double end = own_end(pl, start, now, samples, offered, n_offered, done);
    pthread_mutex_unlock(&pl->mu);
    return end;
}

/* JoinPlanner._pays */
static int pays(const as_plan *pl, double start, double now, int64_t samples, const int64_t *offered, int n_offered,
                int first, double end, int64_t joining, int64_t group, int64_t requests, double free_at)
{
    double own = own_end(pl, start, now, samples, offered, n_offered, first - 1);
    double delay = fmax2(0.0, end - own);
    double gain = fmax2(now, free_at) + as_plan_effective(pl, joining) - end;
    return (double)group * gain > (double)requests * delay;
}

int as_plan_join_plan(as_plan *pl, double now, int done, double elapsed, int64_t samples, double limit,
                      const int64_t *sizes, const double *limits, int n, int64_t max_batch_size,
                      const int64_t *offered, int n_offered, int64_t requests, double free_at, int *last_stage,
                      double *finish_at)
{
    int take = 0;
    pthread_mutex_lock(&pl->mu);
    int last = pl->stages - 1, first = done + 1;
    if (pl->stages < 1 || !pl->published || elapsed < 0.0 || first > last)
        goto out;
    double start = now - elapsed;
    for (int t = n; t > 0; t--) {
        int64_t joining = sizes[t - 1];
        if (samples + joining > max_batch_size)
            continue;
        double bound = limits[t - 1] < limit ? limits[t - 1] : limit;
        int best = -1;
        for (int k = first; k <= last; k++) {
            if (finish(pl, start, now, samples, joining, k, offered, n_offered) > bound)
                break;
            best = k;
        }
        if (best < 0)
            continue;
        double end = finish(pl, start, now, samples, joining, first, offered, n_offered);
        if (!isnan(free_at) && !pays(pl, start, now, samples, offered, n_offered, first, end, joining, t, requests,
                                     free_at))
            continue;
        take = t;
        *last_stage = best;
        *finish_at = end;
        break;
    }
out:
    pthread_mutex_unlock(&pl->mu);
    return take;
}

/* StageProfile.observe */
void as_plan_join_observe(as_plan *pl, const double *seconds, int n)
{
    pthread_mutex_lock(&pl->mu);
    double total = 0.0;
    int ok = n == pl->stages && n > 0;
    for (int i = 0; ok && i < n; i++) {
        total += seconds[i];
        ok = seconds[i] >= 0.0;
    }
    if (ok && total > 0.0 && isfinite(total)) {
        double norm = 0.0, a = pl->profile_alpha;
        for (int i = 0; i < n; i++) {
            pl->shares[i] = pl->shares[i] + a * (seconds[i] / total - pl->shares[i]);
            norm += pl->shares[i];
        }
        for (int i = 0; i < n; i++)
            pl->shares[i] = pl->shares[i] / norm;
        pl->profile_observations++;
    }
    pthread_mutex_unlock(&pl->mu);
}

void as_plan_joined(as_plan *pl, int64_t groups, int64_t requests)
{
    pthread_mutex_lock(&pl->mu);
    pl->joins += groups;
    pl->joined_requests += requests;
    pthread_mutex_unlock(&pl->mu);
}

void as_plan_turned_away(as_plan *pl)
{
    pthread_mutex_lock(&pl->mu);
    pl->turned_away++;
    pthread_mutex_unlock(&pl->mu);
}
