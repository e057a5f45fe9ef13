/* profiler_host.c: CUPTI's profiler host API, and the Python type cudaforge._core.Profiler.
 *
 * The host API needs only libcupti + libnvperf_host and a chip name ("GH100"), so this half works
 * on a machine without a GPU: Profiler(metrics, chip="GH100") checks each metric name (a rejected
 * one is reported with the reason), builds the config image and counts the replay passes it
 * needs; base_metrics(), properties() and submetrics() read the chip's metric tables. Without a
 * chip the Profiler binds to a device and profile() runs the Range Profiler (profiler_range.c). */
#include "cudaforge.h"

#include <string.h>

/* ---------------------------------------------------------------- host objects and metric names */

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

/* p->metrics: the names of `requested` that the host object knows, in the order given, each
 * once; every other name goes to p->unsupported with the reason. Each name is checked on its own
 * (metric properties), so that a bad one is reported by name instead of failing the list. */
static int accept_names(cf_state *st, cf_profiler *p, PyObject *requested, const char *chip)
{
    PyObject *accepted = PyList_New(0);
    PyObject *seq = PySequence_Fast(requested, "metrics must be a list of metric names");
    if (accepted == NULL || seq == NULL)
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
    Py_DECREF(accepted);
    Py_DECREF(seq);
    return p->metrics == NULL ? -1 : 0;
error:
    Py_XDECREF(accepted);
    Py_XDECREF(seq);
    return -1;
}

/* p->names: the UTF-8 of p->metrics, for the CUPTI calls. */
static int names_of_metrics(cf_profiler *p)
{
    PyMem_Free((void *)p->names);
    p->n_names = (size_t)PyTuple_GET_SIZE(p->metrics);
    p->names = PyMem_Calloc(p->n_names + 1, sizeof(char *));
    if (p->names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < p->n_names; i++) {
        p->names[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(p->metrics, (Py_ssize_t)i));
        if (p->names[i] == NULL)
            return -1;
    }
    return 0;
}

/* After ConfigAddMetrics refused the list: a failed ConfigAddMetrics leaves the host object
 * unusable (seen with CUDA 13.0), so the rare name that passes the properties check but not the
 * config is found with scratch host objects (about 1.5 ms each), moved to p->unsupported, and the
 * config is rebuilt on a fresh host object from the others. Returns that config's status, or -1
 * with an exception set. */
static int drop_uncollectable(cf_state *st, cf_profiler *p, const char *chip, CUptiResult *status)
{
    PyObject *still = PyList_New(0);
    if (still == NULL)
        return -1;
    for (size_t i = 0; i < p->n_names; i++) {
        CUpti_Profiler_Host_Object *scratch = host_open(st, chip, p->availability);
        if (scratch == NULL)
            goto error;
        CUptiResult one = config_add(scratch, &p->names[i], 1);
        host_close(scratch);
        PyObject *item = PyTuple_GET_ITEM(p->metrics, (Py_ssize_t)i);
        if (one == CUPTI_SUCCESS) {
            if (PyList_Append(still, item) < 0)
                goto error;
            continue;
        }
        PyObject *why = PyUnicode_FromFormat("the host API describes '%s' on %s but the Range "
                                             "Profiler cannot collect it (%s)",
                                             p->names[i], chip, cf_cupti_text(one));
        if (why == NULL || PyDict_SetItem(p->unsupported, item, why) < 0) {
            Py_XDECREF(why);
            goto error;
        }
        Py_DECREF(why);
    }
    Py_XSETREF(p->metrics, PyList_AsTuple(still));
    Py_CLEAR(still);
    if (p->metrics == NULL || names_of_metrics(p) < 0)
        return -1;
    host_close(p->host);
    p->host = host_open(st, chip, p->availability);
    if (p->host == NULL)
        return -1;
    *status = p->n_names > 0 ? config_add(p->host, p->names, p->n_names) : CUPTI_SUCCESS;
    return 0;
error:
    Py_XDECREF(still);
    return -1;
}

/* Fill p->metrics, p->unsupported and p->names, and add the metrics to the host object's
 * config. */
static int add_metrics(cf_state *st, cf_profiler *p, PyObject *requested)
{
    const char *chip = PyUnicode_AsUTF8(p->chip);
    if (chip == NULL || accept_names(st, p, requested, chip) < 0 || names_of_metrics(p) < 0)
        return -1;
    if (p->n_names == 0)
        return 0;
    CUptiResult status = config_add(p->host, p->names, p->n_names);
    if ((status == CUPTI_ERROR_INVALID_METRIC_NAME || status == CUPTI_ERROR_INVALID_PARAMETER) &&
        drop_uncollectable(st, p, chip, &status) < 0)
        return -1;
    CF_CUPTI(status);
    return 0;
error:
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
    } else if (cf_profiler_bind_device(st, p, device) < 0) {
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
    {"profile", (PyCFunction)(void (*)(void))cf_profiler_profile, METH_VARARGS | METH_KEYWORDS,
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

static PyMethodDef profiler_host_methods[] = {
    {"profiler_supported_chips", profiler_supported_chips, METH_NOARGS,
     "Chip names ('GH100', ...) that CUPTI's profiler host API knows."},
    {NULL, NULL, 0, NULL},
};

int cf_profiler_host_exec(PyObject *m)
{
    PyObject *type = PyType_FromModuleAndSpec(m, &profiler_spec, NULL);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddType(m, (PyTypeObject *)type);
    Py_DECREF(type);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(m, profiler_host_methods);
}
