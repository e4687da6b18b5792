/* Link: the Python type a front uses, in its own interpreter and its own copy of this
 * extension, to submit batches to the host's pools (link.h) and take their completions.
 *
 * Everything that touches a Python object here runs under the front's GIL; everything
 * that touches a pool runs through the host's as_link_api. A job's token and the
 * buffers of its inputs are the front's objects: the host only carries their addresses.
 */
#include "link.h"

#include <math.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    const as_link_api *api;
    as_link *link;
    Py_ssize_t jobs;   /* submitted, not yet taken */
    Py_ssize_t inputs; /* inputs still referenced by the host or an interpreter */
    PyObject *tensor_type; /* what a request's outputs are made of (request), or NULL */
    PyObject *error;       /* (error type, text) -> the exception a failed request is told, or NULL */
} linkobj;

/* What Link.request queues for one model, read once (Link.target): a capsule's. */
typedef struct {
    pool_t *pool;
    char *key;
    uint64_t mask;
    int64_t max_rows;
    void *counter;
    int slots[4]; /* the Counter's slots: queued samples, requests, batches; running batches */
    as_plan *plan; /* the model's adaptive policy (plan.h), which the host keeps while the front may use it; or NULL */
    Py_ssize_t n;
    char **names, **datatypes;
} ltarget;

#define TARGET_NAME "aserve._native.Link.target"

/* The front's hold on one job's input memory. */
typedef struct {
    size_t n;   /* views taken */
    size_t cap; /* inputs */
    Py_buffer views[];
} held_t;

/* The outputs of one finished job, shared by the buffers over them (front GIL). */
typedef struct {
    const as_link_api *api;
    pool_t *pool;
    int worker;
    int shared; /* the owner is a shared one: the job ran coalesced with others */
    void *owner;
    Py_ssize_t refs;
} fresult_t;

static void held_release(held_t *h)
{
    for (size_t i = 0; i < h->n; i++)
        PyBuffer_Release(&h->views[i]);
    PyMem_Free(h);
}

static void result_decref(void *ctx)
{
    fresult_t *r = ctx;
    if (--r->refs > 0)
        return;
    if (r->shared)
        r->api->shared_release(r->pool, r->owner);
    else
        r->api->give_back(r->pool, r->worker, r->owner);
    PyMem_Free(r);
}

static PyObject *link_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"api", "tensor", "error", NULL};
    PyObject *address, *tensor_type = NULL, *error = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:Link", kwlist, &address, &tensor_type, &error))
        return NULL;
    if ((tensor_type != NULL && !PyCallable_Check(tensor_type)) || (error != NULL && !PyCallable_Check(error)))
        return PyErr_Format(PyExc_TypeError, "Link: tensor and error must be callables");
    const as_link_api *api = PyLong_AsVoidPtr(address);
    if (api == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Link: api must be the address link_api() returned");
        return NULL;
    }
    if (api->version != AS_LINK_API_VERSION || api->job_size != sizeof(hjob) || api->link_size != sizeof(as_link)) {
        PyErr_Format(PyExc_RuntimeError, "Link: the host's link table is version %d (%zu, %zu); this build has "
                     "%d (%zu, %zu)", api->version, api->job_size, api->link_size, AS_LINK_API_VERSION,
                     sizeof(hjob), sizeof(as_link));
        return NULL;
    }
    linkobj *self = (linkobj *)tp->tp_alloc(tp, 0);
    if (self == NULL)
        return NULL;
    self->api = api;
    self->tensor_type = Py_XNewRef(tensor_type);
    self->error = Py_XNewRef(error);
    self->link = api->open();
    if (self->link == NULL) {
        Py_DECREF(self);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return (PyObject *)self;
}

static void link_dealloc(linkobj *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->link != NULL)
        self->api->release(self->link); /* held jobs are out too: they complete, and the link is leaked */
    /* a link with jobs out is leaked rather than freed under a worker's feet */
    if (self->link != NULL && self->jobs == 0 && self->inputs == 0)
        self->api->close(self->link);
    Py_XDECREF(self->tensor_type);
    Py_XDECREF(self->error);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *link_fileno(linkobj *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(self->link->efd);
}

/* Each input's shape and data (in[i].name and .datatype set; held->views taken in order,
 * held->n counting them); 0, or -1 with an exception set. */
static int read_inputs(module_state *st, PyObject *const *items, as_tensor *in, held_t *held)
{
    for (size_t i = 0; i < held->cap; i++) {
        as_tensor *t = &in[i];
        PyObject *shape = PyObject_GetAttr(items[i], st->str_shape);
        if (shape == NULL || !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > AS_MAX_DIMS) {
            if (shape != NULL)
                PyErr_Format(PyExc_ValueError, "Link: input %s: shape must be a tuple of at most %d dimensions",
                             t->name, AS_MAX_DIMS);
            Py_XDECREF(shape);
            return -1;
        }
        t->ndim = (int)PyTuple_GET_SIZE(shape);
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
            if (t->shape[d] == -1 && PyErr_Occurred()) {
                Py_DECREF(shape);
                return -1;
            }
        }
        Py_DECREF(shape);
        PyObject *data = PyObject_GetAttr(items[i], st->str_data);
        if (data == NULL)
            return -1;
        int rc = PyObject_GetBuffer(data, &held->views[i], PyBUF_C_CONTIGUOUS);
        Py_DECREF(data);
        if (rc < 0)
            return -1;
        held->n = i + 1;
        t->data = held->views[i].buf;
        t->nbytes = (size_t)held->views[i].len;
    }
    return 0;
}

static PyObject *link_infer(linkobj *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pool", "model", "mask", "names", "datatypes", "inputs", "token", "trace", "max_rows",
                             "waiting", "context", NULL};
    PyObject *pool_address, *names, *datatypes, *inputs, *token, *waiting = Py_None;
    const char *key, *context = NULL;
    unsigned long long mask;
    int trace = 0;
    long long max_rows = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsKOOOO|pLOz:infer", kwlist, &pool_address, &key, &mask, &names,
                                     &datatypes, &inputs, &token, &trace, &max_rows, &waiting, &context))
        return NULL;
    as_wait wait = {0};
    if (waiting != Py_None) {
        unsigned long long counter, plan = 0;
        long long samples, requests;
        if (!PyArg_ParseTuple(waiting, "K(iii)LL|K;Link.infer: waiting must be (counter, (samples slot, requests "
                              "slot, batches slot), samples, requests[, plan])",
                              &counter, &wait.slots[0], &wait.slots[1], &wait.slots[2], &samples, &requests, &plan))
            return NULL;
        wait.plan = (as_plan *)(uintptr_t)plan;
        if (counter == 0 || counter % 64 != 0)
            return PyErr_Format(PyExc_ValueError, "Link.infer: waiting: %#llx is not a counter's address", counter);
        int n = as_counter_slots((void *)(uintptr_t)counter);
        for (int i = 0; i < 3; i++)
            if (wait.slots[i] < 0 || wait.slots[i] >= n)
                return PyErr_Format(PyExc_ValueError, "Link.infer: waiting: slot %d of %d is out of range",
                                    wait.slots[i], n);
        wait.counter = (void *)(uintptr_t)counter;
        wait.samples = samples;
        wait.requests = requests;
    }
    module_state *st = as_state_of_type(Py_TYPE(self));
    if (st == NULL)
        return PyErr_Format(PyExc_RuntimeError, "Link.infer: the module is gone");
    pool_t *p = PyLong_AsVoidPtr(pool_address);
    if (p == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "Link.infer: no pool at address 0");
    if (!PyTuple_Check(names) || !PyTuple_Check(datatypes) || !PyList_Check(inputs) ||
        PyTuple_GET_SIZE(names) != PyList_GET_SIZE(inputs) || PyTuple_GET_SIZE(datatypes) != PyList_GET_SIZE(inputs))
        return PyErr_Format(PyExc_TypeError, "Link.infer: names and datatypes (tuples) and inputs (a list) "
                                             "must have one item per input");
    size_t n = (size_t)PyList_GET_SIZE(inputs);
    as_tensor *in = PyMem_Calloc(n ? n : 1, sizeof(as_tensor));
    held_t *held = PyMem_Calloc(1, sizeof(held_t) + n * sizeof(Py_buffer));
    if (in == NULL || held == NULL) {
        PyMem_Free(in);
        PyMem_Free(held);
        return PyErr_NoMemory();
    }
    held->cap = n;
    for (size_t i = 0; i < n; i++) {
        in[i].name = (char *)PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, (Py_ssize_t)i));
        in[i].datatype = (char *)PyUnicode_AsUTF8(PyTuple_GET_ITEM(datatypes, (Py_ssize_t)i));
        if (in[i].name == NULL || in[i].datatype == NULL)
            goto error;
    }
    if (read_inputs(st, PySequence_Fast_ITEMS(inputs), in, held) < 0)
        goto error;
    uint64_t id;
    if (self->api->infer(self->link, p, key, mask, n, in, token, held, trace, context, max_rows, &wait,
                         NULL, &id) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    PyMem_Free(in);
    Py_INCREF(token); /* the job's, until take hands it back */
    self->jobs++;
    self->inputs++;
    return PyLong_FromUnsignedLongLong(id);
error:
    PyMem_Free(in);
    held_release(held);
    return NULL;
}

static void target_free(PyObject *capsule)
{
    ltarget *t = PyCapsule_GetPointer(capsule, TARGET_NAME);
    if (t == NULL)
        return;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyMem_Free(t->names[i]);
        PyMem_Free(t->datatypes[i]);
    }
    PyMem_Free(t->names);
    PyMem_Free(t->datatypes);
    PyMem_Free(t->key);
    PyMem_Free(t);
}

static char *copy_text(PyObject *str)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(str, &n);
    if (s == NULL)
        return NULL;
    char *copy = PyMem_Malloc((size_t)n + 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(copy, s, (size_t)n + 1);
    return copy;
}

/* target(pool, model, mask, names, datatypes, max_rows, counter, slots) -> what request takes */
static PyObject *link_target(linkobj *self, PyObject *args)
{
    PyObject *pool_address, *model, *names, *datatypes;
    unsigned long long mask, counter, plan = 0;
    long long max_rows;
    int slots[4];
    if (!PyArg_ParseTuple(args, "OUKO!O!LK(iiii)|K:target", &pool_address, &model, &mask, &PyTuple_Type, &names,
                          &PyTuple_Type, &datatypes, &max_rows, &counter, &slots[0], &slots[1], &slots[2], &slots[3],
                          &plan))
        return NULL;
    pool_t *p = PyLong_AsVoidPtr(pool_address);
    if (p == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "Link.target: no pool at address 0");
    if (counter == 0 || counter % 64 != 0)
        return PyErr_Format(PyExc_ValueError, "Link.target: %#llx is not a counter's address", counter);
    int have = as_counter_slots((void *)(uintptr_t)counter);
    for (int i = 0; i < 4; i++)
        if (slots[i] < 0 || slots[i] >= have)
            return PyErr_Format(PyExc_ValueError, "Link.target: slot %d of %d is out of range", slots[i], have);
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(datatypes) != n)
        return PyErr_Format(PyExc_TypeError, "Link.target: one datatype per input name");
    ltarget *t = PyMem_Calloc(1, sizeof *t);
    if (t == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(t, TARGET_NAME, target_free);
    if (capsule == NULL) {
        PyMem_Free(t);
        return NULL;
    }
    t->pool = p;
    t->mask = mask;
    t->max_rows = max_rows;
    t->counter = (void *)(uintptr_t)counter;
    t->plan = (as_plan *)(uintptr_t)plan;
    memcpy(t->slots, slots, sizeof slots);
    t->names = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *));
    t->datatypes = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *));
    if (t->names == NULL || t->datatypes == NULL) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    t->n = n;
    t->key = copy_text(model);
    for (Py_ssize_t i = 0; t->key != NULL && i < n; i++) {
        t->names[i] = copy_text(PyTuple_GET_ITEM(names, i));
        t->datatypes[i] = t->names[i] != NULL ? copy_text(PyTuple_GET_ITEM(datatypes, i)) : NULL;
        if (t->datatypes[i] == NULL)
            break;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* One request of the target's model queued on the Link `link` (Link.request, FrontQueue's
 * flush): the pool batches it by the window rule; drain calls done(outputs, None, led rows,
 * run start ns, run end ns) or done(None, error, 0, 0, 0). 0 and *id, or -1 with an
 * exception set. */
int as_link_request(PyObject *link, PyObject *target, PyObject *inputs, long long samples, long long window_ns,
                    long long deadline_ns, double budget, double waited, PyObject *done, unsigned long long *id_out)
{
    linkobj *self = (linkobj *)link;
    if (self->tensor_type == NULL || self->error == NULL) {
        PyErr_Format(PyExc_TypeError, "Link.request: the Link was made without tensor= and error=");
        return -1;
    }
    module_state *st = as_state_of_type(Py_TYPE(self));
    if (st == NULL) {
        PyErr_Format(PyExc_RuntimeError, "Link.request: the module is gone");
        return -1;
    }
    ltarget *t = PyCapsule_GetPointer(target, TARGET_NAME);
    if (t == NULL)
        return -1;
    if (window_ns < 0 || deadline_ns < 0 || samples < 0) {
        PyErr_Format(PyExc_ValueError, "Link.request: samples, the window and the deadline must be >= 0, "
                     "got %lld, %lld and %lld", samples, window_ns, deadline_ns);
        return -1;
    }
    if (!(PyList_Check(inputs) || PyTuple_Check(inputs)) || PySequence_Fast_GET_SIZE(inputs) != t->n) {
        PyErr_Format(PyExc_TypeError, "Link.request: expected a list of %zd inputs", t->n);
        return -1;
    }
    size_t n = (size_t)t->n;
    as_tensor local[4], *in = n <= 4 ? local : PyMem_Calloc(n, sizeof(as_tensor));
    held_t *held = PyMem_Calloc(1, sizeof(held_t) + n * sizeof(Py_buffer));
    if (in == NULL || held == NULL) {
        if (in != local)
            PyMem_Free(in);
        PyMem_Free(held);
        PyErr_NoMemory();
        return -1;
    }
    if (in == local)
        memset(local, 0, sizeof local);
    held->cap = n;
    for (size_t i = 0; i < n; i++) {
        in[i].name = t->names[i];
        in[i].datatype = t->datatypes[i];
    }
    as_wait wait = {t->counter, {t->slots[0], t->slots[1], t->slots[2]}, samples, 1};
    as_window win = {window_ns, deadline_ns, t->slots[3], t->plan, budget, waited};
    uint64_t id;
    int rc = -1;
    if (read_inputs(st, PySequence_Fast_ITEMS(inputs), in, held) < 0)
        goto done;
    if (self->api->infer(self->link, t->pool, t->key, t->mask, n, in, done, held, 0, NULL, t->max_rows, &wait, &win,
                         &id) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    held = NULL; /* the job's, until its inputs come back */
    Py_INCREF(done);
    self->jobs++;
    self->inputs++;
    *id_out = id;
    rc = 0;
done:
    if (in != local)
        PyMem_Free(in);
    if (held != NULL)
        held_release(held);
    return rc;
}

static ltarget *plan_target(PyObject *target)
{
    ltarget *t = PyCapsule_GetPointer(target, TARGET_NAME);
    return t;
}

double as_link_plan_admit(PyObject *link, PyObject *target, double now, long long queued, long long samples,
                          double budget, double waited, int mode)
{
    linkobj *self = (linkobj *)link;
    ltarget *t = plan_target(target);
    if (t == NULL)
        return -3.0;
    if (t->plan == NULL)
        return -2.0;
    return self->api->plan_admit(t->plan, now, queued, samples, budget, waited, mode);
}

int as_link_plan_arrive(PyObject *link, PyObject *target, double now, long long samples)
{
    linkobj *self = (linkobj *)link;
    ltarget *t = plan_target(target);
    if (t == NULL)
        return -1;
    if (t->plan != NULL)
        self->api->plan_arrive(t->plan, now, samples);
    return 0;
}

double as_link_plan_rate(PyObject *link, PyObject *target)
{
    linkobj *self = (linkobj *)link;
    ltarget *t = plan_target(target);
    if (t == NULL)
        return -3.0;
    return t->plan != NULL ? self->api->plan_rate(t->plan) : NAN;
}

/* plan_admit(target, now, queued, samples, budget, waited, mode) -> Retry-After s or None */
static PyObject *link_plan_admit(linkobj *self, PyObject *args)
{
    PyObject *target, *budget_obj;
    double now, waited;
    long long queued, samples;
    int mode;
    if (!PyArg_ParseTuple(args, "OdLLOdi:plan_admit", &target, &now, &queued, &samples, &budget_obj, &waited, &mode))
        return NULL;
    double budget = budget_obj == Py_None ? NAN : PyFloat_AsDouble(budget_obj);
    if (budget_obj != Py_None && budget == -1.0 && PyErr_Occurred())
        return NULL;
    if (mode < 0 || mode > 2)
        return PyErr_Format(PyExc_ValueError, "Link.plan_admit: mode must be 0, 1 or 2, got %d", mode);
    double wait = as_link_plan_admit((PyObject *)self, target, now, queued, samples, budget, waited, mode);
    if (wait == -3.0)
        return NULL;
    if (wait == -2.0)
        return PyErr_Format(PyExc_ValueError, "Link.plan_admit: the target's model has no adaptive policy");
    if (isnan(wait))
        Py_RETURN_NONE;
    return PyFloat_FromDouble(wait);
}

/* plan_arrive(target, now, samples): an arrival counts in the policy's rate */
static PyObject *link_plan_arrive(linkobj *self, PyObject *args)
{
    PyObject *target;
    double now;
    long long samples;
    if (!PyArg_ParseTuple(args, "OdL:plan_arrive", &target, &now, &samples))
        return NULL;
    if (as_link_plan_arrive((PyObject *)self, target, now, samples) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* plan_rate(target) -> requests/s admitted while overloaded, or None */
static PyObject *link_plan_rate(linkobj *self, PyObject *target)
{
    double rate = as_link_plan_rate((PyObject *)self, target);
    if (rate == -3.0)
        return NULL;
    if (isnan(rate))
        Py_RETURN_NONE;
    return PyFloat_FromDouble(rate);
}

void as_link_hold(PyObject *link)
{
    linkobj *self = (linkobj *)link;
    self->api->hold(self->link);
}

void as_link_release(PyObject *link)
{
    linkobj *self = (linkobj *)link;
    self->api->release(self->link);
}

/* request(target, inputs, samples, window_ns, deadline_ns, done) -> job id (as_link_request) */
static PyObject *link_request(linkobj *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError, "Link.request: expected 6 arguments, got %zd", nargs);
    long long samples = PyLong_AsLongLong(args[2]), window_ns = PyLong_AsLongLong(args[3]),
              deadline_ns = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    unsigned long long id;
    if (as_link_request((PyObject *)self, args[0], args[1], samples, window_ns, deadline_ns, NAN, 0.0, args[5], &id) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(id);
}

/* The job's outputs: a list of (name, datatype, shape, buffer), or with tensor_type a dict
 * {name: tensor_type(datatype, shape, buffer)}. */
static PyObject *make_outputs(linkobj *self, hjob *j, PyTypeObject *buffer_type, PyObject *tensor_type)
{
    fresult_t *r = PyMem_Calloc(1, sizeof *r);
    if (r == NULL)
        return PyErr_NoMemory(); /* job_free gives the owner back */
    r->api = self->api;
    r->pool = j->pool;
    r->worker = j->worker;
    r->shared = j->shared;
    r->owner = j->job.owner;
    r->refs = 1; /* held while building */
    j->job.owner = NULL;
    PyObject *outputs = tensor_type != NULL
                            ? as_output_dict(buffer_type, &j->job, result_decref, r, &r->refs, tensor_type)
                            : as_output_list(buffer_type, &j->job, result_decref, r, &r->refs);
    result_decref(r);
    return outputs;
}

/* ("EngineError", the text of the exception set now, or None), the exception cleared: the
 * failure of a job whose completion could not be made. */
static PyObject *engine_error_payload(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
    PyErr_Clear();
    PyObject *payload = Py_BuildValue("(sO)", "EngineError", text != NULL ? text : Py_None);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return payload;
}

/* (None, False, the exception set now), the exception cleared: a request's done that raised,
 * listed by drain for its caller to report. */
static PyObject *raised_item(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *item = Py_BuildValue("(OOO)", Py_None, Py_False, value != NULL ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return item;
}

/* (token, ok, payload) as Pool.drain gives them; NULL with an exception set. */
static PyObject *completion(linkobj *self, hjob *j, PyTypeObject *buffer_type)
{
    PyObject *token = j->ftoken;
    if (j->job.failed)
        return Py_BuildValue("(OO(ss))", token, Py_False, j->job.error_type ? j->job.error_type : "Error",
                             j->job.error ? j->job.error : "");
    PyObject *outputs = make_outputs(self, j, buffer_type, NULL);
    if (outputs == NULL)
        return NULL;
    if (j->job.trace)
        return Py_BuildValue("(OO(NiLLz))", token, Py_True, outputs, j->worker, (long long)j->ran_from,
                             (long long)j->ran_to, j->job.result);
    return Py_BuildValue("(OON)", token, Py_True, outputs);
}

/* A request's completion (Link.request): its done called; NULL with the exception it raised. */
static PyObject *tell_request(linkobj *self, hjob *j, PyTypeObject *buffer_type)
{
    PyObject *outputs = NULL, *error = NULL;
    if (!j->job.failed)
        outputs = make_outputs(self, j, buffer_type, self->tensor_type);
    if (outputs == NULL) { /* failed, or its outputs could not be made: that is its error */
        PyObject *payload;
        if (j->job.failed) {
            payload = Py_BuildValue("(ss)", j->job.error_type ? j->job.error_type : "Error",
                                    j->job.error ? j->job.error : "");
        } else {
            payload = engine_error_payload();
        }
        error = payload != NULL ? PyObject_CallOneArg(self->error, payload) : NULL;
        Py_XDECREF(payload);
        if (error == NULL)
            return NULL;
    }
    PyObject *led = PyLong_FromLongLong(outputs != NULL ? (long long)j->led_rows : 0);
    PyObject *from = PyLong_FromLongLong(outputs != NULL ? (long long)j->ran_from : 0);
    PyObject *to = PyLong_FromLongLong(outputs != NULL ? (long long)j->ran_to : 0);
    PyObject *result = NULL;
    if (led != NULL && from != NULL && to != NULL) {
        PyObject *args[5] = {outputs != NULL ? outputs : Py_None, error != NULL ? error : Py_None, led, from, to};
        result = PyObject_Vectorcall((PyObject *)j->ftoken, args, 5, NULL);
    }
    Py_XDECREF(led);
    Py_XDECREF(from);
    Py_XDECREF(to);
    Py_XDECREF(outputs);
    Py_XDECREF(error);
    return result;
}

static void release_inputs(linkobj *self, hinputs *in)
{
    held_release(in->cookie);
    self->api->inputs_free(in);
    self->inputs--;
}

static PyObject *link_drain(linkobj *self, PyObject *Py_UNUSED(ignored))
{
    module_state *st = as_state_of_type(Py_TYPE(self));
    if (st == NULL)
        return PyErr_Format(PyExc_RuntimeError, "Link.drain: the module is gone");
    hinputs *released;
    hjob *j = self->api->take(self->link, &released);
    while (released != NULL) {
        hinputs *next = released->next;
        release_inputs(self, released);
        released = next;
    }
    PyObject *out = PyList_New(0);
    for (; j != NULL;) {
        hjob *next = j->next;
        PyObject *item;
        if (j->native) { /* a request: its done is told here; one that raised is listed */
            PyObject *told = tell_request(self, j, st->buffer_type);
            item = told == NULL ? raised_item() : NULL;
            Py_XDECREF(told);
        } else {
            item = out != NULL ? completion(self, j, st->buffer_type) : NULL;
            if (item == NULL) { /* the job fails with the reason, and no other */
                PyObject *payload = engine_error_payload();
                item = payload != NULL ? Py_BuildValue("(OON)", (PyObject *)j->ftoken, Py_False, payload) : NULL;
            }
        }
        if (out != NULL && item != NULL && PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
        Py_DECREF((PyObject *)j->ftoken); /* the job's reference */
        self->jobs--;
        hinputs *last = self->api->job_free(j);
        if (last != NULL)
            release_inputs(self, last);
        j = next;
    }
    return out;
}

static PyObject *link_cancel(linkobj *self, PyObject *args)
{
    PyObject *pool_address;
    unsigned long long id;
    if (!PyArg_ParseTuple(args, "OK:cancel", &pool_address, &id))
        return NULL;
    pool_t *p = PyLong_AsVoidPtr(pool_address);
    if (p == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "Link.cancel: no pool at address 0");
    const char *state = self->api->cancel(p, (uint64_t)id);
    if (state == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(state);
}

static PyObject *link_abandon(linkobj *self, PyObject *pool_address)
{
    pool_t *p = PyLong_AsVoidPtr(pool_address);
    if (p == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "Link.abandon: no pool at address 0");
    return PyLong_FromLong(self->api->cancel_link(p, self->link));
}

static PyObject *link_hold(linkobj *self, PyObject *Py_UNUSED(ignored))
{
    as_link_hold((PyObject *)self);
    Py_RETURN_NONE;
}

static PyObject *link_release(linkobj *self, PyObject *Py_UNUSED(ignored))
{
    as_link_release((PyObject *)self);
    Py_RETURN_NONE;
}

static PyObject *link_pending(linkobj *self, void *Py_UNUSED(closure))
{
    return Py_BuildValue("(nn)", self->jobs, self->inputs);
}

static PyMethodDef link_methods[] = {
    {"fileno", (PyCFunction)link_fileno, METH_NOARGS, "the eventfd written when a job finishes"},
    {"hold", (PyCFunction)link_hold, METH_NOARGS,
     "hold() -> None: infer keeps the jobs it makes (numbered: cancel takes them once released) until release"},
    {"release", (PyCFunction)link_release, METH_NOARGS,
     "release() -> None: queue every held job, each pool's together, then wake the interpreters that take them"},
    {"infer", (PyCFunction)(void (*)(void))link_infer, METH_VARARGS | METH_KEYWORDS,
     "infer(pool, model, mask, names, datatypes, inputs, token, trace=False, max_rows=0, waiting=None, "
     "context=None) -> job id: "
     "queue a batch of `model` (inputs: tensors with .shape and .data) on the pool at address `pool`; max_rows > 0: "
     "it may run in one batch with other fronts' batches of the model, of at most that many rows; waiting: "
     "(Counter.address, (slot, slot, slot), samples, requests): while it waits for an interpreter its samples, "
     "requests and itself count in those slots; context: the W3C headers model code runs in (Pool.infer's)"},
    {"plan_admit", (PyCFunction)link_plan_admit, METH_VARARGS,
     "plan_admit(target, now, queued, samples, budget, waited, mode) -> Retry-After seconds or None: the "
     "adaptive policy's admission for the target's model, run by the host's code (mode 0: from a request's "
     "head, nothing counted; 1: counted; 2: only a refusal counted)"},
    {"plan_arrive", (PyCFunction)link_plan_arrive, METH_VARARGS,
     "plan_arrive(target, now, samples): a request of the target's model counts in its adaptive policy's arrival "
     "rate"},
    {"plan_rate", (PyCFunction)link_plan_rate, METH_O,
     "plan_rate(target) -> requests/s the target's adaptive policy admits while overloaded, or None"},
    {"target", (PyCFunction)link_target, METH_VARARGS,
     "target(pool, model, mask, names, datatypes, max_rows, counter, (samples, requests, batches, running slots)) "
     "-> what request takes for `model` on the pool at address `pool`, read once"},
    {"request", (PyCFunction)(void (*)(void))link_request, METH_FASTCALL,
     "request(target, inputs, samples, window_ns, deadline_ns, done) -> job id: one request the pool batches "
     "with the model's other queued requests by the window rule; it counts in the target's Counter slots while "
     "queued. drain calls done(outputs, None, rows of the batch it led or 0, run start ns, run end ns), outputs "
     "{name: tensor(datatype, shape, buffer)}, or done(None, error((type, text)), 0, 0, 0)"},
    {"drain", (PyCFunction)link_drain, METH_NOARGS,
     "drain() -> [(token, ok, payload)]: the jobs finished since the last drain, as Pool.drain gives them; a "
     "request's done is called here instead, and one that raised is listed as (None, False, exception)"},
    {"cancel", (PyCFunction)link_cancel, METH_VARARGS,
     "cancel(pool, job) -> 'queued' | 'running' | None: a queued job completes now, failed with Cancelled; "
     "Cancelled is raised in a running one; None: it finished, or runs in one batch with other jobs"},
    {"abandon", (PyCFunction)link_abandon, METH_O,
     "abandon(pool) -> int: every job of this link still queued on the pool at address `pool` completes now, "
     "failed with Cancelled, and gives back what it counted in its model's queue (the front's loop ends); "
     "running ones finish. How many were queued"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef link_getset[] = {
    {"pending", (getter)link_pending, NULL, "(jobs not yet drained, inputs not yet given back)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot link_slots[] = {
    {Py_tp_new, link_new},
    {Py_tp_dealloc, link_dealloc},
    {Py_tp_methods, link_methods},
    {Py_tp_getset, link_getset},
    {Py_tp_doc, "Link(api): a front's way to the host's pools (api: aserve._native.link_api() of the host)."},
    {0, NULL},
};

PyType_Spec as_link_spec = {
    .name = "aserve._native.Link",
    .basicsize = sizeof(linkobj),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = link_slots,
};

PyObject *as_link_api_address(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromVoidPtr((void *)&as_link_api_table);
}

/* window_rule(now, queue, running, max_rows, window) -> (take, wake_at): the pool's window
 * rule over a queue of (queued ns, rows, deadline ns or 0), every request compatible with
 * the head, as WindowPolicy.decide with a free interpreter; for tests against it. */
PyObject *as_window_rule_py(PyObject *Py_UNUSED(module), PyObject *args)
{
    long long now, running, max_rows, window;
    PyObject *queue;
    if (!PyArg_ParseTuple(args, "LO!LLL:window_rule", &now, &PyList_Type, &queue, &running, &max_rows, &window))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(queue);
    if (n == 0)
        return Py_BuildValue("(iO)", 0, Py_None);
    long long head[3] = {0, 0, 0}, item[3];
    Py_ssize_t take = 0;
    int64_t rows = 0;
    int more = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyArg_ParseTuple(PyList_GET_ITEM(queue, i), "LLL;window_rule: each request is (queued ns, rows, "
                              "deadline ns or 0)", &item[0], &item[1], &item[2]))
            return NULL;
        if (i == 0)
            memcpy(head, item, sizeof head);
        if (max_rows <= 0) { /* the model does not batch: one request */
            take = 1;
            rows = item[1];
            break;
        }
        if (take > 0 && rows + item[1] > max_rows) {
            more = 1;
            break;
        }
        rows += item[1];
        take++;
    }
    int64_t close = 0;
    if (as_window_rule(now, head[0], head[2], rows, more, running, max_rows, window, &close))
        return Py_BuildValue("(nO)", take, Py_None);
    return Py_BuildValue("(iL)", 0, (long long)close);
}
