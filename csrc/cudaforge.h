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
    X(cuMemGetInfo, 3020)                                                                          \
    X(cuMemsetD32Async, 3020)

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

/* CUPTI: timing.c and metrics.c add the names they use here. */
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
    /* metrics.c */                                                                                \
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
int cf_raise_cupti(cf_state *st, CUptiResult status, const char *call, const char *file, int line);
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

/* libcurl (http.c). The header does not include curl.h: `code` is a CURLcode, 0 is CURLE_OK. */
int cf_raise_curl(cf_state *st, int code, const char *call, const char *file, int line);

#define CF_CURL(call)                                                                              \
    do {                                                                                           \
        int cf_status_ = (int)(call);                                                              \
        if (cf_status_ != 0) {                                                                     \
            cf_raise_curl(st, cf_status_, #call, __FILE__, __LINE__);                              \
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

/* For metrics.c, which names the ranges of a profile by tracing the same launches: start a
 * trace (-1 with ProfilerError set if a trace is already running or CUPTI refuses), and stop it,
 * handing over a malloc'ed array of records sorted by correlation id (free with free()). */
int cf_trace_begin(cf_state *st);
int cf_trace_end(cf_state *st, cf_kernel_record **records, size_t *count, uint64_t *dropped);

/* metrics.c: after a CF_CUPTI failure, rewrite the pending ProfilerError's message with the way
 * out (the privileges knob, the other subscriber, ...) and set .reason accordingly. */
void cf_cupti_explain(cf_state *st);

/* ---------------------------------------------------------------- one exec per file */

int cf_errors_exec(PyObject *m);
int cf_loader_exec(PyObject *m);
int cf_compile_exec(PyObject *m);
int cf_launch_exec(PyObject *m);
int cf_timing_exec(PyObject *m);
int cf_metrics_exec(PyObject *m);
int cf_http_exec(PyObject *m);

/* Module teardown hooks for files that hold library-side state. */
void cf_http_free(void);

#endif /* CUDAFORGE_H */
