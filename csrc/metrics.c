/* metrics.c: hardware metrics per kernel with the CUPTI Range Profiler and the profiler host API
 * (CUDA 12.6+ / 13), as the Python type cudaforge._core.Profiler.
 *
 * Two halves. The host half (metric names, validation, the config image, the number of passes)
 * needs only libcupti + libnvperf_host and a chip name ("GH100"), so it works on a machine without
 * a GPU: Profiler(metrics, chip="GH100"). The target half profiles the kernels that a Python
 * callable launches: Profiler(metrics, device=0).profile(fn). It uses auto ranges (one range per
 * kernel launch) and kernel replay: CUPTI saves and restores the kernel's memory and runs each
 * kernel once per pass inside its launch, so fn is called once (the loop below only calls it again
 * if CUPTI asks for more passes, which kernel replay does not).
 *
 * Auto ranges are named "0", "1", ... in launch order; the kernel names come from an activity
 * trace of the same launches (timing.c), matched by launch order. */
#include "cudaforge.h"

#include <string.h>
#include <time.h>

#include <stdlib.h>

/* cuptiProfilerInitialize is process-wide (hooks into the driver): done once, kept. */
static int profiler_initialized;

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

/* ---------------------------------------------------------------- errors with the way out */

/* Rewrite a pending ProfilerError (set by CF_CUPTI) so that its message says why and what to do
 * for the statuses a user can act on; its attributes are kept. */
void cf_cupti_explain(cf_state *st)
{
    PyObject *type, *value, *tb;
    if (!PyErr_Occurred() || !PyErr_ExceptionMatches(st->ProfilerError))
        return;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *code_obj = value ? PyObject_GetAttrString(value, "code") : NULL;
    long code = code_obj ? PyLong_AsLong(code_obj) : -1;
    Py_XDECREF(code_obj);
    PyErr_Clear();
    const char *advice = NULL, *reason = NULL;
    switch (code) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
        reason = "insufficient_privileges";
        advice = "reading GPU performance counters needs admin rights here: the NVIDIA driver "
                 "restricts them (NVreg_RestrictProfilingToAdminUsers=1, seen as "
                 "RmProfilingAdminOnly: 1 in /proc/driver/nvidia/params). Run as root, with "
                 "CAP_SYS_ADMIN (or CAP_PERFMON from driver R565), or load the driver with "
                 "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' (modprobe.d, then reload "
                 "or reboot). Kernel timing (CUPTI activity) does not need these rights";
        break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        reason = "another_subscriber";
        advice = "another CUPTI client is attached to this process (torch.profiler/Kineto while "
                 "it records, Nsight Systems, Nsight Compute, compute-sanitizer) and CUPTI "
                 "allows one: finish or detach that tool, or profile in a process of its own";
        break;
    case CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED:
        reason = "another_subscriber";
        advice = "this process already used the pre-13 CUPTI profiler API (another tool): the "
                 "Range Profiler cannot run beside it; profile in a process of its own";
        break;
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED:
    case CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED:
        reason = "unsupported_device";
        advice = "this GPU or its configuration (vGPU, confidential computing, MIG, WSL, CMP) "
                 "gives no performance counters to CUPTI";
        break;
    default:
        break;
    }
    if (advice != NULL && value != NULL) {
        PyObject *text = PyObject_Str(value);
        PyObject *msg = text ? PyUnicode_FromFormat("%U: %s", text, advice) : NULL;
        PyObject *args = msg ? PyTuple_Pack(1, msg) : NULL;
        PyObject *r = reason ? PyUnicode_FromString(reason) : NULL;
        if (args != NULL && r != NULL && PyObject_SetAttrString(value, "args", args) == 0)
            PyObject_SetAttrString(value, "reason", r);
        Py_XDECREF(text);
        Py_XDECREF(msg);
        Py_XDECREF(args);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    PyErr_Restore(type, value, tb);
}

static int raise_profiler(cf_state *st, const char *reason, const char *msg)
{
    PyObject *attrs = Py_BuildValue("{s:s}", "reason", reason);
    if (attrs == NULL)
        return -1;
    cf_raise_with(st->ProfilerError, msg, attrs);
    Py_DECREF(attrs);
    return -1;
}

/* ---------------------------------------------------------------- host half */

static CUpti_Profiler_Host_Object *host_open(cf_state *st, const char *chip,
                                             const uint8_t *availability)
{
    CUpti_Profiler_Host_Initialize_Params p = {
        .structSize = CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE,
        .profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER,
        .pChipName = chip,
        .pCounterAvailabilityImage = availability,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerHostInitialize(&p));
    return p.pHostObject;
error:
    return NULL;
}

static void host_close(CUpti_Profiler_Host_Object *host)
{
    if (host == NULL)
        return;
    CUpti_Profiler_Host_Deinitialize_Params p = {
        .structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE,
        .pHostObject = host,
    };
    cf_cupti.cuptiProfilerHostDeinitialize(&p); /* teardown: nothing to report to */
}

/* 1 if the host object knows `name` (with or without rollup/submetric), 0 if not, -1 on error. */
static int metric_known(cf_state *st, CUpti_Profiler_Host_Object *host, const char *name)
{
    CUpti_Profiler_Host_GetMetricProperties_Params p = {
        .structSize = CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE,
        .pHostObject = host,
        .pMetricName = name,
    };
    CUptiResult status = cf_cupti.cuptiProfilerHostGetMetricProperties(&p);
    if (status == CUPTI_ERROR_INVALID_METRIC_NAME || status == CUPTI_ERROR_INVALID_PARAMETER)
        return 0;
    CF_CUPTI(status);
    return 1;
error:
    return -1;
}

/* Why `name` is not accepted, as a str. */
static PyObject *rejection_reason(cf_state *st, CUpti_Profiler_Host_Object *host, const char *chip,
                                  const char *name)
{
    if (strncmp(name, "launch__", 8) == 0)
        return PyUnicode_FromFormat("'%s' is not a hardware counter: Nsight Compute derives it "
                                    "from the launch (function attributes and the occupancy API)",
                                    name);
    const char *dot = strchr(name, '.');
    if (dot != NULL && dot > name) {
        char base[256];
        size_t len =
            (size_t)(dot - name) < sizeof base - 1 ? (size_t)(dot - name) : sizeof base - 1;
        memcpy(base, name, len);
        base[len] = '\0';
        int known = metric_known(st, host, base);
        if (known < 0)
            return NULL;
        if (known)
            return PyUnicode_FromFormat("metric '%s' exists on %s but not with the suffix '%s' "
                                        "(see Profiler.submetrics('%s'))",
                                        base, chip, dot, base);
        return PyUnicode_FromFormat("no metric '%s' on chip %s", base, chip);
    }
    return PyUnicode_FromFormat("no metric '%s' on chip %s (a name needs a rollup such as "
                                "'.sum' or '.avg')",
                                name, chip);
}

/* CUPTI_SUCCESS, or the status of ConfigAddMetrics for `names` on `host`. */
static CUptiResult config_add(CUpti_Profiler_Host_Object *host, const char **names, size_t n)
{
    CUpti_Profiler_Host_ConfigAddMetrics_Params add = {
        .structSize = CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE,
        .pHostObject = host,
        .ppMetricNames = names,
        .numMetrics = n,
    };
    return cf_cupti.cuptiProfilerHostConfigAddMetrics(&add);
}

static int set_unsupported(cf_state *st, cf_profiler *p, PyObject *item, const char *chip)
{
    PyObject *why = rejection_reason(st, p->host, chip, PyUnicode_AsUTF8(item));
    if (why == NULL || PyDict_SetItem(p->unsupported, item, why) < 0) {
        Py_XDECREF(why);
        return -1;
    }
    Py_DECREF(why);
    return 0;
}

/* Fill p->metrics (accepted, in the order given, each once), p->unsupported (name -> reason) and
 * p->names. A name is checked on its own first (metric properties), so that a bad one is reported
 * by name instead of failing the list; a failed ConfigAddMetrics leaves the host object unusable
 * (seen with CUDA 13.0), so the rare name that passes the check but not the config is found with
 * scratch host objects (about 1.5 ms each) and the config is rebuilt. */
static int add_metrics(cf_state *st, cf_profiler *p, PyObject *requested)
{
    const char *chip = PyUnicode_AsUTF8(p->chip);
    PyObject *accepted = PyList_New(0);
    PyObject *seq = PySequence_Fast(requested, "metrics must be a list of metric names");
    if (chip == NULL || accepted == NULL || seq == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "metric names must be str, got %.100s",
                         Py_TYPE(item)->tp_name);
            goto error;
        }
        int seen = PySequence_Contains(accepted, item);
        if (seen < 0)
            goto error;
        if (seen || PyDict_Contains(p->unsupported, item))
            continue; /* a repeated name is collected once */
        const char *name = PyUnicode_AsUTF8(item);
        if (name == NULL)
            goto error;
        int known = strncmp(name, "launch__", 8) == 0 ? 0 : metric_known(st, p->host, name);
        if (known < 0)
            goto error;
        if (known ? PyList_Append(accepted, item) < 0 : set_unsupported(st, p, item, chip) < 0)
            goto error;
    }
    Py_XSETREF(p->metrics, PyList_AsTuple(accepted));
    if (p->metrics == NULL)
        goto error;
    p->n_names = (size_t)PyTuple_GET_SIZE(p->metrics);
    p->names = PyMem_Calloc(p->n_names + 1, sizeof(char *));
    if (p->names == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (size_t i = 0; i < p->n_names; i++) {
        p->names[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(p->metrics, (Py_ssize_t)i));
        if (p->names[i] == NULL)
            goto error;
    }
    if (p->n_names > 0) {
        CUptiResult status = config_add(p->host, p->names, p->n_names);
        if (status == CUPTI_ERROR_INVALID_METRIC_NAME || status == CUPTI_ERROR_INVALID_PARAMETER) {
            size_t kept = 0;
            for (size_t i = 0; i < p->n_names; i++) {
                CUpti_Profiler_Host_Object *scratch = host_open(st, chip, p->availability);
                if (scratch == NULL)
                    goto error;
                CUptiResult one = config_add(scratch, &p->names[i], 1);
                host_close(scratch);
                PyObject *item = PyTuple_GET_ITEM(p->metrics, (Py_ssize_t)i);
                if (one == CUPTI_SUCCESS) {
                    p->names[kept++] = p->names[i];
                    continue;
                }
                const char *text = "CUPTI_ERROR_UNKNOWN";
                cf_cupti.cuptiGetResultString(one, &text);
                PyObject *why = PyUnicode_FromFormat(
                    "the host API describes '%s' on %s but the Range Profiler cannot collect it "
                    "(%s)",
                    p->names[i], chip, text);
                if (why == NULL || PyDict_SetItem(p->unsupported, item, why) < 0) {
                    Py_XDECREF(why);
                    goto error;
                }
                Py_DECREF(why);
            }
            PyObject *still = PyList_New(0);
            if (still == NULL)
                goto error;
            for (size_t i = 0; i < p->n_names; i++) {
                PyObject *item = PyTuple_GET_ITEM(p->metrics, (Py_ssize_t)i);
                if (!PyDict_Contains(p->unsupported, item) && PyList_Append(still, item) < 0) {
                    Py_DECREF(still);
                    goto error;
                }
            }
            Py_XSETREF(p->metrics, PyList_AsTuple(still));
            Py_DECREF(still);
            if (p->metrics == NULL)
                goto error;
            p->n_names = kept;
            host_close(p->host);
            p->host = host_open(st, chip, p->availability);
            if (p->host == NULL)
                goto error;
            status = kept > 0 ? config_add(p->host, p->names, kept) : CUPTI_SUCCESS;
        }
        CF_CUPTI(status);
    }
    Py_DECREF(accepted);
    Py_DECREF(seq);
    return 0;
error:
    Py_XDECREF(accepted);
    Py_XDECREF(seq);
    return -1;
}

static int build_config(cf_state *st, cf_profiler *p)
{
    if (p->n_names == 0)
        return 0; /* nothing to schedule: passes stays 0 */
    CUpti_Profiler_Host_GetConfigImageSize_Params size = {
        .structSize = CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE,
        .pHostObject = p->host,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerHostGetConfigImageSize(&size));
    p->config = PyMem_Malloc(size.configImageSize);
    if (p->config == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    p->config_size = size.configImageSize;
    static uint64_t configs_made;
    p->config_id = ++configs_made;
    CUpti_Profiler_Host_GetConfigImage_Params image = {
        .structSize = CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE,
        .pHostObject = p->host,
        .configImageSize = p->config_size,
        .pConfigImage = p->config,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerHostGetConfigImage(&image));
    CUpti_Profiler_Host_GetNumOfPasses_Params passes = {
        .structSize = CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE,
        .configImageSize = p->config_size,
        .pConfigImage = p->config,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerHostGetNumOfPasses(&passes));
    p->passes = passes.numOfPasses;
    return 0;
error:
    return -1;
}

/* ---------------------------------------------------------------- target half: the device */

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
    cf_cupti_explain(st);
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
    return raise_profiler(st, "unsupported_device", msg);
error:
    cf_cupti_explain(st);
    return -1;
}

static void kept_release(void);

/* One profile() at a time in the process: the kept object and the naming trace are shared. */
static int profiling;

/* The chip name and the counter availability image of the current context's device. */
static int device_setup(cf_state *st, cf_profiler *p, int device)
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
    if (profiling) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a profile() is running; create the Profiler before or after it");
        return -1;
    }
    kept_release();
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
    cf_cupti_explain(st);
    return -1;
}

/* ---------------------------------------------------------------- the type */

static int profiler_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_profiler *p = (cf_profiler *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *metrics;
    const char *chip = NULL;
    int device = -1;
    static char *kwlist[] = {"metrics", "chip", "device", NULL};
    if (st == NULL)
        return -1;
    if (p->host != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Profiler is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|zi:Profiler", kwlist, &metrics, &chip,
                                     &device))
        return -1;
    if (PyUnicode_Check(metrics)) {
        PyErr_SetString(PyExc_TypeError, "metrics must be a list of names, not one str");
        return -1;
    }
    if (cf_need_cupti(st) < 0)
        return -1;
    /* a failed __init__ may have left buffers behind */
    PyMem_Free(p->availability);
    PyMem_Free(p->config);
    PyMem_Free((void *)p->names);
    p->availability = p->config = NULL;
    p->names = NULL;
    p->n_names = p->passes = p->config_size = 0;
    p->device = -1;
    Py_XSETREF(p->unsupported, PyDict_New());
    Py_XSETREF(p->last_run, Py_NewRef(Py_None));
    if (p->unsupported == NULL)
        return -1;
    if (chip != NULL) {
        Py_XSETREF(p->chip, PyUnicode_FromString(chip));
        if (p->chip == NULL)
            return -1;
    } else if (device_setup(st, p, device) < 0) {
        return -1;
    }
    const char *chip_name = PyUnicode_AsUTF8(p->chip);
    if (chip_name == NULL)
        return -1;
    p->host = host_open(st, chip_name, p->availability);
    if (p->host == NULL) {
        if (PyErr_ExceptionMatches(st->ProfilerError) && chip != NULL) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "CUPTI's host API does not know the chip '%s' (see "
                         "profiler_supported_chips())",
                         chip);
        }
        return -1;
    }
    if (add_metrics(st, p, metrics) < 0 || build_config(st, p) < 0)
        return -1;
    return 0;
}

static int profiler_traverse(PyObject *self, visitproc visit, void *arg)
{
    cf_profiler *p = (cf_profiler *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(p->chip);
    Py_VISIT(p->metrics);
    Py_VISIT(p->unsupported);
    Py_VISIT(p->last_run);
    return 0;
}

static int profiler_clear(PyObject *self)
{
    cf_profiler *p = (cf_profiler *)self;
    Py_CLEAR(p->chip);
    Py_CLEAR(p->metrics);
    Py_CLEAR(p->unsupported);
    Py_CLEAR(p->last_run);
    return 0;
}

static void profiler_dealloc(PyObject *self)
{
    cf_profiler *p = (cf_profiler *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    host_close(p->host);
    p->host = NULL;
    PyMem_Free(p->config);
    PyMem_Free(p->availability);
    PyMem_Free((void *)p->names);
    profiler_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int check_ready(cf_profiler *p)
{
    if (p->host == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Profiler was not initialized");
        return -1;
    }
    return 0;
}

/* base_metrics(type=None) -> list of str (type 'counter', 'ratio' or 'throughput'), or a dict of
 * the three lists when type is None. */
static PyObject *profiler_base_metrics(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_profiler *p = (cf_profiler *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    const char *type = NULL;
    static char *kwlist[] = {"type", NULL};
    static const char *const type_names[] = {"counter", "ratio", "throughput"};
    PyObject *out = NULL;
    if (st == NULL || check_ready(p) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|z:base_metrics", kwlist, &type))
        return NULL;
    /* A scratch host object: CUPTI appends to the lists it returns on every query of the same
     * host object (seen with CUDA 13.0: the second call gave each name twice). */
    const char *chip = PyUnicode_AsUTF8(p->chip);
    if (chip == NULL)
        return NULL;
    CUpti_Profiler_Host_Object *host = host_open(st, chip, p->availability);
    if (host == NULL)
        return NULL;
    out = PyDict_New();
    if (out == NULL)
        goto error;
    int found = 0;
    for (int t = 0; t < CUPTI_METRIC_TYPE__COUNT; t++) {
        if (type != NULL && strcmp(type, type_names[t]) != 0)
            continue;
        found = 1;
        CUpti_Profiler_Host_GetBaseMetrics_Params q = {
            .structSize = CUpti_Profiler_Host_GetBaseMetrics_Params_STRUCT_SIZE,
            .pHostObject = host,
            .metricType = (CUpti_MetricType)t,
        };
        CF_CUPTI(cf_cupti.cuptiProfilerHostGetBaseMetrics(&q));
        PyObject *list = PyList_New((Py_ssize_t)q.numMetrics);
        if (list == NULL || PyDict_SetItemString(out, type_names[t], list) < 0) {
            Py_XDECREF(list);
            goto error;
        }
        Py_DECREF(list);
        for (size_t i = 0; i < q.numMetrics; i++) {
            PyObject *name = PyUnicode_FromString(q.ppMetricNames[i]);
            if (name == NULL)
                goto error;
            PyList_SET_ITEM(list, (Py_ssize_t)i, name);
        }
        if (PyList_Sort(list) < 0)
            goto error;
    }
    if (!found) {
        PyErr_Format(PyExc_ValueError,
                     "type must be 'counter', 'ratio', 'throughput' or None, "
                     "not '%s'",
                     type);
        goto error;
    }
    host_close(host);
    if (type != NULL) {
        PyObject *list = Py_NewRef(PyDict_GetItemString(out, type));
        Py_DECREF(out);
        return list;
    }
    return out;
error:
    host_close(host);
    Py_XDECREF(out);
    return NULL;
}

static const char *metric_type_name(CUpti_MetricType t)
{
    switch (t) {
    case CUPTI_METRIC_TYPE_COUNTER:
        return "counter";
    case CUPTI_METRIC_TYPE_RATIO:
        return "ratio";
    case CUPTI_METRIC_TYPE_THROUGHPUT:
        return "throughput";
    default:
        return "unknown";
    }
}

/* properties(name) -> dict(description, hw_unit, dim_unit, type); KeyError if unknown. */
static PyObject *profiler_properties(PyObject *self, PyObject *arg)
{
    cf_profiler *p = (cf_profiler *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    if (st == NULL || check_ready(p) < 0)
        return NULL;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    CUpti_Profiler_Host_GetMetricProperties_Params q = {
        .structSize = CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE,
        .pHostObject = p->host,
        .pMetricName = name,
    };
    CUptiResult status = cf_cupti.cuptiProfilerHostGetMetricProperties(&q);
    if (status == CUPTI_ERROR_INVALID_METRIC_NAME || status == CUPTI_ERROR_INVALID_PARAMETER) {
        PyErr_Format(PyExc_KeyError, "no metric '%s' on chip %U", name, p->chip);
        return NULL;
    }
    CF_CUPTI(status);
    return Py_BuildValue("{s:s,s:s,s:s,s:s}", "description", q.pDescription ? q.pDescription : "",
                         "hw_unit", q.pHwUnit ? q.pHwUnit : "", "dim_unit",
                         q.pDimUnit ? q.pDimUnit : "", "type", metric_type_name(q.metricType));
error:
    return NULL;
}

/* submetrics(name) -> list of the suffixes CUPTI accepts after a base metric. */
static PyObject *profiler_submetrics(PyObject *self, PyObject *arg)
{
    cf_profiler *p = (cf_profiler *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    CUpti_Profiler_Host_Object *host = NULL;
    if (st == NULL || check_ready(p) < 0)
        return NULL;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    CUpti_Profiler_Host_GetMetricProperties_Params props = {
        .structSize = CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE,
        .pHostObject = p->host,
        .pMetricName = name,
    };
    CUptiResult status = cf_cupti.cuptiProfilerHostGetMetricProperties(&props);
    if (status == CUPTI_ERROR_INVALID_METRIC_NAME || status == CUPTI_ERROR_INVALID_PARAMETER) {
        PyErr_Format(PyExc_KeyError, "no metric '%s' on chip %U", name, p->chip);
        return NULL;
    }
    CF_CUPTI(status);
    const char *chip = PyUnicode_AsUTF8(p->chip);
    if (chip == NULL)
        return NULL;
    host = host_open(st, chip, p->availability); /* scratch: see base_metrics */
    if (host == NULL)
        return NULL;
    CUpti_Profiler_Host_GetSubMetrics_Params q = {
        .structSize = CUpti_Profiler_Host_GetSubMetrics_Params_STRUCT_SIZE,
        .pHostObject = host,
        .metricType = props.metricType,
        .pMetricName = name,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerHostGetSubMetrics(&q));
    PyObject *out = PyList_New((Py_ssize_t)q.numOfSubmetrics);
    for (size_t i = 0; out != NULL && i < q.numOfSubmetrics; i++) {
        PyObject *s = PyUnicode_FromString(q.ppSubMetrics[i]);
        if (s == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, s);
    }
    host_close(host);
    return out;
error:
    host_close(host);
    return NULL;
}

/* ---------------------------------------------------------------- profile(fn) */

/* The Range Profiler object kept enabled between profile(keep=True) calls. Its first Start after
 * Enable costs ~0.4 s on the H200 (measured: start 412 ms of a 1-pass profile), the later ones
 * ~20 ms, so a warm worker keeps one enabled, with the counter data image it was last
 * configured with (CUPTI may hold on to it until the next SetConfig). Only touched with the GIL
 * held and no profile running. */
static struct {
    CUpti_RangeProfiler_Object *object;
    CUcontext ctx;
    uint8_t *counter_data;
    uint8_t *pristine; /* the counter data image as initialized, before any pass */
    /* what the object was configured with (SetConfig): reused only for the same */
    size_t counter_data_size;
    uint64_t config_id;
    int user_replay;
    size_t max_kernels;
} kept;

/* Disable a Range Profiler object, best effort: it is dropped whatever CUPTI says. */
static void range_disable(CUpti_RangeProfiler_Object *object)
{
    CUpti_RangeProfiler_Disable_Params off = {
        .structSize = CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE,
        .pRangeProfilerObject = object,
    };
    Py_BEGIN_ALLOW_THREADS
    cf_cupti.cuptiRangeProfilerDisable(&off);
    Py_END_ALLOW_THREADS
}

static void kept_release(void)
{
    /* forget it first: the disable below lets other threads run */
    CUpti_RangeProfiler_Object *object = kept.object;
    uint8_t *counter_data = kept.counter_data, *pristine = kept.pristine;
    kept.object = NULL;
    kept.pristine = NULL;
    kept.ctx = NULL;
    kept.counter_data = NULL;
    kept.counter_data_size = 0;
    kept.config_id = 0;
    if (object != NULL)
        range_disable(object);
    PyMem_RawFree(counter_data);
    PyMem_RawFree(pristine);
}

/* State of one profile() call, released in one place whatever happened. */
typedef struct {
    CUpti_RangeProfiler_Object *object;
    int kept; /* object is kept.object */
    uint8_t *counter_data;
    uint8_t *pristine; /* a copy of counter_data as initialized, for a kept object */
    size_t counter_data_size;
    uint64_t config_id; /* what SetConfig was given, remembered with a kept object */
    int user_replay;
    size_t max_kernels;
    int started;
    int tracing;
    cf_kernel_record *records;
    size_t n_records;
    double *values;
} profile_run;

static void run_release(cf_state *st, profile_run *run)
{
    /* Called with or without an exception pending: failures here must not replace it. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (run->kept && type == NULL) {
        /* success: the object stays enabled, holding this run's counter data image */
        PyMem_RawFree(kept.counter_data);
        kept.counter_data = run->counter_data;
        if (run->pristine != NULL) {
            PyMem_RawFree(kept.pristine);
            kept.pristine = run->pristine;
            run->pristine = NULL;
        }
        kept.counter_data_size = run->counter_data_size;
        kept.config_id = run->config_id;
        kept.user_replay = run->user_replay;
        kept.max_kernels = run->max_kernels;
        run->counter_data = NULL;
        run->object = NULL;
    }
    if (run->started) {
        CUpti_RangeProfiler_Stop_Params stop = {
            .structSize = CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE,
            .pRangeProfilerObject = run->object,
        };
        cf_cupti.cuptiRangeProfilerStop(&stop);
        run->started = 0;
    }
    if (run->object != NULL) {
        if (run->kept)
            kept_release(); /* a failed run: start afresh next time */
        else
            range_disable(run->object);
        run->object = NULL;
    }
    if (run->tracing) {
        uint64_t dropped = 0;
        free(run->records);
        run->records = NULL;
        if (cf_trace_end(st, &run->records, &run->n_records, &dropped) < 0)
            PyErr_Clear();
        run->tracing = 0;
    }
    free(run->records);
    run->records = NULL;
    PyMem_RawFree(run->counter_data);
    run->counter_data = NULL;
    PyMem_RawFree(run->pristine);
    run->pristine = NULL;
    PyMem_Free(run->values);
    run->values = NULL;
    PyErr_Restore(type, value, tb);
}

/* The kernel name of range `index`: the index-th distinct launch of the trace (records come
 * sorted by correlation id; kernel replay may repeat a launch's correlation id). */
static const char *range_kernel(const profile_run *run, size_t index)
{
    size_t distinct = 0;
    for (size_t i = 0; i < run->n_records; i++) {
        if (i > 0 && run->records[i].correlation_id == run->records[i - 1].correlation_id)
            continue;
        if (distinct == index)
            return run->records[i].name;
        distinct++;
    }
    return NULL;
}

static size_t distinct_launches(const profile_run *run)
{
    size_t n = 0;
    for (size_t i = 0; i < run->n_records; i++)
        if (i == 0 || run->records[i].correlation_id != run->records[i - 1].correlation_id)
            n++;
    return n;
}

static PyObject *range_dict(cf_profiler *p, const profile_run *run, size_t index, int named,
                            const double *values)
{
    PyObject *metrics = PyDict_New();
    if (metrics == NULL)
        return NULL;
    for (size_t m = 0; m < p->n_names; m++) {
        PyObject *v = PyFloat_FromDouble(values[m]);
        if (v == NULL ||
            PyDict_SetItem(metrics, PyTuple_GET_ITEM(p->metrics, (Py_ssize_t)m), v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(metrics);
            return NULL;
        }
        Py_DECREF(v);
    }
    const char *name = named ? range_kernel(run, index) : NULL;
    PyObject *out = Py_BuildValue("{s:n,s:z,s:N}", "range", (Py_ssize_t)index, "name", name,
                                  "metrics", metrics);
    return out;
}

/* Stop the naming trace of `run` if it runs, keeping its records; a note if it lost some. */
static int end_trace(cf_state *st, profile_run *run, char *note, size_t note_size,
                     const char **names_note)
{
    uint64_t dropped = 0;
    if (!run->tracing)
        return 0;
    run->tracing = 0;
    if (cf_trace_end(st, &run->records, &run->n_records, &dropped) < 0)
        return -1;
    if (dropped > 0) {
        snprintf(note, note_size, "kernel names unavailable: the trace dropped %llu records",
                 (unsigned long long)dropped);
        *names_note = note;
    }
    return 0;
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Call `before` (not None) and wait for the work it launched; its time is added to *spent. */
static int run_before(cf_state *st, PyObject *before, double *spent)
{
    double t = seconds_now();
    PyObject *r = PyObject_CallNoArgs(before);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    CF_CU_NOGIL(cf_cu.cuCtxSynchronize());
    *spent += seconds_now() - t;
    return 0;
error:
    return -1;
}

/* profile(fn, max_kernels=256, replay="kernel", names=True, keep=False, before=None)
 *     -> list of dict(range, name, metrics)
 *
 * replay="kernel": CUPTI replays each launch inside one call of fn, saving and restoring the
 * memory it may write (fn runs once; the cost grows with the memory the context holds).
 * replay="user": fn runs once per pass (it must launch the same kernels each time; nothing is
 * restored between passes), which avoids the memory save and restore.
 * names=False skips the activity trace that names the ranges (their names are then None).
 * before: a callable run before each pass, outside the profiled range, and waited for (an L2
 * flush, so that every pass starts from the same cache state).
 * keep=True leaves the Range Profiler object enabled and configured on the context, and reuses
 * the one kept by the last keep=True call of this Profiler with the same replay and max_kernels:
 * its counter data image is reset from a copy, with no new Enable, SetConfig or image set-up
 * (an object set up by another Profiler is disabled first: configured again, it gave NaNs). */
static PyObject *profiler_profile(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_profiler *p = (cf_profiler *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *fn, *before = Py_None, *result = NULL;
    Py_ssize_t max_kernels = 256;
    const char *replay = "kernel";
    int names = 1, keep = 0;
    static char *kwlist[] = {"fn", "max_kernels", "replay", "names", "keep", "before", NULL};
    profile_run run = {0};
    size_t calls = 0, dropped_ranges = 0, n_ranges = 0;
    int all_submitted = 0, named = 0;
    const char *names_note = NULL;
    char note_buf[256];
    CUdevice dev;
    CUcontext ctx = NULL;

    if (st == NULL || check_ready(p) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "O|nsppO:profile", kwlist, &fn, &max_kernels,
                                     &replay, &names, &keep, &before))
        return NULL;
    int user_replay = strcmp(replay, "user") == 0;
    if (!user_replay && strcmp(replay, "kernel") != 0) {
        PyErr_Format(PyExc_ValueError, "replay must be 'kernel' or 'user', not '%s'", replay);
        return NULL;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "profile(fn): fn must be callable with no arguments");
        return NULL;
    }
    if (before != Py_None && !PyCallable_Check(before)) {
        PyErr_SetString(PyExc_TypeError, "profile(before=...): before must be None or callable");
        return NULL;
    }
    if (p->device < 0) {
        PyErr_Format(PyExc_ValueError,
                     "this Profiler was made offline for chip %U (host API only); create it with "
                     "device=N to profile on a GPU",
                     p->chip);
        return NULL;
    }
    if (p->n_names == 0) {
        PyErr_SetString(PyExc_ValueError, "no metric of this Profiler can be collected (see "
                                          ".unsupported)");
        return NULL;
    }
    if (max_kernels < 1) {
        PyErr_SetString(PyExc_ValueError, "max_kernels must be >= 1");
        return NULL;
    }
    if (profiling) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a profile is already running in this process (another thread)");
        return NULL;
    }
    if (cf_ensure_context(st, p->device, &dev) < 0)
        return NULL;
    if (dev != (CUdevice)p->device) {
        PyErr_Format(PyExc_ValueError,
                     "the Profiler is for device %d but the current CUDA context is on device %d",
                     p->device, (int)dev);
        return NULL;
    }
    profiling = 1;
    double t_start = seconds_now(), t_setup = 0, t_passes = 0, t_decode = 0;
    double t_counter = 0, t_config = 0; /* the setup's steps */
    /* where the pass loop spends its time, summed over the passes */
    double t_before = 0, t_begin = 0, t_call = 0, t_sync = 0, t_end = 0, t_mark;
    CF_CU(cf_cu.cuCtxGetCurrent(&ctx));

    int reused = keep && kept.object != NULL && kept.ctx == ctx && kept.counter_data != NULL &&
                 kept.pristine != NULL && kept.config_id == p->config_id &&
                 kept.user_replay == user_replay && kept.max_kernels == (size_t)max_kernels;
    run.config_id = p->config_id;
    run.user_replay = user_replay;
    run.max_kernels = (size_t)max_kernels;
    if (reused) {
        /* enabled and configured already; the run owns the kept image until it ends well, and
           the copy resets it (34 ms less than initializing it again for 24 metrics, H200) */
        run.object = kept.object;
        run.kept = 1;
        run.counter_data = kept.counter_data;
        run.counter_data_size = kept.counter_data_size;
        kept.counter_data = NULL;
        memcpy(run.counter_data, kept.pristine, run.counter_data_size);
        t_counter = t_config = seconds_now();
    } else {
        kept_release(); /* one enabled object at a time: a kept one elsewhere goes */
        CUpti_RangeProfiler_Enable_Params on = {
            .structSize = CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE,
            .ctx = ctx,
        };
        CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerEnable(&on));
        run.object = on.pRangeProfilerObject;
        if (keep) {
            kept.object = run.object;
            kept.ctx = ctx;
            run.kept = 1;
        }
        CUpti_RangeProfiler_GetCounterDataSize_Params size = {
            .structSize = CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE,
            .pRangeProfilerObject = run.object,
            .pMetricNames = p->names,
            .numMetrics = p->n_names,
            .maxNumOfRanges = (size_t)max_kernels,
            .maxNumRangeTreeNodes = (uint32_t)max_kernels,
        };
        CF_CUPTI(cf_cupti.cuptiRangeProfilerGetCounterDataSize(&size));
        run.counter_data = PyMem_RawCalloc(1, size.counterDataSize);
        if (run.counter_data == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        run.counter_data_size = size.counterDataSize;
        CUpti_RangeProfiler_CounterDataImage_Initialize_Params init = {
            .structSize = CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE,
            .pRangeProfilerObject = run.object,
            .counterDataSize = run.counter_data_size,
            .pCounterData = run.counter_data,
        };
        CF_CUPTI(cf_cupti.cuptiRangeProfilerCounterDataImageInitialize(&init));
        if (keep) {
            run.pristine = PyMem_RawMalloc(run.counter_data_size);
            if (run.pristine == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            memcpy(run.pristine, run.counter_data, run.counter_data_size);
        }
        t_counter = seconds_now();
        CUpti_RangeProfiler_SetConfig_Params config = {
            .structSize = CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE,
            .pRangeProfilerObject = run.object,
            .configSize = p->config_size,
            .pConfig = p->config,
            .counterDataImageSize = run.counter_data_size,
            .pCounterDataImage = run.counter_data,
            .range = CUPTI_AutoRange,
            .replayMode = user_replay ? CUPTI_UserReplay : CUPTI_KernelReplay,
            .maxRangesPerPass = (size_t)max_kernels,
            .numNestingLevels = 1,
            .minNestingLevel = 1,
            .passIndex = 0,
            .targetNestingLevel = 1,
        };
        CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerSetConfig(&config));
        t_config = seconds_now();
    }

    /* the first pass's `before` runs ahead of the naming trace, which must see fn's launches only
     */
    if (before != Py_None && run_before(st, before, &t_before) < 0)
        goto error;
    /* Kernel names: a trace of the same launches. Best effort: a trace already running (the
     * caller is timing) leaves the ranges unnamed, with the reason in last_run. */
    if (!names) {
        names_note = "kernel names not asked for (names=False)";
    } else if (cf_trace_begin(st) == 0) {
        run.tracing = 1;
    } else {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *text = value ? PyObject_Str(value) : NULL;
        snprintf(note_buf, sizeof note_buf, "kernel names unavailable: %s",
                 text ? PyUnicode_AsUTF8(text) : "the activity trace could not start");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        names_note = note_buf;
    }

    t_setup = seconds_now();
    /* Kernel replay runs every pass inside each launch: one call of fn is expected, a second one
     * is allowed in case CUPTI wants it, more means something is wrong. User replay takes one
     * call per pass. */
    size_t max_calls = user_replay ? (size_t)p->passes + 1 : 2;
    while (!all_submitted) {
        if (calls >= max_calls) {
            raise_profiler(st, "incomplete",
                           "the Range Profiler did not finish its passes; does fn launch any "
                           "kernel on the profiled device?");
            goto error;
        }
        if (before != Py_None && calls > 0 && run_before(st, before, &t_before) < 0)
            goto error;
        CUpti_RangeProfiler_Start_Params start = {
            .structSize = CUpti_RangeProfiler_Start_Params_STRUCT_SIZE,
            .pRangeProfilerObject = run.object,
        };
        t_mark = seconds_now();
        CF_CUPTI(cf_cupti.cuptiRangeProfilerStart(&start));
        run.started = 1;
        t_begin += seconds_now() - t_mark;
        t_mark = seconds_now();
        PyObject *r = PyObject_CallNoArgs(fn);
        calls++;
        if (r == NULL)
            goto error;
        Py_DECREF(r);
        t_call += seconds_now() - t_mark;
        t_mark = seconds_now();
        CF_CU_NOGIL(cf_cu.cuCtxSynchronize());
        t_sync += seconds_now() - t_mark;
        t_mark = seconds_now();
        CUpti_RangeProfiler_Stop_Params stop = {
            .structSize = CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE,
            .pRangeProfilerObject = run.object,
        };
        run.started = 0;
        CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerStop(&stop));
        t_end += seconds_now() - t_mark;
        all_submitted = stop.isAllPassSubmitted;
        /* the first pass names the kernels; later passes repeat the same launches */
        if (user_replay && end_trace(st, &run, note_buf, sizeof note_buf, &names_note) < 0)
            goto error;
    }
    t_passes = seconds_now();
    CUpti_RangeProfiler_DecodeData_Params decode = {
        .structSize = CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run.object,
    };
    CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerDecodeData(&decode));
    dropped_ranges = decode.numOfRangeDropped;

    if (end_trace(st, &run, note_buf, sizeof note_buf, &names_note) < 0)
        goto error;

    CUpti_RangeProfiler_GetCounterDataInfo_Params info = {
        .structSize = CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE,
        .pCounterDataImage = run.counter_data,
        .counterDataImageSize = run.counter_data_size,
    };
    CF_CUPTI(cf_cupti.cuptiRangeProfilerGetCounterDataInfo(&info));
    n_ranges = info.numTotalRanges;
    if (names_note == NULL) {
        size_t launches = distinct_launches(&run);
        if (launches == n_ranges) {
            named = 1;
        } else {
            snprintf(note_buf, sizeof note_buf,
                     "kernel names unavailable: the trace saw %zu launches for %zu ranges",
                     launches, n_ranges);
            names_note = note_buf;
        }
    }

    t_decode = seconds_now();
    /* Evaluate every range with the GIL released, then build the Python objects. */
    run.values = PyMem_Calloc(n_ranges * p->n_names + 1, sizeof(double));
    if (run.values == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    {
        CUptiResult status = CUPTI_SUCCESS;
        Py_BEGIN_ALLOW_THREADS
        for (size_t r = 0; r < n_ranges && status == CUPTI_SUCCESS; r++) {
            CUpti_Profiler_Host_EvaluateToGpuValues_Params eval = {
                .structSize = CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE,
                .pHostObject = p->host,
                .pCounterDataImage = run.counter_data,
                .counterDataImageSize = run.counter_data_size,
                .rangeIndex = r,
                .ppMetricNames = p->names,
                .numMetrics = p->n_names,
                .pMetricValues = run.values + r * p->n_names,
            };
            status = cf_cupti.cuptiProfilerHostEvaluateToGpuValues(&eval);
        }
        Py_END_ALLOW_THREADS
        CF_CUPTI(status);
    }

    result = PyList_New((Py_ssize_t)n_ranges);
    if (result == NULL)
        goto error;
    for (size_t r = 0; r < n_ranges; r++) {
        PyObject *d = range_dict(p, &run, r, named, run.values + r * p->n_names);
        if (d == NULL)
            goto error;
        PyList_SET_ITEM(result, (Py_ssize_t)r, d);
    }
    Py_XSETREF(p->last_run,
               Py_BuildValue("{s:s,s:O,s:n,s:n,s:n,s:n,s:z,s:{s:d,s:d,s:d,s:d},"
                             "s:{s:d,s:d,s:d},s:{s:d,s:d,s:d,s:d,s:d}}",
                             "replay", replay, "reused_enabled", reused ? Py_True : Py_False,
                             "calls", (Py_ssize_t)calls, "passes", (Py_ssize_t)p->passes, "ranges",
                             (Py_ssize_t)n_ranges, "ranges_dropped", (Py_ssize_t)dropped_ranges,
                             "names_note", names_note, "seconds", "setup", t_setup - t_start,
                             "passes", t_passes - t_setup, "decode", t_decode - t_passes,
                             "evaluate", seconds_now() - t_decode, "setup_seconds", "counter_data",
                             t_counter - t_start, "set_config", t_config - t_counter, "trace",
                             t_setup - t_config, "pass_seconds", "before", t_before, "start",
                             t_begin, "call", t_call, "sync", t_sync, "stop", t_end));
    if (p->last_run == NULL)
        goto error;
    if (dropped_ranges > 0 &&
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                         "the Range Profiler dropped %zu kernel launches past max_kernels=%zd; "
                         "pass a larger max_kernels",
                         dropped_ranges, max_kernels) < 0)
        goto error;
    run_release(st, &run);
    profiling = 0;
    return result;
error:
    cf_cupti_explain(st);
    Py_XDECREF(result);
    run_release(st, &run);
    profiling = 0;
    return NULL;
}

/* ---------------------------------------------------------------- attributes and the spec */

static PyObject *profiler_get_chip(PyObject *self, void *c)
{
    (void)c;
    PyObject *v = ((cf_profiler *)self)->chip;
    return Py_NewRef(v ? v : Py_None);
}

static PyObject *profiler_get_metrics(PyObject *self, void *c)
{
    (void)c;
    PyObject *v = ((cf_profiler *)self)->metrics;
    return v ? Py_NewRef(v) : PyTuple_New(0);
}

static PyObject *profiler_get_unsupported(PyObject *self, void *c)
{
    (void)c;
    PyObject *v = ((cf_profiler *)self)->unsupported;
    return v ? PyDict_Copy(v) : PyDict_New();
}

static PyObject *profiler_get_passes(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(((cf_profiler *)self)->passes);
}

static PyObject *profiler_get_device(PyObject *self, void *c)
{
    (void)c;
    int d = ((cf_profiler *)self)->device;
    if (d < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(d);
}

static PyObject *profiler_get_last_run(PyObject *self, void *c)
{
    (void)c;
    PyObject *v = ((cf_profiler *)self)->last_run;
    return Py_NewRef(v ? v : Py_None);
}

static PyGetSetDef profiler_getset[] = {
    {"chip", profiler_get_chip, NULL, "The chip the metrics are for ('GH100').", NULL},
    {"metrics", profiler_get_metrics, NULL, "The metric names that will be collected.", NULL},
    {"unsupported", profiler_get_unsupported, NULL,
     "{name: reason} for every requested name that cannot be collected.", NULL},
    {"passes", profiler_get_passes, NULL, "Replay passes per kernel for these metrics.", NULL},
    {"device", profiler_get_device, NULL, "The device profiled, None when offline.", NULL},
    {"last_run", profiler_get_last_run, NULL,
     "About the last profile(): calls of fn, passes, ranges, ranges_dropped, names_note, "
     "seconds (setup, passes, decode, evaluate) and pass_seconds (start, call, sync, stop summed "
     "over the passes).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef profiler_methods[] = {
    {"profile", (PyCFunction)(void (*)(void))profiler_profile, METH_VARARGS | METH_KEYWORDS,
     "profile(fn, max_kernels=256, replay='kernel', names=True, keep=False) -> list of "
     "{range, name, metrics}: one entry per kernel launched by fn(). replay='kernel' calls fn "
     "once and replays each kernel once per pass, restoring its memory; replay='user' calls fn "
     "once per pass. names=False leaves the names None (no activity trace). keep=True leaves "
     "the Range Profiler enabled on the context for the next keep=True call (saves ~0.4 s a "
     "call; profiler_release() ends it). Raises ProfilerError (.reason) when counters are "
     "unavailable."},
    {"base_metrics", (PyCFunction)(void (*)(void))profiler_base_metrics,
     METH_VARARGS | METH_KEYWORDS,
     "base_metrics(type=None) -> the chip's base metric names: a list for type 'counter', "
     "'ratio' or 'throughput', else a dict of the three."},
    {"properties", profiler_properties, METH_O,
     "properties(name) -> {description, hw_unit, dim_unit, type} of a metric."},
    {"submetrics", profiler_submetrics, METH_O,
     "submetrics(name) -> the rollup/submetric suffixes a base metric accepts."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot profiler_slots[] = {
    {Py_tp_doc, "Profiler(metrics, chip=None, device=-1): CUPTI Range Profiler for a metric list.\n"
                "With chip='GH100' it works without a GPU (host API: validation, passes); "
                "without chip it binds to the current CUDA context's device (or `device`)."},
    {Py_tp_init, profiler_init},
    {Py_tp_traverse, profiler_traverse},
    {Py_tp_clear, profiler_clear},
    {Py_tp_dealloc, profiler_dealloc},
    {Py_tp_methods, profiler_methods},
    {Py_tp_getset, profiler_getset},
    {0, NULL},
};

static PyType_Spec profiler_spec = {
    .name = "cudaforge._core.Profiler",
    .basicsize = sizeof(cf_profiler),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = profiler_slots,
};

/* profiler_supported_chips() -> list of the chip names the host API knows. */
static PyObject *profiler_supported_chips(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    if (cf_need_cupti(st) < 0)
        return NULL;
    CUpti_Profiler_Host_GetSupportedChips_Params q = {
        .structSize = CUpti_Profiler_Host_GetSupportedChips_Params_STRUCT_SIZE,
    };
    CF_CUPTI(cf_cupti.cuptiProfilerHostGetSupportedChips(&q));
    PyObject *out = PyList_New((Py_ssize_t)q.numChips);
    for (size_t i = 0; out != NULL && i < q.numChips; i++) {
        PyObject *s = PyUnicode_FromString(q.ppChipNames[i]);
        if (s == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, s);
    }
    return out;
error:
    return NULL;
}

static PyObject *profiler_release(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (profiling) {
        PyErr_SetString(PyExc_RuntimeError, "a profile is running");
        return NULL;
    }
    int had = kept.object != NULL;
    kept_release();
    return PyBool_FromLong(had);
}

static PyMethodDef metrics_methods[] = {
    {"profiler_release", profiler_release, METH_NOARGS,
     "profiler_release() -> bool: disable the Range Profiler kept enabled by profile(keep=True) "
     "(True if there was one)."},
    {"profiler_supported_chips", profiler_supported_chips, METH_NOARGS,
     "Chip names ('GH100', ...) that CUPTI's profiler host API knows."},
    {NULL, NULL, 0, NULL},
};

int cf_metrics_exec(PyObject *m)
{
    PyObject *type = PyType_FromModuleAndSpec(m, &profiler_spec, NULL);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddType(m, (PyTypeObject *)type);
    Py_DECREF(type);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(m, metrics_methods);
}
