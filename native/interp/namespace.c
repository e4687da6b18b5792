/* Making a secondary link-map namespace behave inside one process.
 *
 * The interpreter library is the first object loaded into its namespace, so the
 * symbols it defines here take precedence over the namespace's own libc for every
 * object loaded after it (libpython, extension modules, torch):
 *
 * - pthread keys: each namespace has its own libc whose key allocator hands out the
 *   same numbers, while the values live in the one thread descriptor all namespaces
 *   share. Two libpythons would then overwrite each other's thread-state keys.
 *   Forwarding key calls to the base namespace's libc makes keys unique process-wide.
 * - dlopen(RTLD_GLOBAL): glibc cannot add objects of a secondary namespace to the
 *   global scope (torch loads libtorch_global_deps.so that way and crashes in
 *   add_to_global_resize). Inside a namespace RTLD_GLOBAL is dropped.
 */
#ifndef _GNU_SOURCE  /* setup.py defines it for every file */
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

static struct {
    int (*key_create)(pthread_key_t *, void (*)(void *));
    int (*key_delete)(pthread_key_t);
    void *(*getspecific)(pthread_key_t);
    int (*setspecific)(pthread_key_t, const void *);
    void *(*dlopen)(const char *, int);
} base;

static void resolve(void)
{
    void *libc = dlmopen(LM_ID_BASE, "libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void *own = dlsym(RTLD_NEXT, "pthread_key_create") ? RTLD_NEXT : NULL;
    if (libc == NULL)
        libc = own; /* loaded into the base namespace after all: forward to the next definition */
    base.key_create = dlsym(libc, "pthread_key_create");
    base.key_delete = dlsym(libc, "pthread_key_delete");
    base.getspecific = dlsym(libc, "pthread_getspecific");
    base.setspecific = dlsym(libc, "pthread_setspecific");
    base.dlopen = dlsym(RTLD_NEXT, "dlopen");
}

__attribute__((constructor)) static void namespace_init(void) { resolve(); }

#define READY() (base.key_create != NULL ? (void)0 : resolve())

EXPORT int pthread_key_create(pthread_key_t *key, void (*destructor)(void *))
{
    READY();
    return base.key_create(key, destructor);
}

EXPORT int pthread_key_delete(pthread_key_t key)
{
    READY();
    return base.key_delete(key);
}

EXPORT void *pthread_getspecific(pthread_key_t key)
{
    READY();
    return base.getspecific(key);
}

EXPORT int pthread_setspecific(pthread_key_t key, const void *value)
{
    READY();
    return base.setspecific(key, value);
}

EXPORT void *dlopen(const char *file, int mode)
{
    READY();
    return base.dlopen(file, mode & ~RTLD_GLOBAL);
}
