/* Private libpython copies: one fresh link-map namespace per interpreter.
 *
 * dlmopen(LM_ID_NEWLM) of the interpreter library brings its own libpython (a
 * DT_NEEDED of the library) and its own libc into a new namespace; extension
 * modules imported there later bind to that libpython. See interp/namespace.c for
 * what the library fixes inside the namespace.
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

static atomic_int namespaces_in_use;

int as_private_namespaces_in_use(void) { return atomic_load(&namespaces_in_use); }

int as_private_open(const char *library, as_engine *out, char *err, size_t errlen)
{
    void *h = dlmopen(LM_ID_NEWLM, library, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(err, errlen,
                 "dlmopen(LM_ID_NEWLM, %s): %s; glibc allows 15 extra namespaces and needs "
                 "GLIBC_TUNABLES=glibc.rtld.nns=16:glibc.rtld.optional_static_tls=65536 at process start "
                 "for many (aserve.engine.ensure_glibc_tunables() re-executes the process with it)",
                 library, why ? why : "failed");
        return -1;
    }
    atomic_fetch_add(&namespaces_in_use, 1);
    out->name = "private";
    out->handle = h;
    out->create = (as_create_fn)dlsym(h, "as_interp_create");
    out->run = (as_run_fn)dlsym(h, "as_interp_run_private");
    out->release = (as_release_fn)dlsym(h, "as_interp_release_private");
    /* glibc-private, but the only way to set up this libc's ctype tables for a thread
     * it did not create; without it the tokenizer crashes on the first isalpha(). */
    out->thread_init = (void (*)(void))dlsym(h, "__ctype_init");
    if (out->create == NULL || out->run == NULL || out->release == NULL) {
        snprintf(err, errlen, "%s lacks the aserve interpreter entry points: reinstall aserve", library);
        return -1;
    }
    return 0;
}
