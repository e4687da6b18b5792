/* aserve._native: module definition, state and small functions. */
#include "common.h"

#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

/* GLIBC_TUNABLES as the process saw it at start: glibc reads it only then, so a
 * later os.environ change tells nothing. /proc/self/environ is the start-up copy. */
static PyObject *tunables_at_start(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    int fd = open("/proc/self/environ", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        Py_RETURN_NONE;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t n;
    while (buf != NULL && (n = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap) {
            char *bigger = realloc(buf, cap * 2 + 1);
            if (bigger == NULL)
                break;
            buf = bigger;
            cap *= 2;
        }
    }
    close(fd);
    if (buf == NULL)
        return PyErr_NoMemory();
    buf[len] = 0;
    /* glibc splits the value in place while parsing it (each ':' becomes a NUL), so
     * the entries after it that start with "glibc." are the rest of the value. */
    PyObject *res = NULL;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) {
        if (strncmp(buf + i, "GLIBC_TUNABLES=", 15) != 0)
            continue;
        size_t end = i + strlen(buf + i);
        while (end + 1 < len && strncmp(buf + end + 1, "glibc.", 6) == 0) {
            buf[end] = ':';
            end += strlen(buf + end);
        }
        res = PyUnicode_DecodeFSDefault(buf + i + 15);
        break;
    }
    free(buf);
    return res != NULL || PyErr_Occurred() ? res : Py_NewRef(Py_None);
}

static PyObject *current_cpu(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(sched_getcpu());
}

static PyObject *namespaces_in_use(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(as_private_namespaces_in_use());
}

static PyMethodDef native_methods[] = {
    {"current_cpu", current_cpu, METH_NOARGS,
     "current_cpu() -> int: the CPU the calling thread runs on now (sched_getcpu; -1 where unknown)"},
    {"tunables_at_start", tunables_at_start, METH_NOARGS,
     "tunables_at_start() -> str | None: GLIBC_TUNABLES in the environment the process started with"},
    {"namespaces_in_use", namespaces_in_use, METH_NOARGS,
     "namespaces_in_use() -> int: link-map namespaces opened for private interpreters"},
    {"otlp_encode", as_otlp_encode, METH_VARARGS,
     "otlp_encode(resource_attributes, scope_name, scope_version, spans, records=None) -> bytes: an OTLP "
     "ExportTraceServiceRequest of spans and numeric records (table, requests, batches, links) made by "
     "aserve.tracing.recorder"},
    {"parse_traceparent", as_parse_traceparent, METH_O,
     "parse_traceparent(value) -> (trace id, parent span id, sampled) | None: a W3C traceparent header's "
     "fields, None when it is not one"},
    {"link_api", as_link_api_address, METH_NOARGS,
     "link_api() -> int: the address of the table through which a front's Link reaches this process's pools"},
    {"window_rule", as_window_rule_py, METH_VARARGS,
     "window_rule(now_ns, queue, running, max_rows, window_ns) -> (take, wake_at_ns | None): the rule by which "
     "the pool batches native requests (Link.infer with window=), over queue [(queued ns, rows, deadline ns or "
     "0)], every request compatible with the head"},
    {"v2_json_encode", as_v2_json_encode, METH_VARARGS,
     "v2_json_encode(model_name, model_version, id, outputs) -> bytes | None: the V2 JSON answer whose outputs "
     "(name -> Tensor) are integers or booleans, each as a flat data list, as the Python codec writes it; None "
     "for any other (the codec writes it)"},
    {"v2_binary_encode", as_v2_binary_encode, METH_VARARGS,
     "v2_binary_encode(model_name, model_version, id, outputs, names) -> [header, data...] | None: the V2 answer "
     "with every output (names in order, or the dict's) after the JSON header, as the Python codec writes it; "
     "None for any other (the codec writes it)"},
    {"concat_rows", as_concat_rows, METH_O,
     "concat_rows(buffers) -> bytearray: the buffers' bytes (each C-contiguous) one after another: a batch's "
     "input from its requests'"},
    {"split_rows", (PyCFunction)(void (*)(void))as_split_rows, METH_FASTCALL,
     "split_rows(results, name, tensor_type, datatype, rest, view, samples, stride) -> None: results[i][name] = "
     "tensor_type(datatype, (samples[i], *rest), view[a:b]) for each request i, its rows a zero-copy slice of "
     "the flat byte memoryview view, stride bytes per sample"},
    {"grpc_split", as_grpc_split, METH_O,
     "grpc_split(message) -> (model_name, model_version, id, key, [(start, end) of each raw_input_contents]) | "
     "None: a ModelInferRequest's top-level fields, not decoded (native/host/grpcwire.c)"},
    {"grpc_response", as_grpc_response, METH_VARARGS,
     "grpc_response(model_name, model_version, id, [(name, datatype, shape, data), ...]) -> a ModelInferResponse "
     "with every output in raw_output_contents"},
    {"buffer_from_address", as_buffer_from_address, METH_VARARGS,
     "buffer_from_address(address, nbytes, keep, readonly=False) -> OutputBuffer over memory keep owns"},
    {NULL, NULL, 0, NULL},
};

static int native_exec(PyObject *m)
{
    module_state *st = PyModule_GetState(m);
    /* the engine raises the package's own EngineError, which carries its HTTP status */
    PyObject *errors = PyImport_ImportModule("aserve.errors");
    if (errors == NULL)
        return -1;
    st->engine_error = PyObject_GetAttrString(errors, "EngineError");
    Py_DECREF(errors);
    if (st->engine_error == NULL || PyModule_AddObjectRef(m, "EngineError", st->engine_error) < 0)
        return -1;
#define INTERN(name)                                                                                             \
    if ((st->str_##name = PyUnicode_InternFromString(#name)) == NULL)                                            \
        return -1;
    AS_NAMES(INTERN)
#undef INTERN
    st->pool_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_pool_spec, NULL);
    if (st->pool_type == NULL || PyModule_AddType(m, st->pool_type) < 0)
        return -1;
    st->buffer_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_buffer_spec, NULL);
    if (st->buffer_type == NULL || PyModule_AddType(m, st->buffer_type) < 0)
        return -1;
    st->trace_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_trace_spec, NULL);
    if (st->trace_type == NULL || PyModule_AddType(m, st->trace_type) < 0)
        return -1;
    st->recorder_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_recorder_spec, NULL);
    if (st->recorder_type == NULL || PyModule_AddType(m, st->recorder_type) < 0)
        return -1;
    st->link_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_link_spec, NULL);
    if (st->link_type == NULL || PyModule_AddType(m, st->link_type) < 0)
        return -1;
    PyTypeObject *plan_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_plan_spec, NULL);
    if (plan_type == NULL || PyModule_AddType(m, plan_type) < 0) {
        Py_XDECREF(plan_type);
        return -1;
    }
    Py_DECREF(plan_type);
    st->counter_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_counter_spec, NULL);
    if (st->counter_type == NULL || PyModule_AddType(m, st->counter_type) < 0)
        return -1;
    st->v2json_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_v2json_spec, NULL);
    if (st->v2json_type == NULL || PyModule_AddType(m, st->v2json_type) < 0)
        return -1;
    st->v2binary_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_v2binary_spec, NULL);
    if (st->v2binary_type == NULL || PyModule_AddType(m, st->v2binary_type) < 0)
        return -1;
    st->front_queue_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_front_queue_spec, NULL);
    if (st->front_queue_type == NULL || PyModule_AddType(m, st->front_queue_type) < 0)
        return -1;
    st->front_request_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_front_request_spec, NULL);
    if (st->front_request_type == NULL || PyModule_AddType(m, st->front_request_type) < 0)
        return -1;
    PyTypeObject *h2_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &as_h2_spec, NULL);
    if (h2_type == NULL || PyModule_AddType(m, h2_type) < 0) {
        Py_XDECREF(h2_type);
        return -1;
    }
    Py_DECREF(h2_type);
    if (PyModule_AddIntConstant(m, "JOB_LOAD", AS_JOB_LOAD) < 0 ||
        PyModule_AddIntConstant(m, "JOB_UNLOAD", AS_JOB_UNLOAD) < 0 ||
        PyModule_AddIntConstant(m, "JOB_INFER", AS_JOB_INFER) < 0 ||
        PyModule_AddIntConstant(m, "JOB_EXEC", AS_JOB_EXEC) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NAMESPACES", AS_MAX_NAMESPACES) < 0 ||
        PyModule_AddIntConstant(m, "TRACE_REQUEST_FIELDS", AS_TRACE_REQUEST_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "TRACE_BATCH_FIELDS", AS_TRACE_BATCH_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "TRACE_LINK_FIELDS", AS_TRACE_LINK_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "ABI_VERSION", AS_ABI_VERSION) < 0)
        return -1;
    return 0;
}

static int native_traverse(PyObject *m, visitproc visit, void *arg)
{
    module_state *st = PyModule_GetState(m);
    Py_VISIT(st->engine_error);
    Py_VISIT(st->pool_type);
    Py_VISIT(st->buffer_type);
    Py_VISIT(st->recorder_type);
    Py_VISIT(st->trace_type);
    Py_VISIT(st->link_type);
    Py_VISIT(st->counter_type);
    Py_VISIT(st->v2json_type);
    Py_VISIT(st->v2binary_type);
    Py_VISIT(st->front_queue_type);
    Py_VISIT(st->front_request_type);
#define VISIT(name) Py_VISIT(st->str_##name);
    AS_NAMES(VISIT)
#undef VISIT
    return 0;
}

static int native_clear(PyObject *m)
{
    module_state *st = PyModule_GetState(m);
    Py_CLEAR(st->engine_error);
    Py_CLEAR(st->pool_type);
    Py_CLEAR(st->buffer_type);
    Py_CLEAR(st->recorder_type);
    Py_CLEAR(st->trace_type);
    Py_CLEAR(st->link_type);
    Py_CLEAR(st->counter_type);
    Py_CLEAR(st->v2json_type);
    Py_CLEAR(st->v2binary_type);
    Py_CLEAR(st->front_queue_type);
    Py_CLEAR(st->front_request_type);
#define CLEAR(name) Py_CLEAR(st->str_##name);
    AS_NAMES(CLEAR)
#undef CLEAR
    return 0;
}

static PyModuleDef_Slot native_slots[] = {
    {Py_mod_exec, native_exec},
#ifdef Py_mod_multiple_interpreters
    /* imported by the host and by each front loop (a private interpreter: its own copy); its
     * state is per module, so a per-interpreter GIL is no obstacle */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aserve._native",
    .m_doc = "aserve's interpreter engine: native pools of private, PEP 684 and host interpreters.",
    .m_size = sizeof(module_state),
    .m_methods = native_methods,
    .m_slots = native_slots,
    .m_traverse = native_traverse,
    .m_clear = native_clear,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&native_module); }
