/* http.c: HTTP POST with libcurl, for the LLM clients (cudaforge/agents/providers.py).
 *
 * One easy handle per request, so several Python threads can post at once. The GIL is released
 * for the whole transfer and taken back only a few times a second, to let Ctrl-C interrupt a long
 * wait. TLS peers and host names are always verified; only http and https are allowed; redirects
 * are not followed. Any HTTP status (2xx or not) is returned to Python, which owns the retry
 * policy (429, 5xx, Retry-After); a transfer that fails (DNS, connect, TLS, timeout) raises
 * HTTPError with status None and retryable set for the failures worth another try. */
#include "cudaforge.h"

#include <curl/curl.h>
#include <math.h>
#include <time.h>

/* An LLM reply is kilobytes; a body this large is a misdirected request. */
#define HTTP_MAX_RESPONSE_BYTES ((size_t)64 * 1024 * 1024)
/* How often a blocked transfer looks for a pending signal (KeyboardInterrupt), in ns. */
#define HTTP_SIGNAL_CHECK_NS 200000000LL

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

/* Runs without the GIL (curl callbacks): raw allocator only. */
static int buffer_append(buffer *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *data = PyMem_RawRealloc(b->data, cap);
        if (data == NULL)
            return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

typedef struct {
    buffer body;
    buffer headers;
    int too_large;         /* the body passed HTTP_MAX_RESPONSE_BYTES */
    int out_of_memory;     /* a buffer could not grow */
    int interrupted;       /* a signal handler raised; the exception is set */
    PyThreadState *tstate; /* this thread's state, to take the GIL back in on_progress */
    struct timespec last_check;
} transfer;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    transfer *t = userdata;
    size_t n = size * nmemb;
    if (t->body.len + n > HTTP_MAX_RESPONSE_BYTES) {
        t->too_large = 1;
        return 0; /* anything but n makes curl stop with CURLE_WRITE_ERROR */
    }
    if (buffer_append(&t->body, ptr, n) < 0) {
        t->out_of_memory = 1;
        return 0;
    }
    return n;
}

static size_t on_header(char *ptr, size_t size, size_t nitems, void *userdata)
{
    transfer *t = userdata;
    size_t n = size * nitems;
    /* A status line opens a new block (after "100 Continue"): keep only the final response's. */
    if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0)
        t->headers.len = 0;
    if (buffer_append(&t->headers, ptr, n) < 0) {
        t->out_of_memory = 1;
        return 0;
    }
    return n;
}

static int on_progress(void *clientp, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    transfer *t = clientp;
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return 0;
    long long elapsed = (long long)(now.tv_sec - t->last_check.tv_sec) * 1000000000LL +
                        (now.tv_nsec - t->last_check.tv_nsec);
    if (elapsed < HTTP_SIGNAL_CHECK_NS)
        return 0;
    t->last_check = now;
    PyEval_RestoreThread(t->tstate);
    int rc = PyErr_CheckSignals(); /* a no-op outside the main thread */
    PyThreadState *saved = PyEval_SaveThread();
    (void)saved; /* the same thread state as t->tstate */
    if (rc < 0) {
        t->interrupted = 1;
        return 1; /* abort: CURLE_ABORTED_BY_CALLBACK */
    }
    return 0;
}

/* The error of a failed curl_easy_perform: what failed, curl's detail, and the URL (never the
 * headers: they hold the API key). */
static int raise_transfer_error(cf_state *st, const transfer *t, CURLcode code, const char *errbuf,
                                const char *url)
{
    if (t->interrupted)
        return -1; /* the signal handler's exception is already set */
    if (t->out_of_memory) {
        PyErr_NoMemory();
        return -1;
    }
    char what[1024], too_large[96];
    snprintf(what, sizeof what, "POST %s", url);
    if (t->too_large)
        snprintf(too_large, sizeof too_large, "the response passed %zu MiB; refusing to read more",
                 HTTP_MAX_RESPONSE_BYTES >> 20);
    return cf_raise_curl(st, (int)code, what, t->too_large ? too_large : errbuf, url, NULL, 0);
}

/* Append one "Name: value" line, refusing line breaks (they would inject headers). */
static int append_header(struct curl_slist **list, PyObject *line)
{
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(line, &len);
    if (text == NULL)
        return -1;
    if (strpbrk(text, "\r\n") != NULL || (Py_ssize_t)strlen(text) != len) {
        PyErr_SetString(PyExc_ValueError, "http_post: a header contains a line break or NUL");
        return -1;
    }
    struct curl_slist *grown = curl_slist_append(*list, text);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *list = grown;
    return 0;
}

static int append_pair(struct curl_slist **list, PyObject *name, PyObject *value)
{
    if (!PyUnicode_Check(name) || !PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "http_post: header names and values must be str, not %s: %s",
                     Py_TYPE(name)->tp_name, Py_TYPE(value)->tp_name);
        return -1;
    }
    PyObject *line = PyUnicode_FromFormat("%U: %U", name, value);
    if (line == NULL)
        return -1;
    int rc = append_header(list, line);
    Py_DECREF(line);
    return rc;
}

/* headers: a dict {name: value}, or a list/tuple of "Name: value" strings or (name, value)
 * pairs. Returns 0 with *out set (curl always gets "Expect:", so the list is never empty). */
static int build_headers(PyObject *headers, struct curl_slist **out)
{
    struct curl_slist *list = NULL;
    PyObject *fast = NULL;
    if (PyDict_Check(headers)) {
        PyObject *name, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(headers, &pos, &name, &value))
            if (append_pair(&list, name, value) < 0)
                goto error;
    } else if (PyList_Check(headers) || PyTuple_Check(headers)) {
        fast = PySequence_Fast(headers, "http_post: headers must be a dict or a list");
        if (fast == NULL)
            goto error;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
            if (PyUnicode_Check(item)) {
                if (append_header(&list, item) < 0)
                    goto error;
            } else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) {
                if (append_pair(&list, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1)) < 0)
                    goto error;
            } else {
                PyErr_Format(PyExc_TypeError,
                             "http_post: header %zd must be a 'Name: value' str or a (name, "
                             "value) tuple, not %s",
                             i, Py_TYPE(item)->tp_name);
                goto error;
            }
        }
    } else if (headers != Py_None) {
        PyErr_Format(PyExc_TypeError, "http_post: headers must be a dict or a list, not %s",
                     Py_TYPE(headers)->tp_name);
        goto error;
    }
    /* No "Expect: 100-continue" round trip before large bodies. */
    struct curl_slist *grown = curl_slist_append(list, "Expect:");
    if (grown == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    Py_XDECREF(fast);
    *out = grown;
    return 0;
error:
    Py_XDECREF(fast);
    curl_slist_free_all(list);
    return -1;
}

/* The final response's header block -> {lower-case name: value}; repeated names are joined with
 * ", " (RFC 9110). */
static PyObject *parse_headers(const buffer *raw)
{
    PyObject *dict = PyDict_New();
    if (dict == NULL || raw->data == NULL)
        return dict;
    const char *p = raw->data, *end = raw->data + raw->len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        const char *colon = memchr(p, ':', (size_t)(line_end - p));
        int status_line = line_end - p >= 5 && memcmp(p, "HTTP/", 5) == 0;
        if (colon != NULL && colon > p && !status_line) {
            const char *v = colon + 1, *v_end = line_end;
            while (v < v_end && (*v == ' ' || *v == '\t'))
                v++;
            while (v_end > v && (v_end[-1] == '\r' || v_end[-1] == ' ' || v_end[-1] == '\t'))
                v_end--;
            PyObject *name = PyUnicode_DecodeLatin1(p, colon - p, NULL);
            PyObject *lower = name ? PyObject_CallMethod(name, "lower", NULL) : NULL;
            PyObject *value = PyUnicode_DecodeLatin1(v, v_end - v, NULL);
            Py_XDECREF(name);
            if (lower == NULL || value == NULL) {
                Py_XDECREF(lower);
                Py_XDECREF(value);
                goto error;
            }
            PyObject *old = PyDict_GetItemWithError(dict, lower); /* borrowed */
            int rc;
            if (old != NULL) {
                PyObject *joined = PyUnicode_FromFormat("%U, %U", old, value);
                rc = joined == NULL ? -1 : PyDict_SetItem(dict, lower, joined);
                Py_XDECREF(joined);
            } else
                rc = PyErr_Occurred() ? -1 : PyDict_SetItem(dict, lower, value);
            Py_DECREF(lower);
            Py_DECREF(value);
            if (rc < 0)
                goto error;
        }
        p = line_end + 1;
    }
    return dict;
error:
    Py_DECREF(dict);
    return NULL;
}

static PyObject *http_post(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"url", "headers", "body", "timeout", "connect_timeout", NULL};
    cf_state *st = cf_get_state(module);
    const char *url;
    PyObject *headers, *body;
    double timeout, connect_timeout = 10.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOOd|d:http_post", kwlist, &url, &headers,
                                     &body, &timeout, &connect_timeout))
        return NULL;
    if (!(timeout > 0.0 && isfinite(timeout)) ||
        !(connect_timeout > 0.0 && isfinite(connect_timeout))) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "http_post: timeout and connect_timeout must be positive seconds, got %g and %g",
                 timeout, connect_timeout);
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
    const char *data;
    Py_ssize_t data_len;
    if (PyBytes_Check(body)) {
        data = PyBytes_AS_STRING(body);
        data_len = PyBytes_GET_SIZE(body);
    } else if (PyUnicode_Check(body)) {
        data = PyUnicode_AsUTF8AndSize(body, &data_len); /* cached in `body`, which we hold */
        if (data == NULL)
            return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "http_post: body must be bytes or str, not %s",
                     Py_TYPE(body)->tp_name);
        return NULL;
    }

    PyObject *result = NULL, *response_headers = NULL;
    struct curl_slist *header_list = NULL;
    transfer t = {0};
    char errbuf[CURL_ERROR_SIZE] = {0};
    long status = 0;
    CURL *curl = curl_easy_init();
    if (curl == NULL) {
        cf_raise_curl(st, CURLE_OUT_OF_MEMORY, "curl_easy_init", NULL, url, __FILE__, __LINE__);
        goto error;
    }
    if (build_headers(headers, &header_list) < 0)
        goto error;

    CF_CURL(curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_URL, url));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https"));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)ceil(timeout * 1000.0)));
    CF_CURL(
        curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)ceil(connect_timeout * 1000.0)));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_USERAGENT, "cudaforge libcurl/" LIBCURL_VERSION));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "")); /* any curl can decode */
    CF_CURL(curl_easy_setopt(curl, CURLOPT_HTTPHEADER, header_list));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_POST, 1L));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)data_len));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_POSTFIELDS, data));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t));
    CF_CURL(curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L));

    t.tstate = PyThreadState_Get();
    if (clock_gettime(CLOCK_MONOTONIC, &t.last_check) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    CURLcode code;
    Py_BEGIN_ALLOW_THREADS
    code = curl_easy_perform(curl);
    Py_END_ALLOW_THREADS
    if (code != CURLE_OK) {
        raise_transfer_error(st, &t, code, errbuf, url);
        goto error;
    }
    CF_CURL(curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status));
    response_headers = parse_headers(&t.headers);
    if (response_headers == NULL)
        goto error;
    result = Py_BuildValue("(ly#O)", status, t.body.data ? t.body.data : "", (Py_ssize_t)t.body.len,
                           response_headers);
error:
    Py_XDECREF(response_headers);
    curl_slist_free_all(header_list);
    curl_easy_cleanup(curl); /* a no-op on NULL */
    PyMem_RawFree(t.body.data);
    PyMem_RawFree(t.headers.data);
    return result;
}

static PyMethodDef http_methods[] = {
    {"http_post", (PyCFunction)(void (*)(void))http_post, METH_VARARGS | METH_KEYWORDS,
     "http_post(url, headers, body, timeout, connect_timeout=10.0) -> (status, body, headers)\n"
     "POST `body` (bytes, or str sent as UTF-8) to `url`. `headers` is a dict or a list of\n"
     "'Name: value' strings or (name, value) pairs. timeout bounds the whole transfer and\n"
     "connect_timeout the connection, both in seconds. Every HTTP status is returned (status\n"
     "int, body bytes, headers as {lower-case name: value}); retrying is the caller's choice.\n"
     "A failed transfer raises HTTPError(status=None, body='', retryable, url, curl_code)."},
    {NULL, NULL, 0, NULL},
};

/* The capsule's pointer: libcurl's global state has no handle of its own. */
static char curl_global_state;

static void curl_global_release(PyObject *capsule)
{
    (void)capsule;
    curl_global_cleanup(); /* libcurl counts its inits: this undoes one */
}

int cf_http_exec(PyObject *m)
{
    cf_state *st = cf_get_state(m);
    CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (code != CURLE_OK)
        return cf_raise_curl(st, (int)code, "curl_global_init", NULL, "", __FILE__, __LINE__);
    /* held by the module state: clearing it at module teardown ends this init */
    st->curl_global =
        PyCapsule_New(&curl_global_state, "cudaforge._core.curl_global", curl_global_release);
    if (st->curl_global == NULL) {
        curl_global_cleanup();
        return -1;
    }
    return PyModule_AddFunctions(m, http_methods);
}
