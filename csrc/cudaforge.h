/* cudaforge.h: the one internal header of the C core.
 *
 * The module state (exception types, heap types, objects handed over from Python), the tables of
 * functions loaded from libcuda, libnvrtc and libcupti at first use, the check macros that turn a
 * library status into a Python exception, and one *_exec() per file that adds that file's
 * functions and types to the module. */
#ifndef CUDAFORGE_H
#define CUDAFORGE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cuda.h>
#include <nvrtc.h>
#include <cupti.h>
#include <cupti_profiler_host.h> /* needs csrc/shim/string: the header includes <string> */
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_target.h>
#include <stdint.h>

/* ---------------------------------------------------------------- module state */

typedef struct {
    /* exceptions (errors.c) */
    PyObject *CudaforgeError;
    PyObject *LibraryNotFound;
    PyObject *CudaError;
    PyObject *KernelFault;
    PyObject *CompileError;
    PyObject *ProfilerError;
    PyObject *HTTPError;
    /* heap types (launch.c) */
    PyTypeObject *ModuleType;
    PyTypeObject *KernelType;
    /* handed over by the Python package (launch.c: set_torch_hooks) */
    PyObject *tensor_type;   /* torch.Tensor, or NULL before torch is known */
    PyObject *stream_getter; /* callable(device_index) -> raw cudaStream_t as int */
    /* interned method names for the launch hot path */
    PyObject *str_data_ptr;
    PyObject *str_get_device;
    PyObject *str_cuda_stream;
    /* libcurl's global init, undone when this capsule goes with the module (http.c) */
    PyObject *curl_global;
} cf_state;

cf_state *cf_get_state(PyObject *module);
cf_state *cf_state_from_type(PyTypeObject *type);

/* ---------------------------------------------------------------- loaded libraries (loader.c) */

/* Each X-list names the functions a file uses; the table member gets the prototype's type from
 * the header, so a name that cuda.h maps to a _v2 symbol keeps the _v2 signature. The driver's
 * functions also carry the CUDA version whose ABI matches that prototype (cudaTypedefs.h's
 * PFN_<name>_v<version>): cuGetProcAddress at CUDA 13.0 would return e.g. cuCtxGetDevice_v2,
 * which takes an extra context argument. */
#define CF_CUDA_API(X)                                                                             \
    X(cuInit, 2000)                                                                                \
    X(cuDriverGetVersion, 2020)                                                                    \
    X(cuGetErrorName, 6000)                                                                        \
    X(cuGetErrorString, 6000)                                                                      \
    X(cuDeviceGet, 2000)                                                                           \
    X(cuDeviceGetCount, 2000)                                                                      \
    X(cuDeviceGetName, 2000)                                                                       \
    X(cuDeviceGetAttribute, 2000)                                                                  \
    X(cuDeviceTotalMem, 3020)                                                                      \
    X(cuDevicePrimaryCtxRetain, 7000)                                                              \
    X(cuCtxGetCurrent, 4000)                                                                       \
    X(cuCtxSetCurrent, 4000)                                                                       \
    X(cuCtxGetDevice, 2000)                                                                        \
    X(cuCtxSynchronize, 2000)                                                                      \
    X(cuCtxGetLimit, 3010)                                                                         \
    X(cuCtxSetLimit, 3010)                                                                         \
    X(cuCtxResetPersistingL2Cache, 11000)                                                          \
    X(cuModuleLoadData, 2000)                                                                      \
    X(cuModuleUnload, 2000)                                                                        \
    X(cuModuleGetFunction, 2000)                                                                   \
    X(cuFuncGetAttribute, 2020)                                                                    \
    X(cuFuncSetAttribute, 9000)                                                                    \
    X(cuFuncGetParamInfo, 12040)                                                                   \
    X(cuLaunchKernel, 4000)                                                                        \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050)                                           \
    X(cuStreamSynchronize, 2000)                                                                   \
    X(cuStreamQuery, 2000)                                                                         \
    X(cuStreamGetAttribute, 11000)                                                                 \
    X(cuStreamSetAttribute, 11000)                                                                 \
    X(cuMemGetInfo, 3020)                                                                          \
    X(cuMemsetD32Async, 3020)                                                                      \
    /* area.c: device memory shared with another process (virtual memory management) */            \
    X(cuMemGetAllocationGranularity, 10020)                                                        \
    X(cuMemCreate, 10020)                                                                          \
    X(cuMemRelease, 10020)                                                                         \
    X(cuMemExportToShareableHandle, 10020)                                                         \
    X(cuMemImportFromShareableHandle, 10020)                                                       \
    X(cuMemAddressReserve, 10020)                                                                  \
    X(cuMemAddressFree, 10020)                                                                     \
    X(cuMemMap, 10020)                                                                             \
    X(cuMemUnmap, 10020)                                                                           \
    X(cuMemSetAccess, 10020)

#define CF_NVRTC_API(X)                                                                            \
    X(nvrtcVersion)                                                                                \
    X(nvrtcGetErrorString)                                                                         \
    X(nvrtcGetNumSupportedArchs)                                                                   \
    X(nvrtcGetSupportedArchs)                                                                      \
    X(nvrtcCreateProgram)                                                                          \
    X(nvrtcDestroyProgram)                                                                         \
    X(nvrtcCompileProgram)                                                                         \
    X(nvrtcGetProgramLogSize)                                                                      \
    X(nvrtcGetProgramLog)                                                                          \
    X(nvrtcGetCUBINSize)                                                                           \
    X(nvrtcGetCUBIN)                                                                               \
    X(nvrtcGetPTXSize)                                                                             \
    X(nvrtcGetPTX)                                                                                 \
    X(nvrtcAddNameExpression)                                                                      \
    X(nvrtcGetLoweredName)

/* CUPTI: timing.c and the profiler files add the names they use here. */
#define CF_CUPTI_API(X)                                                                            \
    X(cuptiGetVersion)                                                                             \
    X(cuptiGetResultString)                                                                        \
    /* timing.c */                                                                                 \
    X(cuptiActivityRegisterCallbacks)                                                              \
    X(cuptiActivityRegisterTimestampCallback)                                                      \
    X(cuptiActivityEnable)                                                                         \
    X(cuptiActivityDisable)                                                                        \
    X(cuptiActivityFlushAll)                                                                       \
    X(cuptiActivityGetNextRecord)                                                                  \
    X(cuptiActivityGetNumDroppedRecords)                                                           \
    /* profiler_host.c, profiler_range.c */                                                        \
    X(cuptiProfilerInitialize)                                                                     \
    X(cuptiProfilerDeviceSupported)                                                                \
    X(cuptiDeviceGetChipName)                                                                      \
    X(cuptiProfilerGetCounterAvailability)                                                         \
    X(cuptiProfilerHostGetSupportedChips)                                                          \
    X(cuptiProfilerHostInitialize)                                                                 \
    X(cuptiProfilerHostDeinitialize)                                                               \
    X(cuptiProfilerHostGetBaseMetrics)                                                             \
    X(cuptiProfilerHostGetSubMetrics)                                                              \
    X(cuptiProfilerHostGetMetricProperties)                                                        \
    X(cuptiProfilerHostConfigAddMetrics)                                                           \
    X(cuptiProfilerHostGetConfigImageSize)                                                         \
    X(cuptiProfilerHostGetConfigImage)                                                             \
    X(cuptiProfilerHostGetNumOfPasses)                                                             \
    X(cuptiProfilerHostEvaluateToGpuValues)                                                        \
    X(cuptiRangeProfilerEnable)                                                                    \
    X(cuptiRangeProfilerDisable)                                                                   \
    X(cuptiRangeProfilerGetCounterDataSize)                                                        \
    X(cuptiRangeProfilerCounterDataImageInitialize)                                                \
    X(cuptiRangeProfilerSetConfig)                                                                 \
    X(cuptiRangeProfilerStart)                                                                     \
    X(cuptiRangeProfilerStop)                                                                      \
    X(cuptiRangeProfilerDecodeData)                                                                \
    X(cuptiRangeProfilerGetCounterDataInfo)

#define CF_DECLARE_MEMBER(name) __typeof__(&name) name;
#define CF_DECLARE_VERSIONED_MEMBER(name, version) __typeof__(&name) name;
typedef struct {
    CF_CUDA_API(CF_DECLARE_VERSIONED_MEMBER)
} cf_cuda_table;
typedef struct {
    CF_NVRTC_API(CF_DECLARE_MEMBER)
} cf_nvrtc_table;
typedef struct {
    CF_CUPTI_API(CF_DECLARE_MEMBER)
} cf_cupti_table;

extern cf_cuda_table cf_cu;
extern cf_nvrtc_table cf_nvrtc;
extern cf_cupti_table cf_cupti;

/* Return 0 when the library's table is filled, else -1 with LibraryNotFound set. */
int cf_need_cuda(cf_state *st);
int cf_need_nvrtc(cf_state *st);
int cf_need_cupti(cf_state *st);

/* Make a context current on this thread: the one already current (torch's), else the primary
 * context of `device` (never a private one: torch's pointers would not be valid there). Stores
 * the device of the current context in *device_out. */
int cf_ensure_context(cf_state *st, int device, CUdevice *device_out);

/* ---------------------------------------------------------------- errors (errors.c) */

int cf_raise_cu(cf_state *st, CUresult status, const char *call, const char *file, int line);
int cf_raise_nvrtc(cf_state *st, nvrtcResult status, const char *call, const char *file, int line);
/* ProfilerError with .reason: insufficient_privileges, another_subscriber, unsupported_device
 * (each with the way out in the message) or cupti_error. */
int cf_raise_cupti(cf_state *st, CUptiResult status, const char *call, const char *file, int line);
/* HTTPError (status None, body '', .url, .curl_code, .retryable for the failures worth another
 * try) for a failed libcurl call: `what` failed ("POST <url>" or the call), `detail` is curl's
 * error buffer or our own reason (may be NULL); `file` NULL leaves the call site out. */
int cf_raise_curl(cf_state *st, int code, const char *what, const char *detail, const char *url,
                  const char *file, int line);
/* CUPTI's name of a status ("CUPTI_ERROR_INVALID_METRIC_NAME"), for messages. */
const char *cf_cupti_text(CUptiResult status);
/* ProfilerError with a reason of our own (busy, incomplete, unsupported_device). */
int cf_raise_profiler(cf_state *st, const char *reason, const char *msg);
/* Set `type` with message `msg` and keyword attributes from `attrs` (a dict, may be NULL). */
int cf_raise_with(PyObject *type, const char *msg, PyObject *attrs);
/* True for errors after which the context is unusable (illegal address, trap, ...). */
int cf_is_sticky(CUresult status);

/* Every library call goes through one of these; they expect `st` (cf_state *) in scope and an
 * `error:` label that cleans up and returns the failure value. */
#define CF_CU(call)                                                                                \
    do {                                                                                           \
        CUresult cf_status_ = (call);                                                              \
        if (cf_status_ != CUDA_SUCCESS) {                                                          \
            cf_raise_cu(st, cf_status_, #call, __FILE__, __LINE__);                                \
            goto error;                                                                            \
        }                                                                                          \
    } while (0)

#define CF_CU_NOGIL(call)                                                                          \
    do {                                                                                           \
        CUresult cf_status_;                                                                       \
        Py_BEGIN_ALLOW_THREADS                                                                     \
        cf_status_ = (call);                                                                       \
        Py_END_ALLOW_THREADS                                                                       \
        if (cf_status_ != CUDA_SUCCESS) {                                                          \
            cf_raise_cu(st, cf_status_, #call, __FILE__, __LINE__);                                \
            goto error;                                                                            \
        }                                                                                          \
    } while (0)

#define CF_NVRTC(call)                                                                             \
    do {                                                                                           \
        nvrtcResult cf_status_ = (call);                                                           \
        if (cf_status_ != NVRTC_SUCCESS) {                                                         \
            cf_raise_nvrtc(st, cf_status_, #call, __FILE__, __LINE__);                             \
            goto error;                                                                            \
        }                                                                                          \
    } while (0)

#define CF_CUPTI(call)                                                                             \
    do {                                                                                           \
        CUptiResult cf_status_ = (call);                                                           \
        if (cf_status_ != CUPTI_SUCCESS) {                                                         \
            cf_raise_cupti(st, cf_status_, #call, __FILE__, __LINE__);                             \
            goto error;                                                                            \
        }                                                                                          \
    } while (0)

/* libcurl (http.c). The header does not include curl.h: the status is a CURLcode, 0 is
 * CURLE_OK. */
#define CF_CURL(call)                                                                              \
    do {                                                                                           \
        int cf_status_ = (int)(call);                                                              \
        if (cf_status_ != 0) {                                                                     \
            cf_raise_curl(st, cf_status_, #call, NULL, "", __FILE__, __LINE__);                    \
            goto error;                                                                            \
        }                                                                                          \
    } while (0)

/* The same with the GIL released around the call (profiling passes, flushes). */
#define CF_CUPTI_NOGIL(call)                                                                       \
    do {                                                                                           \
        CUptiResult cf_status_;                                                                    \
        Py_BEGIN_ALLOW_THREADS                                                                     \
        cf_status_ = (call);                                                                       \
        Py_END_ALLOW_THREADS                                                                       \
        if (cf_status_ != CUPTI_SUCCESS) {                                                         \
            cf_raise_cupti(st, cf_status_, #call, __FILE__, __LINE__);                             \
            goto error;                                                                            \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- kernel arguments (args.c) */

#define CF_MAX_PARAMS 64
#define CF_MAX_PARAM_BYTES 4096

/* A kernel's parameters: one type code each from the source's signature ('?' where it is not
 * known), and each one's offset and size in the parameter buffer, from the binary. */
typedef struct {
    char codes[CF_MAX_PARAMS + 1];
    int n_params; /* -1 until the binary was read */
    size_t offset[CF_MAX_PARAMS];
    size_t size[CF_MAX_PARAMS];
} cf_params;

/* Take the type codes from `codes` (a str, or None: all from the binary); ValueError if one is
 * not a known code. Resets n_params to -1. */
int cf_params_set_codes(cf_params *p, PyObject *codes);
/* Once the binary shows n parameters (offsets and sizes filled): TypeError naming `kernel` when
 * the declared codes are another number of them. */
int cf_params_check_count(cf_params *p, int n, const char *kernel);
/* The device of the first torch tensor among `items`, -1 when there is none. */
int cf_args_device(cf_state *st, PyObject *const *items, Py_ssize_t n, long *device);
/* Convert `items` into the bytes of the parameters, in `buffer` (CF_MAX_PARAM_BYTES), with
 * params[i] pointing at parameter i: tensors must be on `dev`; ints must fit their parameter.
 * Errors name the argument (by `param_names`, a tuple of str) and the kernel. */
int cf_pack_args(cf_state *st, const cf_params *p, PyObject *kernel, PyObject *param_names,
                 PyObject *const *items, Py_ssize_t n, CUdevice dev, unsigned char *buffer,
                 void **params);

/* ---------------------------------------------------------------- CUPTI activity (timing.c) */

/* One kernel execution as seen by the activity API, copied out of CUPTI's buffers. */
typedef struct {
    const char *name; /* owned by timing.c's name table, valid for the process */
    uint64_t start_ns, end_ns;
    uint32_t stream, correlation_id, device, context;
    int32_t grid[3], block[3];
    int32_t static_shared, dynamic_shared;
    uint32_t shared_executed; /* the shared memory carveout the driver chose, bytes */
    uint32_t local_bytes;     /* per thread */
    uint16_t registers;
} cf_kernel_record;

/* For profiler_range.c, which names the ranges of a profile by tracing the same launches: start a
 * trace (-1 with ProfilerError set if a trace is already running or CUPTI refuses), and stop it,
 * handing over a malloc'ed array of records sorted by correlation id (free with free()). */
int cf_trace_begin(cf_state *st);
int cf_trace_end(cf_state *st, cf_kernel_record **records, size_t *count, uint64_t *dropped);

/* ---------------------------------------------------------------- the Profiler type */

/* cudaforge._core.Profiler: a metric list made ready by CUPTI's profiler host API
 * (profiler_host.c: names, config image, passes; no GPU needed), bound to a device and run by the
 * Range Profiler (profiler_range.c). */
typedef struct {
    PyObject_HEAD PyObject *chip; /* str */
    PyObject *metrics;            /* tuple of str: the names the host API accepted, in order */
    PyObject *unsupported;        /* dict: name -> reason, for every name it did not accept */
    PyObject *last_run;           /* dict about the last profile() call, or None */
    int device;                   /* -1: offline (host API only) */
    CUpti_Profiler_Host_Object *host;
    uint8_t *config;
    size_t config_size;
    uint64_t config_id; /* a process-unique number of this config image (0: none yet) */
    size_t passes;
    uint8_t *availability;
    const char **names; /* UTF-8 of the items of `metrics`, owned by them */
    size_t n_names;
} cf_profiler;

/* profiler_device.c: bind `p` to the current context's device (`device`, or any when -1):
 * CUPTI's profiler initialized, the device checked, p->device, p->chip and p->availability (the
 * counter availability image) set. */
int cf_profiler_bind_device(cf_state *st, cf_profiler *p, int device);
/* profiler_range.c: the Profiler.profile(fn, ...) method. */
PyObject *cf_profiler_profile(PyObject *self, PyObject *args, PyObject *kwargs);
/* profiler_range.c: disable the Range Profiler kept enabled by profile(keep=True): 1 if there was
 * one, 0 if not, -1 with RuntimeError(busy) while a profile runs. */
int cf_profiler_release_kept(const char *busy);

/* ---------------------------------------------------------------- one exec per file */

int cf_errors_exec(PyObject *m);
int cf_loader_exec(PyObject *m);
int cf_compile_exec(PyObject *m);
int cf_launch_exec(PyObject *m);
int cf_device_exec(PyObject *m);
int cf_area_exec(PyObject *m);
int cf_timing_exec(PyObject *m);
int cf_profiler_host_exec(PyObject *m);
int cf_profiler_range_exec(PyObject *m);
int cf_http_exec(PyObject *m);

#endif /* CUDAFORGE_H */
