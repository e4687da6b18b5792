/* Plan: the Python type over one model's adaptive policy in C (plan.h), on the host.
 *
 * The host makes one per load of a model with the adaptive policy, publishes its fitted
 * cost curve into it, feeds the batches' times back into the curve (batching/native.py,
 * PlanFeed), and hands its address to the fronts (Link.target), whose requests the pool
 * then batches by it. Its methods are AdaptivePolicy's, for the host and for the tests
 * that hold the two to the same decisions.
 */
#include "common.h"
#include "plan.h"

#include <math.h>

typedef struct {
    PyObject_HEAD
    as_plan *plan;
} planobj;

static PyObject *plan_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"interpreters", "latency_budget_s", "max_queue_delay_s", "headroom", "rate_alpha",
                             "admit_factor", "overload_reserve", "slowdown_alpha", "contention", NULL};
    int interpreters = 0;
    double budget = NAN, delay = NAN, headroom = 1.25, rate_alpha = 0.05, admit_factor = 1.0, reserve = 0.0, slowdown_alpha = 0.2,
                          contention = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$idddddddd:Plan", kwlist, &interpreters, &budget, &delay,
                                     &headroom, &rate_alpha, &admit_factor, &reserve, &slowdown_alpha, &contention))
        return NULL;
    if (interpreters < 1 || interpreters > 64 || !(budget > 0.0) || !(delay >= 0.0) || !(rate_alpha > 0.0))
        return PyErr_Format(PyExc_ValueError,
                            "Plan: interpreters (1 to 64), latency_budget_s (> 0) and max_queue_delay_s (>= 0) "
                            "are required; rate_alpha must be > 0");
    planobj *self = (planobj *)tp->tp_alloc(tp, 0);
    if (self == NULL)
        return NULL;
    self->plan = as_plan_new(interpreters, budget, delay, headroom, rate_alpha, admit_factor, reserve, slowdown_alpha,
                             contention);
    if (self->plan == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void plan_dealloc(planobj *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->plan != NULL)
        as_plan_drop(self->plan);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static double opt_double(PyObject *o, double none)
{
    return o == Py_None ? none : PyFloat_AsDouble(o);
}

static PyObject *wait_or_none(double wait)
{
    if (isnan(wait))
        Py_RETURN_NONE;
    return PyFloat_FromDouble(wait);
}

/* publish(predict, max_batch_size, best, efficient) */
static PyObject *plan_publish(planobj *self, PyObject *args)
{
    PyObject *seq;
    long long max_batch_size, best, efficient;
    if (!PyArg_ParseTuple(args, "OLLL:publish", &seq, &max_batch_size, &best, &efficient))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "Plan.publish: predict must be a sequence of seconds");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n < 1 || n > 1 << 20 || best < 1 || efficient < 1 || max_batch_size < 0) {
        Py_DECREF(fast);
        return PyErr_Format(PyExc_ValueError, "Plan.publish: 1 to 2**20 predictions, best and efficient >= 1");
    }
    double *table = PyMem_Malloc(sizeof(double) * (size_t)n);
    if (table == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        table[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (table[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(table);
            Py_DECREF(fast);
            return NULL;
        }
        if (!(table[i] > 0.0) || !isfinite(table[i])) {
            PyMem_Free(table);
            Py_DECREF(fast);
            return PyErr_Format(PyExc_ValueError, "Plan.publish: prediction %zd is not a positive number", i + 1);
        }
    }
    Py_DECREF(fast);
    int rc = as_plan_publish(self->plan, table, (int)n, max_batch_size, best, efficient);
    PyMem_Free(table);
    if (rc < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* decide(now, queue, idle, running, max_batch_size) -> (take, wake_at or None); queue: objects
 * with arrival, samples, deadline, budget and waited (batching/policy.py, Pending) */
static PyObject *plan_decide(planobj *self, PyObject *args)
{
    double now;
    PyObject *queue;
    int idle, running;
    long long max_batch_size;
    if (!PyArg_ParseTuple(args, "dOiiL:decide", &now, &queue, &idle, &running, &max_batch_size))
        return NULL;
    PyObject *fast = PySequence_Fast(queue, "Plan.decide: queue must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    as_pending *pending = PyMem_Calloc(n ? (size_t)n : 1, sizeof *pending);
    if (pending == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    static const char *fields[] = {"arrival", "samples", "deadline", "budget", "waited"};
    for (Py_ssize_t i = 0; i < n && !PyErr_Occurred(); i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(fast, i), *v[5] = {NULL};
        for (int f = 0; f < 5; f++)
            if ((v[f] = PyObject_GetAttrString(p, fields[f])) == NULL)
                break;
        if (!PyErr_Occurred()) {
            pending[i].arrival = PyFloat_AsDouble(v[0]);
            pending[i].samples = PyLong_AsLongLong(v[1]);
            pending[i].deadline = opt_double(v[2], NAN);
            pending[i].budget = opt_double(v[3], NAN);
            pending[i].waited = PyFloat_AsDouble(v[4]);
        }
        for (int f = 0; f < 5; f++)
            Py_XDECREF(v[f]);
    }
    Py_DECREF(fast);
    if (PyErr_Occurred()) {
        PyMem_Free(pending);
        return NULL;
    }
    double wake;
    int take = as_plan_decide(self->plan, now, pending, (int)n, idle, running, max_batch_size, &wake);
    PyMem_Free(pending);
    if (isnan(wake))
        return Py_BuildValue("(iO)", take, Py_None);
    return Py_BuildValue("(id)", take, wake);
}

/* the arguments admit, admits_surely and refuses share: (now, queued, samples=1, budget=None, waited=0.0) */
static int admission_args(PyObject *args, PyObject *kwds, const char *name, double *now, long long *queued,
                          long long *samples, double *budget, double *waited, int *count)
{
    static char *kwlist[] = {"now", "queued_samples", "samples", "budget", "waited", "count", NULL};
    PyObject *budget_obj = Py_None;
    *samples = 1;
    *waited = 0.0;
    char format[48];
    snprintf(format, sizeof format, "dL|LOd$p:%s", name);
    if (!PyArg_ParseTupleAndKeywords(args, kwds, format, kwlist, now, queued, samples, &budget_obj, waited, count))
        return -1;
    *budget = opt_double(budget_obj, NAN);
    return *budget == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *plan_admit(planobj *self, PyObject *args, PyObject *kwds)
{
    double now, budget, waited;
    long long queued, samples;
    int count = 1;
    if (admission_args(args, kwds, "admit", &now, &queued, &samples, &budget, &waited, &count) < 0)
        return NULL;
    return wait_or_none(as_plan_admit(self->plan, now, queued, samples, budget, waited, count));
}

static PyObject *plan_admits_surely(planobj *self, PyObject *args, PyObject *kwds)
{
    double now, budget, waited;
    long long queued, samples;
    int count = 1;
    if (admission_args(args, kwds, "admits_surely", &now, &queued, &samples, &budget, &waited, &count) < 0)
        return NULL;
    return PyBool_FromLong(as_plan_admits_surely(self->plan, now, queued, samples, budget, waited));
}

static PyObject *plan_refuses(planobj *self, PyObject *args, PyObject *kwds)
{
    double now, budget, waited;
    long long queued, samples;
    int count = 1;
    if (admission_args(args, kwds, "refuses", &now, &queued, &samples, &budget, &waited, &count) < 0)
        return NULL;
    return wait_or_none(as_plan_refuses(self->plan, now, queued, samples, budget, waited));
}

static PyObject *plan_arrive(planobj *self, PyObject *args)
{
    double now;
    long long samples = 1;
    if (!PyArg_ParseTuple(args, "d|L:arrive", &now, &samples))
        return NULL;
    as_plan_arrive(self->plan, now, samples);
    Py_RETURN_NONE;
}

/* finish(ok, samples, seconds): a batch it dispatched ended */
static PyObject *plan_finish(planobj *self, PyObject *args)
{
    int ok;
    long long samples;
    double seconds;
    if (!PyArg_ParseTuple(args, "pLd:finish", &ok, &samples, &seconds))
        return NULL;
    as_plan_finish(self->plan, ok, samples, seconds);
    Py_RETURN_NONE;
}

/* observed() -> [(samples, seconds)]: the batches finished since the last call, oldest first */
static PyObject *plan_observed(planobj *self, PyObject *Py_UNUSED(ignored))
{
    int64_t samples[AS_PLAN_OBSERVED];
    double seconds[AS_PLAN_OBSERVED];
    int n = as_plan_take_observed(self->plan, samples, seconds, AS_PLAN_OBSERVED);
    PyObject *out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        PyObject *pair = Py_BuildValue("(Ld)", (long long)samples[i], seconds[i]);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *plan_admission_rate(planobj *self, PyObject *Py_UNUSED(ignored))
{
    return wait_or_none(as_plan_admission_rate(self->plan));
}

/* A sequence of numbers into out (at most max), as doubles or int64s; its length, or -1 with
 * an exception set. */
static Py_ssize_t numbers(PyObject *seq, const char *what, double *dout, int64_t *iout, Py_ssize_t max)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: at most %zd", what, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(fast, i);
        if (dout != NULL)
            dout[i] = PyFloat_AsDouble(x);
        else
            iout[i] = PyLong_AsLongLong(x);
        if (PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return n;
}

/* join_setup(shares, benefit, alpha) */
static PyObject *plan_join_setup(planobj *self, PyObject *args)
{
    PyObject *seq;
    int benefit;
    double alpha;
    if (!PyArg_ParseTuple(args, "Opd:join_setup", &seq, &benefit, &alpha))
        return NULL;
    double shares[AS_PLAN_STAGES];
    Py_ssize_t n = numbers(seq, "Plan.join_setup: shares", shares, NULL, AS_PLAN_STAGES);
    if (n < 0)
        return NULL;
    if (as_plan_join_setup(self->plan, (int)n, shares, benefit, alpha) < 0)
        return PyErr_Format(PyExc_ValueError, "Plan.join_setup: 1 to %d stage shares and 0 < alpha <= 1",
                            AS_PLAN_STAGES);
    Py_RETURN_NONE;
}

static PyObject *plan_may_pay(planobj *self, PyObject *arg)
{
    int flag = PyObject_IsTrue(arg);
    if (flag < 0)
        return NULL;
    as_plan_join_may_pay(self->plan, flag);
    Py_RETURN_NONE;
}

/* join(now, done, elapsed, samples, limit, sizes, limits, max_batch_size, offered, requests, free_at) */
static PyObject *plan_join(planobj *self, PyObject *args)
{
    double now, elapsed, limit;
    int done;
    long long samples, max_batch_size, requests;
    PyObject *sizes_seq, *limits_seq, *offered_seq, *free_obj;
    if (!PyArg_ParseTuple(args, "didLdOOLOLO:join", &now, &done, &elapsed, &samples, &limit, &sizes_seq, &limits_seq,
                          &max_batch_size, &offered_seq, &requests, &free_obj))
        return NULL;
    enum { MAX = 1024 };
    int64_t sizes[MAX], offered[MAX];
    double limits[MAX];
    Py_ssize_t n = numbers(sizes_seq, "Plan.join: sizes", NULL, sizes, MAX);
    Py_ssize_t nl = n < 0 ? -1 : numbers(limits_seq, "Plan.join: limits", limits, NULL, MAX);
    Py_ssize_t no = nl < 0 ? -1 : numbers(offered_seq, "Plan.join: offered", NULL, offered, MAX);
    if (no < 0)
        return NULL;
    if (nl != n)
        return PyErr_Format(PyExc_ValueError, "Plan.join: sizes and limits differ in length");
    double free_at = free_obj == Py_None ? NAN : PyFloat_AsDouble(free_obj);
    if (free_at == -1.0 && PyErr_Occurred())
        return NULL;
    int last = 0;
    double end = 0.0;
    int take = as_plan_join_plan(self->plan, now, done, elapsed, samples, limit, sizes, limits, (int)n, max_batch_size,
                                 offered, (int)no, requests, free_at, &last, &end);
    if (take == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(iid)", take, last, end);
}

/* own_end(start, now, samples, offered, done) */
static PyObject *plan_own_end(planobj *self, PyObject *args)
{
    double start, now;
    long long samples;
    PyObject *offered_seq;
    int done;
    if (!PyArg_ParseTuple(args, "ddLOi:own_end", &start, &now, &samples, &offered_seq, &done))
        return NULL;
    int64_t offered[256];
    Py_ssize_t n = numbers(offered_seq, "Plan.own_end: offered", NULL, offered, 256);
    if (n < 0)
        return NULL;
    return PyFloat_FromDouble(as_plan_join_own_end(self->plan, start, now, samples, offered, (int)n, done));
}

static PyObject *plan_observe_stages(planobj *self, PyObject *arg)
{
    double seconds[AS_PLAN_STAGES];
    Py_ssize_t n = numbers(arg, "Plan.observe_stages: seconds", seconds, NULL, AS_PLAN_STAGES);
    if (n < 0)
        return NULL;
    as_plan_join_observe(self->plan, seconds, (int)n);
    Py_RETURN_NONE;
}

/* read(now) -> dict: what metrics and metadata show of it */
static PyObject *plan_read(planobj *self, PyObject *arg)
{
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    as_plan_view v;
    as_plan_read(self->plan, now, &v);
    PyObject *keep_up = v.keep_up < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(v.keep_up);
    if (keep_up == NULL)
        return NULL;
    PyObject *state = Py_BuildValue(
        "{s:d,s:d,s:d,s:L,s:L,s:N,s:L,s:O,s:d}", "arrival_rate_samples_per_s", v.arrival_rate, "slowdown", v.slowdown,
        "slowdown_cautious", v.cautious, "largest_batch", (long long)v.largest, "backlog_batch", (long long)v.backlog,
        "keep_up_batch", keep_up, "in_flight", (long long)v.in_flight, "batching_pays", v.pays ? Py_True : Py_False,
        "drain_rate_samples_per_s", v.drain_rate);
    if (state == NULL || v.stages == 0)
        return state;
    PyObject *shares = PyList_New(v.stages);
    for (int i = 0; shares != NULL && i < v.stages; i++) {
        PyObject *x = PyFloat_FromDouble(v.shares[i]);
        if (x == NULL)
            Py_CLEAR(shares);
        else
            PyList_SET_ITEM(shares, i, x);
    }
    PyObject *join = shares == NULL ? NULL : Py_BuildValue(
        "{s:O,s:N,s:L,s:L,s:L,s:L}", "active", v.join_active ? Py_True : Py_False, "stage_shares", shares,
        "profile_observations", (long long)v.profile_observations, "joins", (long long)v.joins, "joined_requests",
        (long long)v.joined_requests, "offers_turned_away", (long long)v.turned_away);
    if (join == NULL || PyDict_SetItemString(state, "join", join) < 0)
        Py_CLEAR(state);
    Py_XDECREF(join);
    return state;
}

static PyObject *plan_address(planobj *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)self->plan);
}

static PyMethodDef plan_methods[] = {
    {"publish", (PyCFunction)plan_publish, METH_VARARGS,
     "publish(predict, max_batch_size, best, efficient): the fitted cost curve (predict[b - 1]: seconds of a "
     "batch of b, for b up to at least 2 x max_batch_size) and its throughput-optimal and efficient sizes"},
    {"decide", (PyCFunction)plan_decide, METH_VARARGS,
     "decide(now, queue, idle, running, max_batch_size) -> (take, wake_at or None): AdaptivePolicy.decide"},
    {"admit", (PyCFunction)(void (*)(void))plan_admit, METH_VARARGS | METH_KEYWORDS,
     "admit(now, queued_samples, samples=1, budget=None, waited=0.0, *, count=True) -> Retry-After or None"},
    {"admits_surely", (PyCFunction)(void (*)(void))plan_admits_surely, METH_VARARGS | METH_KEYWORDS,
     "admits_surely(now, queued_samples, samples=1, budget=None, waited=0.0) -> bool"},
    {"refuses", (PyCFunction)(void (*)(void))plan_refuses, METH_VARARGS | METH_KEYWORDS,
     "refuses(now, queued_samples, samples=1, budget=None, waited=0.0) -> Retry-After or None"},
    {"arrive", (PyCFunction)plan_arrive, METH_VARARGS, "arrive(now, samples=1): count an arrival"},
    {"finish", (PyCFunction)plan_finish, METH_VARARGS,
     "finish(ok, samples, seconds): a batch it dispatched ended (ok: it took `seconds`)"},
    {"observed", (PyCFunction)plan_observed, METH_NOARGS,
     "observed() -> [(samples, seconds)]: the batches that ended since the last call, oldest first"},
    {"admission_rate", (PyCFunction)plan_admission_rate, METH_NOARGS,
     "admission_rate() -> requests/s admitted while overloaded, or None before a curve is published"},
    {"read", (PyCFunction)plan_read, METH_O, "read(now) -> dict of its state"},
    {"join_setup", (PyCFunction)plan_join_setup, METH_VARARGS,
     "join_setup(shares, benefit, alpha): the model joins at stage boundaries; its measured stage shares, whether "
     "a join must lower the total latency, the weight of one batch's timings in the shares"},
    {"may_pay", (PyCFunction)plan_may_pay, METH_O, "may_pay(flag): whether a join can pay on the published curve"},
    {"join", (PyCFunction)plan_join, METH_VARARGS,
     "join(now, done, elapsed, samples, limit, sizes, limits, max_batch_size, offered, requests, free_at) -> "
     "(take, last_stage, finish) or None: JoinPlanner.plan"},
    {"own_end", (PyCFunction)plan_own_end, METH_VARARGS,
     "own_end(start, now, samples, offered, done) -> seconds: JoinPlanner.own_end"},
    {"observe_stages", (PyCFunction)plan_observe_stages, METH_O,
     "observe_stages(seconds): a batch that ran as dispatched took seconds[i] in stage i"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"address", (getter)plan_address, NULL, "its memory's address, for Link.target", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_doc, "Plan(*, interpreters, latency_budget_s, max_queue_delay_s, headroom=1.25, rate_alpha=0.05, "
                "admit_factor=1.0, overload_reserve=0.0, slowdown_alpha=0.2, contention=1.0): one model's "
                "adaptive batching policy in C, shared by every loop and the pool (native/host/plan.h)"},
    {Py_tp_new, plan_new},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_methods, plan_methods},
    {Py_tp_getset, plan_getset},
    {0, NULL},
};

PyType_Spec as_plan_spec = {
    .name = "aserve._native.Plan",
    .basicsize = sizeof(planobj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = plan_slots,
};
