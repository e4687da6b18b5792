/* H2: one gRPC connection's HTTP/2, on libnghttp2 (framing, HPACK, flow control, the
 * protocol's limits), with gRPC's message framing on top (a 5-byte prefix per message).
 *
 * The connection's bytes go in through feed(), which returns what they made, as tuples:
 *   (H2_CALL, stream, method, path, metadata)  a call's headers (metadata: [(name, value)],
 *                                               a `-bin` value as bytes, every other as str)
 *   (H2_MESSAGE, stream, bytes, compressed)    one whole request message
 *   (H2_END, stream)                           the client sent all it will send
 *   (H2_RESET, stream, code)                   the stream ended before finish() (client's RST,
 *                                               or the connection's end)
 *   (H2_OVERSIZE, stream, what, size)          over a limit (what: 1 its metadata, 2 a message,
 *                                               3 the unfinished messages of every stream of
 *                                               the connection, which hold at most one
 *                                               message's worth): the stream reads no more of
 *                                               it; its call is answered
 *   (H2_PING, ack)                             a PING came (ack: the answer to ours)
 * and what the server answers goes out through send() (the response's headers with its first
 * message), finish() (the trailers: grpc-status, grpc-message, any more) and output(), the
 * bytes to write; output() may end streams too (their H2_RESET then waits for take()).
 * Everything here runs on one event loop, under its GIL.
 */
#include "common.h"

#include <nghttp2/nghttp2.h>
#include <string.h>

enum { H2_CALL = 1, H2_MESSAGE, H2_END, H2_RESET, H2_OVERSIZE, H2_PING };

typedef struct h2stream {
    int32_t id;
    /* the request */
    PyObject *method, *path, *metadata;
    size_t header_bytes;
    char *in; /* a message not yet whole */
    size_t in_len, in_cap;
    int oversize; /* 1: its metadata, 2: a message: nothing more of it is read */
    /* the response */
    char *out;
    size_t out_off, out_len, out_cap;
    nghttp2_nv *trailers; /* with their names and values in the same block */
    size_t ntrailers;
    int started, finished, deferred;
    struct h2stream *prev, *next; /* the connection's open streams */
} h2stream;

typedef struct {
    PyObject_HEAD
    nghttp2_session *session;
    PyObject *events; /* list, handed out by feed() */
    size_t max_header_bytes, max_message_bytes;
    size_t buffered; /* bytes of unfinished messages, every stream's: at most max_message_bytes */
    h2stream *streams; /* every stream with state here, freed with the session */
    int failed;        /* a callback failed (its exception is set) */
    int closing;       /* the session is being deleted: its streams' ends are not reported */
} h2conn;

static void drop_input(h2conn *c, h2stream *s)
{
    c->buffered -= s->in_len;
    free(s->in);
    s->in = NULL;
    s->in_len = s->in_cap = 0;
}

static void stream_free(h2conn *c, h2stream *s)
{
    drop_input(c, s);
    if (s->prev)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    Py_XDECREF(s->method);
    Py_XDECREF(s->path);
    Py_XDECREF(s->metadata);
    free(s->out);
    free(s->trailers);
    free(s);
}

static int emit(h2conn *c, PyObject *event)
{
    if (event == NULL || PyList_Append(c->events, event) < 0) {
        Py_XDECREF(event);
        c->failed = 1;
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    Py_DECREF(event);
    return 0;
}

static int reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap : 256;
    while (cap2 < need)
        cap2 *= 2;
    char *b = realloc(*buf, cap2);
    if (b == NULL)
        return -1;
    *buf = b;
    *cap = cap2;
    return 0;
}

/* ---- receiving ---- */

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user)
{
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    h2stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    s->id = frame->hd.stream_id;
    s->metadata = PyList_New(0);
    if (s->metadata == NULL) {
        ((h2conn *)user)->failed = 1;
        free(s);
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    nghttp2_session_set_stream_user_data(session, s->id, s);
    h2conn *c = user;
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user)
{
    h2conn *c = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* a client's trailers: gRPC requests have none that mean anything */
    h2stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s == NULL || s->oversize)
        return 0;
    s->header_bytes += namelen + valuelen + 32; /* HTTP/2's size of a header list (RFC 9113 6.5.2) */
    if (s->header_bytes > c->max_header_bytes) {
        s->oversize = 1;
        return 0;
    }
    PyObject *v;
    if (namelen && name[0] == ':') {
        v = PyUnicode_DecodeLatin1((const char *)value, (Py_ssize_t)valuelen, NULL);
        if (v == NULL)
            goto failed;
        PyObject **slot = namelen == 5 && !memcmp(name, ":path", 5)     ? &s->path
                          : namelen == 7 && !memcmp(name, ":method", 7) ? &s->method
                                                                        : NULL;
        if (slot != NULL)
            Py_XSETREF(*slot, v);
        else
            Py_DECREF(v);
        return 0;
    }
    int binary = namelen > 4 && !memcmp(name + namelen - 4, "-bin", 4);
    PyObject *k = PyUnicode_DecodeLatin1((const char *)name, (Py_ssize_t)namelen, NULL);
    v = binary ? PyBytes_FromStringAndSize((const char *)value, (Py_ssize_t)valuelen)
               : PyUnicode_DecodeLatin1((const char *)value, (Py_ssize_t)valuelen, NULL);
    PyObject *pair = k && v ? PyTuple_Pack(2, k, v) : NULL;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (pair == NULL || PyList_Append(s->metadata, pair) < 0) {
        Py_XDECREF(pair);
        goto failed;
    }
    Py_DECREF(pair);
    return 0;
failed:
    c->failed = 1;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* The whole messages at the front of data[0:len]; returns how many bytes they took. */
static ssize_t messages(h2conn *c, h2stream *s, const char *data, size_t len)
{
    size_t off = 0;
    while (len - off >= 5) {
        const unsigned char *p = (const unsigned char *)data + off;
        size_t size = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
        if (size > c->max_message_bytes) {
            s->oversize = 2;
            if (emit(c, Py_BuildValue("(iiin)", H2_OVERSIZE, s->id, 2, (Py_ssize_t)size)) < 0)
                return -1;
            return (ssize_t)len;
        }
        if (len - off - 5 < size)
            break;
        PyObject *m = PyBytes_FromStringAndSize(data + off + 5, (Py_ssize_t)size);
        if (m == NULL)
            return c->failed = 1, -1;
        if (emit(c, Py_BuildValue("(iiNO)", H2_MESSAGE, s->id, m, p[0] ? Py_True : Py_False)) < 0)
            return -1;
        off += 5 + size;
    }
    return (ssize_t)off;
}

static int on_data_chunk_recv(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
                              size_t len, void *user)
{
    h2conn *c = user;
    h2stream *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (s == NULL || s->oversize)
        return 0;
    const char *d = (const char *)data;
    if (s->in_len == 0) { /* the common case: whole messages, straight from the frame */
        ssize_t took = messages(c, s, d, len);
        if (took < 0)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        d += took;
        len -= (size_t)took;
        if (len == 0 || s->oversize)
            return 0;
    }
    if (c->buffered + len > c->max_message_bytes) { /* many streams' pieces: as one message too large */
        size_t held = c->buffered + len;
        s->oversize = 3;
        drop_input(c, s);
        return emit(c, Py_BuildValue("(iiin)", H2_OVERSIZE, s->id, 3, (Py_ssize_t)held));
    }
    if (reserve(&s->in, &s->in_cap, s->in_len + len) < 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    memcpy(s->in + s->in_len, d, len);
    s->in_len += len;
    c->buffered += len;
    ssize_t took = messages(c, s, s->in, s->in_len);
    if (took < 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    memmove(s->in, s->in + took, s->in_len - (size_t)took);
    s->in_len -= (size_t)took;
    c->buffered -= (size_t)took;
    if (s->oversize) /* nothing more of it is kept */
        drop_input(c, s);
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user)
{
    h2conn *c = user;
    int32_t id = frame->hd.stream_id;
    switch (frame->hd.type) {
    case NGHTTP2_PING:
        return emit(c, Py_BuildValue("(iO)", H2_PING, frame->hd.flags & NGHTTP2_FLAG_ACK ? Py_True : Py_False));
    case NGHTTP2_HEADERS:
        if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
            h2stream *s = nghttp2_session_get_stream_user_data(session, id);
            if (s == NULL)
                return 0;
            PyObject *event = s->oversize ? Py_BuildValue("(iiin)", H2_OVERSIZE, id, 1, (Py_ssize_t)s->header_bytes)
                                          : Py_BuildValue("(iiOOO)", H2_CALL, id, s->method ? s->method : Py_None,
                                                          s->path ? s->path : Py_None, s->metadata);
            if (emit(c, event) < 0)
                return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        break;
    case NGHTTP2_DATA:
        break;
    default:
        return 0;
    }
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        h2stream *s = nghttp2_session_get_stream_user_data(session, id);
        if (s != NULL && s->oversize != 1)
            return emit(c, Py_BuildValue("(ii)", H2_END, id));
    }
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user)
{
    h2conn *c = user;
    if (c->closing)
        return 0;
    h2stream *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (s == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(session, stream_id, NULL);
    int finished = s->finished;
    stream_free(c, s);
    if (!finished)
        return emit(c, Py_BuildValue("(iiI)", H2_RESET, stream_id, error_code));
    return 0;
}

/* ---- answering ---- */

/* The call's last frame went out while the client may still send: its stream is reset with
 * NO_ERROR (RFC 9113 8.1), as gRPC's servers do, so that the client ends it cleanly rather
 * than wait for the connection's end. */
static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user)
{
    (void)user;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->hd.flags & NGHTTP2_FLAG_END_STREAM &&
        nghttp2_session_get_stream_remote_close(session, frame->hd.stream_id) == 0)
        return nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR) == 0
                   ? 0
                   : NGHTTP2_ERR_CALLBACK_FAILURE;
    return 0;
}

static ssize_t read_response(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                             uint32_t *flags, nghttp2_data_source *source, void *user)
{
    h2stream *s = source->ptr;
    size_t avail = s->out_len - s->out_off;
    if (avail == 0) {
        if (!s->finished) {
            s->deferred = 1;
            return NGHTTP2_ERR_DEFERRED;
        }
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (nghttp2_submit_trailer(session, stream_id, s->trailers, s->ntrailers) != 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    size_t n = avail < length ? avail : length;
    memcpy(buf, s->out + s->out_off, n);
    s->out_off += n;
    if (s->out_off == s->out_len)
        s->out_off = s->out_len = 0;
    return (ssize_t)n;
}

/* The stream's state while the server may still answer on it; NULL when the stream is gone
 * (reset by the client, or closed by nghttp2 for a protocol error in this very read) or
 * finished: the caller's answer then goes nowhere, as the client no longer waits for it. */
/* The stream's answer goes on: nghttp2 asks read_response again (it deferred it for lack of data). */
static int resume(h2conn *c, h2stream *s)
{
    if (!s->deferred)
        return 0;
    s->deferred = 0;
    return nghttp2_session_resume_data(c->session, s->id);
}

static h2stream *stream_of(h2conn *c, int stream_id)
{
    h2stream *s = c->session && stream_id > 0 ? nghttp2_session_get_stream_user_data(c->session, stream_id) : NULL;
    return s == NULL || s->finished ? NULL : s;
}

#define NV(n, v, vl) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE}
static const nghttp2_nv response_headers[] = {
    NV(":status", "200", 3),
    NV("content-type", "application/grpc", 16),
};

/* send(stream, message) -> False when the stream is gone: the response's headers with its first
 * message, then each message. */
static PyObject *h2_send(h2conn *c, PyObject *args)
{
    int id;
    Py_buffer m;
    if (!PyArg_ParseTuple(args, "iy*:send", &id, &m))
        return NULL;
    h2stream *s = stream_of(c, id);
    if (s == NULL) {
        PyBuffer_Release(&m);
        Py_RETURN_FALSE;
    }
    if (reserve(&s->out, &s->out_cap, s->out_len + 5 + (size_t)m.len) < 0) {
        PyBuffer_Release(&m);
        return PyErr_NoMemory();
    }
    unsigned char *p = (unsigned char *)s->out + s->out_len;
    size_t n = (size_t)m.len;
    p[0] = 0;
    p[1] = (unsigned char)(n >> 24), p[2] = (unsigned char)(n >> 16), p[3] = (unsigned char)(n >> 8);
    p[4] = (unsigned char)n;
    memcpy(p + 5, m.buf, n);
    s->out_len += 5 + n;
    PyBuffer_Release(&m);
    int rv = 0;
    if (!s->started) {
        nghttp2_data_provider provider = {.source.ptr = s, .read_callback = read_response};
        rv = nghttp2_submit_response(c->session, id, response_headers, 2, &provider);
        s->started = 1;
    } else {
        rv = resume(c, s);
    }
    if (rv != 0)
        return PyErr_Format(PyExc_RuntimeError, "nghttp2: %s", nghttp2_strerror(rv));
    Py_RETURN_TRUE;
}

/* finish(stream, trailers) -> False when the stream is gone: the call's end, [(name, value)]
 * with grpc-status first. A call that sent no message answers with trailers alone, in its one
 * HEADERS frame. */
static PyObject *h2_finish(h2conn *c, PyObject *args)
{
    int id;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "iO!:finish", &id, &PyList_Type, &list))
        return NULL;
    h2stream *s = stream_of(c, id);
    if (s == NULL)
        Py_RETURN_FALSE;
    Py_ssize_t count = PyList_GET_SIZE(list);
    size_t extra = s->started ? 0 : 2, bytes = 0;
    const char *names[64], *values[64];
    Py_ssize_t nlen[64], vlen[64];
    if (count > 64)
        return PyErr_Format(PyExc_ValueError, "at most 64 trailers, got %zd", count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)
            return PyErr_Format(PyExc_TypeError, "trailers: expected (name, value) pairs");
        names[i] = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &nlen[i]);
        values[i] = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 1), &vlen[i]);
        if (names[i] == NULL || values[i] == NULL)
            return NULL;
        bytes += (size_t)nlen[i] + (size_t)vlen[i];
    }
    size_t n = extra + (size_t)count;
    nghttp2_nv *nv = malloc(n * sizeof *nv + bytes + 1);
    if (nv == NULL)
        return PyErr_NoMemory();
    char *text = (char *)(nv + n);
    if (extra)
        memcpy(nv, response_headers, sizeof response_headers);
    for (Py_ssize_t i = 0; i < count; i++) {
        nghttp2_nv *e = &nv[extra + (size_t)i];
        memcpy(text, names[i], (size_t)nlen[i]);
        e->name = (uint8_t *)text, e->namelen = (size_t)nlen[i];
        text += nlen[i];
        memcpy(text, values[i], (size_t)vlen[i]);
        e->value = (uint8_t *)text, e->valuelen = (size_t)vlen[i];
        text += vlen[i];
        e->flags = NGHTTP2_NV_FLAG_NONE;
    }
    int rv;
    s->finished = 1;
    if (!s->started) {
        s->started = 1;
        rv = nghttp2_submit_response(c->session, id, nv, n, NULL); /* copies what it needs */
        free(nv);
    } else {
        free(s->trailers);
        s->trailers = nv;
        s->ntrailers = n;
        rv = resume(c, s);
    }
    if (rv != 0)
        return PyErr_Format(PyExc_RuntimeError, "nghttp2: %s", nghttp2_strerror(rv));
    Py_RETURN_TRUE;
}

/* ---- the connection ---- */

static PyObject *h2_feed(h2conn *c, PyObject *arg)
{
    Py_buffer data;
    if (c->session == NULL)
        return PyErr_Format(PyExc_ValueError, "the connection is closed");
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    ssize_t rv = nghttp2_session_mem_recv(c->session, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    if (c->failed) {
        c->failed = 0;
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    if (rv < 0) /* a connection error: nghttp2 queued its GOAWAY, if it may still send one */
        return PyErr_Format(PyExc_ConnectionError, "HTTP/2: %s", nghttp2_strerror((int)rv));
    PyObject *events = c->events;
    c->events = PyList_New(0);
    if (c->events == NULL) {
        c->events = events;
        return NULL;
    }
    return events;
}

/* take(): the events made since feed() returned (output() closes streams too). */
static PyObject *h2_take(h2conn *c, PyObject *Py_UNUSED(ignored))
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *events = c->events;
    c->events = fresh;
    return events;
}

static PyObject *h2_get_events(h2conn *c, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(PyList_GET_SIZE(c->events) > 0);
}

/* output(): the bytes to write now (b"" for none). */
static PyObject *h2_output(h2conn *c, PyObject *Py_UNUSED(ignored))
{
    if (c->session == NULL)
        return PyBytes_FromStringAndSize(NULL, 0);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        const uint8_t *chunk;
        ssize_t n = nghttp2_session_mem_send(c->session, &chunk);
        if (n < 0) {
            free(buf);
            return PyErr_Format(PyExc_ConnectionError, "HTTP/2: %s", nghttp2_strerror((int)n));
        }
        if (n == 0)
            break;
        if (reserve(&buf, &cap, len + (size_t)n) < 0) {
            free(buf);
            return PyErr_NoMemory();
        }
        memcpy(buf + len, chunk, (size_t)n);
        len += (size_t)n;
    }
    PyObject *out = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
    free(buf);
    return out;
}

/* backlog(stream): the bytes of its answers that wait for the client's window (0: none, or no such stream) */
static PyObject *h2_backlog(h2conn *c, PyObject *arg)
{
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    if (id < 0 || id > INT32_MAX)
        return PyLong_FromLong(0);
    h2stream *s = c->session ? nghttp2_session_get_stream_user_data(c->session, (int32_t)id) : NULL;
    return PyLong_FromSize_t(s == NULL ? 0 : s->out_len - s->out_off);
}

static PyObject *h2_ping(h2conn *c, PyObject *Py_UNUSED(ignored))
{
    if (c->session != NULL)
        nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, NULL);
    Py_RETURN_NONE;
}

/* goaway(code, debug): no more calls. Every stream the client opened so far is still answered;
 * one it opens after is refused, and gRPC's clients send such a call again on a new connection. */
static PyObject *h2_goaway(h2conn *c, PyObject *args)
{
    unsigned int code;
    const char *debug;
    Py_ssize_t debuglen;
    if (!PyArg_ParseTuple(args, "Iy#:goaway", &code, &debug, &debuglen))
        return NULL;
    if (c->session != NULL) {
        int32_t last = nghttp2_session_get_last_proc_stream_id(c->session);
        nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, last, code, (const uint8_t *)debug, (size_t)debuglen);
    }
    Py_RETURN_NONE;
}

static PyObject *h2_reset(h2conn *c, PyObject *args)
{
    int id;
    unsigned int code;
    if (!PyArg_ParseTuple(args, "iI:reset", &id, &code))
        return NULL;
    if (c->session != NULL) {
        h2stream *s = nghttp2_session_get_stream_user_data(c->session, id);
        if (s != NULL)
            s->finished = 1; /* its end is the server's: no H2_RESET */
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, id, code);
    }
    Py_RETURN_NONE;
}

/* The session and its streams' state go (the streams' ends are the connection's: none is reported). */
static void session_end(h2conn *c)
{
    if (c->session != NULL) {
        c->closing = 1;
        nghttp2_session_del(c->session);
        c->session = NULL;
    }
    while (c->streams != NULL)
        stream_free(c, c->streams);
}

static PyObject *h2_close(h2conn *c, PyObject *Py_UNUSED(ignored))
{
    session_end(c);
    Py_RETURN_NONE;
}

static PyObject *h2_get_want(h2conn *c, void *closure)
{
    if (c->session == NULL)
        Py_RETURN_FALSE;
    int want = closure ? nghttp2_session_want_write(c->session) : nghttp2_session_want_read(c->session);
    return PyBool_FromLong(want);
}

static PyObject *h2_get_streams(h2conn *c, void *Py_UNUSED(closure))
{
    /* the streams the client opened that are not closed yet */
    long n = 0;
    for (h2stream *s = c->streams; s != NULL; s = s->next)
        n++;
    return PyLong_FromLong(n);
}

static int h2_init(h2conn *c, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"max_concurrent_streams", "max_header_bytes", "max_message_bytes", "window", NULL};
    unsigned int streams, window = 1 << 20;
    Py_ssize_t headers, message;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Inn|I:H2", kwlist, &streams, &headers, &message, &window))
        return -1;
    if (c->session != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "H2 is initialised once");
        return -1;
    }
    c->max_header_bytes = (size_t)headers;
    c->max_message_bytes = (size_t)message;
    c->events = PyList_New(0);
    if (c->events == NULL)
        return -1;
    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    if (nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    /* the client's header block is bounded by the setting (and by max_header_bytes per call) */
    nghttp2_option_set_max_settings(opt, 32);
    int rv = nghttp2_session_server_new2(&c->session, cb, c, opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    if (rv != 0) {
        PyErr_Format(PyExc_RuntimeError, "nghttp2: %s", nghttp2_strerror(rv));
        return -1;
    }
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, window},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)(headers > 0x7fffffff ? 0x7fffffff : headers)},
    };
    rv = nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 3);
    if (rv == 0) /* the connection's window: room for every stream's at once, up to 16 MiB */
        rv = nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0,
                                                   (int32_t)(window * 16u > (1u << 24) ? (1u << 24) : window * 16u));
    if (rv != 0) {
        PyErr_Format(PyExc_RuntimeError, "nghttp2: %s", nghttp2_strerror(rv));
        return -1;
    }
    return 0;
}

static PyObject *h2_new(PyTypeObject *tp, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kw))
{
    return tp->tp_alloc(tp, 0);
}

static int h2_traverse(h2conn *c, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(c));
    Py_VISIT(c->events);
    return 0;
}

static void h2_dealloc(h2conn *c)
{
    PyTypeObject *tp = Py_TYPE(c);
    PyObject_GC_UnTrack(c);
    session_end(c);
    Py_CLEAR(c->events);
    tp->tp_free(c);
    Py_DECREF(tp);
}

static PyMethodDef h2_methods[] = {
    {"feed", (PyCFunction)h2_feed, METH_O, "feed(data) -> the events the client's bytes made (see the module)"},
    {"output", (PyCFunction)h2_output, METH_NOARGS, "output() -> the bytes to write now"},
    {"take", (PyCFunction)h2_take, METH_NOARGS, "take() -> the events made since feed() returned"},
    {"send", (PyCFunction)h2_send, METH_VARARGS, "send(stream, message) -> False if it is gone: one message"},
    {"finish", (PyCFunction)h2_finish, METH_VARARGS,
     "finish(stream, trailers) -> False if it is gone: the call's status and end"},
    {"reset", (PyCFunction)h2_reset, METH_VARARGS, "reset(stream, code): RST_STREAM"},
    {"backlog", (PyCFunction)h2_backlog, METH_O, "backlog(stream) -> its answers' bytes not yet sent"},
    {"ping", (PyCFunction)h2_ping, METH_NOARGS, "ping(): a PING the client answers"},
    {"goaway", (PyCFunction)h2_goaway, METH_VARARGS, "goaway(code, debug): no stream after the last one opened"},
    {"close", (PyCFunction)h2_close, METH_NOARGS, "close(): the session ends (the connection was lost)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef h2_getset[] = {
    {"want_read", (getter)h2_get_want, NULL, "whether the session reads more", NULL},
    {"want_write", (getter)h2_get_want, NULL, "whether the session has more to write", (void *)1},
    {"streams", (getter)h2_get_streams, NULL, "the streams open now", NULL},
    {"events", (getter)h2_get_events, NULL, "whether events wait to be taken", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot h2_slots[] = {
    {Py_tp_doc, "H2(max_concurrent_streams, max_header_bytes, max_message_bytes, window=1 MiB): "
                "a gRPC connection's HTTP/2 (see native/host/h2.c)"},
    {Py_tp_new, h2_new},
    {Py_tp_init, h2_init},
    {Py_tp_dealloc, h2_dealloc},
    {Py_tp_traverse, h2_traverse},
    {Py_tp_methods, h2_methods},
    {Py_tp_getset, h2_getset},
    {0, NULL},
};

PyType_Spec as_h2_spec = {
    .name = "aserve._native.H2",
    .basicsize = sizeof(h2conn),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = h2_slots,
};
