/* Reports of fatal signals in model code.
 *
 * A segfault, an abort() or another fatal signal in model code cannot be survived in
 * one process: every interpreter shares its memory. What can be done is to say where
 * it happened before the process ends, in a form a supervisor's log keeps: which
 * interpreter of which engine, the model and version (the pool key `name/version` of
 * the job it ran) and the job kind, and that interpreter's Python stack.
 *
 * Every worker thread registers a slot (the interpreter, its engine) and marks the job
 * it runs in it; the handler finds the slot of the thread the signal hit by its
 * pthread_t. It writes with write(2) only and allocates nothing: the Python stack is
 * walked the way faulthandler walks it (3.11: its exported _Py_DumpTraceback; 3.12+:
 * the interpreter frames, through the internal frame layout of the Python this is
 * built for, which is the layout of every private copy too). Then the previous
 * handler (faulthandler's, if the host enabled it) or the default action takes the
 * signal, and the process ends with it.
 *
 * Each worker gets an alternate signal stack, so a model that overflows its thread's
 * stack is reported too.
 */
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030C0000
#define Py_BUILD_CORE 1 /* internal/pycore_frame.h: the frame layout */
#endif
#include "common.h"
#if PY_VERSION_HEX >= 0x030C0000
#include <internal/pycore_frame.h>
#else
PyAPI_FUNC(void) _Py_DumpTraceback(int fd, PyThreadState *tstate);
#endif
#include "../interp/runtime.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SLOTS 256
#define ALT_STACK_BYTES (64 * 1024)
#define MAX_DEPTH 100

typedef struct {
    int used;
    pthread_t thread;
    int index;
    const char *engine;
    void *alt_stack;
    as_interp *volatile ip;
    const char *volatile key; /* the model's pool key while a job runs, else NULL */
    volatile int kind;
} slot_t;

static slot_t slots[MAX_SLOTS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t installed = PTHREAD_ONCE_INIT;
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_FATAL (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction previous[N_FATAL];
static volatile sig_atomic_t reporting;

/* ---- async-signal-safe output on stderr ---- */

static void put_n(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void put(const char *s) { put_n(s, strlen(s)); }

static void put_uint(unsigned long v)
{
    char buf[24];
    size_t i = sizeof buf;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    put_n(buf + i, sizeof buf - i);
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV (segmentation fault)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (floating-point exception)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGABRT: return "SIGABRT (abort)";
    default: return "a fatal signal";
    }
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case AS_JOB_LOAD: return "loading it";
    case AS_JOB_UNLOAD: return "unloading it";
    case AS_JOB_INFER: return "running a batch";
    case AS_JOB_EXEC: return "running Pool.execute code";
    default: return "running a job";
    }
}

/* `model "name" version v` from a pool key `name/version` (or `name/version#load`). */
static void put_model(const char *key)
{
    const char *slash = NULL;
    for (const char *c = key; *c != '\0'; c++)
        if (*c == '/')
            slash = c;
    put("model \"");
    if (slash == NULL) {
        put(key);
        put("\"");
        return;
    }
    put_n(key, (size_t)(slash - key));
    put("\" version ");
    size_t n = 0;
    while (slash[1 + n] != '\0' && slash[1 + n] != '#')
        n++;
    put_n(slash + 1, n);
}

static void put_slot_job(const slot_t *s, const char *key)
{
    put("interpreter ");
    put_uint((unsigned long)s->index);
    put(" (engine ");
    put(s->engine != NULL ? s->engine : "?");
    put(")");
    if (key != NULL) {
        put(", ");
        put(kind_name(s->kind));
        put(" of ");
        put_model(key);
        put(" (pool key ");
        put(key);
        put(")");
    } else {
        put(", between jobs");
    }
}

/* ---- the Python stack of one interpreter's worker ---- */

#if PY_VERSION_HEX >= 0x030C0000
static void put_str(PyObject *s)
{
    if (s == NULL || !PyUnicode_Check(s)) { /* a flag test: holds for any copy's str type */
        put("???");
        return;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n && i < 500; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 32 && c < 127) {
            char ch = (char)c;
            put_n(&ch, 1);
        } else {
            char esc[10] = {'\\', 'U'};
            for (int k = 0; k < 8; k++)
                esc[2 + k] = hex[(c >> (28 - 4 * k)) & 0xf];
            put_n(esc, sizeof esc);
        }
    }
    if (n > 500)
        put("...");
}

static void dump_stack(PyThreadState *ts)
{
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
#else
    _PyInterpreterFrame *f = ts->cframe != NULL ? ts->cframe->current_frame : NULL;
#endif
    put("Stack (most recent call first):\n");
    if (f == NULL) {
        put("  <no Python frame>\n");
        return;
    }
    for (int depth = 0; f != NULL; f = f->previous) {
        if (f->owner == FRAME_OWNED_BY_CSTACK) /* a trampoline between C and Python */
            continue;
        if (depth++ >= MAX_DEPTH) {
            put("  ...\n");
            break;
        }
#if PY_VERSION_HEX >= 0x030D0000
        PyCodeObject *code = _PyFrame_GetCode(f);
#else
        PyCodeObject *code = f->f_code;
#endif
        put("  File \"");
        put_str(code->co_filename);
        put("\", line ");
        int line = PyUnstable_InterpreterFrame_GetLine(f);
        put_uint(line > 0 ? (unsigned long)line : 0);
        put(" in ");
        put_str(code->co_name);
        put("\n");
    }
}
#else
static void dump_stack(PyThreadState *ts) { _Py_DumpTraceback(STDERR_FILENO, ts); }
#endif

/* ---- the handler ---- */

static void report(int sig)
{
    pthread_t self = pthread_self();
    const slot_t *mine = NULL;
    for (int i = 0; i < MAX_SLOTS; i++)
        if (slots[i].used && pthread_equal(slots[i].thread, self))
            mine = &slots[i];
    put("\naserve: fatal signal ");
    put(signal_name(sig));
    if (mine != NULL) {
        const char *key = mine->key;
        put(" in ");
        put_slot_job(mine, key);
        put("\n");
        as_interp *ip = mine->ip;
        if (key != NULL && ip != NULL && ip->ts != NULL) {
            put("aserve: Python stack of interpreter ");
            put_uint((unsigned long)mine->index);
            put(":\n");
            dump_stack(ip->ts);
        }
    } else {
        put(" in a thread that is no pool worker (the host's, or one that model code started)\n");
        for (int i = 0; i < MAX_SLOTS; i++) {
            const char *key = slots[i].key;
            if (slots[i].used && key != NULL) {
                put("aserve: running meanwhile: ");
                put_slot_job(&slots[i], key);
                put("\n");
            }
        }
    }
    put("aserve: the process ends now with every request in flight; `aserve serve --supervise` or an "
        "orchestrator's liveness probe (/v2/health/live) restarts the server\n");
}

static void on_fatal(int sig, siginfo_t *info, void *context)
{
    (void)info;
    (void)context;
    int saved = errno;
    size_t i = 0;
    while (i < N_FATAL && fatal_signals[i] != sig)
        i++;
    if (!reporting) { /* a fault while reporting goes straight on */
        reporting = 1;
        report(sig);
    }
    /* hand the signal on: to the previous handler (faulthandler's, say) or the default action */
    if (i < N_FATAL)
        sigaction(sig, &previous[i], NULL);
    errno = saved;
    raise(sig);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_FATAL; i++)
        sigaction(fatal_signals[i], &sa, &previous[i]);
}

void as_fault_install(void) { pthread_once(&installed, install); }

/* On the worker thread: its slot (or -1 if every slot is taken: it goes unreported). */
int as_fault_register(int index, const char *engine)
{
    as_fault_install();
    void *alt = malloc(ALT_STACK_BYTES);
    if (alt != NULL) {
        stack_t ss;
        memset(&ss, 0, sizeof ss);
        ss.ss_sp = alt;
        ss.ss_size = ALT_STACK_BYTES;
        if (sigaltstack(&ss, NULL) != 0) {
            free(alt);
            alt = NULL;
        }
    }
    int found = -1;
    pthread_mutex_lock(&slots_mu);
    for (int i = 0; i < MAX_SLOTS && found < 0; i++) {
        if (slots[i].used)
            continue;
        slots[i] = (slot_t){.thread = pthread_self(), .index = index, .engine = engine, .alt_stack = alt};
        slots[i].used = 1;
        found = i;
    }
    pthread_mutex_unlock(&slots_mu);
    return found;
}

void as_fault_bind(int slot, as_interp *ip)
{
    if (slot >= 0)
        slots[slot].ip = ip;
}

void as_fault_job(int slot, const char *key, int kind)
{
    if (slot < 0)
        return;
    slots[slot].kind = kind;
    slots[slot].key = key;
}

/* On the worker thread, as it ends. */
void as_fault_unregister(int slot)
{
    if (slot < 0)
        return;
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, NULL);
    pthread_mutex_lock(&slots_mu);
    free(slots[slot].alt_stack);
    slots[slot].used = 0;
    slots[slot].key = NULL;
    slots[slot].ip = NULL;
    pthread_mutex_unlock(&slots_mu);
}
