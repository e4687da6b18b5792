/* Counter: one number shared by every event loop of the process, such as a model's
 * queued samples that its batchers on the host's loop and on each front loop add to.
 *
 * Slots past the first `summed` are kept beside the number, not in it: total() reads
 * the first `summed`, get(slot) any one. A front's batch waiting in a pool's queue counts
 * in slots of its own (as_counter_hold/add/drop below): the front that queues it and the
 * worker that takes it both write them, so those adds are atomic read-modify-writes, and
 * the job holds the memory until it leaves the queue.
 *
 * The host allocates it (Counter(slots)) and hands its address to the fronts, whose own
 * copy of this extension views the same memory (Counter.at(address, slot)). Each loop
 * writes only its own slot, on a cache line of its own, and a reader sums them all: no
 * lock, and when a loop ends the host clears its slot (clear(slot)), taking back what it
 * held. The host keeps the memory for as long as any loop may use it: a load is retired
 * only after every front dropped its view (server/loops.py, retire). */
#include "common.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#define AS_COUNTER_MAX_SLOTS 128 /* 1 + 5 x 14 front loops (dataplane/models.py, queue_layout) fit */

typedef struct {
    _Alignas(64) _Atomic int64_t value;
    char pad[64 - sizeof(int64_t)];
} counter_slot;

/* The cache line before the slots: what every view reads, and who holds the memory. */
typedef struct {
    _Alignas(64) _Atomic int64_t refs; /* the owning Counter's, and one per job holding it */
    int n, summed;
    int64_t running; /* batches of the model that native requests lead, running now (pool.h, unhold) */
    int64_t queued;  /* rows of the model's native requests in the pool's queue (pool.h, dequeued) */
} counter_head;

typedef struct {
    PyObject_HEAD
    counter_slot *slots; /* host memory, shared by every loop; its head just before */
    int n;               /* slots */
    int summed;          /* total() sums slots [0, summed) */
    int slot;            /* the one this object adds to */
    int owner;           /* this object holds `slots` (one of the head's refs) */
} counter_t;

static inline counter_head *head_of(void *slots)
{
    return (counter_head *)slots - 1;
}

void as_counter_hold(void *slots)
{
    atomic_fetch_add_explicit(&head_of(slots)->refs, 1, memory_order_relaxed);
}

void as_counter_add(void *slots, int slot, int64_t d)
{
    atomic_fetch_add_explicit(&((counter_slot *)slots)[slot].value, d, memory_order_relaxed);
}

int64_t *as_counter_running(void *slots)
{
    return &head_of(slots)->running;
}

int64_t *as_counter_queued(void *slots)
{
    return &head_of(slots)->queued;
}

int as_counter_slots(void *slots)
{
    return head_of(slots)->n;
}

void as_counter_drop(void *slots)
{
    counter_head *h = head_of(slots);
    if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) == 1)
        free(h);
}

static PyObject *counter_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"slots", "summed", NULL};
    int n, summed = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|$i:Counter", kwlist, &n, &summed))
        return NULL;
    if (n < 1 || n > AS_COUNTER_MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "Counter: slots must be in [1, %d], got %d", AS_COUNTER_MAX_SLOTS, n);
        return NULL;
    }
    if (summed == -1)
        summed = n;
    if (summed < 1 || summed > n) {
        PyErr_Format(PyExc_ValueError, "Counter: summed must be in [1, slots=%d], got %d", n, summed);
        return NULL;
    }
    counter_head *h = aligned_alloc(64, sizeof(counter_head) + sizeof(counter_slot) * (size_t)n);
    if (h == NULL)
        return PyErr_NoMemory();
    atomic_init(&h->refs, 1);
    h->running = 0;
    h->queued = 0;
    h->n = n;
    h->summed = summed;
    counter_slot *slots = (counter_slot *)(h + 1);
    for (int i = 0; i < n; i++)
        atomic_init(&slots[i].value, 0);
    counter_t *c = (counter_t *)tp->tp_alloc(tp, 0);
    if (c == NULL) {
        free(h);
        return NULL;
    }
    c->slots = slots;
    c->n = n;
    c->summed = summed;
    c->slot = 0;
    c->owner = 1;
    return (PyObject *)c;
}

static void counter_dealloc(counter_t *c)
{
    PyTypeObject *tp = Py_TYPE(c);
    if (c->owner)
        as_counter_drop(c->slots);
    tp->tp_free((PyObject *)c);
    Py_DECREF(tp);
}

/* Counter.at(address, slot): a view of the host's counter at `address`. */
static PyObject *counter_at(PyTypeObject *tp, PyObject *args)
{
    unsigned long long address;
    int slot;
    if (!PyArg_ParseTuple(args, "Ki:at", &address, &slot))
        return NULL;
    if (address == 0 || address % 64 != 0) {
        PyErr_Format(PyExc_ValueError, "Counter.at: %#llx is not a counter's address", address);
        return NULL;
    }
    counter_head *h = head_of((void *)(uintptr_t)address);
    int n = h->n;
    if (slot < 0 || slot >= n) {
        PyErr_Format(PyExc_ValueError, "Counter.at: slot %d of %d is out of range", slot, n);
        return NULL;
    }
    counter_t *c = (counter_t *)tp->tp_alloc(tp, 0);
    if (c == NULL)
        return NULL;
    c->slots = (counter_slot *)(uintptr_t)address;
    c->n = n;
    c->summed = h->summed;
    c->slot = slot;
    c->owner = 0;
    return (PyObject *)c;
}

void as_counter_loop_add(PyObject *counter, long long d)
{
    counter_t *c = (counter_t *)counter;
    /* one writer per slot: a load and a store are enough, and cheaper than a locked add */
    _Atomic int64_t *v = &c->slots[c->slot].value;
    atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + d, memory_order_relaxed);
}

long long as_counter_loop_total(PyObject *counter)
{
    counter_t *c = (counter_t *)counter;
    int64_t sum = 0;
    for (int i = 0; i < c->summed; i++)
        sum += atomic_load_explicit(&c->slots[i].value, memory_order_relaxed);
    return sum;
}

long long as_counter_loop_running(PyObject *counter)
{
    return __atomic_load_n(as_counter_running(((counter_t *)counter)->slots), __ATOMIC_RELAXED);
}

static PyObject *counter_add(counter_t *c, PyObject *arg)
{
    long long d = PyLong_AsLongLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    as_counter_loop_add((PyObject *)c, d);
    Py_RETURN_NONE;
}

static PyObject *counter_total(counter_t *c, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(as_counter_loop_total((PyObject *)c));
}

/* The slot `arg` names, or NULL with ValueError naming `method` when it is out of range. */
static _Atomic int64_t *slot_arg(counter_t *c, PyObject *arg, const char *method)
{
    long slot = PyLong_AsLong(arg);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= c->n) {
        PyErr_Format(PyExc_ValueError, "Counter.%s: slot %ld of %d is out of range", method, slot, c->n);
        return NULL;
    }
    return &c->slots[slot].value;
}

static PyObject *counter_get(counter_t *c, PyObject *arg)
{
    _Atomic int64_t *v = slot_arg(c, arg, "get");
    return v == NULL ? NULL : PyLong_FromLongLong(atomic_load_explicit(v, memory_order_relaxed));
}

static PyObject *counter_clear(counter_t *c, PyObject *arg)
{
    _Atomic int64_t *v = slot_arg(c, arg, "clear");
    if (v == NULL)
        return NULL;
    atomic_store_explicit(v, 0, memory_order_relaxed);
    Py_RETURN_NONE;
}

static PyObject *counter_address(counter_t *c, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)c->slots);
}

static PyObject *counter_slots(counter_t *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(c->n);
}

static PyObject *counter_own(counter_t *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(atomic_load_explicit(&c->slots[c->slot].value, memory_order_relaxed));
}

static PyObject *counter_running(counter_t *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(__atomic_load_n(as_counter_running(c->slots), __ATOMIC_RELAXED));
}

static PyObject *counter_pool_rows(counter_t *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(__atomic_load_n(as_counter_queued(c->slots), __ATOMIC_RELAXED));
}

static PyMethodDef counter_methods[] = {
    {"at", (PyCFunction)counter_at, METH_VARARGS | METH_CLASS,
     "at(address, slot): a view of the counter at `address` (another loop's Counter.address) "
     "that adds to `slot`"},
    {"add", (PyCFunction)counter_add, METH_O, "add(n): add n to this loop's slot"},
    {"total", (PyCFunction)counter_total, METH_NOARGS, "total() -> int: the first `summed` slots summed"},
    {"get", (PyCFunction)counter_get, METH_O, "get(slot) -> int: one slot's value"},
    {"clear", (PyCFunction)counter_clear, METH_O,
     "clear(slot): set a slot to 0 (its loop ended: what it held is taken back)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef counter_getset[] = {
    {"address", (getter)counter_address, NULL, "the shared memory's address, for Counter.at", NULL},
    {"slots", (getter)counter_slots, NULL, "how many slots it has", NULL},
    {"own", (getter)counter_own, NULL, "this loop's slot", NULL},
    {"running", (getter)counter_running, NULL,
     "batches of the model led by native requests (Link.infer with window=), running now", NULL},
    {"pool_rows", (getter)counter_pool_rows, NULL, "rows of the model's native requests in the pool's queue", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot counter_slots_spec[] = {
    {Py_tp_doc, "Counter(slots, *, summed=slots): a number every event loop of the process adds to, one "
                "slot each, read whole with total(); slots past `summed` are read one by one with get() "
                "(see native/host/counter.c)"},
    {Py_tp_new, counter_new},
    {Py_tp_dealloc, counter_dealloc},
    {Py_tp_methods, counter_methods},
    {Py_tp_getset, counter_getset},
    {0, NULL},
};

PyType_Spec as_counter_spec = {
    .name = "aserve._native.Counter",
    .basicsize = sizeof(counter_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = counter_slots_spec,
};
