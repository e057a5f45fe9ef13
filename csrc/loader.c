/* loader.c: libcuda, libnvrtc and libcupti are opened with dlopen on first use, so that the module
 * imports on a machine without a GPU or a toolkit. The Python side (cudaforge/cuda/libs.py) decides
 * where to look; this file opens the first candidate that loads and fills the function tables. */
#include "cudaforge.h"

#include <dlfcn.h>

cf_cuda_table cf_cu;
cf_nvrtc_table cf_nvrtc;
cf_cupti_table cf_cupti;

enum { LIB_CUDA, LIB_NVRTC, LIB_CUPTI, LIB_COUNT };
static const char *const lib_names[LIB_COUNT] = {"cuda", "nvrtc", "cupti"};
static const char *const lib_env[LIB_COUNT] = {"CUDAFORGE_LIBCUDA", "CUDAFORGE_LIBNVRTC",
                                               "CUDAFORGE_LIBCUPTI"};
/* The loaded-library tables: written once, under the GIL, when a library is first loaded. */
static void *lib_handle[LIB_COUNT];
static char lib_path[LIB_COUNT][1024];
static int cuda_initialized;

static int lib_index(const char *kind)
{
    for (int i = 0; i < LIB_COUNT; i++)
        if (strcmp(kind, lib_names[i]) == 0)
            return i;
    return -1;
}

static int fill_cuda(cf_state *st, void *handle, char *why, size_t why_size)
{
    typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);
    get_proc_t get_proc = (get_proc_t)dlsym(handle, "cuGetProcAddress_v2");
    if (get_proc == NULL) {
        snprintf(why, why_size, "no cuGetProcAddress_v2 (a driver older than CUDA 12)");
        return -1;
    }
    CUdriverProcAddressQueryResult found;
#define CF_RESOLVE_CU(name, version)                                                               \
    if (get_proc(#name, (void **)&cf_cu.name, version, CU_GET_PROC_ADDRESS_DEFAULT, &found) !=     \
            CUDA_SUCCESS ||                                                                        \
        found != CU_GET_PROC_ADDRESS_SUCCESS || cf_cu.name == NULL) {                              \
        snprintf(why, why_size, "the driver has no %s (CUDA %d ABI)", #name, version);             \
        return -1;                                                                                 \
    }
    CF_CUDA_API(CF_RESOLVE_CU)
#undef CF_RESOLVE_CU
    (void)st;
    return 0;
}

#define CF_FILL_BY_DLSYM(table, list)                                                              \
    static int fill_##table(cf_state *st, void *handle, char *why, size_t why_size)                \
    {                                                                                              \
        (void)st;                                                                                  \
        list(CF_DLSYM_ONE) return 0;                                                               \
    }
#define CF_DLSYM_ONE(name)                                                                         \
    if ((*(void **)&CF_TABLE.name = dlsym(handle, #name)) == NULL) {                               \
        snprintf(why, why_size, "no symbol %s", #name);                                            \
        return -1;                                                                                 \
    }
#define CF_TABLE cf_nvrtc
CF_FILL_BY_DLSYM(nvrtc, CF_NVRTC_API)
#undef CF_TABLE
#define CF_TABLE cf_cupti
CF_FILL_BY_DLSYM(cupti, CF_CUPTI_API)
#undef CF_TABLE

typedef int (*fill_fn)(cf_state *, void *, char *, size_t);
static const fill_fn lib_fill[LIB_COUNT] = {fill_cuda, fill_nvrtc, fill_cupti};

/* load_library(kind, candidates) -> path: open the first candidate that loads and has every
 * symbol; a bare soname is tried with RTLD_NOLOAD first, to reuse a copy already mapped (torch's
 * libcupti: one CUPTI per process). */
static PyObject *load_library(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    const char *kind;
    PyObject *candidates;
    if (!PyArg_ParseTuple(args, "sO!:load_library", &kind, &PyList_Type, &candidates))
        return NULL;
    int idx = lib_index(kind);
    if (idx < 0) {
        PyErr_Format(PyExc_ValueError, "unknown library kind %R (cuda, nvrtc, cupti)", args);
        return NULL;
    }
    if (lib_handle[idx] != NULL)
        return PyUnicode_FromString(lib_path[idx]);

    PyObject *tried = PyList_New(0);
    if (tried == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(candidates); i++) {
        const char *path = PyUnicode_AsUTF8(PyList_GET_ITEM(candidates, i));
        if (path == NULL)
            goto error;
        char why[512] = "";
        void *handle = NULL;
        if (strchr(path, '/') == NULL)
            handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        if (handle == NULL)
            handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (handle == NULL) {
            const char *err = dlerror();
            snprintf(why, sizeof why, "%s", err ? err : "dlopen failed");
        } else if (lib_fill[idx](st, handle, why, sizeof why) == 0) {
            lib_handle[idx] = handle;
            if (dlinfo(handle, RTLD_DI_ORIGIN, why) == 0 && strchr(path, '/') == NULL)
                snprintf(lib_path[idx], sizeof lib_path[idx], "%s/%s", why, path);
            else
                snprintf(lib_path[idx], sizeof lib_path[idx], "%s", path);
            Py_DECREF(tried);
            return PyUnicode_FromString(lib_path[idx]);
        } else {
            dlclose(handle);
        }
        PyObject *line = PyUnicode_FromFormat("  %s: %s", path, why);
        if (line == NULL || PyList_Append(tried, line) < 0) {
            Py_XDECREF(line);
            goto error;
        }
        Py_DECREF(line);
    }
    {
        PyObject *sep = PyUnicode_FromString("\n");
        PyObject *joined = sep ? PyUnicode_Join(sep, tried) : NULL;
        Py_XDECREF(sep);
        if (joined == NULL)
            goto error;
        PyObject *msg = PyUnicode_FromFormat(
            "lib%s could not be loaded; tried:\n%U\nset %s to the library's path, or %s", kind,
            joined, lib_env[idx],
            idx == LIB_CUDA
                ? "install the NVIDIA driver (libcuda comes with it)"
                : "pip install 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-cupti==13.0.*'");
        Py_DECREF(joined);
        if (msg == NULL)
            goto error;
        PyObject *attrs = Py_BuildValue("{s:s,s:O,s:s}", "library", kind, "tried", tried, "env_var",
                                        lib_env[idx]);
        if (attrs != NULL) {
            cf_raise_with(st->LibraryNotFound, PyUnicode_AsUTF8(msg), attrs);
            Py_DECREF(attrs);
        }
        Py_DECREF(msg);
    }
error:
    Py_DECREF(tried);
    return NULL;
}

static int need(cf_state *st, int idx)
{
    if (lib_handle[idx] != NULL)
        return 0;
    char msg[256];
    snprintf(msg, sizeof msg,
             "lib%s is not loaded yet: use the cudaforge package, which loads it on first use "
             "(or set %s)",
             lib_names[idx], lib_env[idx]);
    PyObject *attrs =
        Py_BuildValue("{s:s,s:s}", "library", lib_names[idx], "env_var", lib_env[idx]);
    if (attrs == NULL)
        return -1;
    cf_raise_with(st->LibraryNotFound, msg, attrs);
    Py_DECREF(attrs);
    return -1;
}

int cf_need_nvrtc(cf_state *st) { return need(st, LIB_NVRTC); }
int cf_need_cupti(cf_state *st) { return need(st, LIB_CUPTI); }

int cf_need_cuda(cf_state *st)
{
    if (need(st, LIB_CUDA) < 0)
        return -1;
    if (!cuda_initialized) {
        CF_CU(cf_cu.cuInit(0));
        cuda_initialized = 1;
    }
    return 0;
error:
    return -1;
}

int cf_ensure_context(cf_state *st, int device, CUdevice *device_out)
{
    CUcontext ctx = NULL;
    if (cf_need_cuda(st) < 0)
        return -1;
    CF_CU(cf_cu.cuCtxGetCurrent(&ctx));
    if (ctx == NULL) {
        CUdevice dev;
        CF_CU(cf_cu.cuDeviceGet(&dev, device < 0 ? 0 : device));
        CF_CU(cf_cu.cuDevicePrimaryCtxRetain(&ctx, dev));
        CF_CU(cf_cu.cuCtxSetCurrent(ctx));
    }
    CF_CU(cf_cu.cuCtxGetDevice(device_out));
    return 0;
error:
    return -1;
}

static PyObject *loaded_libraries(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && i < LIB_COUNT; i++) {
        if (lib_handle[i] == NULL)
            continue;
        PyObject *path = PyUnicode_FromString(lib_path[i]);
        if (path == NULL || PyDict_SetItemString(out, lib_names[i], path) < 0)
            Py_CLEAR(out);
        Py_XDECREF(path);
    }
    return out;
}

static PyObject *driver_version(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    int version = 0;
    if (need(st, LIB_CUDA) < 0)
        return NULL;
    CF_CU(cf_cu.cuDriverGetVersion(&version));
    return PyLong_FromLong(version);
error:
    return NULL;
}

static PyObject *nvrtc_version(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    int major = 0, minor = 0;
    if (cf_need_nvrtc(st) < 0)
        return NULL;
    CF_NVRTC(cf_nvrtc.nvrtcVersion(&major, &minor));
    return Py_BuildValue("(ii)", major, minor);
error:
    return NULL;
}

static PyObject *nvrtc_supported_archs(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    int count = 0, archs[64];
    if (cf_need_nvrtc(st) < 0)
        return NULL;
    CF_NVRTC(cf_nvrtc.nvrtcGetNumSupportedArchs(&count));
    if (count > 64)
        count = 64;
    CF_NVRTC(cf_nvrtc.nvrtcGetSupportedArchs(archs));
    PyObject *out = PyList_New(count);
    for (int i = 0; out != NULL && i < count; i++) {
        PyObject *v = PyLong_FromLong(archs[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
error:
    return NULL;
}

static PyObject *cupti_version(PyObject *module, PyObject *unused)
{
    (void)unused;
    cf_state *st = cf_get_state(module);
    uint32_t version = 0;
    if (cf_need_cupti(st) < 0)
        return NULL;
    CF_CUPTI(cf_cupti.cuptiGetVersion(&version));
    return PyLong_FromUnsignedLong(version);
error:
    return NULL;
}

static PyMethodDef loader_methods[] = {
    {"load_library", load_library, METH_VARARGS,
     "load_library(kind, candidates) -> path: open libcuda/libnvrtc/libcupti from the first "
     "candidate path that loads."},
    {"loaded_libraries", loaded_libraries, METH_NOARGS, "{kind: path} of the libraries loaded."},
    {"driver_version", driver_version, METH_NOARGS, "CUDA version the driver supports (13000)."},
    {"nvrtc_version", nvrtc_version, METH_NOARGS, "(major, minor) of the loaded NVRTC."},
    {"nvrtc_supported_archs", nvrtc_supported_archs, METH_NOARGS,
     "Compute capabilities NVRTC can target, as ints (90 for sm_90)."},
    {"cupti_version", cupti_version, METH_NOARGS, "CUPTI API version of the loaded libcupti."},
    {NULL, NULL, 0, NULL},
};

int cf_loader_exec(PyObject *m) { return PyModule_AddFunctions(m, loader_methods); }
