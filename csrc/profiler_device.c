/* profiler_device.c: binding a Profiler to a GPU: CUPTI's profiler initialized (once per
 * process), the device checked for what rules profiling out (vGPU, confidential computing, ...),
 * and the device's chip name and counter availability image, which the host API needs for a
 * config that this device can collect. */
#include "cudaforge.h"

/* cuptiProfilerInitialize is process-wide (hooks into the driver): done once, kept. */
static int profiler_initialized;

static int profiler_initialize(cf_state *st)
{
    if (profiler_initialized)
        return 0;
    CUpti_Profiler_Initialize_Params p = {.structSize =
                                              CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    CF_CUPTI(cf_cupti.cuptiProfilerInitialize(&p));
    profiler_initialized = 1;
    return 0;
error:
    return -1;
}

static const char *support_word(CUpti_Profiler_Support_Level level)
{
    switch (level) {
    case CUPTI_PROFILER_CONFIGURATION_SUPPORTED:
        return "supported";
    case CUPTI_PROFILER_CONFIGURATION_DISABLED:
        return "disabled";
    case CUPTI_PROFILER_CONFIGURATION_UNSUPPORTED:
        return "unsupported";
    default:
        return "unknown";
    }
}

/* Raise ProfilerError(reason="unsupported_device") naming the feature that rules profiling out. */
static int check_device_supported(cf_state *st, CUdevice dev)
{
    CUpti_Profiler_DeviceSupported_Params p = {
        .structSize = CUpti_Profiler_DeviceSupported_Params_STRUCT_SIZE,
        .cuDevice = dev,
        .api = CUPTI_PROFILER_RANGE_PROFILING,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerDeviceSupported(&p));
    if (p.isSupported == CUPTI_PROFILER_CONFIGURATION_SUPPORTED)
        return 0;
    char msg[512];
    snprintf(msg, sizeof msg,
             "device %d cannot be profiled by the CUPTI Range Profiler: architecture %s, SLI %s, "
             "vGPU %s, confidential computing %s, CMP %s, WSL %s",
             (int)dev, support_word(p.architecture), support_word(p.sli), support_word(p.vGpu),
             support_word(p.confidentialCompute), support_word(p.cmp), support_word(p.wsl));
    return cf_raise_profiler(st, "unsupported_device", msg);
error:
    return -1;
}

int cf_profiler_bind_device(cf_state *st, cf_profiler *p, int device)
{
    CUdevice dev;
    CUcontext ctx = NULL;
    if (cf_ensure_context(st, device, &dev) < 0)
        return -1;
    if (device >= 0 && dev != (CUdevice)device) {
        PyErr_Format(PyExc_ValueError,
                     "device %d requested but the current CUDA context is on device %d; use "
                     "torch.cuda.device(%d) or pass device=%d",
                     device, (int)dev, device, (int)dev);
        return -1;
    }
    p->device = (int)dev;
    if (profiler_initialize(st) < 0 || check_device_supported(st, dev) < 0)
        return -1;
    CUpti_Device_GetChipName_Params chip = {
        .structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE,
        .deviceIndex = (size_t)dev,
    };
    CF_CUPTI(cf_cupti.cuptiDeviceGetChipName(&chip));
    Py_XSETREF(p->chip, PyUnicode_FromString(chip.pChipName));
    if (p->chip == NULL)
        return -1;
    CF_CU(cf_cu.cuCtxGetCurrent(&ctx));
    /* CUPTI reads counter availability only while no Range Profiler is enabled; the kept one
       goes, unless a profile in another thread is using it */
    if (cf_profiler_release_kept("a profile() is running; create the Profiler before or after "
                                 "it") < 0)
        return -1;
    CUpti_Profiler_GetCounterAvailability_Params avail = {
        .structSize = CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE,
        .ctx = ctx,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerGetCounterAvailability(&avail));
    p->availability = PyMem_Malloc(avail.counterAvailabilityImageSize);
    if (p->availability == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    avail.pCounterAvailabilityImage = p->availability;
    CF_CUPTI(cf_cupti.cuptiProfilerGetCounterAvailability(&avail));
    return 0;
error:
    return -1;
}
