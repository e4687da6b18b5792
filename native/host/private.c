/* Private libpython copies: one fresh link-map namespace per interpreter.
 *
 * dlmopen(LM_ID_NEWLM) of the interpreter library brings its own libpython (a
 * DT_NEEDED of the library) and its own libc into a new namespace; extension
 * modules imported there later bind to that libpython. See interp/namespace.c for
 * what the library fixes inside the namespace.
 */
#ifndef _GNU_SOURCE  /* setup.py defines it for every file */
#define _GNU_SOURCE
#endif
#include "common.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

static atomic_int namespaces_in_use;

extern char **environ;

/* The libc of a new namespace starts with the caller's environment array (rtld hands
 * it the base libc's `environ`). When the host later sets a variable, the base libc may
 * reallocate that array and free the old one, and the namespace would read freed
 * memory (and crash in its own setenv). Give the namespace an array of its own: its
 * setenv copies it before growing, and never frees it. */
static int own_environment(void *h, char *err, size_t errlen)
{
    char ***ns_environ = dlsym(h, "__environ");
    if (ns_environ == NULL) {
        snprintf(err, errlen, "the interpreter library's namespace has no __environ: reinstall aserve");
        return -1;
    }
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **copy = calloc(n + 1, sizeof(char *));
    if (copy == NULL) {
        snprintf(err, errlen, "out of memory copying the environment");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if ((copy[i] = strdup(environ[i])) == NULL) {
            snprintf(err, errlen, "out of memory copying the environment");
            return -1; /* the strings copied so far leak: the process is out of memory anyway */
        }
    *ns_environ = copy;
    return 0;
}

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
    if (own_environment(h, err, errlen) < 0)
        return -1;
    out->name = "private";
    out->handle = h;
    out->create = (as_create_fn)dlsym(h, "as_interp_create");
    out->run = (as_run_fn)dlsym(h, "as_interp_run_private");
    out->release = (as_release_fn)dlsym(h, "as_interp_release_private");
    out->cancel = (as_cancel_fn)dlsym(h, "as_interp_cancel_private");
    /* glibc-private, but the only way to set up this libc's ctype tables for a thread
     * it did not create; without it the tokenizer crashes on the first isalpha(). */
    out->thread_init = (void (*)(void))dlsym(h, "__ctype_init");
    if (out->create == NULL || out->run == NULL || out->release == NULL || out->cancel == NULL) {
        snprintf(err, errlen, "%s lacks the aserve interpreter entry points: reinstall aserve", library);
        return -1;
    }
    return 0;
}
