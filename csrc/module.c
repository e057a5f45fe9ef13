/* module.c: the definition of cudaforge._core: multi-phase init, one exec slot per file, and the
 * traverse/clear/free functions of the module state. */
#include "cudaforge.h"

cf_state *cf_get_state(PyObject *module) { return (cf_state *)PyModule_GetState(module); }

static PyModuleDef cf_module_def;

cf_state *cf_state_from_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &cf_module_def);
    return module == NULL ? NULL : cf_get_state(module);
}

static int cf_traverse(PyObject *m, visitproc visit, void *arg)
{
    cf_state *st = cf_get_state(m);
    Py_VISIT(st->CudaforgeError);
    Py_VISIT(st->LibraryNotFound);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->KernelFault);
    Py_VISIT(st->CompileError);
    Py_VISIT(st->ProfilerError);
    Py_VISIT(st->HTTPError);
    Py_VISIT(st->ModuleType);
    Py_VISIT(st->KernelType);
    Py_VISIT(st->tensor_type);
    Py_VISIT(st->stream_getter);
    return 0;
}

static int cf_clear(PyObject *m)
{
    cf_state *st = cf_get_state(m);
    Py_CLEAR(st->CudaforgeError);
    Py_CLEAR(st->LibraryNotFound);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->KernelFault);
    Py_CLEAR(st->CompileError);
    Py_CLEAR(st->ProfilerError);
    Py_CLEAR(st->HTTPError);
    Py_CLEAR(st->ModuleType);
    Py_CLEAR(st->KernelType);
    Py_CLEAR(st->tensor_type);
    Py_CLEAR(st->stream_getter);
    Py_CLEAR(st->str_data_ptr);
    Py_CLEAR(st->str_get_device);
    Py_CLEAR(st->str_cuda_stream);
    Py_CLEAR(st->curl_global);
    return 0;
}

static void cf_free(void *m) { cf_clear((PyObject *)m); }

static int cf_strings_exec(PyObject *m)
{
    cf_state *st = cf_get_state(m);
    st->str_data_ptr = PyUnicode_InternFromString("data_ptr");
    st->str_get_device = PyUnicode_InternFromString("get_device");
    st->str_cuda_stream = PyUnicode_InternFromString("cuda_stream");
    if (st->str_data_ptr == NULL || st->str_get_device == NULL || st->str_cuda_stream == NULL)
        return -1;
    return 0;
}

static PyModuleDef_Slot cf_slots[] = {
    {Py_mod_exec, cf_strings_exec},       {Py_mod_exec, cf_errors_exec},
    {Py_mod_exec, cf_loader_exec},        {Py_mod_exec, cf_compile_exec},
    {Py_mod_exec, cf_launch_exec},        {Py_mod_exec, cf_device_exec},
    {Py_mod_exec, cf_area_exec},          {Py_mod_exec, cf_timing_exec},
    {Py_mod_exec, cf_profiler_host_exec}, {Py_mod_exec, cf_profiler_range_exec},
    {Py_mod_exec, cf_http_exec},          {0, NULL},
};

static PyModuleDef cf_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudaforge._core",
    .m_doc = "The C core of cudaforge: NVRTC, the CUDA driver API, CUPTI and libcurl.",
    .m_size = sizeof(cf_state),
    .m_slots = cf_slots,
    .m_traverse = cf_traverse,
    .m_clear = cf_clear,
    .m_free = cf_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&cf_module_def); }
