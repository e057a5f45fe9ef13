/* timing.c: per-kernel GPU timing with the CUPTI Activity API. _core.timing_start() /
 * _core.timing_stop() -> list of dicts.
 *
 * KERNEL records by default: they serialize the kernels, but time them as they run. The
 * CONCURRENT_KERNEL kind (serial=False) lets kernels overlap; on GPUs before Blackwell CUPTI
 * times those by instrumenting the kernels, and on the H200 that made a tanh-GELU kernel of 262k
 * blocks read 226.9 us against 208.8 us with KERNEL records, 207.9 us from the Range Profiler's
 * gpu__time_duration and 208.1 us from ncu (measured 2026-12-02; benchmarks/RESULTS.md).
 *
 * CUPTI hands filled buffers to a callback on its own thread, so the records are copied into C
 * memory under a mutex there, with no Python object touched; timing_stop() flushes, and only then
 * builds the dicts. Records CUPTI could not store (buffers full) and records past max_records are
 * counted and reported (a RuntimeWarning, and timing_stats()), never dropped silently.
 *
 * Timestamps come from our own clock callback (CLOCK_MONOTONIC, ns: comparable with Python's
 * time.monotonic_ns()), registered before each session: torch.profiler (Kineto) registers its own,
 * which changed the durations seen afterwards (CUPTI_NOTES). */
#include "cudaforge.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define BUFFER_BYTES ((size_t)4 << 20)

enum { IDLE = 0, USER_TIMING = 1, PROFILER_TRACE = 2 };

/* One trace at a time per process (CUPTI's activity buffers are per process). The mutex guards
 * the records and counters, which the buffer callback writes from CUPTI's thread; `mode` and
 * `max_records` are only touched under the GIL while no trace runs. */
static struct {
    pthread_mutex_t lock;
    cf_kernel_record *records;
    size_t count, capacity, max_records;
    uint64_t dropped_by_cupti; /* cuptiActivityGetNumDroppedRecords: buffers were full */
    uint64_t dropped_over_limit;
    uint64_t buffers;
    int mode;
    CUpti_ActivityKind kind; /* CONCURRENT_KERNEL, or KERNEL (serialized) when asked */
    /* Kernel names, interned for the life of the process: a record's name pointer belongs to
     * CUPTI and may not outlive the module that holds the kernel. */
    char **names;
    size_t n_names, name_slots;
} trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Last session's counters, for timing_stats(). */
static uint64_t last_dropped_by_cupti, last_dropped_over_limit, last_buffers, last_records;

static uint64_t CUPTIAPI monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

/* The interned copy of `name`, or NULL when out of memory. Called with trace.lock held. */
static const char *intern_name(const char *name)
{
    if (name == NULL)
        name = "<unknown>";
    if (2 * (trace.n_names + 1) > trace.name_slots) {
        size_t slots = trace.name_slots ? 2 * trace.name_slots : 256;
        char **grown = calloc(slots, sizeof(char *));
        if (grown == NULL)
            return NULL;
        for (size_t i = 0; i < trace.name_slots; i++) {
            if (trace.names[i] == NULL)
                continue;
            size_t j = hash_name(trace.names[i]) & (slots - 1);
            while (grown[j] != NULL)
                j = (j + 1) & (slots - 1);
            grown[j] = trace.names[i];
        }
        free(trace.names);
        trace.names = grown;
        trace.name_slots = slots;
    }
    size_t j = hash_name(name) & (trace.name_slots - 1);
    while (trace.names[j] != NULL) {
        if (strcmp(trace.names[j], name) == 0)
            return trace.names[j];
        j = (j + 1) & (trace.name_slots - 1);
    }
    size_t len = strlen(name);
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return NULL;
    memcpy(copy, name, len + 1);
    trace.names[j] = copy;
    trace.n_names++;
    return copy;
}

/* Called with trace.lock held. */
static void keep_record(const CUpti_ActivityKernel10 *k)
{
    if (trace.count >= trace.max_records) {
        trace.dropped_over_limit++;
        return;
    }
    if (trace.count == trace.capacity) {
        size_t capacity = trace.capacity ? 2 * trace.capacity : 1024;
        if (capacity > trace.max_records)
            capacity = trace.max_records;
        cf_kernel_record *grown = realloc(trace.records, capacity * sizeof *grown);
        if (grown == NULL) {
            trace.dropped_over_limit++;
            return;
        }
        trace.records = grown;
        trace.capacity = capacity;
    }
    const char *name = intern_name(k->name);
    if (name == NULL) {
        trace.dropped_over_limit++;
        return;
    }
    cf_kernel_record *r = &trace.records[trace.count++];
    r->name = name;
    r->start_ns = k->start;
    r->end_ns = k->end;
    r->stream = k->streamId;
    r->correlation_id = k->correlationId;
    r->device = k->deviceId;
    r->context = k->contextId;
    r->grid[0] = k->gridX;
    r->grid[1] = k->gridY;
    r->grid[2] = k->gridZ;
    r->block[0] = k->blockX;
    r->block[1] = k->blockY;
    r->block[2] = k->blockZ;
    r->static_shared = k->staticSharedMemory;
    r->dynamic_shared = k->dynamicSharedMemory;
    r->shared_executed = k->sharedMemoryExecuted;
    r->local_bytes = k->localMemoryPerThread;
    r->registers = k->registersPerThread;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUFFER_BYTES); /* CUPTI wants 8-byte alignment */
    *size = *buffer != NULL ? BUFFER_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)size;
    CUpti_Activity *rec = NULL;
    size_t dropped = 0;
    pthread_mutex_lock(&trace.lock);
    trace.buffers++;
    while (buffer != NULL &&
           cf_cupti.cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            keep_record((const CUpti_ActivityKernel10 *)rec);
    }
    if (cf_cupti.cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        trace.dropped_by_cupti += dropped;
    pthread_mutex_unlock(&trace.lock);
    free(buffer);
}

/* ---------------------------------------------------------------- sessions */

static int begin(cf_state *st, int mode, size_t max_records, CUpti_ActivityKind kind)
{
    if (trace.mode != IDLE) {
        const char *who =
            trace.mode == USER_TIMING ? "timing_start() is running" : "a profile is running";
        char msg[256];
        snprintf(msg, sizeof msg,
                 "a CUPTI activity trace is already active in this process (%s); stop it first",
                 who);
        return cf_raise_profiler(st, "busy", msg);
    }
    if (cf_need_cupti(st) < 0)
        return -1;
    pthread_mutex_lock(&trace.lock);
    trace.count = 0;
    trace.max_records = max_records;
    trace.dropped_by_cupti = 0;
    trace.dropped_over_limit = 0;
    trace.buffers = 0;
    pthread_mutex_unlock(&trace.lock);
    CF_CUPTI(cf_cupti.cuptiActivityRegisterTimestampCallback(monotonic_ns));
    CF_CUPTI(cf_cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CF_CUPTI(cf_cupti.cuptiActivityEnable(kind));
    trace.kind = kind;
    trace.mode = mode;
    return 0;
error:
    return -1;
}

/* Wait for the current context's work (when libcuda is loaded and a context is current), flush
 * CUPTI's buffers and stop recording. Records stay in `trace` for the caller. */
static int end(cf_state *st, int synchronize)
{
    CUcontext ctx = NULL;
    int failed = 0;
    if (synchronize && cf_cu.cuCtxGetCurrent != NULL &&
        cf_cu.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != NULL) {
        CUresult status;
        Py_BEGIN_ALLOW_THREADS
        status = cf_cu.cuCtxSynchronize();
        Py_END_ALLOW_THREADS
        if (status != CUDA_SUCCESS) {
            cf_raise_cu(st, status, "cuCtxSynchronize", __FILE__, __LINE__);
            failed = 1;
        }
    }
    /* Flush even after a failed synchronize: the records already complete are still wanted,
     * and the trace must end either way. */
    CUptiResult flushed, disabled;
    Py_BEGIN_ALLOW_THREADS
    flushed = cf_cupti.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    Py_END_ALLOW_THREADS
    disabled = cf_cupti.cuptiActivityDisable(trace.kind);
    trace.mode = IDLE;
    if (failed)
        return -1;
    CF_CUPTI(flushed);
    CF_CUPTI(disabled);
    return 0;
error:
    return -1;
}

static int by_correlation(const void *a, const void *b)
{
    const cf_kernel_record *x = a, *y = b;
    if (x->correlation_id != y->correlation_id)
        return x->correlation_id < y->correlation_id ? -1 : 1;
    return x->start_ns < y->start_ns ? -1 : x->start_ns > y->start_ns;
}

/* Move the records out (sorted by correlation id, i.e. launch order) and save the counters. */
static cf_kernel_record *take_records(size_t *count, uint64_t *dropped)
{
    pthread_mutex_lock(&trace.lock);
    cf_kernel_record *records = trace.records;
    *count = trace.count;
    *dropped = trace.dropped_by_cupti + trace.dropped_over_limit;
    last_dropped_by_cupti = trace.dropped_by_cupti;
    last_dropped_over_limit = trace.dropped_over_limit;
    last_buffers = trace.buffers;
    last_records = trace.count;
    trace.records = NULL;
    trace.count = trace.capacity = 0;
    pthread_mutex_unlock(&trace.lock);
    if (records != NULL && *count > 1)
        qsort(records, *count, sizeof *records, by_correlation);
    return records;
}

int cf_trace_begin(cf_state *st)
{
    /* KERNEL records: the naming trace runs during a pass, so it must not instrument kernels */
    return begin(st, PROFILER_TRACE, (size_t)1 << 20, CUPTI_ACTIVITY_KIND_KERNEL);
}

int cf_trace_end(cf_state *st, cf_kernel_record **records, size_t *count, uint64_t *dropped)
{
    *records = NULL;
    *count = 0;
    *dropped = 0;
    if (trace.mode != PROFILER_TRACE) {
        PyErr_SetString(PyExc_RuntimeError, "no profiler trace is running");
        return -1;
    }
    int rc = end(st, 1);
    *records = take_records(count, dropped);
    return rc;
}

/* ---------------------------------------------------------------- Python API */

static PyObject *timing_start(PyObject *module, PyObject *args, PyObject *kwargs)
{
    cf_state *st = cf_get_state(module);
    Py_ssize_t max_records = 1 << 20;
    int serial = 1;
    static char *kwlist[] = {"max_records", "serial", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|n$p:timing_start", kwlist, &max_records,
                                     &serial))
        return NULL;
    if (max_records < 1) {
        PyErr_SetString(PyExc_ValueError, "max_records must be >= 1");
        return NULL;
    }
    if (begin(st, USER_TIMING, (size_t)max_records,
              serial ? CUPTI_ACTIVITY_KIND_KERNEL : CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *record_dict(const cf_kernel_record *r)
{
    return Py_BuildValue(
        "{s:s,s:K,s:K,s:L,s:I,s:I,s:I,s:I,s:(iii),s:(iii),s:i,s:i,s:i,s:I,s:I}", "name", r->name,
        "start_ns", (unsigned long long)r->start_ns, "end_ns", (unsigned long long)r->end_ns,
        "duration_ns", (long long)(r->end_ns - r->start_ns), "stream", r->stream, "correlation_id",
        r->correlation_id, "device", r->device, "context", r->context, "grid", r->grid[0],
        r->grid[1], r->grid[2], "block", r->block[0], r->block[1], r->block[2], "registers",
        (int)r->registers, "static_shared", r->static_shared, "dynamic_shared", r->dynamic_shared,
        "shared_executed", r->shared_executed, "local_bytes", r->local_bytes);
}

static PyObject *timing_stop(PyObject *module, PyObject *args, PyObject *kwargs)
{
    cf_state *st = cf_get_state(module);
    int synchronize = 1;
    static char *kwlist[] = {"synchronize", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:timing_stop", kwlist, &synchronize))
        return NULL;
    if (trace.mode != USER_TIMING) {
        PyErr_SetString(PyExc_RuntimeError, trace.mode == IDLE
                                                ? "timing_stop() without timing_start()"
                                                : "the running trace belongs to a profile");
        return NULL;
    }
    int rc = end(st, synchronize);
    size_t count = 0;
    uint64_t dropped = 0;
    cf_kernel_record *records = take_records(&count, &dropped);
    PyObject *out = NULL;
    if (rc < 0)
        goto done;
    out = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; out != NULL && i < count; i++) {
        PyObject *d = record_dict(&records[i]);
        if (d == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, d);
    }
    if (out != NULL && dropped > 0 &&
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                         "CUPTI timing lost %llu kernel records (%llu: CUPTI's buffers were full, "
                         "%llu: over max_records=%zu or out of memory); durations are incomplete",
                         (unsigned long long)dropped, (unsigned long long)last_dropped_by_cupti,
                         (unsigned long long)last_dropped_over_limit, trace.max_records) < 0)
        Py_CLEAR(out);
done:
    free(records);
    return out;
}

static PyObject *timing_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue(
        "{s:O,s:K,s:K,s:K,s:K,s:K}", "active", trace.mode != IDLE ? Py_True : Py_False, "records",
        (unsigned long long)last_records, "dropped",
        (unsigned long long)(last_dropped_by_cupti + last_dropped_over_limit), "dropped_by_cupti",
        (unsigned long long)last_dropped_by_cupti, "dropped_over_limit",
        (unsigned long long)last_dropped_over_limit, "buffers", (unsigned long long)last_buffers);
}

static PyObject *timing_clock_ns(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(monotonic_ns());
}

static PyMethodDef timing_methods[] = {
    {"timing_start", (PyCFunction)(void (*)(void))timing_start, METH_VARARGS | METH_KEYWORDS,
     "timing_start(max_records=1048576, *, serial=True): record every kernel execution from now "
     "on. serial=True: CUPTI's KERNEL records, kernels serialized and timed without being "
     "instrumented; serial=False: CONCURRENT_KERNEL records, kernels overlap as launched but "
     "(before Blackwell) CUPTI instruments them, which slows kernels of many short blocks. Raises "
     "ProfilerError(reason='another_subscriber') when "
     "another CUPTI client owns the process, reason='busy' when a trace already runs."},
    {"timing_stop", (PyCFunction)(void (*)(void))timing_stop, METH_VARARGS | METH_KEYWORDS,
     "timing_stop(synchronize=True) -> list of dict(name, start_ns, end_ns, duration_ns, stream, "
     "correlation_id, device, context, grid, block, registers, static_shared, dynamic_shared, "
     "shared_executed, local_bytes), in launch order. Waits for the current context first. "
     "Warns (RuntimeWarning) when records were lost; timing_stats() has the counts."},
    {"timing_stats", timing_stats, METH_NOARGS,
     "timing_stats() -> dict(active, records, dropped, dropped_by_cupti, dropped_over_limit, "
     "buffers) of the last finished trace."},
    {"timing_clock_ns", timing_clock_ns, METH_NOARGS,
     "The clock of the timing records (CLOCK_MONOTONIC, ns), for relating them to host time."},
    {NULL, NULL, 0, NULL},
};

int cf_timing_exec(PyObject *m) { return PyModule_AddFunctions(m, timing_methods); }
