/* Shared declarations of the host extension aserve._native. */
#ifndef ASERVE_HOST_COMMON_H
#define ASERVE_HOST_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include "../abi.h"

#define AS_MAX_NAMESPACES 15 /* glibc: 16 link-map namespaces, the base one included */

/* One kind of interpreter: how a worker creates it and runs jobs in it. */
typedef struct as_engine {
    const char *name;
    as_create_fn create;
    as_run_fn run;
    as_release_fn release;
    as_destroy_fn destroy;     /* end the interpreter on its worker thread, or NULL */
    as_cancel_fn cancel;       /* raise Cancelled in a running job (any thread) */
    void (*thread_init)(void); /* per-thread set-up in the interpreter's libc, or NULL */
    void *handle;              /* dlmopen handle of a private namespace */
} as_engine;

#define AS_NAMES(X)                                                                                              \
    X(datatype) X(shape) X(data) X(done) X(set_result) X(set_exception) X(cancel) X(_arm) X(deadline) X(budget)  \
    X(trace) X(waited) X(context) X(held) X(request)

typedef struct {
    PyTypeObject *pool_type;
    PyTypeObject *buffer_type;
    PyTypeObject *recorder_type;
    PyTypeObject *trace_type;
    PyTypeObject *link_type;
    PyTypeObject *counter_type;
    PyTypeObject *v2json_type;
    PyTypeObject *v2binary_type;
    PyTypeObject *front_queue_type;
    PyTypeObject *front_request_type;
    PyObject *engine_error; /* aserve._native.EngineError */
    /* names read or called per request, interned (AS_NAMES): a tensor's fields, which the
     * encoders read per output; a future's methods and Batcher.submit's keywords (front_queue.c) */
#define AS_NAME_FIELD(name) PyObject *str_##name;
    AS_NAMES(AS_NAME_FIELD)
#undef AS_NAME_FIELD
} module_state;

/* The module's state from one of its own types. Every type here is made with
 * PyType_FromModuleAndSpec and none may be subclassed, so the type's own module is
 * the one (a subclassable type would need PyType_GetModuleByDef and module.c's def).
 * NULL, with no exception set, if tp has no module. */
static inline module_state *as_state_of_type(PyTypeObject *tp)
{
    module_state *st = PyType_GetModuleState(tp);
    if (st == NULL)
        PyErr_Clear();
    return st;
}

/* errors.c */
PyObject *as_engine_error(PyTypeObject *tp, const char *fmt, ...);

/* private.c: open a fresh namespace with the interpreter library. */
int as_private_open(const char *library, as_engine *out, char *err, size_t errlen);
int as_private_namespaces_in_use(void);

/* engines.c: engines in the host's own libpython. */
int as_subinterp_engine(as_engine *out, char *err, size_t errlen);
void as_main_engine(as_engine *out);

/* fault.c: reports of fatal signals (SIGSEGV, SIGABRT, ...) in model code. Worker
 * threads register a slot; the report names the interpreter, its engine, the model
 * and job it was running and, where it can, that interpreter's Python stack. */
void as_fault_install(void);
int as_fault_register(int index, const char *engine);
void as_fault_bind(int slot, as_interp *ip);
void as_fault_job(int slot, const char *key, int kind);
void as_fault_unregister(int slot);

/* pool_type.c: the Python type Pool (pool.h: what the pool's files share) */
extern PyType_Spec as_pool_spec;

/* link_type.c: the Python type Link (link.h), and link_api() */
extern PyType_Spec as_link_spec;
PyObject *as_link_api_address(PyObject *module, PyObject *ignored);
PyObject *as_window_rule_py(PyObject *module, PyObject *args);
int as_link_request(PyObject *link, PyObject *target, PyObject *inputs, long long samples, long long window_ns,
                    long long deadline_ns, double budget, double waited, PyObject *done, unsigned long long *id);
/* The adaptive policy's admission for a target whose model has one (Link.target's plan), through
 * the host's code: mode 0 from a request's head, 1 counted, 2 refusals only (link.h, plan_admit);
 * NAN to admit, else a Retry-After in seconds. -2: the target has no plan; -3: an exception is set. */
double as_link_plan_admit(PyObject *link, PyObject *target, double now, long long queued, long long samples,
                          double budget, double waited, int mode);
/* The request counts in the policy's arrival rate, admitted without a question (nothing waits).
 * 0, or -1 with an exception set. */
int as_link_plan_arrive(PyObject *link, PyObject *target, double now, long long samples);
/* Requests/s the policy admits while overloaded (NAN: no curve yet); -3 with an exception set. */
double as_link_plan_rate(PyObject *link, PyObject *target);
void as_link_hold(PyObject *link);
void as_link_release(PyObject *link);

/* front_queue.c: the Python type FrontQueue, a front loop's side of a model batched in the pool */
extern PyType_Spec as_front_queue_spec;
extern PyType_Spec as_front_request_spec;

/* grpcwire.c: ModelInferRequest's top-level fields read, a raw ModelInferResponse written */
PyObject *as_grpc_split(PyObject *module, PyObject *arg);
PyObject *as_grpc_response(PyObject *module, PyObject *args);

/* h2.c: the Python type H2, a gRPC connection's HTTP/2 (libnghttp2) */
extern PyType_Spec as_h2_spec;

/* plan_type.c: the Python type Plan, one model's adaptive batching policy in C (plan.h) */
extern PyType_Spec as_plan_spec;

/* counter.c: the Python type Counter, a number every event loop adds to */
extern PyType_Spec as_counter_spec;
void as_counter_loop_add(PyObject *counter, long long n); /* a Counter's add(n) and total(), from C */
long long as_counter_loop_total(PyObject *counter);
long long as_counter_loop_running(PyObject *counter); /* its model's running batches (Counter.running) */

/* v2json.c: V2 JSON infer messages of numeric tensors, decoded and encoded in C */
extern PyType_Spec as_v2json_spec;
extern PyType_Spec as_v2binary_spec;
PyObject *as_v2_json_encode(PyObject *module, PyObject *args);
PyObject *as_v2_binary_encode(PyObject *module, PyObject *args);

/* rows.c: a batch's inputs from its requests', and its outputs given back per request */
PyObject *as_concat_rows(PyObject *module, PyObject *buffers);
PyObject *as_split_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* otlp.c: recorded spans to an OTLP ExportTraceServiceRequest. */
PyObject *as_otlp_encode(PyObject *module, PyObject *args);

/* trace.c: sampling and the numeric trace records made on the event loop. The records'
 * sizes in unsigned 64-bit numbers (their fields: aserve/tracing/recorder.py), which otlp.c
 * reads and the module exports as TRACE_*_FIELDS. */
#define AS_TRACE_REQUEST_FIELDS 19
#define AS_TRACE_BATCH_FIELDS 12
#define AS_TRACE_LINK_FIELDS 4
extern PyType_Spec as_recorder_spec;
extern PyType_Spec as_trace_spec;
PyObject *as_parse_traceparent(PyObject *module, PyObject *arg);

/* buffer.c: a host object exporting an interpreter's output memory. on_free(ctx), if
 * not NULL, is called once under the host GIL when the buffer is gone: it gives the
 * memory back to whoever owns it. */
typedef void (*as_buffer_free_fn)(void *ctx);
extern PyType_Spec as_buffer_spec;
PyObject *as_buffer_new(PyTypeObject *tp, as_buffer_free_fn on_free, void *ctx, PyObject *keep, void *data,
                        size_t nbytes, int readonly);
PyObject *as_buffer_from_address(PyObject *module, PyObject *args);
/* A finished job's outputs as a list of (name, datatype, shape, OutputBuffer): each buffer
 * takes one reference on *refs and calls on_free(ctx) when gone (the caller holds one of its
 * own while this runs). NULL with an exception set. */
PyObject *as_output_list(PyTypeObject *tp, const as_job *job, as_buffer_free_fn on_free, void *ctx, Py_ssize_t *refs);
/* The same as a dict {name: tensor_type(datatype, shape, OutputBuffer)}. */
PyObject *as_output_dict(PyTypeObject *tp, const as_job *job, as_buffer_free_fn on_free, void *ctx,
                         Py_ssize_t *refs, PyObject *tensor_type);

#endif
