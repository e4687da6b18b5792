/* Trace recording on the event loop: sampling, ids, and the numeric records of sampled
 * requests and their batches (aserve/tracing/recorder.py says what is recorded and why).
 *
 * A Recorder samples each request as it starts (the W3C `traceparent` header parsed here,
 * roots decided by a run of Bernoulli trials drawn at once), draws ids from its own
 * generator, and keeps three growing arrays of unsigned 64-bit numbers: request records,
 * batch records and links, in the layout the exporter reads. A sampled request is a
 * RequestTrace, a plain object (not tracked by the garbage collector: a traced request
 * must not bring collections onto the loop) holding its ids, the times of its phases from
 * the system clock, and its batch's facts; `end(status)` appends its record. What does not
 * fit the numbers (errors, attributes of its own) returns False there and is recorded as a
 * span by the Python recorder.
 *
 * Everything here runs on the event loop's thread, under the host GIL: no lock.
 * `notify` (the Python tracer's wake-up) is called when the first record waits (it arms
 * the flush timer) and when `max_batch` wait (it exports).
 */
#include "common.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define NEVER (LLONG_MAX / 2) /* roots to the next sampled one when none is */

typedef struct {
    uint64_t *v;
    size_t len, cap;
} u64s;

/* Room for `more` numbers at the end of b; -1 with MemoryError. */
static int u64s_room(u64s *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more)
        cap *= 2;
    uint64_t *v = PyMem_Realloc(b->v, cap * sizeof(uint64_t));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->v = v;
    b->cap = cap;
    return 0;
}

static PyObject *u64s_take(u64s *b)
{
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)b->v, (Py_ssize_t)(b->len * sizeof(uint64_t)));
    if (bytes != NULL)
        b->len = 0;
    return bytes;
}

static inline uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- ids: xoshiro256** seeded from the kernel ---- */

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void seed_from(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

/* A number in [0, bound): the high half of a 128-bit product (bias below bound / 2^64). */
static inline uint64_t below(uint64_t s[4], uint64_t bound)
{
    return (uint64_t)(((unsigned __int128)next_u64(s) * bound) >> 64);
}

/* ---- the W3C traceparent header ---- */

static int hex_digits(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; /* HEXDIGLC only */
        if (d < 0)
            return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* version-traceid-parentid-flags: 0 and the fields, or -1 when the value is not one
 * (version ff, or 00 with more fields, ids of zeros, anything not lower-case hex): then
 * the request starts a trace of its own, as W3C Trace Context asks. */
static int parse_traceparent(const char *s, Py_ssize_t n, uint64_t *hi, uint64_t *lo, uint64_t *parent, int *sampled)
{
    while (n > 0 && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    uint64_t version, flags;
    if (n < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' || hex_digits(s, 2, &version) < 0 ||
        hex_digits(s + 3, 16, hi) < 0 || hex_digits(s + 19, 16, lo) < 0 || hex_digits(s + 36, 16, parent) < 0 ||
        hex_digits(s + 53, 2, &flags) < 0)
        return -1;
    if (version == 0xff || (version == 0 && n != 55) || (n > 55 && s[55] != '-'))
        return -1;
    if ((*hi == 0 && *lo == 0) || *parent == 0)
        return -1;
    *sampled = (int)(flags & 1);
    return 0;
}

static PyObject *u128(uint64_t hi, uint64_t lo);

/* parse_traceparent(value) -> (trace id, parent span id, sampled) | None */
PyObject *as_parse_traceparent(PyObject *module, PyObject *arg)
{
    uint64_t hi, lo, parent;
    int sampled;
    Py_ssize_t n;
    const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &n) : NULL;
    if (s == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (parse_traceparent(s, n, &hi, &lo, &parent, &sampled) < 0)
        Py_RETURN_NONE;
    PyObject *trace_id = u128(hi, lo);
    if (trace_id == NULL)
        return NULL;
    return Py_BuildValue("NKO", trace_id, (unsigned long long)parent, sampled ? Py_True : Py_False);
}

/* ---- Recorder and RequestTrace ---- */

typedef struct Recorder Recorder;

typedef struct {
    PyObject_HEAD
    Recorder *rec;
    uint64_t hi, lo, span, parent, start;
    int remote;
    int64_t route;          /* index of its route's attributes in the tracer's table; -1: none */
    uint64_t phase[6];      /* decode, queue, encode: (start, end) in ns; 0: not reached */
    uint64_t batch[4];      /* size, samples, compute (0.1 us), interpreter + 1; zeros: not batched */
    PyObject *attributes;   /* its own beyond its status (a dict), or None */
    PyObject *common;       /* its route's attributes when not in the table, or None */
    PyObject *tracestate;   /* the caller's W3C tracestate (str) or None */
    PyObject *baggage;      /* the caller's W3C baggage header (str) or None */
} Trace;

struct Recorder {
    PyObject_HEAD
    uint64_t rng[4];
    uint64_t bound;  /* a root is sampled when the low 64 bits of its id are below it ... */
    int all;         /* ... or always */
    int parentbased; /* a traceparent's sampled flag decides, not its id */
    int enabled;
    long long skip; /* roots until the next sampled one, this one included */
    long long offset; /* CLOCK_REALTIME - CLOCK_MONOTONIC at creation, ns */
    Py_ssize_t pending, max_queue, max_batch;
    unsigned long long recorded, dropped;
    u64s requests, batches, links;
    PyObject *notify, *owner;
    PyTypeObject *trace_type;
    PyObject *s_get, *s_traceparent, *s_trace, *s_arrival;
};

static long long roots_to_next(Recorder *r)
{
    if (r->all)
        return 1;
    if (r->bound == 0)
        return NEVER;
    double p = ldexp((double)r->bound, -64);
    double u = (double)(next_u64(r->rng) >> 11) * 0x1.0p-53; /* [0, 1) */
    double k = log1p(-u) / log1p(-p);
    return k < 1e15 ? 1 + (long long)k : NEVER;
}

/* One more record waits: wake the Python tracer when it is the first or the batch is full. */
static int counted(Recorder *r)
{
    r->pending++;
    r->recorded++;
    if ((r->pending == 1 || r->pending == r->max_batch) && r->notify != Py_None) {
        PyObject *res = PyObject_CallNoArgs(r->notify);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    return 0;
}

static PyObject *new_trace(Recorder *r, uint64_t hi, uint64_t lo, uint64_t parent, int remote)
{
    Trace *t = PyObject_New(Trace, r->trace_type);
    if (t == NULL)
        return NULL;
    t->rec = (Recorder *)Py_NewRef(r);
    t->hi = hi;
    t->lo = lo;
    uint64_t span = next_u64(r->rng);
    t->span = span ? span : 1;
    t->parent = parent;
    t->remote = remote;
    t->start = clock_ns(CLOCK_REALTIME);
    t->route = -1;
    memset(t->phase, 0, sizeof t->phase);
    memset(t->batch, 0, sizeof t->batch);
    t->attributes = Py_NewRef(Py_None);
    t->common = Py_NewRef(Py_None);
    t->tracestate = Py_NewRef(Py_None);
    t->baggage = Py_NewRef(Py_None);
    return (PyObject *)t;
}

static PyObject *recorder_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *names[] = {"max_queue", "max_batch", "notify", "owner", NULL};
    Py_ssize_t max_queue, max_batch;
    PyObject *notify = Py_None, *owner = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nn|OO:Recorder", names, &max_queue, &max_batch, &notify, &owner))
        return NULL;
    if (max_queue < 1 || max_batch < 1) {
        PyErr_SetString(PyExc_ValueError, "Recorder: max_queue and max_batch must be at least 1");
        return NULL;
    }
    module_state *st = as_state_of_type(tp);
    if (st == NULL || st->trace_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Recorder: aserve._native is not initialised");
        return NULL;
    }
    Recorder *r = (Recorder *)tp->tp_alloc(tp, 0);
    if (r == NULL)
        return NULL;
    if (getrandom(r->rng, sizeof r->rng, 0) != (ssize_t)sizeof r->rng)
        seed_from(r->rng, clock_ns(CLOCK_MONOTONIC) ^ ((uint64_t)getpid() << 32));
    r->all = 1;
    r->enabled = 1;
    r->skip = 1;
    r->offset = (long long)(clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC));
    r->max_queue = max_queue;
    r->max_batch = max_batch;
    r->notify = Py_NewRef(notify);
    r->owner = Py_NewRef(owner);
    r->trace_type = (PyTypeObject *)Py_NewRef(st->trace_type);
    r->s_get = PyUnicode_InternFromString("get");
    r->s_traceparent = PyUnicode_InternFromString("traceparent");
    r->s_trace = PyUnicode_InternFromString("trace");
    r->s_arrival = PyUnicode_InternFromString("arrival");
    if (r->s_get == NULL || r->s_traceparent == NULL || r->s_trace == NULL || r->s_arrival == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static int recorder_traverse(Recorder *r, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(r));
    Py_VISIT(r->trace_type);
    Py_VISIT(r->notify);
    Py_VISIT(r->owner);
    return 0;
}

static int recorder_clear(Recorder *r)
{
    Py_CLEAR(r->notify);
    Py_CLEAR(r->owner);
    return 0;
}

static void recorder_dealloc(Recorder *r)
{
    PyTypeObject *tp = Py_TYPE(r);
    PyObject_GC_UnTrack(r);
    recorder_clear(r);
    Py_CLEAR(r->trace_type);
    Py_CLEAR(r->s_get);
    Py_CLEAR(r->s_traceparent);
    Py_CLEAR(r->s_trace);
    Py_CLEAR(r->s_arrival);
    PyMem_Free(r->requests.v);
    PyMem_Free(r->batches.v);
    PyMem_Free(r->links.v);
    tp->tp_free(r);
    Py_DECREF(tp);
}

/* start(headers) -> RequestTrace | None: the trace of a request that starts now, if sampled. */
static PyObject *recorder_start(Recorder *r, PyObject *headers)
{
    if (!r->enabled)
        Py_RETURN_NONE;
    PyObject *value;
    if (PyDict_CheckExact(headers)) {
        value = Py_XNewRef(PyDict_GetItemWithError(headers, r->s_traceparent));
        if (value == NULL && PyErr_Occurred())
            return NULL;
    } else {
        value = PyObject_CallMethodOneArg(headers, r->s_get, r->s_traceparent);
        if (value == NULL)
            return NULL;
    }
    if (value != NULL && value != Py_None) {
        uint64_t hi, lo, parent;
        int sampled, ok = -1;
        if (PyUnicode_Check(value)) {
            Py_ssize_t n;
            const char *s = PyUnicode_AsUTF8AndSize(value, &n);
            if (s == NULL) {
                Py_DECREF(value);
                return NULL;
            }
            ok = parse_traceparent(s, n, &hi, &lo, &parent, &sampled);
        }
        Py_DECREF(value);
        if (ok == 0) { /* the caller's trace continues, if the sampler keeps it */
            if (r->parentbased ? !sampled : !r->all && lo >= r->bound)
                Py_RETURN_NONE;
            return new_trace(r, hi, lo, parent, 1);
        }
    } else {
        Py_XDECREF(value);
    }
    if (--r->skip > 0) /* a root: sampled with the ratio, its id's low 64 bits under the bound */
        Py_RETURN_NONE;
    r->skip = roots_to_next(r);
    uint64_t lo = r->all ? next_u64(r->rng) : below(r->rng, r->bound);
    uint64_t hi = next_u64(r->rng);
    if (hi == 0 && lo == 0)
        lo = 1;
    return new_trace(r, hi, lo, 0, 0);
}

/* sampler(all, bound, parentbased): roots sampled always (all) or when the low 64 bits of
 * their id are below bound; parentbased: a traceparent's flag decides. Draws the run again. */
static PyObject *recorder_sampler(Recorder *r, PyObject *args)
{
    int all, parentbased;
    unsigned long long bound;
    if (!PyArg_ParseTuple(args, "pKp:sampler", &all, &bound, &parentbased))
        return NULL;
    r->all = all;
    r->bound = bound;
    r->parentbased = parentbased;
    r->skip = roots_to_next(r);
    Py_RETURN_NONE;
}

static PyObject *recorder_seed(Recorder *r, PyObject *arg)
{
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(arg);
    if (seed == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    seed_from(r->rng, seed);
    r->skip = roots_to_next(r);
    Py_RETURN_NONE;
}

static PyObject *recorder_span_id(Recorder *r, PyObject *Py_UNUSED(ignored))
{
    uint64_t id = next_u64(r->rng);
    return PyLong_FromUnsignedLongLong(id ? id : 1);
}

/* count(): a record the Python recorder keeps (a span) now waits. */
static PyObject *recorder_count(Recorder *r, PyObject *Py_UNUSED(ignored))
{
    if (counted(r) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* take() -> (records, requests, batches, links): what waits, the arrays as bytes; empties them. */
static PyObject *recorder_take(Recorder *r, PyObject *Py_UNUSED(ignored))
{
    PyObject *req = u64s_take(&r->requests), *bat = u64s_take(&r->batches), *lnk = u64s_take(&r->links);
    PyObject *res = NULL;
    if (req != NULL && bat != NULL && lnk != NULL)
        res = Py_BuildValue("nOOO", r->pending, req, bat, lnk);
    if (res != NULL)
        r->pending = 0;
    Py_XDECREF(req);
    Py_XDECREF(bat);
    Py_XDECREF(lnk);
    return res;
}

static int as_u64(PyObject *o, uint64_t *out, const char *what)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "Recorder.batch: %s must be a whole number >= 0", what);
        return -1;
    }
    *out = v;
    return 0;
}

/* batch(model, requests, samples, started, ran[, ids]): the record of a batch that ran and
 * succeeded, and on each sampled request of it (`requests`: the batcher's requests, each
 * with `trace` and `arrival`) its queue phase and the batch's facts. model: its entry in
 * the table; started: when the batch was dispatched (monotonic seconds); ran: the engine's
 * (interpreter, ran from, ran to, ...) in monotonic ns; ids: (trace_hi, trace_lo, batch
 * span id, run span id) drawn before the run (model code saw them), else drawn here. */
static PyObject *recorder_batch(Recorder *r, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 5 && nargs != 6) || !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) < 3 ||
        (nargs == 6 && args[5] != Py_None && (!PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) != 4))) {
        PyErr_SetString(PyExc_TypeError, "Recorder.batch(model: int, requests: sequence, samples: int, "
                                         "started: float, ran: (interpreter, from_ns, to_ns, ...)"
                                         "[, ids: (trace_hi, trace_lo, span_id, run_span_id)])");
        return NULL;
    }
    uint64_t model, samples, ran_from, ran_to;
    long interpreter = PyLong_AsLong(PyTuple_GET_ITEM(args[4], 0));
    if ((interpreter == -1 && PyErr_Occurred()) || as_u64(args[0], &model, "model") < 0 ||
        as_u64(args[2], &samples, "samples") < 0 || as_u64(PyTuple_GET_ITEM(args[4], 1), &ran_from, "ran from") < 0 ||
        as_u64(PyTuple_GET_ITEM(args[4], 2), &ran_to, "ran to") < 0)
        return NULL;
    double started = PyFloat_AsDouble(args[3]);
    if (started == -1.0 && PyErr_Occurred())
        return NULL;
    int keep = r->pending < r->max_queue; /* else the requests get their facts, the batch is dropped */
    PyObject *requests = PySequence_Fast(args[1], "Recorder.batch: requests must be a sequence");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    PyObject *res = NULL;
    uint64_t now = clock_ns(CLOCK_REALTIME), start = (uint64_t)llround(started * 1e9) + (uint64_t)r->offset;
    uint64_t facts[4] = {(uint64_t)n, samples, now > start ? (now - start) / 100 : 0, (uint64_t)(interpreter + 1)};
    uint64_t hi, lo, id, run;
    if (nargs == 6 && args[5] != Py_None) {
        if (as_u64(PyTuple_GET_ITEM(args[5], 0), &hi, "trace_hi") < 0 ||
            as_u64(PyTuple_GET_ITEM(args[5], 1), &lo, "trace_lo") < 0 ||
            as_u64(PyTuple_GET_ITEM(args[5], 2), &id, "span_id") < 0 ||
            as_u64(PyTuple_GET_ITEM(args[5], 3), &run, "run span_id") < 0)
            goto finally;
    } else {
        hi = next_u64(r->rng), lo = next_u64(r->rng), id = next_u64(r->rng) | 1, run = next_u64(r->rng) | 1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *req = PySequence_Fast_GET_ITEM(requests, i);
        PyObject *trace = PyObject_GetAttr(req, r->s_trace);
        if (trace == NULL)
            goto finally;
        if (Py_TYPE(trace) != r->trace_type) {
            Py_DECREF(trace);
            continue;
        }
        Trace *t = (Trace *)trace;
        PyObject *arrival = PyObject_GetAttr(req, r->s_arrival);
        double at = arrival != NULL ? PyFloat_AsDouble(arrival) : -1.0;
        Py_XDECREF(arrival);
        if ((at == -1.0 && PyErr_Occurred()) || (keep && u64s_room(&r->links, AS_TRACE_LINK_FIELDS) < 0)) {
            Py_DECREF(trace);
            goto finally;
        }
        t->phase[2] = (uint64_t)llround(at * 1e9) + (uint64_t)r->offset;
        t->phase[3] = start;
        memcpy(t->batch, facts, sizeof facts);
        if (keep) {
            uint64_t *l = r->links.v + r->links.len;
            l[0] = id, l[1] = t->hi, l[2] = t->lo, l[3] = t->span;
            r->links.len += AS_TRACE_LINK_FIELDS;
        }
        Py_DECREF(trace);
    }
    if (!keep) {
        r->dropped++;
        res = Py_NewRef(Py_None);
        goto finally;
    }
    if (u64s_room(&r->batches, AS_TRACE_BATCH_FIELDS) < 0)
        goto finally;
    uint64_t *b = r->batches.v + r->batches.len;
    b[0] = hi, b[1] = lo, b[2] = id, b[3] = run, b[4] = start, b[5] = now;
    b[6] = ran_from + (uint64_t)r->offset, b[7] = ran_to + (uint64_t)r->offset;
    b[8] = facts[3], b[9] = facts[0], b[10] = samples, b[11] = model;
    r->batches.len += AS_TRACE_BATCH_FIELDS;
    if (counted(r) == 0)
        res = Py_NewRef(Py_None);
finally:
    Py_DECREF(requests);
    return res;
}

static PyObject *recorder_records(Recorder *r, void *Py_UNUSED(c))
{
    return Py_BuildValue("nnn", (Py_ssize_t)(r->requests.len / AS_TRACE_REQUEST_FIELDS),
                         (Py_ssize_t)(r->batches.len / AS_TRACE_BATCH_FIELDS), (Py_ssize_t)(r->links.len / AS_TRACE_LINK_FIELDS));
}

static PyObject *recorder_offset(Recorder *r, void *Py_UNUSED(c)) { return PyLong_FromLongLong(r->offset); }
static PyObject *recorder_pending(Recorder *r, void *Py_UNUSED(c)) { return PyLong_FromSsize_t(r->pending); }
static PyObject *recorder_recorded(Recorder *r, void *Py_UNUSED(c)) { return PyLong_FromUnsignedLongLong(r->recorded); }
static PyObject *recorder_dropped(Recorder *r, void *Py_UNUSED(c)) { return PyLong_FromUnsignedLongLong(r->dropped); }
static PyObject *recorder_owner(Recorder *r, void *Py_UNUSED(c)) { return Py_NewRef(r->owner ? r->owner : Py_None); }
static PyObject *recorder_get_enabled(Recorder *r, void *Py_UNUSED(c)) { return PyBool_FromLong(r->enabled); }

static int recorder_set_enabled(Recorder *r, PyObject *v, void *Py_UNUSED(c))
{
    int on = v == NULL ? -1 : PyObject_IsTrue(v);
    if (on < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "Recorder.enabled cannot be deleted");
        return -1;
    }
    r->enabled = on;
    return 0;
}

static PyObject *recorder_drop(Recorder *r, PyObject *arg)
{
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "Recorder.drop: expected a count >= 0");
        return NULL;
    }
    r->dropped += (unsigned long long)n;
    Py_RETURN_NONE;
}

static PyMethodDef recorder_methods[] = {
    {"start", (PyCFunction)recorder_start, METH_O,
     "start(headers) -> RequestTrace | None: the trace of a request starting now, if it is sampled"},
    {"sampler", (PyCFunction)recorder_sampler, METH_VARARGS,
     "sampler(all, bound, parentbased): how roots and continued traces are sampled"},
    {"seed", (PyCFunction)recorder_seed, METH_O, "seed(n): make the ids and decisions that follow repeatable"},
    {"span_id", (PyCFunction)recorder_span_id, METH_NOARGS, "span_id() -> int: a new span id"},
    {"count", (PyCFunction)recorder_count, METH_NOARGS, "count(): one more record (kept by the caller) waits"},
    {"drop", (PyCFunction)recorder_drop, METH_O, "drop(n): n records were dropped (the queue was full, the export failed)"},
    {"take", (PyCFunction)recorder_take, METH_NOARGS,
     "take() -> (records waiting, requests, batches, links): the numeric records as bytes, emptied"},
    {"batch", (PyCFunction)(void (*)(void))recorder_batch, METH_FASTCALL,
     "batch(model, requests, samples, started, ran): the record of a batch that succeeded"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef recorder_getset[] = {
    {"offset", (getter)recorder_offset, NULL, "CLOCK_REALTIME - CLOCK_MONOTONIC in ns", NULL},
    {"pending", (getter)recorder_pending, NULL, "records waiting for export", NULL},
    {"recorded", (getter)recorder_recorded, NULL, "records made", NULL},
    {"dropped", (getter)recorder_dropped, NULL, "records dropped because max_queue waited", NULL},
    {"records", (getter)recorder_records, NULL, "(requests, batches, links) in the numeric arrays", NULL},
    {"owner", (getter)recorder_owner, NULL, "the tracer this records for", NULL},
    {"enabled", (getter)recorder_get_enabled, (setter)recorder_set_enabled, "whether requests are sampled", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot recorder_slots[] = {
    {Py_tp_new, recorder_new},
    {Py_tp_dealloc, recorder_dealloc},
    {Py_tp_traverse, recorder_traverse},
    {Py_tp_clear, recorder_clear},
    {Py_tp_methods, recorder_methods},
    {Py_tp_getset, recorder_getset},
    {Py_tp_doc, "Recorder(max_queue, max_batch, notify=None, owner=None): sampling and numeric trace records"},
    {0, NULL},
};

PyType_Spec as_recorder_spec = {
    .name = "aserve._native.Recorder",
    .basicsize = sizeof(Recorder),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = recorder_slots,
};

/* ---- RequestTrace ---- */

static void trace_dealloc(Trace *t)
{
    PyTypeObject *tp = Py_TYPE(t);
    Py_CLEAR(t->rec);
    Py_CLEAR(t->attributes);
    Py_CLEAR(t->common);
    Py_CLEAR(t->tracestate);
    Py_CLEAR(t->baggage);
    PyObject_Free(t);
    Py_DECREF(tp);
}

/* stamp(phase): now, in ns, as the start (even phase) or end (odd) of decode (0, 1) or encode (4, 5). */
static PyObject *trace_stamp(Trace *t, PyObject *arg)
{
    long k = PyLong_AsLong(arg);
    if (k < 0 || k > 5) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "RequestTrace.stamp: phase %ld is not in 0..5", k);
        return NULL;
    }
    t->phase[k] = clock_ns(CLOCK_REALTIME);
    Py_RETURN_NONE;
}

/* end(status) -> bool: the request was answered; its record is appended (True) unless it has
 * attributes of its own, none in the table or a tracestate (False: record it as a span). */
static PyObject *trace_end(Trace *t, PyObject *arg)
{
    Recorder *r = t->rec;
    if (t->attributes != Py_None || t->route < 0 || t->tracestate != Py_None)
        Py_RETURN_FALSE;
    unsigned long long status = PyLong_AsUnsignedLongLong(arg);
    if (status == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (r->pending >= r->max_queue) {
        r->dropped++;
        Py_RETURN_TRUE;
    }
    if (u64s_room(&r->requests, AS_TRACE_REQUEST_FIELDS) < 0)
        return NULL;
    uint64_t *v = r->requests.v + r->requests.len;
    v[0] = t->hi, v[1] = t->lo, v[2] = t->span, v[3] = t->parent, v[4] = (uint64_t)t->remote, v[5] = status;
    v[6] = t->start, v[7] = clock_ns(CLOCK_REALTIME);
    memcpy(v + 8, t->phase, sizeof t->phase);
    v[14] = (uint64_t)t->route;
    memcpy(v + 15, t->batch, sizeof t->batch);
    r->requests.len += AS_TRACE_REQUEST_FIELDS;
    if (counted(r) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *u128(uint64_t hi, uint64_t lo)
{
    unsigned char b[16];
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(hi >> (56 - 8 * i));
        b[8 + i] = (unsigned char)(lo >> (56 - 8 * i));
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)b, 16);
    if (bytes == NULL)
        return NULL;
    PyObject *res = PyObject_CallMethod((PyObject *)&PyLong_Type, "from_bytes", "Os", bytes, "big");
    Py_DECREF(bytes);
    return res;
}

static PyObject *trace_trace_id(Trace *t, void *Py_UNUSED(c)) { return u128(t->hi, t->lo); }
static PyObject *trace_span_id(Trace *t, void *Py_UNUSED(c)) { return PyLong_FromUnsignedLongLong(t->span); }
static PyObject *trace_parent_id(Trace *t, void *Py_UNUSED(c)) { return PyLong_FromUnsignedLongLong(t->parent); }
static PyObject *trace_remote(Trace *t, void *Py_UNUSED(c)) { return PyBool_FromLong(t->remote); }
static PyObject *trace_start(Trace *t, void *Py_UNUSED(c)) { return PyLong_FromUnsignedLongLong(t->start); }
static PyObject *trace_tracer(Trace *t, void *Py_UNUSED(c)) { return recorder_owner(t->rec, NULL); }

static PyObject *trace_trace_id_hex(Trace *t, void *Py_UNUSED(c))
{
    char s[33];
    snprintf(s, sizeof s, "%016llx%016llx", (unsigned long long)t->hi, (unsigned long long)t->lo);
    return PyUnicode_FromStringAndSize(s, 32);
}

static PyObject *trace_span_id_hex(Trace *t, void *Py_UNUSED(c))
{
    char s[17];
    snprintf(s, sizeof s, "%016llx", (unsigned long long)t->span);
    return PyUnicode_FromStringAndSize(s, 16);
}

static PyObject *trace_get_route(Trace *t, void *Py_UNUSED(c)) { return PyLong_FromLongLong(t->route); }

static int trace_set_route(Trace *t, PyObject *v, void *Py_UNUSED(c))
{
    long long route = v == NULL ? -2 : PyLong_AsLongLong(v);
    if (route < -1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "RequestTrace.route: expected a table index or -1");
        return -1;
    }
    t->route = route;
    return 0;
}

/* attributes and common: an object or None */
static PyObject *trace_get_object(Trace *t, void *c) { return Py_NewRef(*(PyObject **)((char *)t + (size_t)c)); }

static int trace_set_object(Trace *t, PyObject *v, void *c)
{
    PyObject **slot = (PyObject **)((char *)t + (size_t)c);
    Py_XSETREF(*slot, Py_NewRef(v != NULL ? v : Py_None));
    return 0;
}

/* decode, queue, encode: (start_ns, end_ns); batch: (size, samples, compute, interpreter + 1) */
static PyObject *trace_get_numbers(Trace *t, void *c)
{
    size_t which = (size_t)c;
    uint64_t *v = which < 3 ? t->phase + 2 * which : t->batch;
    Py_ssize_t n = which < 3 ? 2 : 4;
    PyObject *tuple = PyTuple_New(n);
    for (Py_ssize_t i = 0; tuple != NULL && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (x == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, x);
    }
    return tuple;
}

static int trace_set_numbers(Trace *t, PyObject *value, void *c)
{
    size_t which = (size_t)c;
    uint64_t *v = which < 3 ? t->phase + 2 * which : t->batch, got[4];
    Py_ssize_t n = which < 3 ? 2 : 4;
    if (value == NULL || !PyTuple_Check(value) || PyTuple_GET_SIZE(value) != n) {
        PyErr_Format(PyExc_TypeError, "RequestTrace: expected a tuple of %zd whole numbers", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        got[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(value, i));
        if (got[i] == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
    }
    memcpy(v, got, (size_t)n * sizeof(uint64_t));
    return 0;
}

static PyMethodDef trace_methods[] = {
    {"stamp", (PyCFunction)trace_stamp, METH_O,
     "stamp(phase): the time now as decode start (0) / end (1) or encode start (4) / end (5)"},
    {"end", (PyCFunction)trace_end, METH_O,
     "end(status) -> bool: append the request's record; False when it must be recorded as a span"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef trace_getset[] = {
    {"trace_id", (getter)trace_trace_id, NULL, "128-bit trace id", NULL},
    {"span_id", (getter)trace_span_id, NULL, "the server span's id", NULL},
    {"parent_id", (getter)trace_parent_id, NULL, "the caller's span id, 0 for a root", NULL},
    {"remote", (getter)trace_remote, NULL, "whether the parent came from a traceparent header", NULL},
    {"start", (getter)trace_start, NULL, "start of the server span, ns since the epoch", NULL},
    {"tracer", (getter)trace_tracer, NULL, "the tracer that sampled it", NULL},
    {"trace_id_hex", (getter)trace_trace_id_hex, NULL, "the trace id, 32 hex digits", NULL},
    {"span_id_hex", (getter)trace_span_id_hex, NULL, "the span id, 16 hex digits", NULL},
    {"route", (getter)trace_get_route, (setter)trace_set_route, "table index of its route's attributes, or -1", NULL},
    {"attributes", (getter)trace_get_object, (setter)trace_set_object, "its own attributes (dict) or None",
     (void *)offsetof(Trace, attributes)},
    {"common", (getter)trace_get_object, (setter)trace_set_object,
     "its route's attributes when the table has no entry for them, or None", (void *)offsetof(Trace, common)},
    {"tracestate", (getter)trace_get_object, (setter)trace_set_object, "the caller's W3C tracestate or None",
     (void *)offsetof(Trace, tracestate)},
    {"baggage", (getter)trace_get_object, (setter)trace_set_object, "the caller's W3C baggage header or None",
     (void *)offsetof(Trace, baggage)},
    {"decode", (getter)trace_get_numbers, (setter)trace_set_numbers, "(start_ns, end_ns) of decoding", (void *)0},
    {"queue", (getter)trace_get_numbers, (setter)trace_set_numbers, "(start_ns, end_ns) in the queue", (void *)1},
    {"encode", (getter)trace_get_numbers, (setter)trace_set_numbers, "(start_ns, end_ns) of encoding", (void *)2},
    {"batch", (getter)trace_get_numbers, (setter)trace_set_numbers,
     "(size, samples, compute in 0.1 us, interpreter + 1) of its batch; zeros: not batched", (void *)3},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot trace_slots[] = {
    {Py_tp_dealloc, trace_dealloc},
    {Py_tp_methods, trace_methods},
    {Py_tp_getset, trace_getset},
    {Py_tp_doc, "A sampled request's server span, made by Recorder.start"},
    {0, NULL},
};

PyType_Spec as_trace_spec = {
    .name = "aserve._native.RequestTrace",
    .basicsize = sizeof(Trace),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = trace_slots,
};
