/* errors.c: the exception hierarchy of cudaforge, and the only code that turns a library status
 * (CUresult, nvrtcResult, CUptiResult, CURLcode) into a Python exception carrying the evidence:
 * one cf_raise_* per library, with the library's own words, the call site, and where the status
 * is one a user can act on (counters need admin rights, another profiler is attached, a network
 * failure worth retrying) the reason and the way out. */
#include "cudaforge.h"

#include <curl/curl.h>

static PyObject *new_exception(PyObject *m, const char *name, const char *doc, PyObject *base1,
                               PyObject *base2)
{
    PyObject *bases = base2 ? PyTuple_Pack(2, base1, base2) : PyTuple_Pack(1, base1);
    if (bases == NULL)
        return NULL;
    char qualname[96];
    snprintf(qualname, sizeof qualname, "cudaforge.%s", name);
    PyObject *type = PyErr_NewExceptionWithDoc(qualname, doc, bases, NULL);
    Py_DECREF(bases);
    if (type == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, name, type) < 0) {
        Py_DECREF(type);
        return NULL;
    }
    return type;
}

int cf_errors_exec(PyObject *m)
{
    cf_state *st = cf_get_state(m);
    st->CudaforgeError =
        new_exception(m, "CudaforgeError", "Base of every cudaforge error.", PyExc_Exception, NULL);
    if (st->CudaforgeError == NULL)
        return -1;
    st->LibraryNotFound = new_exception(
        m, "LibraryNotFound",
        "A CUDA library (libcuda, libnvrtc, libcupti) could not be loaded; the message says "
        "where it looked and which environment variable names it.",
        st->CudaforgeError, PyExc_OSError);
    st->CudaError =
        new_exception(m, "CudaError", "A CUDA driver call failed. Attributes: code, name, call.",
                      st->CudaforgeError, PyExc_RuntimeError);
    if (st->LibraryNotFound == NULL || st->CudaError == NULL)
        return -1;
    st->KernelFault = new_exception(
        m, "KernelFault",
        "A sticky CUDA error (illegal address, trap, ...): the CUDA context of this process "
        "is unusable; only a new process can use the GPU again.",
        st->CudaError, NULL);
    st->CompileError = new_exception(
        m, "CompileError", "NVRTC rejected a source. Attributes: log, options, line, kernel.",
        st->CudaforgeError, PyExc_ValueError);
    st->ProfilerError =
        new_exception(m, "ProfilerError", "CUPTI could not profile. Attribute: reason.",
                      st->CudaforgeError, NULL);
    st->HTTPError = new_exception(m, "HTTPError",
                                  "An HTTP request failed. Attributes: status, body, retryable.",
                                  st->CudaforgeError, PyExc_OSError);
    if (st->KernelFault == NULL || st->CompileError == NULL || st->ProfilerError == NULL ||
        st->HTTPError == NULL)
        return -1;
    return 0;
}

int cf_raise_with(PyObject *type, const char *msg, PyObject *attrs)
{
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (text == NULL)
        return -1;
    PyObject *exc = PyObject_CallOneArg(type, text);
    Py_DECREF(text);
    if (exc == NULL)
        return -1;
    if (attrs != NULL) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(attrs, &pos, &key, &value)) {
            if (PyObject_SetAttr(exc, key, value) < 0) {
                Py_DECREF(exc);
                return -1;
            }
        }
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return -1;
}

int cf_is_sticky(CUresult status)
{
    switch (status) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return 1;
    default:
        return 0;
    }
}

/* Strip the argument list from a stringized call: "cuFoo(a, b)" -> "cuFoo". */
static void call_name(const char *call, char *out, size_t size)
{
    size_t i = 0;
    while (call[i] && call[i] != '(' && i + 1 < size) {
        out[i] = call[i];
        i++;
    }
    out[i] = '\0';
    /* cf_cu.cuLaunchKernel -> cuLaunchKernel */
    char *dot = strrchr(out, '.');
    if (dot != NULL)
        memmove(out, dot + 1, strlen(dot + 1) + 1);
}

static int raise_status(PyObject *type, long code, const char *name, const char *text,
                        const char *call, const char *file, int line)
{
    char fn[96], msg[768];
    call_name(call, fn, sizeof fn);
    snprintf(msg, sizeof msg, "%s failed: %s (%s) [%s:%d]", fn, name, text, file, line);
    PyObject *attrs = Py_BuildValue("{s:l,s:s,s:s}", "code", code, "name", name, "call", fn);
    if (attrs == NULL)
        return -1;
    cf_raise_with(type, msg, attrs);
    Py_DECREF(attrs);
    return -1;
}

int cf_raise_cu(cf_state *st, CUresult status, const char *call, const char *file, int line)
{
    const char *name = NULL, *text = NULL;
    if (cf_cu.cuGetErrorName == NULL || cf_cu.cuGetErrorName(status, &name) != CUDA_SUCCESS)
        name = "CUDA_ERROR_UNKNOWN";
    if (cf_cu.cuGetErrorString == NULL || cf_cu.cuGetErrorString(status, &text) != CUDA_SUCCESS)
        text = "no description";
    PyObject *type = cf_is_sticky(status) ? st->KernelFault : st->CudaError;
    return raise_status(type, (long)status, name, text, call, file, line);
}

int cf_raise_nvrtc(cf_state *st, nvrtcResult status, const char *call, const char *file, int line)
{
    const char *name =
        cf_nvrtc.nvrtcGetErrorString ? cf_nvrtc.nvrtcGetErrorString(status) : "NVRTC_ERROR";
    return raise_status(st->CudaforgeError, (long)status, name, "NVRTC", call, file, line);
}

/* ---------------------------------------------------------------- CUPTI */

/* What a CUPTI status means for the user: the .reason of the ProfilerError and, for the statuses
 * they can act on, the way out appended to the message (NULL: CUPTI's words say it all). */
static const char *cupti_reason(CUptiResult status, const char **advice)
{
    *advice = NULL;
    switch (status) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
        *advice = "reading GPU performance counters needs admin rights here: the NVIDIA driver "
                  "restricts them (NVreg_RestrictProfilingToAdminUsers=1, seen as "
                  "RmProfilingAdminOnly: 1 in /proc/driver/nvidia/params). Run as root, with "
                  "CAP_SYS_ADMIN (or CAP_PERFMON from driver R565), or load the driver with "
                  "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' (modprobe.d, then "
                  "reload or reboot). Kernel timing (CUPTI activity) does not need these rights";
        return "insufficient_privileges";
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *advice = "another CUPTI client is attached to this process (torch.profiler/Kineto while "
                  "it records, Nsight Systems, Nsight Compute, compute-sanitizer) and CUPTI "
                  "allows one: finish or detach that tool, or profile in a process of its own";
        return "another_subscriber";
    case CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED:
        *advice = "this process already used the pre-13 CUPTI profiler API (another tool): the "
                  "Range Profiler cannot run beside it; profile in a process of its own";
        return "another_subscriber";
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED:
    case CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED:
        *advice = "this GPU or its configuration (vGPU, confidential computing, MIG, WSL, CMP) "
                  "gives no performance counters to CUPTI";
        return "unsupported_device";
    default:
        return "cupti_error";
    }
}

const char *cf_cupti_text(CUptiResult status)
{
    const char *text = NULL;
    if (cf_cupti.cuptiGetResultString == NULL ||
        cf_cupti.cuptiGetResultString(status, &text) != CUPTI_SUCCESS || text == NULL)
        text = "CUPTI_ERROR_UNKNOWN";
    return text;
}

int cf_raise_cupti(cf_state *st, CUptiResult status, const char *call, const char *file, int line)
{
    const char *text = cf_cupti_text(status), *advice;
    const char *reason = cupti_reason(status, &advice);
    char fn[96], msg[1536];
    call_name(call, fn, sizeof fn);
    snprintf(msg, sizeof msg, "%s failed: %s [%s:%d]%s%s", fn, text, file, line, advice ? ": " : "",
             advice ? advice : "");
    PyObject *attrs = Py_BuildValue("{s:l,s:s,s:s,s:s}", "code", (long)status, "name", text, "call",
                                    fn, "reason", reason);
    if (attrs == NULL)
        return -1;
    cf_raise_with(st->ProfilerError, msg, attrs);
    Py_DECREF(attrs);
    return -1;
}

int cf_raise_profiler(cf_state *st, const char *reason, const char *msg)
{
    PyObject *attrs = Py_BuildValue("{s:s}", "reason", reason);
    if (attrs == NULL)
        return -1;
    cf_raise_with(st->ProfilerError, msg, attrs);
    Py_DECREF(attrs);
    return -1;
}

/* ---------------------------------------------------------------- libcurl */

/* Failures where the same request may succeed a moment later. */
static int curl_retryable(CURLcode code)
{
    switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return 1;
    default:
        return 0;
    }
}

int cf_raise_curl(cf_state *st, int code, const char *what, const char *detail, const char *url,
                  const char *file, int line)
{
    char msg[CURL_ERROR_SIZE + 1536], where[160] = "";
    int has_detail = detail != NULL && detail[0] != '\0';
    if (file != NULL)
        snprintf(where, sizeof where, " [%s:%d]", file, line);
    snprintf(msg, sizeof msg, "%s failed: %s%s%s%s (CURLcode %d)%s", what,
             curl_easy_strerror((CURLcode)code), has_detail ? " (" : "", has_detail ? detail : "",
             has_detail ? ")" : "", code, where);
    PyObject *attrs =
        Py_BuildValue("{s:O,s:s,s:O,s:s,s:i}", "status", Py_None, "body", "", "retryable",
                      curl_retryable((CURLcode)code) ? Py_True : Py_False, "url", url ? url : "",
                      "curl_code", code);
    if (attrs == NULL)
        return -1;
    cf_raise_with(st->HTTPError, msg, attrs);
    Py_DECREF(attrs);
    return -1;
}
