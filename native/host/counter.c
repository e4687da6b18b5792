/* Counter: one number shared by every event loop of the process, such as a model's
 * queued samples that its batchers on the host's loop and on each front loop add to.
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

#define AS_COUNTER_MAX_SLOTS 64

typedef struct {
    _Alignas(64) _Atomic int64_t value;
    char pad[64 - sizeof(int64_t)];
} counter_slot;

typedef struct {
    PyObject_HEAD
    counter_slot *slots; /* host memory, shared by every loop */
    int n;               /* slots */
    int slot;            /* the one this object adds to */
    int owner;           /* this object frees `slots` */
} counter_t;

static PyObject *counter_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"slots", NULL};
    int n;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i:Counter", kwlist, &n))
        return NULL;
    if (n < 1 || n > AS_COUNTER_MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "Counter: slots must be in [1, %d], got %d", AS_COUNTER_MAX_SLOTS, n);
        return NULL;
    }
    counter_slot *slots = aligned_alloc(64, sizeof(counter_slot) * (size_t)n);
    if (slots == NULL)
        return PyErr_NoMemory();
    for (int i = 0; i < n; i++)
        atomic_init(&slots[i].value, 0);
    counter_t *c = (counter_t *)tp->tp_alloc(tp, 0);
    if (c == NULL) {
        free(slots);
        return NULL;
    }
    c->slots = slots;
    c->n = n;
    c->slot = 0;
    c->owner = 1;
    return (PyObject *)c;
}

static void counter_dealloc(counter_t *c)
{
    PyTypeObject *tp = Py_TYPE(c);
    if (c->owner)
        free(c->slots);
    tp->tp_free((PyObject *)c);
    Py_DECREF(tp);
}

/* Counter.at(address, slots, slot): a view of the host's counter at `address`. */
static PyObject *counter_at(PyTypeObject *tp, PyObject *args)
{
    unsigned long long address;
    int n, slot;
    if (!PyArg_ParseTuple(args, "Kii:at", &address, &n, &slot))
        return NULL;
    if (address == 0 || address % 64 != 0) {
        PyErr_Format(PyExc_ValueError, "Counter.at: %#llx is not a counter's address", address);
        return NULL;
    }
    if (n < 1 || n > AS_COUNTER_MAX_SLOTS || slot < 0 || slot >= n) {
        PyErr_Format(PyExc_ValueError, "Counter.at: slot %d of %d is out of range", slot, n);
        return NULL;
    }
    counter_t *c = (counter_t *)tp->tp_alloc(tp, 0);
    if (c == NULL)
        return NULL;
    c->slots = (counter_slot *)(uintptr_t)address;
    c->n = n;
    c->slot = slot;
    c->owner = 0;
    return (PyObject *)c;
}

static PyObject *counter_add(counter_t *c, PyObject *arg)
{
    long long d = PyLong_AsLongLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    /* one writer per slot: a load and a store are enough, and cheaper than a locked add */
    _Atomic int64_t *v = &c->slots[c->slot].value;
    atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + d, memory_order_relaxed);
    Py_RETURN_NONE;
}

static PyObject *counter_total(counter_t *c, PyObject *Py_UNUSED(ignored))
{
    int64_t sum = 0;
    for (int i = 0; i < c->n; i++)
        sum += atomic_load_explicit(&c->slots[i].value, memory_order_relaxed);
    return PyLong_FromLongLong(sum);
}

static PyObject *counter_clear(counter_t *c, PyObject *arg)
{
    long slot = PyLong_AsLong(arg);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= c->n) {
        PyErr_Format(PyExc_ValueError, "Counter.clear: slot %ld of %d is out of range", slot, c->n);
        return NULL;
    }
    atomic_store_explicit(&c->slots[slot].value, 0, memory_order_relaxed);
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

static PyMethodDef counter_methods[] = {
    {"at", (PyCFunction)counter_at, METH_VARARGS | METH_CLASS,
     "at(address, slots, slot): a view of the counter at `address` (another loop's Counter.address) "
     "that adds to `slot`"},
    {"add", (PyCFunction)counter_add, METH_O, "add(n): add n to this loop's slot"},
    {"total", (PyCFunction)counter_total, METH_NOARGS, "total() -> int: every slot summed"},
    {"clear", (PyCFunction)counter_clear, METH_O,
     "clear(slot): set a slot to 0 (its loop ended: what it held is taken back)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef counter_getset[] = {
    {"address", (getter)counter_address, NULL, "the shared memory's address, for Counter.at", NULL},
    {"slots", (getter)counter_slots, NULL, "how many loops may add to it", NULL},
    {"own", (getter)counter_own, NULL, "this loop's slot", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot counter_slots_spec[] = {
    {Py_tp_doc, "Counter(slots): a number every event loop of the process adds to, one slot each, "
                "read whole with total() (see native/host/counter.c)"},
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
