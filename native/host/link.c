/* The host's side of links (link.h): plain C over the pool's queues. */
#include "link.h"

#include <fcntl.h>
#include <string.h>
#include <sys/eventfd.h>

static void link_wake(as_link *l)
{
    uint64_t one = 1;
    ssize_t rc;
    do
        rc = write(l->efd, &one, sizeof one);
    while (rc < 0 && errno == EINTR);
}

void as_link_post(hjob *j)
{
    as_link *l = j->link;
    pthread_mutex_lock(&l->mu);
    j->next = l->done;
    l->done = j;
    int wake = !l->signalled;
    l->signalled = 1;
    pthread_mutex_unlock(&l->mu);
    if (wake)
        link_wake(l);
}

void as_link_post_inputs(hinputs *in)
{
    as_link *l = in->link;
    pthread_mutex_lock(&l->mu);
    in->next = l->released;
    l->released = in;
    int wake = !l->signalled;
    l->signalled = 1;
    pthread_mutex_unlock(&l->mu);
    if (wake)
        link_wake(l);
}

static as_link *link_open(void)
{
    as_link *l = calloc(1, sizeof *l);
    if (l == NULL)
        return NULL;
    l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->efd < 0) {
        free(l);
        return NULL;
    }
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

/* The front has taken every job and released every input first (it closes last). */
static void link_close(as_link *l)
{
    close(l->efd);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static int link_infer(as_link *l, pool_t *p, const char *key, uint64_t mask, size_t n, const as_tensor *in,
                      void *token, void *cookie, int trace, const char *context, int64_t max_rows,
                      const as_wait *wait, const as_window *window, uint64_t *id)
{
    if (window != NULL && (wait == NULL || wait->counter == NULL)) {
        errno = EINVAL;
        return -1;
    }
    /* one block: the tensors, then their names and datatypes */
    size_t size = (n ? n : 1) * sizeof(as_tensor);
    for (size_t i = 0; i < n; i++)
        size += strlen(in[i].name) + strlen(in[i].datatype) + 2;
    hjob *j = calloc(1, sizeof *j);
    as_tensor *copy = malloc(size);
    hinputs *inputs = calloc(1, sizeof *inputs);
    char *key_copy = strdup(key);
    char *context_copy = context != NULL ? strdup(context) : NULL;
    if (j == NULL || copy == NULL || inputs == NULL || key_copy == NULL || (context != NULL && context_copy == NULL)) {
        free(j);
        free(copy);
        free(inputs);
        free(key_copy);
        free(context_copy);
        errno = ENOMEM;
        return -1;
    }
    char *text = (char *)(copy + (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        copy[i] = in[i];
        size_t a = strlen(in[i].name) + 1, b = strlen(in[i].datatype) + 1;
        copy[i].name = memcpy(text, in[i].name, a);
        copy[i].datatype = memcpy(text + a, in[i].datatype, b);
        copy[i].readonly = 1;
        text += a + b;
    }
    inputs->pool = p;
    inputs->link = l;
    inputs->cookie = cookie;
    inputs->refs = 1; /* the front's, dropped when it frees the job */
    j->pool = p;
    j->worker = -1;
    j->link = l;
    j->ftoken = token;
    j->job.kind = AS_JOB_INFER;
    j->key = key_copy;
    j->job.model = key_copy;
    j->mask = mask;
    j->in = copy;
    j->inputs = inputs;
    j->job.inputs = copy;
    j->job.n_inputs = n;
    j->job.inputs_ctx = inputs;
    j->job.trace = trace;
    j->text = context_copy; /* freed with the job */
    j->job.text = context_copy;
    j->max_rows = max_rows;
    if (wait != NULL && wait->counter != NULL) {
        as_counter_hold(wait->counter);
        j->waiting = wait->counter;
        memcpy(j->wait_slots, wait->slots, sizeof j->wait_slots);
        j->wait_samples = wait->samples;
        j->wait_requests = wait->requests;
        j->wait_batches = window == NULL; /* a native request is no batch until a worker takes it */
        wait_count(j, 1);
    }
    j->run_slot = -1;
    if (window == NULL && wait != NULL && wait->counter != NULL && wait->plan != NULL) {
        as_counter_hold(wait->counter);
        j->held = wait->counter;
        as_plan_hold(wait->plan);
        j->plan = wait->plan;
    }
    if (window != NULL) {
        as_counter_hold(wait->counter);
        j->held = wait->counter;
        j->native = 1;
        j->window_ns = window->window_ns;
        j->deadline_ns = window->deadline_ns;
        j->run_slot = window->run_slot;
        j->budget = window->budget;
        j->waited = window->waited;
        if (window->plan != NULL) {
            as_plan_hold(window->plan);
            j->plan = window->plan;
        }
    }
    if (l->holding) {
        as_pool_number_job(p, j); /* its id: the caller's handle for cancel */
        job_append(&l->held_head, &l->held_tail, j);
    } else {
        as_pool_enqueue(p, j, -1);
    }
    *id = j->id;
    return 0;
}

static void link_hold(as_link *l)
{
    l->holding = 1;
}

static void link_release(as_link *l)
{
    l->holding = 0;
    hjob *j = l->held_head;
    l->held_head = l->held_tail = NULL;
    while (j != NULL) { /* each run of jobs of one pool, in one enqueue */
        hjob *first = j, *last = j;
        while (last->next != NULL && last->next->pool == first->pool)
            last = last->next;
        j = last->next;
        last->next = NULL;
        as_pool_enqueue_many(first->pool, first);
    }
}

static hjob *link_take(as_link *l, hinputs **released)
{
    uint64_t count;
    if (read(l->efd, &count, sizeof count) < 0) {
        /* EAGAIN: nothing was written since the last take */
    }
    pthread_mutex_lock(&l->mu);
    hjob *j = l->done;
    l->done = NULL;
    *released = l->released;
    l->released = NULL;
    l->signalled = 0;
    pthread_mutex_unlock(&l->mu);
    hjob *ordered = NULL; /* newest first: reverse */
    while (j != NULL) {
        hjob *next = j->next;
        j->next = ordered;
        ordered = j;
        j = next;
    }
    return ordered;
}

static hinputs *link_job_free(hjob *j)
{
    hinputs *in = j->inputs;
    j->inputs = NULL;
    hinputs *last = in != NULL ? as_pool_inputs_drop(in) : NULL;
    as_pool_job_free(j); /* no Python object in a front's job: safe without the host GIL */
    return last;
}

static void link_give_back(pool_t *p, int worker, void *owner)
{
    as_pool_give_back(p, p->workers[worker], owner);
}

static double link_plan_admit(as_plan *plan, double now, int64_t queued, int64_t samples, double budget,
                              double waited, int mode)
{
    if (mode == 2)
        return as_plan_refuses(plan, now, queued, samples, budget, waited);
    return as_plan_admit(plan, now, queued, samples, budget, waited, mode);
}

const as_link_api as_link_api_table = {
    .version = AS_LINK_API_VERSION,
    .job_size = sizeof(hjob),
    .link_size = sizeof(as_link),
    .open = link_open,
    .close = link_close,
    .infer = link_infer,
    .hold = link_hold,
    .release = link_release,
    .take = link_take,
    .job_free = link_job_free,
    .inputs_free = as_pool_inputs_free,
    .give_back = link_give_back,
    .shared_release = as_pool_shared_release,
    .cancel = as_pool_cancel,
    .cancel_link = as_pool_cancel_link,
    .plan_admit = link_plan_admit,
    .plan_arrive = as_plan_arrive,
    .plan_rate = as_plan_admission_rate,
};
