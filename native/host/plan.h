/* The adaptive batching policy in C (plan.c), over the state the host publishes.
 *
 * batching/adaptive.py's AdaptivePolicy is the reference: the same rules, the same order of
 * arithmetic, tested against it on the same traces in virtual time (tests/batching). The
 * host fits the model's cost curve and publishes it here as a table (predicted seconds of a
 * batch of b samples); the arrival rate, the slowdown and the batches in flight are kept
 * here, because every front loop's admission and the pool's workers change them.
 *
 * One as_plan per model load, in memory shared by every loop (like counter.c's Counter):
 * the host allocates it, fronts and queued jobs hold references. Every function below
 * takes plan->mu itself; the pool calls as_plan_decide and as_plan_finish under p->mu
 * (lock order: p->mu, then plan->mu; nothing here takes p->mu).
 */
#ifndef ASERVE_HOST_PLAN_H
#define ASERVE_HOST_PLAN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define AS_PLAN_FLIGHT 128  /* batches in flight it remembers (more than any pool's workers) */
#define AS_PLAN_OBSERVED 256 /* finished batches kept for the host's cost model, oldest dropped */
#define AS_PLAN_STAGES 64    /* as abi.h's AS_MAX_STAGES */

/* One queued request, as the policy sees it (batching/policy.py, Pending). Times in seconds
 * on CLOCK_MONOTONIC; deadline and budget NAN where the request has none. */
typedef struct {
    double arrival, deadline, budget, waited;
    int64_t samples;
} as_pending;

typedef struct {
    double start, predicted;
} as_flight;

typedef struct as_plan {
    pthread_mutex_t mu;
    _Atomic int64_t refs;
    /* settings (AdaptivePolicy's arguments) */
    int interpreters;
    double budget, max_queue_delay, headroom, rate_alpha, admit_factor, overload_reserve, slowdown_alpha;
    double contention;
    /* the cost curve, as the host last published it: predict[b - 1] for b in 1..n_predict */
    int64_t max_batch_size; /* the cost model's */
    int n_predict;
    double *predict;
    int64_t best, efficient; /* throughput-optimal and efficient batch sizes of that curve */
    int published;           /* a curve was published: until then every decision takes one request */
    /* the arrival rate */
    double gap, mean_samples, last_arrival, outpaced_since;
    int has_gap, has_last, outpaced;
    int64_t arrivals;
    int64_t keep_up; /* at the last decision; -1: none keeps up */
    /* the slowdown */
    double slowdown, spread, cautious;
    int64_t observed;
    /* batches in flight, and batches finished since the host last read them */
    int n_flight;
    as_flight flight[AS_PLAN_FLIGHT];
    int n_done, done_at;
    struct {
        int64_t samples;
        double seconds;
    } done[AS_PLAN_OBSERVED];
    /* layer joining (plan_join.c): the stage profile, learned here from the stage timings of
     * batches that ran as dispatched; the rule; whether the published curve lets a join pay */
    int stages; /* 0: the model's batches run whole */
    double shares[AS_PLAN_STAGES], profile_alpha;
    int64_t profile_observations;
    int benefit, may_pay;
    int64_t joins, joined_requests, turned_away;
} as_plan;

typedef struct {
    double gap, mean_samples, last_arrival, outpaced_since;
    int has_gap, has_last, outpaced;
    int64_t arrivals, keep_up;
} as_plan_arrivals;

/* A new plan, one reference held; NULL when out of memory. */
as_plan *as_plan_new(int interpreters, double budget, double max_queue_delay, double headroom, double rate_alpha,
                     double admit_factor, double overload_reserve, double slowdown_alpha, double contention);
void as_plan_hold(as_plan *pl);
void as_plan_drop(as_plan *pl);

/* The host's fitted curve: predict[b - 1] seconds for b in 1..n (n >= 2 x max_batch_size),
 * its throughput-optimal and efficient sizes. 0, or -1 when out of memory. */
int as_plan_publish(as_plan *pl, const double *predict, int n, int64_t max_batch_size, int64_t best,
                    int64_t efficient);

/* AdaptivePolicy.decide: how many requests from the head of `queue` to dispatch now as one
 * batch (0: wait until *wake_at, or NAN: the next arrival or completion). A dispatch is
 * remembered as in flight until as_plan_finish. */
int as_plan_decide(as_plan *pl, double now, const as_pending *queue, int n, int idle, int running,
                   int64_t max_batch_size, double *wake_at);

/* A batch of `samples` that the policy did not decide (a front's traced batch) started at `now`:
 * it is in flight until as_plan_finish, as a batch as_plan_decide chose would be. */
void as_plan_dispatched(as_plan *pl, double now, int64_t samples);

/* AdaptivePolicy.admit: NAN to admit, else a Retry-After in seconds. budget NAN: the policy's.
 * count 0: asked from a request's head, nothing counted. */
double as_plan_admit(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget, double waited,
                     int count);
/* AdaptivePolicy.admits_surely and .refuses */
int as_plan_admits_surely(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget,
                          double waited);
double as_plan_refuses(as_plan *pl, double now, int64_t queued_samples, int64_t samples, double budget,
                       double waited);
void as_plan_arrive(as_plan *pl, double now, int64_t samples);
double as_plan_admission_rate(as_plan *pl);

/* A batch it dispatched ended: ok, it held an interpreter `seconds` for `samples`, which
 * refines the slowdown and is kept for the host's cost model; not ok (failed, cancelled), it
 * only leaves the batches in flight. */
void as_plan_finish(as_plan *pl, int ok, int64_t samples, double seconds);
/* The batches finished since the last call, oldest first, into out (at most max); how many. */
int as_plan_take_observed(as_plan *pl, int64_t *samples, double *seconds, int max);

/* When queued request p must finish: its arrival less what it waited before, plus its budget
 * (or the policy's), or its deadline if earlier (join.py's tightest). The budget is fixed at
 * creation: no lock needed. */
double as_plan_limit(const as_plan *pl, const as_pending *p);

/* plan.c, caller holds pl->mu: seconds one batch of b samples is expected to take now: the
 * published curve times the cautious slowdown, as admission plans with. */
double as_plan_effective(const as_plan *pl, int64_t b);

/* ---- layer joining (plan_join.c; join.py's JoinPlanner and StageProfile are the reference) ---- */

/* The model runs its batches in `stages` stages whose shares of a batch's time were measured
 * (shares, normalised here); benefit: a join must also lower the total latency; alpha: the
 * weight of one batch's stage timings in the shares. 0, or -1 on bad arguments. */
int as_plan_join_setup(as_plan *pl, int stages, const double *shares, int benefit, double alpha);
/* Whether a join can pay on the curve the host fitted (JoinPlanner.may_pay), with each publish. */
void as_plan_join_may_pay(as_plan *pl, int may_pay);
/* Whether batches run stage by stage and queued requests are offered to them now: 0 no, 1 yes
 * (joins must fit the budgets), 2 yes (joins must also lower the total latency). */
int as_plan_join_active(as_plan *pl);
/* JoinPlanner.plan: how many requests from the head of a queue (cumulative samples sizes[i]
 * and tightest finish limits limits[i] of the first i + 1) to offer a batch running for
 * `elapsed` s with `done` stages done, `samples` samples and `requests` requests (with the
 * n_offered groups offered to it before, of offered[i] samples), whose earliest limit is
 * `limit`; free_at NAN: budgets only. 0: none; else *last_stage and *finish are set. */
int as_plan_join_plan(as_plan *pl, double now, int done, double elapsed, int64_t samples, double limit,
                      const int64_t *sizes, const double *limits, int n, int64_t max_batch_size,
                      const int64_t *offered, int n_offered, int64_t requests, double free_at, int *last_stage,
                      double *finish);
/* JoinPlanner.own_end: the predicted end of a running batch as it stands. */
double as_plan_join_own_end(as_plan *pl, double start, double now, int64_t samples, const int64_t *offered,
                            int n_offered, int done);
/* A batch ran as it was dispatched in n stages of seconds[i]: the profile learns from it. */
void as_plan_join_observe(as_plan *pl, const double *seconds, int n);
/* A batch ended with `groups` groups of `requests` requests joined to it; an offer turned away. */
void as_plan_joined(as_plan *pl, int64_t groups, int64_t requests);
void as_plan_turned_away(as_plan *pl);

/* Read under plan->mu, for the host's metrics. */
typedef struct {
    double arrival_rate, slowdown, cautious, drain_rate;
    int64_t largest, backlog, keep_up, in_flight;
    int pays;
    int stages, join_active;
    double shares[AS_PLAN_STAGES];
    int64_t profile_observations, joins, joined_requests, turned_away;
} as_plan_view;
void as_plan_read(as_plan *pl, double now, as_plan_view *out);

#endif
