/* area.c: device memory one process lends another. The reference process creates an area with
 * the driver's virtual memory management (cuMemCreate, exportable as a POSIX file descriptor),
 * maps it for itself and passes the descriptor to a candidate's worker (SCM_RIGHTS), which maps
 * the same memory and copies its outputs into it. The reference then judges them where they lie,
 * without a host copy. The area belongs to the process that created it: the importer only writes
 * into it, and the creator reads no more than the size it chose. */
#include "cudaforge.h"

#include <unistd.h>

/* The allocation properties of device memory on `dev`, exportable as a file descriptor. */
static void area_properties(CUmemAllocationProp *prop, CUdevice dev)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = (int)dev;
}

/* Reserve `size` bytes of address space, map `handle` there and give `dev` read and write access.
 * On failure nothing stays reserved or mapped; the handle is the caller's. */
static int map_handle(cf_state *st, CUmemGenericAllocationHandle handle, size_t size, CUdevice dev,
                      CUdeviceptr *out)
{
    CUdeviceptr ptr = 0;
    int mapped = 0;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = (int)dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CF_CU(cf_cu.cuMemAddressReserve(&ptr, size, 0, 0, 0));
    CF_CU(cf_cu.cuMemMap(ptr, size, 0, handle, 0));
    mapped = 1;
    CF_CU(cf_cu.cuMemSetAccess(ptr, size, &access, 1));
    *out = ptr;
    return 0;
error:
    if (mapped)
        cf_cu.cuMemUnmap(ptr, size);
    if (ptr)
        cf_cu.cuMemAddressFree(ptr, size);
    return -1;
}

/* area_create(nbytes) -> (pointer, fd, size): at least `nbytes` of device memory on the current
 * context's device, mapped here, and a file descriptor that another process can import it by.
 * `size` is nbytes rounded up to the driver's granularity; the fd is the caller's to close. */
static PyObject *area_create(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    unsigned long long want = 0;
    CUdevice dev;
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle handle = 0;
    int have_handle = 0, fd = -1;
    size_t granularity = 0, size = 0;
    CUdeviceptr ptr = 0;
    if (!PyArg_ParseTuple(args, "K:area_create", &want))
        return NULL;
    if (want == 0) {
        PyErr_SetString(PyExc_ValueError, "area_create: nbytes must be > 0");
        return NULL;
    }
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    area_properties(&prop, dev);
    CF_CU(
        cf_cu.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (granularity == 0 || want > (unsigned long long)SIZE_MAX - granularity) {
        PyErr_Format(PyExc_ValueError, "area_create: %llu bytes cannot be allocated", want);
        return NULL;
    }
    size = ((size_t)want + granularity - 1) / granularity * granularity;
    CF_CU_NOGIL(cf_cu.cuMemCreate(&handle, size, &prop, 0));
    have_handle = 1;
    CF_CU(cf_cu.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                             0));
    if (map_handle(st, handle, size, dev, &ptr) < 0)
        goto error;
    /* the mapping holds the memory now; the handle is no longer needed here */
    have_handle = 0;
    CF_CU(cf_cu.cuMemRelease(handle));
    return Py_BuildValue("(KiK)", (unsigned long long)ptr, fd, (unsigned long long)size);
error:
    if (ptr) {
        cf_cu.cuMemUnmap(ptr, size);
        cf_cu.cuMemAddressFree(ptr, size);
    }
    if (have_handle)
        cf_cu.cuMemRelease(handle);
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* area_import(fd, size) -> pointer: the memory another process exported as `fd` (area_create),
 * mapped here. `size` must be the size area_create returned. The fd stays open. */
static PyObject *area_import(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    int fd = -1;
    unsigned long long size = 0;
    CUdevice dev;
    CUmemGenericAllocationHandle handle = 0;
    int have_handle = 0;
    CUdeviceptr ptr = 0;
    if (!PyArg_ParseTuple(args, "iK:area_import", &fd, &size))
        return NULL;
    if (fd < 0 || size == 0) {
        PyErr_SetString(PyExc_ValueError, "area_import: a file descriptor >= 0 and a size > 0");
        return NULL;
    }
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU(cf_cu.cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    have_handle = 1;
    if (map_handle(st, handle, (size_t)size, dev, &ptr) < 0)
        goto error;
    have_handle = 0;
    CF_CU(cf_cu.cuMemRelease(handle));
    return PyLong_FromUnsignedLongLong((unsigned long long)ptr);
error:
    if (ptr) {
        cf_cu.cuMemUnmap(ptr, (size_t)size);
        cf_cu.cuMemAddressFree(ptr, (size_t)size);
    }
    if (have_handle)
        cf_cu.cuMemRelease(handle);
    return NULL;
}

/* area_free(pointer, size): unmap an area (created or imported here) and free its addresses; the
 * memory itself goes when no process maps it any more. Waits for the context's work first. */
static PyObject *area_free(PyObject *module, PyObject *args)
{
    cf_state *st = cf_get_state(module);
    unsigned long long ptr = 0, size = 0;
    CUdevice dev;
    if (!PyArg_ParseTuple(args, "KK:area_free", &ptr, &size))
        return NULL;
    if (cf_ensure_context(st, -1, &dev) < 0)
        return NULL;
    CF_CU_NOGIL(cf_cu.cuCtxSynchronize());
    CF_CU(cf_cu.cuMemUnmap((CUdeviceptr)ptr, (size_t)size));
    CF_CU(cf_cu.cuMemAddressFree((CUdeviceptr)ptr, (size_t)size));
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyMethodDef area_methods[] = {
    {"area_create", area_create, METH_VARARGS,
     "area_create(nbytes) -> (pointer, fd, size): device memory on the current device, mapped "
     "here and exportable to another process by the file descriptor (cuMemCreate, "
     "cuMemExportToShareableHandle). The fd is the caller's to close."},
    {"area_import", area_import, METH_VARARGS,
     "area_import(fd, size) -> pointer: another process's area, mapped here "
     "(cuMemImportFromShareableHandle). The fd stays open."},
    {"area_free", area_free, METH_VARARGS,
     "area_free(pointer, size): unmap an area and free its address range."},
    {NULL, NULL, 0, NULL},
};

int cf_area_exec(PyObject *m) { return PyModule_AddFunctions(m, area_methods); }
