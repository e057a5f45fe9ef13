/* launch.c: the CUDA driver API side of a compiled kernel: devices, loading a cubin into torch's
 * (primary) context, function attributes and occupancy, and the launch itself. The whole path from
 * a Python call `mod.kernel(grid, block, args)` to cuLaunchKernel stays in C (vectorcall). */
#include "cudaforge.h"

#include <stddef.h>
#include <structmember.h>

#if PY_VERSION_HEX >= 0x030D0000
#define cf_is_finalizing() Py_IsFinalizing()
#else
#define cf_is_finalizing() _Py_IsFinalizing()
#endif

#define CF_MAX_DEVICES 64

/* ---------------------------------------------------------------- Module: one image, per device */

typedef struct {
    PyObject_HEAD PyObject *image; /* bytes: cubin or PTX */
    PyObject *name;                /* str, for messages */
    CUmodule loaded[CF_MAX_DEVICES];
} cf_module;

static int module_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_module *mod = (cf_module *)self;
    PyObject *image, *name;
    static char *kwlist[] = {"image", "name", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "SU:Module", kwlist, &image, &name))
        return -1;
    Py_XSETREF(mod->image, Py_NewRef(image));
    Py_XSETREF(mod->name, Py_NewRef(name));
    return 0;
}

static int module_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cf_module *)self)->image);
    Py_VISIT(((cf_module *)self)->name);
    return 0;
}

/* Modules are unloaded late: CUPTI names activity records by function handle, and a handle freed
 * by one module and handed to the next made the next one's kernels carry the old names (seen on
 * the H200: a transpose kernel reported as "relu"). The last RETIRED_MODULES stay loaded, so a
 * handle is reused only after that many modules; their memory is a few KB to a few MB each. */
#define RETIRED_MODULES 256
static CUmodule retired[RETIRED_MODULES];
static size_t retired_next;

static void unload(CUmodule module)
{
    CUresult status = cf_cu.cuModuleUnload(module);
    if (status != CUDA_SUCCESS && !cf_is_sticky(status) && status != CUDA_ERROR_DEINITIALIZED)
        PyErr_WarnFormat(PyExc_ResourceWarning, 1, "cuModuleUnload failed with CUDA error %d",
                         (int)status);
}

static void module_dealloc(PyObject *self)
{
    cf_module *mod = (cf_module *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    /* At interpreter exit the driver may already be gone; after a sticky error the context is.
     * Either way the process is the owner of last resort, so failures here are not raised. */
    if (!cf_is_finalizing()) {
        for (int d = 0; d < CF_MAX_DEVICES; d++) {
            if (mod->loaded[d] == NULL)
                continue;
            if (retired[retired_next] != NULL)
                unload(retired[retired_next]);
            retired[retired_next] = mod->loaded[d];
            retired_next = (retired_next + 1) % RETIRED_MODULES;
        }
    }
    Py_CLEAR(mod->image);
    Py_CLEAR(mod->name);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* The CUmodule of `mod` in the current context (device `dev`), loading it on first use. */
static CUmodule module_on(cf_state *st, cf_module *mod, CUdevice dev)
{
    if (dev < 0 || dev >= CF_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device %d is out of range", (int)dev);
        return NULL;
    }
    if (mod->loaded[dev] == NULL) {
        const char *image = PyBytes_AS_STRING(mod->image);
        CUmodule loaded = NULL;
        CF_CU_NOGIL(cf_cu.cuModuleLoadData(&loaded, image));
        mod->loaded[dev] = loaded;
    }
    return mod->loaded[dev];
error:
    return NULL;
}

static PyType_Slot module_slots[] = {
    {Py_tp_doc, "A compiled image (cubin or PTX), loaded into each device's context on first use."},
    {Py_tp_init, module_init},
    {Py_tp_traverse, module_traverse},
    {Py_tp_dealloc, module_dealloc},
    {0, NULL},
};

static PyType_Spec module_spec = {
    .name = "cudaforge._core.Module",
    .basicsize = sizeof(cf_module),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = module_slots,
};

/* ---------------------------------------------------------------- Kernel */

typedef struct {
    PyObject_HEAD vectorcallfunc vectorcall;
    cf_module *module;
    PyObject *name;        /* str: the (lowered) symbol */
    PyObject *param_names; /* tuple of str, for messages */
    cf_params params;
    CUfunction function[CF_MAX_DEVICES];
    int max_threads[CF_MAX_DEVICES];
    int dynamic_smem_set[CF_MAX_DEVICES];
} cf_kernel;

static PyObject *kernel_vectorcall(PyObject *self, PyObject *const *argv, size_t nargsf,
                                   PyObject *kwnames);

static int kernel_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_kernel *k = (cf_kernel *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *module, *name, *codes = Py_None, *names = Py_None;
    static char *kwlist[] = {"module", "name", "codes", "param_names", NULL};
    if (st == NULL)
        return -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!U|OO:Kernel", kwlist, st->ModuleType, &module,
                                     &name, &codes, &names))
        return -1;
    if (cf_params_set_codes(&k->params, codes) < 0)
        return -1;
    Py_XSETREF(k->module, (cf_module *)Py_NewRef(module));
    Py_XSETREF(k->name, Py_NewRef(name));
    Py_XSETREF(k->param_names, names == Py_None ? PyTuple_New(0) : PySequence_Tuple(names));
    if (k->param_names == NULL)
        return -1;
    k->vectorcall = kernel_vectorcall;
    return 0;
}

static int kernel_traverse(PyObject *self, visitproc visit, void *arg)
{
    cf_kernel *k = (cf_kernel *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(k->module);
    Py_VISIT(k->name);
    Py_VISIT(k->param_names);
    return 0;
}

static void kernel_dealloc(PyObject *self)
{
    cf_kernel *k = (cf_kernel *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(k->module);
    Py_CLEAR(k->name);
    Py_CLEAR(k->param_names);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* The CUfunction for device `dev` in the current context; the first load also reads the
 * parameter layout (cuFuncGetParamInfo) and checks it against the declared codes. */
static CUfunction kernel_function(cf_state *st, cf_kernel *k, CUdevice dev)
{
    if (k->module == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Kernel was not initialized");
        return NULL;
    }
    if (dev >= 0 && dev < CF_MAX_DEVICES && k->function[dev] != NULL)
        return k->function[dev];
    CUmodule mod = module_on(st, k->module, dev);
    if (mod == NULL)
        return NULL;
    const char *name = PyUnicode_AsUTF8(k->name);
    if (name == NULL)
        return NULL;
    CUfunction fn = NULL;
    CUresult status = cf_cu.cuModuleGetFunction(&fn, mod, name);
    if (status == CUDA_ERROR_NOT_FOUND) {
        PyErr_Format(PyExc_AttributeError,
                     "no kernel named '%s' in %U (kernels need extern \"C\", or a name "
                     "expression for templates)",
                     name, k->module->name);
        return NULL;
    }
    CF_CU(status);
    if (k->params.n_params < 0) {
        int n = 0;
        for (; n < CF_MAX_PARAMS; n++) {
            status =
                cf_cu.cuFuncGetParamInfo(fn, (size_t)n, &k->params.offset[n], &k->params.size[n]);
            if (status == CUDA_ERROR_INVALID_VALUE)
                break;
            CF_CU(status);
        }
        if (cf_params_check_count(&k->params, n, name) < 0)
            return NULL;
    }
    CF_CU(cf_cu.cuFuncGetAttribute(&k->max_threads[dev], CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                   fn));
    k->function[dev] = fn;
    return fn;
error:
    return NULL;
}

/* grid/block: an int or a sequence of 1 to 3 ints, each >= 1. */
static int parse_dim(PyObject *obj, const char *what, unsigned int out[3])
{
    out[0] = out[1] = out[2] = 1;
    if (PyLong_Check(obj)) {
        long v = PyLong_AsLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 1 || v > 0x7fffffffL) {
            PyErr_Format(PyExc_ValueError, "%s must be >= 1 and < 2**31, got %ld", what, v);
            return -1;
        }
        out[0] = (unsigned int)v;
        return 0;
    }
    if (!PyTuple_Check(obj) && !PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int or a tuple of 1 to 3 ints, not %s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    if (n < 1 || n > 3) {
        PyErr_Format(PyExc_ValueError, "%s must have 1 to 3 dimensions, got %zd", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(obj, i));
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 1 || v > 0x7fffffffL) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] must be >= 1 and < 2**31, got %ld", what, i, v);
            return -1;
        }
        out[i] = (unsigned int)v;
    }
    return 0;
}

static CUstream resolve_stream(cf_state *st, PyObject *stream, CUdevice dev, int *ok)
{
    *ok = 0;
    PyObject *value = NULL;
    if (stream == NULL || stream == Py_None) {
        if (st->stream_getter == NULL) {
            *ok = 1;
            return NULL;
        }
        PyObject *d = PyLong_FromLong((long)dev);
        if (d == NULL)
            return NULL;
        value = PyObject_CallOneArg(st->stream_getter, d);
        Py_DECREF(d);
    } else if (PyLong_Check(stream)) {
        value = Py_NewRef(stream);
    } else {
        value = PyObject_GetAttr(stream, st->str_cuda_stream);
        if (value == NULL) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "stream must be None, an int handle or a torch.cuda.Stream, not %s",
                         Py_TYPE(stream)->tp_name);
            return NULL;
        }
    }
    if (value == NULL)
        return NULL;
    unsigned long long handle = PyLong_AsUnsignedLongLong(value);
    Py_DECREF(value);
    if (handle == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    *ok = 1;
    return (CUstream)(uintptr_t)handle;
}

static const char *const call_kwnames[] = {"grid", "block", "args", "shared_mem", "stream"};

static PyObject *kernel_vectorcall(PyObject *self, PyObject *const *argv, size_t nargsf,
                                   PyObject *kwnames)
{
    cf_kernel *k = (cf_kernel *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *slot[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *seq = NULL;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    unsigned int grid[3], block[3];
    unsigned long long shared_mem = 0;
    union {
        unsigned char bytes[CF_MAX_PARAM_BYTES];
        double align;
    } buffer;
    void *params[CF_MAX_PARAMS];

    if (st == NULL)
        return NULL;
    if (nargs > 5) {
        PyErr_Format(PyExc_TypeError, "kernel(grid, block, args, shared_mem=0, stream=None) "
                                      "takes at most 5 arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        slot[i] = argv[i];
    for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++) {
        const char *kw = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
        int j = 0;
        if (kw == NULL)
            return NULL;
        while (j < 5 && strcmp(kw, call_kwnames[j]) != 0)
            j++;
        if (j == 5 || slot[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "kernel(): unexpected or repeated argument '%s'", kw);
            return NULL;
        }
        slot[j] = argv[nargs + i];
    }
    if (slot[0] == NULL || slot[1] == NULL || slot[2] == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "kernel(grid, block, args, shared_mem=0, stream=None): grid, block and "
                        "args are required");
        return NULL;
    }
    if (parse_dim(slot[0], "grid", grid) < 0 || parse_dim(slot[1], "block", block) < 0)
        return NULL;
    if (slot[3] != NULL && slot[3] != Py_None) {
        shared_mem = PyLong_AsUnsignedLongLong(slot[3]);
        if (shared_mem == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    seq = PySequence_Fast(slot[2], "args must be a tuple or list of kernel arguments");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n_args = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);

    /* The device: the first tensor argument's, else the current context's. */
    long want;
    if (cf_args_device(st, items, n_args, &want) < 0)
        goto error;
    CUdevice dev;
    if (cf_ensure_context(st, (int)want, &dev) < 0)
        goto error;
    CUfunction fn = kernel_function(st, k, dev);
    if (fn == NULL)
        goto error;
    if (cf_pack_args(st, &k->params, k->name, k->param_names, items, n_args, dev, buffer.bytes,
                     params) < 0)
        goto error;
    unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
    if (threads > (unsigned long long)k->max_threads[dev]) {
        PyErr_Format(PyExc_ValueError,
                     "block (%u, %u, %u) has %llu threads; kernel '%U' allows at most %d", block[0],
                     block[1], block[2], threads, k->name, k->max_threads[dev]);
        goto error;
    }
    if (grid[1] > 65535 || grid[2] > 65535) {
        PyErr_Format(PyExc_ValueError, "grid (%u, %u, %u): y and z must be at most 65535", grid[0],
                     grid[1], grid[2]);
        goto error;
    }
    if (shared_mem > 48 * 1024 && (unsigned long long)k->dynamic_smem_set[dev] < shared_mem) {
        CF_CU(cf_cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       (int)shared_mem));
        k->dynamic_smem_set[dev] = (int)shared_mem;
    }
    int ok;
    CUstream stream = resolve_stream(st, slot[4], dev, &ok);
    if (!ok)
        goto error;
    CUresult status =
        cf_cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                             (unsigned int)shared_mem, stream, params, NULL);
    if (status != CUDA_SUCCESS) {
        char call[256];
        snprintf(call, sizeof call,
                 "cuLaunchKernel of kernel '%s' with grid [%u,%u,%u] block [%u,%u,%u] shared %llu "
                 "bytes",
                 PyUnicode_AsUTF8(k->name), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                 shared_mem);
        cf_raise_cu(st, status, call, __FILE__, __LINE__);
        goto error;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
error:
    Py_XDECREF(seq);
    return NULL;
}

static int current_device(cf_state *st, PyObject *device_arg, CUdevice *dev)
{
    long want = -1;
    if (device_arg != NULL && device_arg != Py_None) {
        want = PyLong_AsLong(device_arg);
        if (want == -1 && PyErr_Occurred())
            return -1;
    }
    if (cf_ensure_context(st, (int)want, dev) < 0)
        return -1;
    if (want >= 0 && *dev != (CUdevice)want) {
        PyErr_Format(PyExc_ValueError,
                     "device %ld requested but the current CUDA context is on device %d", want,
                     (int)*dev);
        return -1;
    }
    return 0;
}

static PyObject *kernel_attributes(PyObject *self, PyObject *args)
{
    cf_kernel *k = (cf_kernel *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *device_arg = Py_None;
    CUdevice dev;
    if (st == NULL || !PyArg_ParseTuple(args, "|O:attributes", &device_arg))
        return NULL;
    if (current_device(st, device_arg, &dev) < 0)
        return NULL;
    CUfunction fn = kernel_function(st, k, dev);
    if (fn == NULL)
        return NULL;
    static const struct {
        const char *name;
        CUfunction_attribute attr;
    } attrs[] = {
        {"max_threads_per_block", CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
        {"registers_per_thread", CU_FUNC_ATTRIBUTE_NUM_REGS},
        {"static_shared_bytes", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
        {"max_dynamic_shared_bytes", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES},
        {"const_bytes", CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES},
        {"local_bytes_per_thread", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES},
        {"ptx_version", CU_FUNC_ATTRIBUTE_PTX_VERSION},
        {"binary_version", CU_FUNC_ATTRIBUTE_BINARY_VERSION},
    };
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int value = 0;
        CF_CU(cf_cu.cuFuncGetAttribute(&value, attrs[i].attr, fn));
        PyObject *v = PyLong_FromLong(value);
        if (v == NULL || PyDict_SetItemString(out, attrs[i].name, v) < 0) {
            Py_XDECREF(v);
            goto error;
        }
        Py_DECREF(v);
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

static PyObject *kernel_occupancy(PyObject *self, PyObject *args, PyObject *kwargs)
{
    cf_kernel *k = (cf_kernel *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    int block_size;
    unsigned long long shared_mem = 0;
    PyObject *device_arg = Py_None;
    static char *kwlist[] = {"block_size", "shared_mem", "device", NULL};
    CUdevice dev;
    int blocks = 0;
    if (st == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "i|KO:occupancy", kwlist,
                                                   &block_size, &shared_mem, &device_arg))
        return NULL;
    if (current_device(st, device_arg, &dev) < 0)
        return NULL;
    CUfunction fn = kernel_function(st, k, dev);
    if (fn == NULL)
        return NULL;
    CF_CU(cf_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, block_size,
                                                            (size_t)shared_mem));
    return PyLong_FromLong(blocks);
error:
    return NULL;
}

static PyObject *kernel_param_sizes(PyObject *self, PyObject *args)
{
    cf_kernel *k = (cf_kernel *)self;
    cf_state *st = cf_state_from_type(Py_TYPE(self));
    PyObject *device_arg = Py_None;
    CUdevice dev;
    if (st == NULL || !PyArg_ParseTuple(args, "|O:param_sizes", &device_arg))
        return NULL;
    if (current_device(st, device_arg, &dev) < 0 || kernel_function(st, k, dev) == NULL)
        return NULL;
    PyObject *out = PyList_New(k->params.n_params);
    for (int i = 0; out != NULL && i < k->params.n_params; i++) {
        PyObject *v = PyLong_FromSize_t(k->params.size[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *kernel_get_name(PyObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(((cf_kernel *)self)->name);
}

static PyObject *kernel_get_codes(PyObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(((cf_kernel *)self)->params.codes);
}

static PyObject *kernel_repr(PyObject *self)
{
    cf_kernel *k = (cf_kernel *)self;
    return PyUnicode_FromFormat("<cudaforge kernel '%U' of %U>", k->name,
                                k->module ? k->module->name : Py_None);
}

static PyMethodDef kernel_methods[] = {
    {"attributes", kernel_attributes, METH_VARARGS,
     "attributes(device=None) -> dict: registers, shared/local memory (bytes), limits."},
    {"occupancy", (PyCFunction)(void (*)(void))kernel_occupancy, METH_VARARGS | METH_KEYWORDS,
     "occupancy(block_size, shared_mem=0, device=None) -> active blocks per multiprocessor."},
    {"param_sizes", kernel_param_sizes, METH_VARARGS,
     "param_sizes(device=None) -> the size in bytes of each parameter (cuFuncGetParamInfo)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kernel_getset[] = {
    {"name", kernel_get_name, NULL, "The kernel's symbol.", NULL},
    {"codes", kernel_get_codes, NULL, "One type code per parameter ('?': from the value).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef kernel_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(cf_kernel, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot kernel_slots[] = {
    {Py_tp_doc, "Kernel(module, name, codes=None, param_names=None): a launchable kernel.\n"
                "Call as kernel(grid, block, args, shared_mem=0, stream=None)."},
    {Py_tp_init, kernel_init},
    {Py_tp_traverse, kernel_traverse},
    {Py_tp_dealloc, kernel_dealloc},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_methods, kernel_methods},
    {Py_tp_getset, kernel_getset},
    {Py_tp_members, kernel_members},
    {Py_tp_repr, kernel_repr},
    {0, NULL},
};

static PyType_Spec kernel_spec = {
    .name = "cudaforge._core.Kernel",
    .basicsize = sizeof(cf_kernel),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = kernel_slots,
};

/* ---------------------------------------------------------------- torch */

static PyObject *set_torch_hooks(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    PyObject *tensor_type, *stream_getter;
    if (!PyArg_ParseTuple(args, "O!O:set_torch_hooks", &PyType_Type, &tensor_type, &stream_getter))
        return NULL;
    if (!PyCallable_Check(stream_getter)) {
        PyErr_SetString(PyExc_TypeError, "stream_getter must be callable(device) -> int");
        return NULL;
    }
    Py_XSETREF(st->tensor_type, Py_NewRef(tensor_type));
    Py_XSETREF(st->stream_getter, Py_NewRef(stream_getter));
    Py_RETURN_NONE;
}

static PyMethodDef launch_methods[] = {
    {"set_torch_hooks", set_torch_hooks, METH_VARARGS,
     "set_torch_hooks(tensor_type, stream_getter): how to recognize tensors and find the "
     "current stream."},
    {NULL, NULL, 0, NULL},
};

int cf_launch_exec(PyObject *m)
{
    cf_state *st = cf_get_state(m);
    st->ModuleType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &module_spec, NULL);
    if (st->ModuleType == NULL || PyModule_AddType(m, st->ModuleType) < 0)
        return -1;
    st->KernelType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &kernel_spec, NULL);
    if (st->KernelType == NULL || PyModule_AddType(m, st->KernelType) < 0)
        return -1;
    return PyModule_AddFunctions(m, launch_methods);
}
