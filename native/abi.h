/* The C interface between the host extension and an interpreter.
 *
 * An interpreter may live in another link-map namespace with its own libpython
 * and its own libc, so nothing Python-level and no heap block crosses this line:
 * only plain structs, host-owned strings and raw buffers. Memory the interpreter
 * side hands back is allocated with the host's allocator (as_host.alloc) so the
 * host frees it with its own libc.
 */
#ifndef ASERVE_ABI_H
#define ASERVE_ABI_H

#include <stddef.h>
#include <stdint.h>

#define AS_ABI_VERSION 6
#define AS_MAX_DIMS 16
#define AS_MAX_STAGES 64

enum as_job_kind {
    AS_JOB_LOAD = 1,   /* model = key, text = JSON spec; result = JSON metadata */
    AS_JOB_UNLOAD = 2, /* model = key, text = NULL (collect the garbage now) or "later" (a later unload will) */
    AS_JOB_INFER = 3,  /* model = key, inputs; outputs + owner */
    AS_JOB_EXEC = 4,   /* text = Python source; result = repr(result) */
};

typedef struct as_tensor {
    char *name;     /* UTF-8, NUL-terminated; inputs: the model's interned names (never freed per job) */
    char *datatype; /* V2 datatype name */
    int ndim;
    int readonly;
    int64_t shape[AS_MAX_DIMS];
    void *data;
    size_t nbytes;
} as_tensor;

/* The join point of a running staged batch (layer-level joining). After each stage
 * but the last, the interpreter side calls poll with the number of stages done; the
 * host answers with the inputs of a group of requests to absorb now (they run the
 * stages done so far, then continue in the batch) or NULL, and sets *inputs_ctx to
 * the group's input reference (see as_job.inputs_ctx). poll takes only the pool's
 * lock, never the host GIL. */
typedef struct as_join {
    void *ctx;
    const struct as_tensor *(*poll)(void *ctx, int done, size_t *n_inputs, void **inputs_ctx);
} as_join;

typedef struct as_job {
    /* set by the host */
    int kind;
    const char *model;
    const char *text;
    size_t n_inputs;
    const as_tensor *inputs;
    /* The interpreter's reference to the input memory: the interpreter side gives it
     * back exactly once, with as_host.inputs_released, when no object of that
     * interpreter exports the inputs any more (at the end of the job, or later if the
     * model kept a view). Until then the host keeps the memory alive. */
    void *inputs_ctx;
    const as_join *join; /* INFER of a staged model that may absorb joiners; NULL: runs whole */
    int trace;           /* INFER: record the spans model code opens (aserve.runtime.span) into result */
    /* set by the interpreter side, with as_host.alloc */
    int failed;
    char *error_type; /* exception class name */
    char *error;      /* message with traceback */
    char *result;     /* text result (a traced INFER: the model's spans as JSON, or NULL) */
    size_t n_outputs;
    as_tensor *outputs; /* names/datatypes allocated with as_host.alloc */
    void *owner;        /* keeps outputs alive; give back with as_interp_release */
    int n_stages;       /* staged runs: stages run and their seconds (of the first group) */
    double stage_seconds[AS_MAX_STAGES];
    uint64_t id; /* set by the host: the job's number in its pool, what a cancellation names */
} as_job;

typedef struct as_host {
    void *(*alloc)(size_t);
    void (*free)(void *);
    /* any thread, holding that interpreter's GIL: the interpreter holds no view of
     * the inputs behind ctx any more. Takes only the pool's lock. */
    void (*inputs_released)(void *ctx);
} as_host;

typedef struct as_init {
    int abi_version;
    const char *executable;      /* sys.executable of the host */
    const char *const *path;     /* sys.path for the interpreter */
    size_t n_path;
    const char *bootstrap;       /* module with load/infer/unload/execute */
    const as_host *host;
    const char *engine;          /* private, subinterp or main: how far fault containment reaches */
} as_init;

typedef struct as_interp as_interp;

/* Entry points exported by the interpreter library (private engine); the host
 * extension has the same functions for subinterpreters. create runs on the worker
 * thread and leaves no thread state attached; run/release attach and detach. */
typedef int (*as_create_fn)(const as_init *cfg, as_interp **out, char *err, size_t errlen);
typedef void (*as_run_fn)(as_interp *ip, as_job *job);
typedef void (*as_release_fn)(as_interp *ip, void *owner);
typedef void (*as_destroy_fn)(as_interp *ip);
/* Cancel job `id` if it is still running in the interpreter: raise the bootstrap's
 * Cancelled in its worker thread at the next bytecode boundary
 * (PyThreadState_SetAsyncExc of the interpreter's own libpython). Runs on a thread of
 * its own, which it attaches to the interpreter (waiting for its GIL) and leaves
 * detached; returns 1 if the exception was set, 0 if the job had already ended. */
typedef int (*as_cancel_fn)(as_interp *ip, uint64_t id);

#endif
