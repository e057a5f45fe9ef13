/* compile.c: CUDA C++ source -> cubin (and PTX) with NVRTC, in-process. The GIL is released
 * during the compilation, so several threads can compile at once. Caching is done by the caller
 * (cudaforge/cuda/kernel.py), keyed by what determines the output. */
#include "cudaforge.h"

/* Find the first "NAME(LINE): error" in an NVRTC log. Returns the line number (0 if none) and
 * points *msg_start and *msg_len at that log line. */
static long first_error(const char *log, const char **msg_start, size_t *msg_len)
{
    const char *hit = strstr(log, "): error");
    if (hit == NULL)
        hit = strstr(log, "error");
    if (hit == NULL)
        return 0;
    const char *start = hit;
    while (start > log && start[-1] != '\n')
        start--;
    const char *end = strchr(hit, '\n');
    *msg_start = start;
    *msg_len = end ? (size_t)(end - start) : strlen(start);
    long line = 0;
    if (hit[0] == ')') {
        const char *open = hit;
        while (open > start && open[-1] != '(')
            open--;
        line = strtol(open, NULL, 10);
    }
    return line;
}

/* Line `n` (1-based) of `src`, or an empty span. */
static void source_line(const char *src, long n, const char **start, int *len)
{
    const char *p = src;
    for (long i = 1; i < n && p != NULL; i++) {
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    if (n <= 0 || p == NULL) {
        *start = "";
        *len = 0;
        return;
    }
    const char *end = strchr(p, '\n');
    *start = p;
    *len = end ? (int)(end - p) : (int)strlen(p);
}

static int raise_compile_error(cf_state *st, const char *src, const char *name, const char *log,
                               PyObject *options)
{
    const char *err_start = log;
    size_t err_len = 0;
    long line = first_error(log, &err_start, &err_len);
    const char *code;
    int code_len;
    source_line(src, line, &code, &code_len);
    while (code_len > 0 && (*code == ' ' || *code == '\t')) {
        code++;
        code_len--;
    }
    size_t size = strlen(log) + err_len + (size_t)code_len + 256;
    char *text = PyMem_Malloc(size);
    if (text == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (err_len == 0)
        snprintf(text, size, "NVRTC could not compile %s:\n%s", name, log);
    else if (code_len > 0)
        snprintf(text, size, "%.*s\n    %ld | %.*s\n(full NVRTC log in .log)", (int)err_len,
                 err_start, line, code_len, code);
    else
        snprintf(text, size, "%.*s\n(full NVRTC log in .log)", (int)err_len, err_start);
    PyObject *msg = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    PyMem_Free(text);
    if (msg == NULL)
        return -1;
    PyObject *attrs = Py_BuildValue("{s:s,s:O,s:l,s:s}", "log", log, "options", options, "line",
                                    line, "kernel", name);
    if (attrs != NULL) {
        cf_raise_with(st->CompileError, PyUnicode_AsUTF8(msg), attrs);
        Py_DECREF(attrs);
    }
    Py_DECREF(msg);
    return -1;
}

/* nvrtc_compile(source, name, options, name_expressions) -> dict(cubin, ptx, log, lowered) */
static PyObject *nvrtc_compile(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    const char *src, *name;
    PyObject *options_in, *names_in;
    PyObject *options = NULL, *names = NULL, *result = NULL, *lowered = NULL;
    const char **opts = NULL;
    char *log = NULL, *cubin = NULL, *ptx = NULL;
    size_t log_size = 0, cubin_size = 0, ptx_size = 0;
    nvrtcProgram prog = NULL;
    nvrtcResult status;

    if (!PyArg_ParseTuple(args, "ssOO:nvrtc_compile", &src, &name, &options_in, &names_in))
        return NULL;
    if (cf_need_nvrtc(st) < 0)
        return NULL;
    /* Tuples: nobody can change them while the GIL is released. */
    options = PySequence_Tuple(options_in);
    names = options ? PySequence_Tuple(names_in) : NULL;
    if (names == NULL)
        goto error;
    Py_ssize_t n_opts = PyTuple_GET_SIZE(options);
    opts = PyMem_Calloc((size_t)n_opts + 1, sizeof(char *));
    if (opts == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n_opts; i++) {
        opts[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(options, i));
        if (opts[i] == NULL)
            goto error;
    }
    CF_NVRTC(cf_nvrtc.nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        const char *expr = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (expr == NULL)
            goto error;
        CF_NVRTC(cf_nvrtc.nvrtcAddNameExpression(prog, expr));
    }
    Py_BEGIN_ALLOW_THREADS
    status = cf_nvrtc.nvrtcCompileProgram(prog, (int)n_opts, opts);
    Py_END_ALLOW_THREADS

    CF_NVRTC(cf_nvrtc.nvrtcGetProgramLogSize(prog, &log_size));
    log = PyMem_Malloc(log_size + 1);
    if (log == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    CF_NVRTC(cf_nvrtc.nvrtcGetProgramLog(prog, log));
    log[log_size] = '\0';
    if (status == NVRTC_ERROR_COMPILATION || status == NVRTC_ERROR_INVALID_OPTION) {
        if (status == NVRTC_ERROR_INVALID_OPTION && log[0] == '\0') {
            PyMem_Free(log);
            log = PyMem_Malloc(64);
            if (log == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            snprintf(log, 64, "error: an option was rejected by NVRTC");
        }
        raise_compile_error(st, src, name, log, options);
        goto error;
    }
    CF_NVRTC(status);

    /* A compute_XX target gives PTX only, an sm_XX target a cubin: ask for both and keep what
     * the target produced (NVRTC_ERROR_INVALID_INPUT means "not produced"). */
    status = cf_nvrtc.nvrtcGetCUBINSize(prog, &cubin_size);
    if (status == NVRTC_SUCCESS && cubin_size > 0) {
        cubin = PyMem_Malloc(cubin_size);
        if (cubin == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        CF_NVRTC(cf_nvrtc.nvrtcGetCUBIN(prog, cubin));
    } else if (status != NVRTC_SUCCESS && status != NVRTC_ERROR_INVALID_INPUT) {
        CF_NVRTC(status);
    }
    status = cf_nvrtc.nvrtcGetPTXSize(prog, &ptx_size);
    if (status == NVRTC_SUCCESS && ptx_size > 1) {
        ptx = PyMem_Malloc(ptx_size);
        if (ptx == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        CF_NVRTC(cf_nvrtc.nvrtcGetPTX(prog, ptx));
    } else if (status != NVRTC_SUCCESS && status != NVRTC_ERROR_INVALID_INPUT) {
        CF_NVRTC(status);
    }

    lowered = PyDict_New();
    if (lowered == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        const char *expr = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        const char *low = NULL;
        CF_NVRTC(cf_nvrtc.nvrtcGetLoweredName(prog, expr, &low));
        PyObject *v = PyUnicode_FromString(low);
        if (v == NULL || PyDict_SetItem(lowered, PyTuple_GET_ITEM(names, i), v) < 0) {
            Py_XDECREF(v);
            goto error;
        }
        Py_DECREF(v);
    }
    result =
        Py_BuildValue("{s:y#,s:y#,s:s,s:O}", "cubin", cubin, (Py_ssize_t)cubin_size, "ptx", ptx,
                      (Py_ssize_t)(ptx ? ptx_size - 1 : 0), "log", log, "lowered", lowered);
    if (result != NULL && cubin == NULL && PyDict_SetItemString(result, "cubin", Py_None) < 0)
        Py_CLEAR(result);
    if (result != NULL && ptx == NULL && PyDict_SetItemString(result, "ptx", Py_None) < 0)
        Py_CLEAR(result);
error:
    if (prog != NULL && cf_nvrtc.nvrtcDestroyProgram(&prog) != NVRTC_SUCCESS && result != NULL &&
        !PyErr_Occurred()) {
        Py_CLEAR(result);
        PyErr_SetString(st->CudaforgeError, "nvrtcDestroyProgram failed");
    }
    Py_XDECREF(lowered);
    Py_XDECREF(options);
    Py_XDECREF(names);
    PyMem_Free(opts);
    PyMem_Free(log);
    PyMem_Free(cubin);
    PyMem_Free(ptx);
    return result;
}

static PyMethodDef compile_methods[] = {
    {"nvrtc_compile", nvrtc_compile, METH_VARARGS,
     "nvrtc_compile(source, name, options, name_expressions) -> {cubin, ptx, log, lowered}.\n"
     "Raises CompileError (with .log, .options, .line) when the source does not compile."},
    {NULL, NULL, 0, NULL},
};

int cf_compile_exec(PyObject *m) { return PyModule_AddFunctions(m, compile_methods); }
