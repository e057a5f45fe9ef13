/* device.c: the devices and the current context: how many GPUs, what each one is (compute
 * capability, multiprocessors, memory, L2), waiting for the context's work, its free memory, and
 * the L2 set-aside for persisting accesses (the context's limit, a stream's access-policy window,
 * the reset), which the harness reads and clears so that one candidate cannot leave the cache
 * shaped for the next. */
#include "cudaforge.h"

/* ---------------------------------------------------------------- devices and synchronization */

static PyObject *device_count(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    int count = 0;
    if (cf_need_cuda(st) < 0)
        return NULL;
    CF_CU(cf_cu.cuDeviceGetCount(&count));
    return PyLong_FromLong(count);
error:
    return NULL;
}

static PyObject *device_info(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    int ordinal = 0;
    CUdevice dev;
    char name[256];
    size_t total = 0;
    if (!PyArg_ParseTuple(args, "|i:device_info", &ordinal))
        return NULL;
    if (cf_need_cuda(st) < 0)
        return NULL;
    CF_CU(cf_cu.cuDeviceGet(&dev, ordinal));
    CF_CU(cf_cu.cuDeviceGetName(name, sizeof name, dev));
    CF_CU(cf_cu.cuDeviceTotalMem(&total, dev));
    static const struct {
        const char *key;
        CUdevice_attribute attr;
    } attrs[] = {
        {"cc_major", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
        {"cc_minor", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
        {"multiprocessors", CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
        {"l2_bytes", CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE},
        {"shared_bytes_per_block_optin", CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
        {"shared_bytes_per_multiprocessor",
         CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR},
        {"registers_per_multiprocessor", CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR},
        {"max_threads_per_multiprocessor", CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR},
        {"max_threads_per_block", CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
        {"max_blocks_per_multiprocessor", CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR},
        {"warp_size", CU_DEVICE_ATTRIBUTE_WARP_SIZE},
        {"clock_khz", CU_DEVICE_ATTRIBUTE_CLOCK_RATE},
        {"memory_clock_khz", CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE},
        {"memory_bus_bits", CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH},
        {"pci_bus_id", CU_DEVICE_ATTRIBUTE_PCI_BUS_ID},
    };
    PyObject *out = Py_BuildValue("{s:s,s:i,s:K}", "name", name, "ordinal", ordinal,
                                  "total_memory_bytes", (unsigned long long)total);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int value = 0;
        CUresult status = cf_cu.cuDeviceGetAttribute(&value, attrs[i].attr, dev);
        if (status != CUDA_SUCCESS) {
            Py_DECREF(out);
            cf_raise_cu(st, status, "cuDeviceGetAttribute", __FILE__, __LINE__);
            return NULL;
        }
        PyObject *v = PyLong_FromLong(value);
        if (v == NULL || PyDict_SetItemString(out, attrs[i].key, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    return out;
error:
    return NULL;
}

static PyObject *synchronize(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU_NOGIL(cf_cu.cuCtxSynchronize());
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *memory_info(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    size_t free_bytes = 0, total = 0;
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU(cf_cu.cuMemGetInfo(&free_bytes, &total));
    return Py_BuildValue("(KK)", (unsigned long long)free_bytes, (unsigned long long)total);
error:
    return NULL;
}

/* ---------------------------------------------------------------- persisting L2 */

/* persisting_l2_limit() -> bytes of L2 set aside for persisting accesses in the current
 * context. */
static PyObject *persisting_l2_limit(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    size_t limit = 0;
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU(cf_cu.cuCtxGetLimit(&limit, CU_LIMIT_PERSISTING_L2_CACHE_SIZE));
    return PyLong_FromSize_t(limit);
error:
    return NULL;
}

/* set_persisting_l2_limit(nbytes): the same limit, set (the driver rounds it to its
 * granularity and caps it at the device's maximum). */
static PyObject *set_persisting_l2_limit(PyObject *module, PyObject *arg)
{
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    size_t nbytes = PyLong_AsSize_t(arg);
    if (nbytes == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU_NOGIL(cf_cu.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, nbytes));
    Py_RETURN_NONE;
error:
    return NULL;
}

/* A stream handle from a Python int (a raw CUstream, as torch.cuda.Stream.cuda_stream gives). */
static int stream_handle(PyObject *arg, CUstream *stream)
{
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "stream must be an int handle, not %s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    unsigned long long handle = PyLong_AsUnsignedLongLong(arg);
    if (handle == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *stream = (CUstream)(uintptr_t)handle;
    return 0;
}

/* stream_window_bytes(stream) -> num_bytes of the stream's access-policy window (0: none set).
 * CudaError where the stream has no attributes (the legacy default stream 0). */
static PyObject *stream_window_bytes(PyObject *module, PyObject *arg)
{
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    CUstream stream;
    CUstreamAttrValue value;
    memset(&value, 0, sizeof value);
    if (stream_handle(arg, &stream) < 0 || cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU(cf_cu.cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value));
    return PyLong_FromSize_t(value.accessPolicyWindow.num_bytes);
error:
    return NULL;
}

/* clear_stream_window(stream): give the stream an empty access-policy window. */
static PyObject *clear_stream_window(PyObject *module, PyObject *arg)
{
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    CUstream stream;
    CUstreamAttrValue value;
    memset(&value, 0, sizeof value); /* base 0, 0 bytes, hit ratio 0, normal accesses */
    if (stream_handle(arg, &stream) < 0 || cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU_NOGIL(
        cf_cu.cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value));
    Py_RETURN_NONE;
error:
    return NULL;
}

/* reset_persisting_l2(): every persisting L2 line of the current context back to normal. */
static PyObject *reset_persisting_l2(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    CUdevice dev;
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU_NOGIL(cf_cu.cuCtxResetPersistingL2Cache());
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyMethodDef device_methods[] = {
    {"device_count", device_count, METH_NOARGS, "Number of CUDA devices the driver sees."},
    {"device_info", device_info, METH_VARARGS,
     "device_info(ordinal=0) -> dict: name, compute capability, multiprocessors, memory."},
    {"synchronize", synchronize, METH_NOARGS,
     "Wait for all work in the current context; raises KernelFault after a sticky error."},
    {"memory_info", memory_info, METH_NOARGS, "(free, total) device memory in bytes."},
    {"persisting_l2_limit", persisting_l2_limit, METH_NOARGS,
     "persisting_l2_limit() -> int: bytes of L2 set aside for persisting accesses in the current "
     "context (cuCtxGetLimit)."},
    {"set_persisting_l2_limit", set_persisting_l2_limit, METH_O,
     "set_persisting_l2_limit(nbytes): set that limit, in bytes (cuCtxSetLimit)."},
    {"stream_window_bytes", stream_window_bytes, METH_O,
     "stream_window_bytes(stream) -> int: num_bytes of the stream's access-policy window, 0 when "
     "none is set; CudaError for a stream without attributes (the legacy default stream 0)."},
    {"clear_stream_window", clear_stream_window, METH_O,
     "clear_stream_window(stream): set the stream's access-policy window to empty."},
    {"reset_persisting_l2", reset_persisting_l2, METH_NOARGS,
     "reset_persisting_l2(): reset every persisting L2 line of the current context to normal "
     "(cuCtxResetPersistingL2Cache)."},
    {NULL, NULL, 0, NULL},
};

int cf_device_exec(PyObject *m) { return PyModule_AddFunctions(m, device_methods); }
