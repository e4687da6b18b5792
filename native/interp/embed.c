/* Creating the interpreter of a private libpython copy.
 *
 * This file is linked only into the interpreter library, which the host loads
 * with dlmopen(LM_ID_NEWLM): Py_InitializeFromConfig here initialises that
 * namespace's own libpython runtime, with its own GIL, on the calling worker
 * thread.
 */
#include "runtime.h"

#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static int config_error(PyStatus st, char *err, size_t errlen)
{
    snprintf(err, errlen, "initialising the private interpreter: %s%s%s",
             st.func ? st.func : "", st.func ? ": " : "", st.err_msg ? st.err_msg : "failed");
    return -1;
}

EXPORT int as_interp_create(const as_init *cfg, as_interp **out, char *err, size_t errlen)
{
    if (cfg->abi_version != AS_ABI_VERSION) {
        snprintf(err, errlen, "interpreter library ABI %d, host ABI %d: reinstall aserve", AS_ABI_VERSION,
                 cfg->abi_version);
        return -1;
    }
    if (Py_IsInitialized()) {
        snprintf(err, errlen, "this namespace already runs an interpreter: one per namespace");
        return -1;
    }
    PyConfig c;
    PyConfig_InitIsolatedConfig(&c);
    c.install_signal_handlers = 0; /* signals belong to the host */
    c.site_import = 0;             /* sys.path comes from the host, .pth files already applied */
    c.parse_argv = 0;
    c.module_search_paths_set = 1;
    PyStatus st = PyConfig_SetBytesString(&c, &c.program_name, cfg->executable);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(&c, &c.executable, cfg->executable);
    for (size_t i = 0; i < cfg->n_path && !PyStatus_Exception(st); i++) {
        wchar_t *w = Py_DecodeLocale(cfg->path[i], NULL);
        if (w == NULL) {
            PyConfig_Clear(&c);
            snprintf(err, errlen, "sys.path entry %s cannot be decoded", cfg->path[i]);
            return -1;
        }
        st = PyWideStringList_Append(&c.module_search_paths, w);
        PyMem_RawFree(w);
    }
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&c);
    PyConfig_Clear(&c);
    if (PyStatus_Exception(st))
        return config_error(st, err, errlen);

    as_interp *ip = PyMem_RawCalloc(1, sizeof(as_interp));
    if (ip == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (as_runtime_bind(ip, cfg, err, errlen) < 0) {
        PyMem_RawFree(ip);
        return -1;
    }
    ip->ts = PyEval_SaveThread();
    *out = ip;
    return 0;
}

EXPORT void as_interp_run_private(as_interp *ip, as_job *job) { as_interp_run(ip, job); }

EXPORT void as_interp_release_private(as_interp *ip, void *owner) { as_interp_release(ip, owner); }

EXPORT int as_interp_cancel_private(as_interp *ip, uint64_t id) { return as_interp_cancel(ip, id); }
