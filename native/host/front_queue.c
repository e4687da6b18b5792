/* FrontQueue: a front loop's side of one model whose requests are batched in the pool's
 * shared queue (batching/native.py: NativeBatcher is its Python subclass).
 *
 * Per request, on the loop that took it (submit): admission over the model's count shared
 * by every loop (first the adaptive policy's, for a model with one: its plan, asked through
 * the Link with the host's code), the deadline's place in a heap, a FrontRequest, and a future. Once per
 * loop iteration (flush) the requests taken in since go to the pool's queue together
 * (Link.request through as_link_request, or a queue object's request() where there is no
 * Link). The Link's drain calls each request's FrontRequest, which counts the batch it led
 * and tells its future. What happens rarely (a deadline's expiry, withdrawal, closing,
 * statistics) is the subclass's, over the same state, read and written as attributes.
 *
 * Everything here runs on the front's loop, under its GIL.
 */
#include "common.h"

#include <structmember.h>
#include <math.h>
#include <stddef.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    /* what it was made with */
    PyObject *model, *key;
    PyObject *queue;   /* request(key, inputs, samples, done, window_ns=, deadline_ns=), hold(), release() */
    PyObject *link;    /* the queue's Link, or NULL: then the queue's own methods are called */
    PyObject *targets; /* with a Link: the queue's {key: (pool address, Link.target)} */
    PyObject *shared, *shared_add, *shared_total;
    int counter; /* shared is a _native.Counter: added to and read in C */
    PyObject *engine_error, *request_timeout, *model_error;
    PyObject *queue_full, *wrong_rows, *count_batch; /* batching's rules, called off the hot path */
    /* a model with the adaptive policy: refusal(wait, budget, held) -> the Overloaded its admission
     * raises (the policy itself is the host's plan, reached through the Link); else NULL */
    PyObject *plan_refusal;
    long long interpreters; /* the model's: a request waits when its batches run on every one */
    long long max_batch_size, max_queue_size, window_ns;
    PyObject *get_running_loop, *heappush, *heappop, *request_kwnames;
    /* the loop, once a request came */
    PyObject *loop, *create_future, *call_soon, *flush;
    /* state */
    PyObject *pending;       /* set: requests queued or running, whose completion has not come */
    PyObject *deadlines;     /* heap [(deadline, request)]; an answered one's entry goes when it comes to the top */
    PyObject *deferred;      /* list: requests taken in since the last flush */
    PyObject *drained;       /* a future close() waits on until nothing is pending, or None */
    PyObject *batch_sizes;   /* {samples: [batches led, their seconds summed]} */
    PyObject *last_dispatch; /* clock time the last batch it led started, or None */
    double expiry_at;        /* when the deadline timer fires (inf: it is not armed) */
    char closed; /* a T_BOOL member: a char */
    int flushing;
    long long batches, requests, refused, timed_out, cancelled;
    double queue_seconds, compute_seconds;
    module_state *st;
} fqueue;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    fqueue *owner;      /* until it is answered */
    PyObject *future;
    PyObject *inputs;   /* until it is handed on */
    PyObject *deadline; /* float or None */
    PyObject *job;      /* what the queue's request returned (a Link's: (pool address, job id)), or None */
    double arrival;
    double budget, waited; /* its latency budget (NAN: the policy's) and the seconds it spent before submit */
    long long samples, deadline_ns;
} freq;

static double monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic's clock */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The module's state: the type is subclassed in Python, so its first base made here has it. */
static module_state *state_of(PyTypeObject *tp)
{
    for (; tp != NULL; tp = tp->tp_base) {
        if (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE))
            continue;
        module_state *st = PyType_GetModuleState(tp);
        if (st != NULL)
            return st;
        PyErr_Clear();
    }
    return NULL;
}

/* future.done(): 1, 0, or -1 with an exception set */
static int future_done(module_state *st, PyObject *future)
{
    PyObject *done = PyObject_CallMethodNoArgs(future, st->str_done);
    if (done == NULL)
        return -1;
    int r = done == Py_True ? 1 : done == Py_False ? 0 : PyObject_IsTrue(done);
    Py_DECREF(done);
    return r;
}

/* future.set_result(value) or future.set_exception(value) (`method`, interned) */
static int future_tell(PyObject *future, PyObject *method, PyObject *value)
{
    PyObject *r = PyObject_CallMethodOneArg(future, method, value);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static void check_drained(fqueue *q)
{
    if (q->drained == Py_None || PySet_GET_SIZE(q->pending) > 0)
        return;
    int done = future_done(q->st, q->drained);
    if (done == 0)
        done = future_tell(q->drained, q->st->str_set_result, Py_None);
    if (done < 0)
        PyErr_WriteUnraisable(q->drained);
}

/* The model's shared count: add(n) */
static int add_shared(fqueue *q, long long n)
{
    if (q->counter) {
        as_counter_loop_add(q->shared, n);
        return 0;
    }
    PyObject *v = PyLong_FromLongLong(n);
    PyObject *r = v != NULL ? PyObject_CallOneArg(q->shared_add, v) : NULL;
    Py_XDECREF(v);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The model's shared count: total(), or -1 with an exception set */
static long long shared_total(fqueue *q)
{
    if (q->counter)
        return as_counter_loop_total(q->shared);
    PyObject *queued = PyObject_CallNoArgs(q->shared_total);
    long long total = queued != NULL ? PyLong_AsLongLong(queued) : -1;
    Py_XDECREF(queued);
    return total;
}

/* ---- FrontRequest ---- */

static int freq_traverse(freq *r, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(r));
    Py_VISIT(r->owner);
    Py_VISIT(r->future);
    Py_VISIT(r->inputs);
    Py_VISIT(r->deadline);
    Py_VISIT(r->job);
    return 0;
}

static int freq_clear(freq *r)
{
    Py_CLEAR(r->owner);
    Py_CLEAR(r->future);
    Py_CLEAR(r->inputs);
    Py_CLEAR(r->deadline);
    Py_CLEAR(r->job);
    return 0;
}

static void freq_dealloc(freq *r)
{
    PyTypeObject *tp = Py_TYPE(r);
    PyObject_GC_UnTrack(r);
    freq_clear(r);
    tp->tp_free(r);
    Py_DECREF(tp);
}

/* Heap order past equal deadlines: arrival. */
static PyObject *freq_richcompare(PyObject *a, PyObject *b, int op)
{
    if (op != Py_LT || Py_TYPE(a) != Py_TYPE(b))
        Py_RETURN_NOTIMPLEMENTED;
    return PyBool_FromLong(((freq *)a)->arrival < ((freq *)b)->arrival);
}

/* By identity, as an object without __lt__ would be (sets hold them). */
static Py_hash_t freq_hash(PyObject *a)
{
    size_t y = (size_t)a;
    y = (y >> 4) | (y << (8 * sizeof(void *) - 4)); /* the low bits of an address are its alignment */
    Py_hash_t x = (Py_hash_t)y;
    return x == -1 ? -2 : x;
}

/* The outputs' first dimension is each the request's rows: 0, or 1 after the future was
 * told wrong_rows(model, name, shape, samples); -1 with an exception set. */
static int rows_wrong(fqueue *q, freq *r, PyObject *outputs)
{
    if (!PyDict_Check(outputs))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *name, *tensor;
    while (PyDict_Next(outputs, &pos, &name, &tensor)) {
        PyObject *shape = PyObject_GetAttr(tensor, q->st->str_shape);
        if (shape == NULL)
            return -1;
        int ok = 0;
        if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) > 0) {
            long long rows = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, 0));
            if (rows == -1 && PyErr_Occurred()) {
                Py_DECREF(shape);
                return -1;
            }
            ok = rows == r->samples;
        }
        if (!ok) {
            PyObject *exc = PyObject_CallFunction(q->wrong_rows, "OOOL", q->model, name, shape, r->samples);
            Py_DECREF(shape);
            if (exc == NULL || future_tell(r->future, q->st->str_set_exception, exc) < 0) {
                Py_XDECREF(exc);
                return -1;
            }
            Py_DECREF(exc);
            return 1;
        }
        Py_DECREF(shape);
    }
    return 0;
}

/* request(outputs, error, led rows, run start ns, run end ns): the pool answered it (the
 * Link's drain calls it): the batch it led counted, its future told. */
static PyObject *freq_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    freq *r = (freq *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0))
        return PyErr_Format(PyExc_TypeError, "FrontRequest: expected (outputs, error, led, start_ns, end_ns)");
    fqueue *q = r->owner;
    if (q == NULL)
        Py_RETURN_NONE; /* answered before */
    PyObject *outputs = args[0], *error = args[1];
    long long led = PyLong_AsLongLong(args[2]), start_ns = PyLong_AsLongLong(args[3]),
              end_ns = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    r->owner = NULL; /* its reference is ours until the end */
    Py_INCREF(r);
    PyObject *result = NULL;
    if (PySet_Discard(q->pending, self) < 0)
        goto done;
    while (PyList_GET_SIZE(q->deadlines) > 0) { /* the answered ones on top hold nothing more */
        PyObject *top = PyList_GET_ITEM(q->deadlines, 0); /* (deadline, request): submit's */
        int held = PySet_Contains(q->pending, PyTuple_GET_ITEM(top, 1));
        if (held != 0) {
            if (held < 0)
                goto done;
            break;
        }
        PyObject *gone = PyObject_CallOneArg(q->heappop, q->deadlines);
        if (gone == NULL)
            goto done;
        Py_DECREF(gone);
    }
    double seconds = (double)(end_ns - start_ns) / 1e9;
    if (led > 0) { /* once per batch: batching.batcher.count_batch, as the host's batcher counts */
        PyObject *at = PyFloat_FromDouble((double)start_ns / 1e9);
        PyObject *counted = at != NULL ? PyObject_CallFunction(q->count_batch, "OLd", q->batch_sizes, led, seconds)
                                       : NULL;
        if (counted == NULL) {
            Py_XDECREF(at);
            goto done;
        }
        Py_DECREF(counted);
        Py_SETREF(q->last_dispatch, at);
        q->batches++;
    }
    int told = future_done(q->st, r->future);
    if (told < 0)
        goto done;
    if (outputs != Py_None) {
        double waited = (double)start_ns / 1e9 - r->arrival;
        q->queue_seconds += waited > 0.0 ? waited : 0.0;
        q->compute_seconds += seconds;
        if (!told) {
            int wrong = q->max_batch_size > 0 ? rows_wrong(q, r, outputs) : 0;
            if (wrong < 0)
                goto done;
            if (!wrong) {
                if (future_tell(r->future, q->st->str_set_result, outputs) < 0)
                    goto done;
                q->requests++;
            }
        }
    } else if (!told) {
        PyObject *exc = error;
        if (exc == Py_None) {
            PyObject *text = PyUnicode_FromFormat("model %R failed", q->model);
            exc = text != NULL ? PyObject_CallOneArg(q->model_error, text) : NULL;
            Py_XDECREF(text);
        } else {
            Py_INCREF(exc);
        }
        int rc = exc != NULL ? future_tell(r->future, q->st->str_set_exception, exc) : -1;
        Py_XDECREF(exc);
        if (rc < 0)
            goto done;
    }
    check_drained(q);
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(q);
    Py_DECREF(r);
    return result;
}

static PyMemberDef freq_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(freq, vectorcall), READONLY, NULL},
    {"arrival", T_DOUBLE, offsetof(freq, arrival), READONLY, "clock time it was taken in"},
    {"samples", T_LONGLONG, offsetof(freq, samples), READONLY, "its rows"},
    {"deadline", T_OBJECT, offsetof(freq, deadline), READONLY, "clock time it fails past, or None"},
    {"future", T_OBJECT, offsetof(freq, future), READONLY, "told its outputs or its error"},
    {"job", T_OBJECT, offsetof(freq, job), 0, "what the queue's request returned once handed on, else None"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot freq_slots[] = {
    {Py_tp_dealloc, freq_dealloc},
    {Py_tp_traverse, freq_traverse},
    {Py_tp_clear, freq_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_richcompare, freq_richcompare},
    {Py_tp_hash, freq_hash},
    {Py_tp_members, freq_members},
    {Py_tp_doc, "FrontRequest: one request a FrontQueue took in; the pool's answer is told by calling it."},
    {0, NULL},
};

PyType_Spec as_front_request_spec = {
    .name = "aserve._native.FrontRequest",
    .basicsize = sizeof(freq),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = freq_slots,
};

/* ---- FrontQueue ---- */

#define FQ_OBJECTS(X)                                                                                    \
    X(model) X(key) X(queue) X(link) X(targets) X(shared) X(shared_add) X(shared_total) X(engine_error)  \
    X(request_timeout) X(model_error) X(queue_full) X(wrong_rows) X(count_batch) X(plan_refusal) X(get_running_loop) \
    X(heappush) X(heappop) X(request_kwnames) X(loop) X(create_future) X(call_soon) X(flush) X(pending)  \
    X(deadlines) X(deferred) X(drained) X(batch_sizes) X(last_dispatch)

static int fq_traverse(fqueue *q, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(q));
#define VISIT(f) Py_VISIT(q->f);
    FQ_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int fq_clear(fqueue *q)
{
#define CLEAR(f) Py_CLEAR(q->f);
    FQ_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void fq_dealloc(fqueue *q)
{
    PyTypeObject *tp = Py_TYPE(q);
    PyObject_GC_UnTrack(q);
    fq_clear(q);
    tp->tp_free(q);
    Py_DECREF(tp);
}

static PyObject *fq_new(PyTypeObject *tp, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kw))
{
    module_state *st = state_of(tp);
    if (st == NULL)
        return PyErr_Format(PyExc_RuntimeError, "FrontQueue: the module is gone");
    fqueue *q = (fqueue *)tp->tp_alloc(tp, 0);
    if (q == NULL)
        return NULL;
    q->st = st;
    q->expiry_at = INFINITY;
    q->pending = PySet_New(NULL);
    q->deadlines = PyList_New(0);
    q->deferred = PyList_New(0);
    q->batch_sizes = PyDict_New();
    q->drained = Py_NewRef(Py_None);
    q->last_dispatch = Py_NewRef(Py_None);
    if (q->pending == NULL || q->deadlines == NULL || q->deferred == NULL || q->batch_sizes == NULL) {
        Py_DECREF(q);
        return NULL;
    }
    return (PyObject *)q;
}

static int fq_init(fqueue *q, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "key", "queue", "shared", "max_batch_size", "max_queue_size", "window_ns",
                             "errors", "rules", "link", "targets", "plan_refusal", "interpreters", NULL};
    PyObject *model = NULL, *key = NULL, *queue = NULL, *shared = NULL, *errors = NULL, *rules = NULL,
             *link = Py_None, *targets = Py_None, *plan_refusal = Py_None;
    long long max_batch_size = -1, max_queue_size = -1, window_ns = -1, interpreters = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$UUOOLLLO!O!OOOL:FrontQueue", kwlist, &model, &key, &queue, &shared,
                                     &max_batch_size, &max_queue_size, &window_ns, &PyTuple_Type, &errors,
                                     &PyTuple_Type, &rules, &link, &targets, &plan_refusal, &interpreters))
        return -1;
    if (plan_refusal != Py_None && link == Py_None) {
        PyErr_SetString(PyExc_TypeError, "FrontQueue: plan_refusal (an adaptive policy) needs a link");
        return -1;
    }
    if (model == NULL || key == NULL || queue == NULL || shared == NULL || errors == NULL || rules == NULL ||
        max_batch_size < 0 || max_queue_size < 0 || window_ns < 0) {
        PyErr_SetString(PyExc_TypeError, "FrontQueue: model, key, queue, shared, errors, rules, and max_batch_size, "
                        "max_queue_size and window_ns (>= 0) are required");
        return -1;
    }
    if (link != Py_None && (!Py_IS_TYPE(link, q->st->link_type) || !PyDict_Check(targets))) {
        PyErr_SetString(PyExc_TypeError, "FrontQueue: link must be an aserve._native.Link, with targets a dict");
        return -1;
    }
    PyObject *engine_error, *request_timeout, *model_error, *queue_full, *wrong_rows, *count_batch;
    if (!PyArg_ParseTuple(errors, "OOO;FrontQueue: errors is (EngineError, RequestTimeout, ModelError)",
                          &engine_error, &request_timeout, &model_error) ||
        !PyArg_ParseTuple(rules, "OOO;FrontQueue: rules is (queue_full, wrong_rows, count_batch)", &queue_full,
                          &wrong_rows, &count_batch))
        return -1;
    PyObject *asyncio = PyImport_ImportModule("asyncio"), *heapq = PyImport_ImportModule("heapq");
    PyObject *get_loop = asyncio != NULL ? PyObject_GetAttrString(asyncio, "get_running_loop") : NULL;
    PyObject *push = heapq != NULL ? PyObject_GetAttrString(heapq, "heappush") : NULL;
    PyObject *pop = heapq != NULL ? PyObject_GetAttrString(heapq, "heappop") : NULL;
    PyObject *add = PyObject_GetAttrString(shared, "add");
    PyObject *total = add != NULL ? PyObject_GetAttrString(shared, "total") : NULL;
    PyObject *kwnames = Py_BuildValue("(ss)", "window_ns", "deadline_ns");
    Py_XDECREF(asyncio);
    Py_XDECREF(heapq);
    if (get_loop == NULL || push == NULL || pop == NULL || add == NULL || total == NULL || kwnames == NULL) {
        Py_XDECREF(get_loop);
        Py_XDECREF(push);
        Py_XDECREF(pop);
        Py_XDECREF(add);
        Py_XDECREF(total);
        Py_XDECREF(kwnames);
        return -1;
    }
    Py_XSETREF(q->get_running_loop, get_loop);
    Py_XSETREF(q->heappush, push);
    Py_XSETREF(q->heappop, pop);
    Py_XSETREF(q->shared, Py_NewRef(shared));
    q->counter = Py_IS_TYPE(shared, q->st->counter_type);
    Py_XSETREF(q->shared_add, add);
    Py_XSETREF(q->shared_total, total);
    Py_XSETREF(q->request_kwnames, kwnames);
    Py_XSETREF(q->model, Py_NewRef(model));
    Py_XSETREF(q->key, Py_NewRef(key));
    Py_XSETREF(q->queue, Py_NewRef(queue));
    Py_XSETREF(q->link, link != Py_None ? Py_NewRef(link) : NULL);
    Py_XSETREF(q->targets, link != Py_None ? Py_NewRef(targets) : NULL);
    Py_XSETREF(q->engine_error, Py_NewRef(engine_error));
    Py_XSETREF(q->request_timeout, Py_NewRef(request_timeout));
    Py_XSETREF(q->model_error, Py_NewRef(model_error));
    Py_XSETREF(q->queue_full, Py_NewRef(queue_full));
    Py_XSETREF(q->wrong_rows, Py_NewRef(wrong_rows));
    Py_XSETREF(q->count_batch, Py_NewRef(count_batch));
    q->max_batch_size = max_batch_size;
    q->max_queue_size = max_queue_size;
    q->window_ns = window_ns;
    Py_XSETREF(q->plan_refusal, plan_refusal != Py_None ? Py_NewRef(plan_refusal) : NULL);
    q->interpreters = interpreters;
    return 0;
}

/* The loop's methods, from the first request on (the loop that takes the requests). */
static int bind_loop(fqueue *q)
{
    PyObject *loop = PyObject_CallNoArgs(q->get_running_loop);
    if (loop == NULL)
        return -1;
    PyObject *create = PyObject_GetAttrString(loop, "create_future");
    PyObject *soon = create != NULL ? PyObject_GetAttrString(loop, "call_soon") : NULL;
    PyObject *flush = soon != NULL ? PyObject_GetAttrString((PyObject *)q, "flush") : NULL;
    if (flush == NULL) {
        Py_DECREF(loop);
        Py_XDECREF(create);
        Py_XDECREF(soon);
        return -1;
    }
    Py_XSETREF(q->loop, loop);
    Py_XSETREF(q->create_future, create);
    Py_XSETREF(q->call_soon, soon);
    Py_XSETREF(q->flush, flush);
    return 0;
}

/* The model's target on the Link (borrowed), or NULL (with an exception set only on error). */
static PyObject *link_target_of(fqueue *q)
{
    if (q->link == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(q->targets, q->key);
    if (found == NULL || !PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2)
        return NULL;
    return PyTuple_GET_ITEM(found, 1);
}

/* The adaptive policy's admission (Batcher._admission's): a request that must wait (others
 * queued on any loop, every interpreter running a batch of the model, or its connection was
 * held) is judged by the policy, one that need not is only counted in its arrival rate.
 * 0, or -1 with the refusal (counted) or another exception set. */
static int plan_admission(fqueue *q, double now, long long total, long long samples, double budget, double waited,
                          PyObject *budget_obj, int held)
{
    PyObject *target = link_target_of(q);
    if (target == NULL)
        return PyErr_Occurred() ? -1 : 0; /* the model went away: the flush says so */
    long long running = q->counter ? as_counter_loop_running(q->shared) : 0;
    if (!(total > 0 || held || running >= q->interpreters))
        return as_link_plan_arrive(q->link, target, now, samples);
    double wait = as_link_plan_admit(q->link, target, now, total, samples, budget, waited, 1);
    if (wait == -3.0)
        return -1;
    if (isnan(wait) || wait < 0.0)
        return 0;
    PyObject *refused = PyObject_CallFunction(q->plan_refusal, "dOO", wait, budget_obj, held ? Py_True : Py_False);
    if (refused == NULL)
        return -1;
    q->refused++;
    PyErr_SetObject((PyObject *)Py_TYPE(refused), refused);
    Py_DECREF(refused);
    return -1;
}

/* submit(inputs, samples, /, *, deadline=None, budget=None, trace=None, waited=0.0,
 * context=None, held=False) -> future of the outputs (Batcher.submit's interface; the
 * queue's bound is its only admission: budget, waited and held judge nothing). */
static PyObject *fq_submit(fqueue *q, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "submit: expected (inputs, samples), got %zd arguments", nargs);
    PyObject *deadline = Py_None, *trace = Py_None, *context = Py_None, *budget = Py_None, *waited_obj = Py_None,
             *held = Py_False;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    module_state *st = q->st;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        /* a call site's keywords are interned: the same objects as the module's names */
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (name == st->str_deadline || PyUnicode_Compare(name, st->str_deadline) == 0)
            deadline = value;
        else if (name == st->str_trace || PyUnicode_Compare(name, st->str_trace) == 0)
            trace = value;
        else if (name == st->str_context || PyUnicode_Compare(name, st->str_context) == 0)
            context = value;
        else if (name == st->str_budget || PyUnicode_Compare(name, st->str_budget) == 0)
            budget = value;
        else if (name == st->str_waited || PyUnicode_Compare(name, st->str_waited) == 0)
            waited_obj = value;
        else if (name == st->str_held || PyUnicode_Compare(name, st->str_held) == 0)
            held = value;
        else
            return PyErr_Format(PyExc_TypeError, "submit: unexpected keyword argument %R", name);
    }
    if (q->model == NULL)
        return PyErr_Format(PyExc_TypeError, "FrontQueue: __init__ was not called");
    if (q->closed)
        return PyErr_Format(q->engine_error, "model %R is shutting down", q->model);
    if (trace != Py_None || context != Py_None)
        return PyErr_Format(q->engine_error, "model %R: a traced request goes to its ModelHandle.traced batcher",
                            q->model);
    long long samples = PyLong_AsLongLong(args[1]);
    if (samples == -1 && PyErr_Occurred())
        return NULL;
    double now = monotonic();
    long long total = shared_total(q);
    if (total == -1 && PyErr_Occurred())
        return NULL;
    double budget_s = NAN, waited = 0.0;
    if (budget != Py_None && (budget_s = PyFloat_AsDouble(budget)) == -1.0 && PyErr_Occurred())
        return NULL;
    if (waited_obj != Py_None && (waited = PyFloat_AsDouble(waited_obj)) == -1.0 && PyErr_Occurred())
        return NULL;
    waited = waited > 0.0 ? waited : 0.0;
    if (q->plan_refusal != NULL) { /* the adaptive policy's admission, before the queue's bound */
        int is_held = PyObject_IsTrue(held);
        if (is_held < 0)
            return NULL;
        if (plan_admission(q, now, total, samples, budget_s, waited, budget, is_held) < 0)
            return NULL;
    }
    if (total > 0 && total + samples > q->max_queue_size) {
        PyObject *refused = PyObject_CallFunction(q->queue_full, "OLLL", q->model, total, samples, q->max_queue_size);
        if (refused == NULL)
            return NULL;
        if (refused != Py_None) {
            q->refused++;
            PyErr_SetObject((PyObject *)Py_TYPE(refused), refused);
            Py_DECREF(refused);
            return NULL;
        }
        Py_DECREF(refused);
    }
    double at = NAN;
    if (deadline != Py_None) {
        at = PyFloat_AsDouble(deadline);
        if (at == -1.0 && PyErr_Occurred())
            return NULL;
        if (at <= now)
            return PyErr_Format(q->request_timeout, "model %R: the request's deadline passed before it was queued",
                                q->model);
    }
    if (q->loop == NULL && bind_loop(q) < 0)
        return NULL;
    PyObject *future = PyObject_CallNoArgs(q->create_future);
    if (future == NULL)
        return NULL;
    freq *r = PyObject_GC_New(freq, q->st->front_request_type);
    if (r == NULL) {
        Py_DECREF(future);
        return NULL;
    }
    r->vectorcall = freq_vectorcall;
    r->owner = (fqueue *)Py_NewRef(q);
    r->future = Py_NewRef(future);
    r->inputs = Py_NewRef(args[0]);
    r->deadline = Py_NewRef(deadline);
    r->job = Py_NewRef(Py_None);
    r->arrival = now;
    r->budget = budget_s;
    r->waited = waited;
    r->samples = samples;
    r->deadline_ns = 0;
    if (deadline != Py_None) {
        long long ns = llround(at * 1e9);
        r->deadline_ns = ns > 1 ? ns : 1;
    }
    PyObject_GC_Track(r);
    if (PySet_Add(q->pending, (PyObject *)r) < 0)
        goto failed;
    if (!q->flushing) { /* before it is deferred: a deferred request always has its flush to come */
        PyObject *handle = PyObject_CallOneArg(q->call_soon, q->flush);
        if (handle == NULL)
            goto failed;
        Py_DECREF(handle);
        q->flushing = 1;
    }
    /* counted as queued on this loop until the flush hands it on (and takes its samples off) */
    if (add_shared(q, samples) < 0)
        goto failed;
    if (PyList_Append(q->deferred, (PyObject *)r) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (add_shared(q, -samples) < 0)
            PyErr_WriteUnraisable((PyObject *)q);
        PyErr_Restore(type, value, tb);
        goto failed;
    }
    if (deadline != Py_None) {
        PyObject *entry = PyTuple_Pack(2, deadline, (PyObject *)r);
        PyObject *push[2] = {q->deadlines, entry};
        PyObject *pushed = entry != NULL ? PyObject_Vectorcall(q->heappush, push, 2, NULL) : NULL;
        Py_XDECREF(entry);
        if (pushed == NULL)
            goto failed;
        Py_DECREF(pushed);
        if (at < q->expiry_at) {
            PyObject *armed = PyObject_CallMethodOneArg((PyObject *)q, st->str__arm, deadline);
            if (armed == NULL)
                goto failed;
            Py_DECREF(armed);
        }
    }
    Py_DECREF(r);
    return future;
failed: {
    /* not taken in, or taken in as far as it went: its future is cancelled, so a flush drops it */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PySet_Discard(q->pending, (PyObject *)r);
    PyObject *cancelled = PyObject_CallMethodNoArgs(future, st->str_cancel);
    Py_XDECREF(cancelled);
    PyErr_Restore(type, value, tb);
}
    Py_DECREF(r);
    Py_DECREF(future);
    return NULL;
}

/* One request to the pool's queue: the job the queue's request returned (a Link's: (pool
 * address, job id)); NULL with an exception set. */
static PyObject *hand_on(fqueue *q, freq *r)
{
    if (q->link != NULL) {
        PyObject *found = PyDict_GetItemWithError(q->targets, q->key); /* borrowed */
        if (found == NULL && PyErr_Occurred())
            return NULL;
        if (found != NULL && PyTuple_Check(found) && PyTuple_GET_SIZE(found) == 2) {
            unsigned long long id;
            if (as_link_request(q->link, PyTuple_GET_ITEM(found, 1), r->inputs, r->samples, q->window_ns,
                                r->deadline_ns, r->budget, r->waited, (PyObject *)r, &id) < 0)
                return NULL;
            return Py_BuildValue("(OK)", PyTuple_GET_ITEM(found, 0), id);
        }
        /* the queue's request says why the model is not there */
    }
    PyObject *samples = PyLong_FromLongLong(r->samples), *window = PyLong_FromLongLong(q->window_ns),
             *deadline_ns = PyLong_FromLongLong(r->deadline_ns);
    PyObject *job = NULL;
    if (samples != NULL && window != NULL && deadline_ns != NULL) {
        PyObject *call[7] = {q->queue, q->key, r->inputs, samples, (PyObject *)r, window, deadline_ns};
        job = PyObject_VectorcallMethod(q->st->str_request, call, 5, q->request_kwnames);
    }
    Py_XDECREF(samples);
    Py_XDECREF(window);
    Py_XDECREF(deadline_ns);
    return job;
}

/* The queue object's hold() or release(), where there is no Link; what it raises is reported,
 * not raised: every request taken in is still handed on or told its failure. */
static void call_queue(fqueue *q, const char *method)
{
    PyObject *r = PyObject_CallMethod(q->queue, method, NULL);
    if (r == NULL)
        PyErr_WriteUnraisable(q->queue);
    Py_XDECREF(r);
}

/* flush(): hand the requests taken in since the last flush to the pool, together: once per
 * loop iteration, after every connection's bytes were read, so a worker that frees finds
 * them all queued and batches them, rather than the first alone. One that cannot be handed
 * on (its model went away) fails alone. */
static PyObject *fq_flush(fqueue *q, PyObject *Py_UNUSED(ignored))
{
    q->flushing = 0;
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *deferred = q->deferred;
    q->deferred = fresh;
    Py_ssize_t n = PyList_GET_SIZE(deferred);
    long long samples = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        samples += ((freq *)PyList_GET_ITEM(deferred, i))->samples;
    if (n > 0 && add_shared(q, -samples) < 0)
        PyErr_WriteUnraisable((PyObject *)q);
    if (n > 0) { /* queued together: an interpreter woken by the first finds the rest queued */
        if (q->link != NULL)
            as_link_hold(q->link);
        else
            call_queue(q, "hold"); /* if it fails, the requests are still handed on, one by one */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        freq *r = (freq *)PyList_GET_ITEM(deferred, i);
        int done = future_done(q->st, r->future);
        if (done != 0) { /* withdrawn or timed out before it was handed on */
            if (done < 0)
                PyErr_WriteUnraisable(r->future);
            if (PySet_Discard(q->pending, (PyObject *)r) < 0)
                PyErr_WriteUnraisable((PyObject *)q);
            Py_CLEAR(r->inputs);
            continue;
        }
        PyObject *job = hand_on(q, r);
        if (job == NULL) { /* the request's own failure */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL)
                PyException_SetTraceback(value, tb);
            if (PySet_Discard(q->pending, (PyObject *)r) < 0 ||
                future_tell(r->future, q->st->str_set_exception, value) < 0)
                PyErr_WriteUnraisable((PyObject *)q);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            Py_SETREF(r->job, job);
        }
        Py_CLEAR(r->inputs);
    }
    if (n > 0) {
        if (q->link != NULL)
            as_link_release(q->link);
        else
            call_queue(q, "release");
    }
    Py_DECREF(deferred);
    check_drained(q);
    Py_RETURN_NONE;
}

static PyMethodDef fq_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))fq_submit, METH_FASTCALL | METH_KEYWORDS,
     "submit(inputs, samples, /, *, deadline=None, budget=None, trace=None, waited=0.0, context=None, "
     "held=False) -> future of the outputs: Batcher.submit; the queue's bound is its only admission (budget, "
     "waited and held judge nothing); a traced request, or one with a caller's context, goes to ModelHandle.traced"},
    {"flush", (PyCFunction)fq_flush, METH_NOARGS,
     "flush() -> None: hand the requests taken in since the last flush to the pool's queue, together"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef fq_members[] = {
    {"model", T_OBJECT, offsetof(fqueue, model), READONLY, "the model's name"},
    {"key", T_OBJECT, offsetof(fqueue, key), READONLY, "the model version's key in the pool"},
    {"max_batch_size", T_LONGLONG, offsetof(fqueue, max_batch_size), READONLY, NULL},
    {"max_queue_size", T_LONGLONG, offsetof(fqueue, max_queue_size), READONLY, NULL},
    {"window_ns", T_LONGLONG, offsetof(fqueue, window_ns), READONLY, "the window rule's max_queue_delay"},
    {"loop", T_OBJECT, offsetof(fqueue, loop), READONLY, "the loop that took its first request, or None"},
    {"link", T_OBJECT, offsetof(fqueue, link), READONLY,
     "the Link its flush queues requests on directly, or None (the queue's request() is called)"},
    {"pending", T_OBJECT, offsetof(fqueue, pending), READONLY,
     "set of FrontRequest: queued or running, their completion not yet come"},
    {"deadlines", T_OBJECT, offsetof(fqueue, deadlines), READONLY,
     "heap [(deadline, FrontRequest)]: an answered one's entry goes when it comes to the top"},
    {"deferred", T_OBJECT, offsetof(fqueue, deferred), READONLY, "requests taken in since the last flush"},
    {"drained", T_OBJECT, offsetof(fqueue, drained), 0, "a future told None once nothing is pending, or None"},
    {"batch_sizes", T_OBJECT, offsetof(fqueue, batch_sizes), READONLY,
     "{samples: [batches led, their seconds summed]}"},
    {"last_dispatch", T_OBJECT, offsetof(fqueue, last_dispatch), 0,
     "clock time the last batch its requests led started, or None"},
    {"expiry_at", T_DOUBLE, offsetof(fqueue, expiry_at), 0,
     "when the deadline timer fires (inf: not armed); submit calls _arm(deadline) for an earlier one"},
    {"closed", T_BOOL, offsetof(fqueue, closed), 0, "submit refuses every request (EngineError)"},
    {"batches", T_LONGLONG, offsetof(fqueue, batches), 0, "batches its requests led"},
    {"requests", T_LONGLONG, offsetof(fqueue, requests), 0, "requests answered by a batch"},
    {"refused", T_LONGLONG, offsetof(fqueue, refused), 0, NULL},
    {"timed_out", T_LONGLONG, offsetof(fqueue, timed_out), 0, NULL},
    {"cancelled", T_LONGLONG, offsetof(fqueue, cancelled), 0,
     "requests cancelled running alone in an interpreter once their deadline passed"},
    {"queue_seconds", T_DOUBLE, offsetof(fqueue, queue_seconds), 0,
     "summed over requests: from arrival to their batch's start"},
    {"compute_seconds", T_DOUBLE, offsetof(fqueue, compute_seconds), 0,
     "summed over requests: their batch's run time"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot fq_slots[] = {
    {Py_tp_new, fq_new},
    {Py_tp_init, fq_init},
    {Py_tp_dealloc, fq_dealloc},
    {Py_tp_traverse, fq_traverse},
    {Py_tp_clear, fq_clear},
    {Py_tp_methods, fq_methods},
    {Py_tp_members, fq_members},
    {Py_tp_doc, "FrontQueue(*, model, key, queue, shared, max_batch_size, max_queue_size, window_ns, errors, "
                "rules, link=None, targets=None, plan_refusal=None, interpreters=1): a front loop's side of one "
                "model batched in the pool's shared queue (batching/native.py). errors: (EngineError, "
                "RequestTimeout, ModelError); rules: (queue_full, wrong_rows, count_batch); plan_refusal(wait, "
                "budget, held) -> Overloaded: the model's target has an adaptive policy, whose admission runs "
                "at submit."},
    {0, NULL},
};

PyType_Spec as_front_queue_spec = {
    .name = "aserve._native.FrontQueue",
    .basicsize = sizeof(fqueue),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = fq_slots,
};
