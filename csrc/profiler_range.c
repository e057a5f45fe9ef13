/* profiler_range.c: hardware metrics per kernel with the CUPTI Range Profiler (CUDA 12.6+ / 13):
 * Profiler.profile(fn), which profiles the kernels that a Python callable launches on the device
 * the Profiler is bound to (profiler_device.c).
 *
 * It uses auto ranges (one range per kernel launch) and kernel replay: CUPTI saves and restores
 * the kernel's memory and runs each kernel once per pass inside its launch, so fn is called once
 * (the pass loop only calls it again if CUPTI asks for more passes, which kernel replay does not).
 * A profile goes step by step: enable the Range Profiler on the context (or reuse the one kept
 * enabled), set up its counter data image and config, start the naming trace, run the passes,
 * decode the ranges, evaluate each range's metrics with the host API, and build the result.
 *
 * Auto ranges are named "0", "1", ... in launch order; the kernel names come from an activity
 * trace of the same launches (timing.c), matched by launch order. */
#include "cudaforge.h"

#include <string.h>
#include <time.h>

#include <stdlib.h>

/* One profile() at a time in the process: the kept object and the naming trace are shared. */
static int profiling;

/* ---------------------------------------------------------------- the object kept enabled */

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

/* ---------------------------------------------------------------- one profile() call */

/* State of one profile() call, released in one place whatever happened. */
typedef struct {
    /* the arguments */
    PyObject *fn, *before; /* borrowed; before is Py_None when not given */
    const char *replay;
    int user_replay, names, keep;
    size_t max_kernels;
    /* the Range Profiler object and its counter data image */
    CUpti_RangeProfiler_Object *object;
    int kept;   /* object is kept.object */
    int reused; /* object came enabled and configured from an earlier keep=True call */
    uint8_t *counter_data;
    uint8_t *pristine; /* a copy of counter_data as initialized, for a kept object */
    size_t counter_data_size;
    uint64_t config_id; /* what SetConfig was given, remembered with a kept object */
    int started;
    /* the naming trace */
    int tracing;
    cf_kernel_record *records;
    size_t n_records;
    const char *names_note; /* why the ranges are unnamed, or NULL */
    char note[256];
    /* the outcome */
    size_t calls, n_ranges, dropped_ranges;
    int named;
    double *values; /* n_ranges x n_names */
    /* seconds: the clock at each step's end, and the pass loop's parts summed over the passes */
    double t_start, t_counter, t_config, t_setup, t_passes, t_decode;
    double t_before, t_begin, t_call, t_sync, t_end;
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

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The arguments of profile(), checked against the Profiler before anything is touched. */
static int parse_arguments(cf_profiler *p, PyObject *args, PyObject *kwargs, profile_run *run)
{
    static char *kwlist[] = {"fn", "max_kernels", "replay", "names", "keep", "before", NULL};
    Py_ssize_t max_kernels = 256;
    run->before = Py_None;
    run->replay = "kernel";
    run->names = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|nsppO:profile", kwlist, &run->fn,
                                     &max_kernels, &run->replay, &run->names, &run->keep,
                                     &run->before))
        return -1;
    run->user_replay = strcmp(run->replay, "user") == 0;
    if (!run->user_replay && strcmp(run->replay, "kernel") != 0) {
        PyErr_Format(PyExc_ValueError, "replay must be 'kernel' or 'user', not '%s'", run->replay);
        return -1;
    }
    if (!PyCallable_Check(run->fn)) {
        PyErr_SetString(PyExc_TypeError, "profile(fn): fn must be callable with no arguments");
        return -1;
    }
    if (run->before != Py_None && !PyCallable_Check(run->before)) {
        PyErr_SetString(PyExc_TypeError, "profile(before=...): before must be None or callable");
        return -1;
    }
    if (p->device < 0) {
        PyErr_Format(PyExc_ValueError,
                     "this Profiler was made offline for chip %U (host API only); create it with "
                     "device=N to profile on a GPU",
                     p->chip);
        return -1;
    }
    if (p->n_names == 0) {
        PyErr_SetString(PyExc_ValueError, "no metric of this Profiler can be collected (see "
                                          ".unsupported)");
        return -1;
    }
    if (max_kernels < 1) {
        PyErr_SetString(PyExc_ValueError, "max_kernels must be >= 1");
        return -1;
    }
    run->max_kernels = (size_t)max_kernels;
    run->config_id = p->config_id;
    return 0;
}

/* Take the object kept by an earlier keep=True call if it was set up for the same config, replay
 * and max_kernels on this context: enabled and configured already, the run owns its image until
 * it ends well, and a copy of the pristine image resets it (34 ms less than initializing it
 * again for 24 metrics, H200). */
static void reuse_kept(profile_run *run, CUcontext ctx)
{
    run->reused = run->keep && kept.object != NULL && kept.ctx == ctx &&
                  kept.counter_data != NULL && kept.pristine != NULL &&
                  kept.config_id == run->config_id && kept.user_replay == run->user_replay &&
                  kept.max_kernels == run->max_kernels;
    if (!run->reused)
        return;
    run->object = kept.object;
    run->kept = 1;
    run->counter_data = kept.counter_data;
    run->counter_data_size = kept.counter_data_size;
    kept.counter_data = NULL;
    memcpy(run->counter_data, kept.pristine, run->counter_data_size);
    run->t_counter = run->t_config = seconds_now();
}

/* Enable a Range Profiler object on the context and initialize a counter data image for the
 * Profiler's metrics and max_kernels ranges (kept with a pristine copy when keep=True). */
static int enable_range_profiler(cf_state *st, cf_profiler *p, profile_run *run, CUcontext ctx)
{
    kept_release(); /* one enabled object at a time: a kept one elsewhere goes */
    CUpti_RangeProfiler_Enable_Params on = {
        .structSize = CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE,
        .ctx = ctx,
    };
    CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerEnable(&on));
    run->object = on.pRangeProfilerObject;
    if (run->keep) {
        kept.object = run->object;
        kept.ctx = ctx;
        run->kept = 1;
    }
    CUpti_RangeProfiler_GetCounterDataSize_Params size = {
        .structSize = CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run->object,
        .pMetricNames = p->names,
        .numMetrics = p->n_names,
        .maxNumOfRanges = run->max_kernels,
        .maxNumRangeTreeNodes = (uint32_t)run->max_kernels,
    };
    CF_CUPTI(cf_cupti.cuptiRangeProfilerGetCounterDataSize(&size));
    run->counter_data = PyMem_RawCalloc(1, size.counterDataSize);
    if (run->counter_data == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    run->counter_data_size = size.counterDataSize;
    CUpti_RangeProfiler_CounterDataImage_Initialize_Params init = {
        .structSize = CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run->object,
        .counterDataSize = run->counter_data_size,
        .pCounterData = run->counter_data,
    };
    CF_CUPTI(cf_cupti.cuptiRangeProfilerCounterDataImageInitialize(&init));
    if (run->keep) {
        run->pristine = PyMem_RawMalloc(run->counter_data_size);
        if (run->pristine == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        memcpy(run->pristine, run->counter_data, run->counter_data_size);
    }
    run->t_counter = seconds_now();
    return 0;
error:
    return -1;
}

/* Give the object the Profiler's config image: auto ranges, one per kernel launch. */
static int set_config(cf_state *st, cf_profiler *p, profile_run *run)
{
    CUpti_RangeProfiler_SetConfig_Params config = {
        .structSize = CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run->object,
        .configSize = p->config_size,
        .pConfig = p->config,
        .counterDataImageSize = run->counter_data_size,
        .pCounterDataImage = run->counter_data,
        .range = CUPTI_AutoRange,
        .replayMode = run->user_replay ? CUPTI_UserReplay : CUPTI_KernelReplay,
        .maxRangesPerPass = run->max_kernels,
        .numNestingLevels = 1,
        .minNestingLevel = 1,
        .passIndex = 0,
        .targetNestingLevel = 1,
    };
    CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerSetConfig(&config));
    run->t_config = seconds_now();
    return 0;
error:
    return -1;
}

/* Call `before` (not None) and wait for the work it launched; its time goes to t_before. */
static int run_before(cf_state *st, profile_run *run)
{
    double t = seconds_now();
    PyObject *r = PyObject_CallNoArgs(run->before);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    CF_CU_NOGIL(cf_cu.cuCtxSynchronize());
    run->t_before += seconds_now() - t;
    return 0;
error:
    return -1;
}

/* Kernel names: a trace of the same launches. Best effort: a trace already running (the caller
 * is timing) leaves the ranges unnamed, with the reason in last_run. */
static void begin_naming_trace(cf_state *st, profile_run *run)
{
    if (!run->names) {
        run->names_note = "kernel names not asked for (names=False)";
        return;
    }
    if (cf_trace_begin(st) == 0) {
        run->tracing = 1;
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    snprintf(run->note, sizeof run->note, "kernel names unavailable: %s",
             text ? PyUnicode_AsUTF8(text) : "the activity trace could not start");
    PyErr_Clear();
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    run->names_note = run->note;
}

/* Stop the naming trace if it runs, keeping its records; a note if it lost some. */
static int end_naming_trace(cf_state *st, profile_run *run)
{
    uint64_t dropped = 0;
    if (!run->tracing)
        return 0;
    run->tracing = 0;
    if (cf_trace_end(st, &run->records, &run->n_records, &dropped) < 0)
        return -1;
    if (dropped > 0) {
        snprintf(run->note, sizeof run->note,
                 "kernel names unavailable: the trace dropped %llu records",
                 (unsigned long long)dropped);
        run->names_note = run->note;
    }
    return 0;
}

/* One pass: start the Range Profiler, call fn, wait for its kernels, stop. */
static int run_pass(cf_state *st, profile_run *run, int *all_submitted)
{
    if (run->before != Py_None && run->calls > 0 && run_before(st, run) < 0)
        return -1;
    CUpti_RangeProfiler_Start_Params start = {
        .structSize = CUpti_RangeProfiler_Start_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run->object,
    };
    double t_mark = seconds_now();
    CF_CUPTI(cf_cupti.cuptiRangeProfilerStart(&start));
    run->started = 1;
    run->t_begin += seconds_now() - t_mark;
    t_mark = seconds_now();
    PyObject *r = PyObject_CallNoArgs(run->fn);
    run->calls++;
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    run->t_call += seconds_now() - t_mark;
    t_mark = seconds_now();
    CF_CU_NOGIL(cf_cu.cuCtxSynchronize());
    run->t_sync += seconds_now() - t_mark;
    t_mark = seconds_now();
    CUpti_RangeProfiler_Stop_Params stop = {
        .structSize = CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run->object,
    };
    run->started = 0;
    CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerStop(&stop));
    run->t_end += seconds_now() - t_mark;
    *all_submitted = stop.isAllPassSubmitted;
    /* the first pass names the kernels; later passes repeat the same launches */
    if (run->user_replay && end_naming_trace(st, run) < 0)
        return -1;
    return 0;
error:
    return -1;
}

/* Passes until CUPTI has all it needs. Kernel replay runs every pass inside each launch: one
 * call of fn is expected, a second one is allowed in case CUPTI wants it, more means something
 * is wrong. User replay takes one call per pass. */
static int run_passes(cf_state *st, cf_profiler *p, profile_run *run)
{
    size_t max_calls = run->user_replay ? p->passes + 1 : 2;
    int all_submitted = 0;
    while (!all_submitted) {
        if (run->calls >= max_calls)
            return cf_raise_profiler(st, "incomplete",
                                     "the Range Profiler did not finish its passes; does fn "
                                     "launch any kernel on the profiled device?");
        if (run_pass(st, run, &all_submitted) < 0)
            return -1;
    }
    run->t_passes = seconds_now();
    return 0;
}

/* The number of distinct launches in the trace (records come sorted by correlation id; kernel
 * replay may repeat a launch's correlation id). */
static size_t distinct_launches(const profile_run *run)
{
    size_t n = 0;
    for (size_t i = 0; i < run->n_records; i++)
        if (i == 0 || run->records[i].correlation_id != run->records[i - 1].correlation_id)
            n++;
    return n;
}

/* The kernel name of range `index`: the index-th distinct launch of the trace. */
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

/* Decode the passes into ranges, and name them when the trace saw one launch per range. */
static int decode_ranges(cf_state *st, profile_run *run)
{
    CUpti_RangeProfiler_DecodeData_Params decode = {
        .structSize = CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE,
        .pRangeProfilerObject = run->object,
    };
    CF_CUPTI_NOGIL(cf_cupti.cuptiRangeProfilerDecodeData(&decode));
    run->dropped_ranges = decode.numOfRangeDropped;
    if (end_naming_trace(st, run) < 0)
        return -1;
    CUpti_RangeProfiler_GetCounterDataInfo_Params info = {
        .structSize = CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE,
        .pCounterDataImage = run->counter_data,
        .counterDataImageSize = run->counter_data_size,
    };
    CF_CUPTI(cf_cupti.cuptiRangeProfilerGetCounterDataInfo(&info));
    run->n_ranges = info.numTotalRanges;
    if (run->names_note == NULL) {
        size_t launches = distinct_launches(run);
        if (launches == run->n_ranges) {
            run->named = 1;
        } else {
            snprintf(run->note, sizeof run->note,
                     "kernel names unavailable: the trace saw %zu launches for %zu ranges",
                     launches, run->n_ranges);
            run->names_note = run->note;
        }
    }
    run->t_decode = seconds_now();
    return 0;
error:
    return -1;
}

/* Every range's metric values from the counter data image, with the GIL released. */
static int evaluate_ranges(cf_state *st, cf_profiler *p, profile_run *run)
{
    run->values = PyMem_Calloc(run->n_ranges * p->n_names + 1, sizeof(double));
    if (run->values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    CUptiResult status = CUPTI_SUCCESS;
    Py_BEGIN_ALLOW_THREADS
    for (size_t r = 0; r < run->n_ranges && status == CUPTI_SUCCESS; r++) {
        CUpti_Profiler_Host_EvaluateToGpuValues_Params eval = {
            .structSize = CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE,
            .pHostObject = p->host,
            .pCounterDataImage = run->counter_data,
            .counterDataImageSize = run->counter_data_size,
            .rangeIndex = r,
            .ppMetricNames = p->names,
            .numMetrics = p->n_names,
            .pMetricValues = run->values + r * p->n_names,
        };
        status = cf_cupti.cuptiProfilerHostEvaluateToGpuValues(&eval);
    }
    Py_END_ALLOW_THREADS
    CF_CUPTI(status);
    return 0;
error:
    return -1;
}

/* {range, name, metrics} of range `index`. */
static PyObject *range_dict(cf_profiler *p, const profile_run *run, size_t index)
{
    const double *values = run->values + index * p->n_names;
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
    const char *name = run->named ? range_kernel(run, index) : NULL;
    return Py_BuildValue("{s:n,s:z,s:N}", "range", (Py_ssize_t)index, "name", name, "metrics",
                         metrics);
}

static PyObject *ranges_list(cf_profiler *p, const profile_run *run)
{
    PyObject *result = PyList_New((Py_ssize_t)run->n_ranges);
    if (result == NULL)
        return NULL;
    for (size_t r = 0; r < run->n_ranges; r++) {
        PyObject *d = range_dict(p, run, r);
        if (d == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)r, d);
    }
    return result;
}

/* Profiler.last_run: what the call did and where its time went. */
static PyObject *last_run_dict(cf_profiler *p, const profile_run *run)
{
    return Py_BuildValue(
        "{s:s,s:O,s:n,s:n,s:n,s:n,s:z,s:{s:d,s:d,s:d,s:d},s:{s:d,s:d,s:d},"
        "s:{s:d,s:d,s:d,s:d,s:d}}",
        "replay", run->replay, "reused_enabled", run->reused ? Py_True : Py_False, "calls",
        (Py_ssize_t)run->calls, "passes", (Py_ssize_t)p->passes, "ranges",
        (Py_ssize_t)run->n_ranges, "ranges_dropped", (Py_ssize_t)run->dropped_ranges, "names_note",
        run->names_note, "seconds", "setup", run->t_setup - run->t_start, "passes",
        run->t_passes - run->t_setup, "decode", run->t_decode - run->t_passes, "evaluate",
        seconds_now() - run->t_decode, "setup_seconds", "counter_data",
        run->t_counter - run->t_start, "set_config", run->t_config - run->t_counter, "trace",
        run->t_setup - run->t_config, "pass_seconds", "before", run->t_before, "start",
        run->t_begin, "call", run->t_call, "sync", run->t_sync, "stop", run->t_end);
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
PyObject *cf_profiler_profile(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_profiler *p = (cf_profiler *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *result = NULL;
    profile_run run = {0};
    CUdevice dev;
    CUcontext ctx = NULL;

    if (st == NULL)
        return NULL;
    if (p->host == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Profiler was not initialized");
        return NULL;
    }
    if (parse_arguments(p, args, kwargs, &run) < 0)
        return NULL;
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
    run.t_start = seconds_now();
    CF_CU(cf_cu.cuCtxGetCurrent(&ctx));
    reuse_kept(&run, ctx);
    if (!run.reused && (enable_range_profiler(st, p, &run, ctx) < 0 || set_config(st, p, &run) < 0))
        goto error;
    /* the first pass's `before` runs ahead of the naming trace, which must see fn's launches
     * only */
    if (run.before != Py_None && run_before(st, &run) < 0)
        goto error;
    begin_naming_trace(st, &run);
    run.t_setup = seconds_now();
    if (run_passes(st, p, &run) < 0 || decode_ranges(st, &run) < 0 ||
        evaluate_ranges(st, p, &run) < 0)
        goto error;
    result = ranges_list(p, &run);
    if (result == NULL)
        goto error;
    Py_XSETREF(p->last_run, last_run_dict(p, &run));
    if (p->last_run == NULL)
        goto error;
    if (run.dropped_ranges > 0 &&
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                         "the Range Profiler dropped %zu kernel launches past max_kernels=%zu; "
                         "pass a larger max_kernels",
                         run.dropped_ranges, run.max_kernels) < 0)
        goto error;
    run_release(st, &run);
    profiling = 0;
    return result;
error:
    Py_XDECREF(result);
    run_release(st, &run);
    profiling = 0;
    return NULL;
}

/* ---------------------------------------------------------------- module functions */

int cf_profiler_release_kept(const char *busy)
{
    if (profiling) {
        PyErr_SetString(PyExc_RuntimeError, busy);
        return -1;
    }
    int had = kept.object != NULL;
    kept_release();
    return had;
}

static PyObject *profiler_release(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    int had = cf_profiler_release_kept("a profile is running");
    return had < 0 ? NULL : PyBool_FromLong(had);
}

static PyMethodDef profiler_range_methods[] = {
    {"profiler_release", profiler_release, METH_NOARGS,
     "profiler_release() -> bool: disable the Range Profiler kept enabled by profile(keep=True) "
     "(True if there was one)."},
    {NULL, NULL, 0, NULL},
};

int cf_profiler_range_exec(PyObject *m) { return PyModule_AddFunctions(m, profiler_range_methods); }
