/* args.c: kernel arguments, from Python to parameter bytes. The type codes come from the kernel's
 * signature in the source (cudaforge/cuda/kernel.py parses it); the offset and size of each
 * parameter from the binary (cuFuncGetParamInfo, launch.c). Tensors pass their data pointer after
 * a device check, ints are range-checked against the parameter's size and signedness, floats are
 * narrowed to float where the parameter is 4 bytes, and bytes pass a struct by value. */
#include "cudaforge.h"

/* p: pointer; b/B h/H i/I l/L: signed/unsigned ints of 1, 2, 4, 8 bytes; f: float; d: double;
 * ?: not declared, the value decides. */
static const char *valid_codes = "pbBhHiIlLfd?";

int cf_params_set_codes(cf_params *p, PyObject *codes)
{
    memset(p->codes, 0, sizeof p->codes);
    p->n_params = -1;
    if (codes == Py_None)
        return 0;
    Py_ssize_t len;
    const char *c = PyUnicode_AsUTF8AndSize(codes, &len);
    if (c == NULL)
        return -1;
    if (len > CF_MAX_PARAMS || strspn(c, valid_codes) != (size_t)len) {
        PyErr_Format(PyExc_ValueError, "codes must be at most %d of %s, one per parameter; got %R",
                     CF_MAX_PARAMS, valid_codes, codes);
        return -1;
    }
    memcpy(p->codes, c, (size_t)len);
    return 0;
}

int cf_params_check_count(cf_params *p, int n, const char *kernel)
{
    size_t declared = strlen(p->codes);
    if (declared == 0) {
        memset(p->codes, '?', (size_t)n);
    } else if (declared != (size_t)n) {
        PyErr_Format(PyExc_TypeError,
                     "kernel '%s': the source declares %zu parameters but the binary has %d",
                     kernel, declared, n);
        return -1;
    }
    p->n_params = n;
    return 0;
}

/* How a parameter is named in messages. */
typedef struct {
    PyObject *kernel; /* str */
    PyObject *names;  /* tuple of str, may be shorter than the parameter list */
} param_names;

static PyObject *param_label(const param_names *names, int i)
{
    if (i < PyTuple_GET_SIZE(names->names))
        return PyUnicode_FromFormat("argument %d ('%U') of kernel '%U'", i,
                                    PyTuple_GET_ITEM(names->names, i), names->kernel);
    return PyUnicode_FromFormat("argument %d of kernel '%U'", i, names->kernel);
}

static int param_error(PyObject *type, const param_names *names, int i, const char *fmt,
                       PyObject *obj)
{
    PyObject *label = param_label(names, i);
    if (label == NULL)
        return -1;
    PyErr_Format(type, "%U: %s, got %.200s", label, fmt, Py_TYPE(obj)->tp_name);
    Py_DECREF(label);
    return -1;
}

/* The device of a torch tensor (get_device(): -1 on the CPU). */
static int tensor_device(cf_state *st, PyObject *tensor, long *device)
{
    PyObject *d = PyObject_CallMethodNoArgs(tensor, st->str_get_device);
    if (d == NULL)
        return -1;
    *device = PyLong_AsLong(d);
    Py_DECREF(d);
    return (*device == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int is_tensor(cf_state *st, PyObject *obj)
{
    return st->tensor_type != NULL && PyObject_TypeCheck(obj, (PyTypeObject *)st->tensor_type);
}

int cf_args_device(cf_state *st, PyObject *const *items, Py_ssize_t n, long *device)
{
    *device = -1;
    for (Py_ssize_t i = 0; i < n && *device < 0; i++)
        if (is_tensor(st, items[i]) && tensor_device(st, items[i], device) < 0)
            return -1;
    return 0;
}

/* A tensor's data pointer, after checking that it lives on `dev`. */
static int pack_tensor(cf_state *st, const param_names *names, int i, PyObject *obj, CUdevice dev,
                       void *dst)
{
    long device;
    if (tensor_device(st, obj, &device) < 0)
        return -1;
    if (device != (long)dev) {
        PyObject *label = param_label(names, i);
        if (label == NULL)
            return -1;
        if (device < 0)
            PyErr_Format(PyExc_ValueError,
                         "%U: tensor is on the CPU; move it to the GPU first (.cuda())", label);
        else
            PyErr_Format(PyExc_ValueError,
                         "%U: tensor is on cuda:%ld but the kernel runs on cuda:%d; use "
                         "torch.cuda.device(%ld) or move the tensor",
                         label, device, (int)dev, device);
        Py_DECREF(label);
        return -1;
    }
    PyObject *ptr = PyObject_CallMethodNoArgs(obj, st->str_data_ptr);
    if (ptr == NULL)
        return -1;
    unsigned long long p = PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    if (p == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    memcpy(dst, &p, sizeof(void *));
    return 0;
}

/* An int, range-checked against the parameter's size and signedness (code c). */
static int pack_int(const param_names *names, int i, char c, size_t size, PyObject *obj, void *dst)
{
    if (PyFloat_Check(obj) || !PyIndex_Check(obj))
        return param_error(PyExc_TypeError, names, i, "expects an int", obj);
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL)
        return -1;
    int is_unsigned = (c == 'B' || c == 'H' || c == 'I' || c == 'L');
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    unsigned long long uv = 0;
    if (overflow > 0 && is_unsigned) {
        uv = PyLong_AsUnsignedLongLong(index);
        overflow = (uv == (unsigned long long)-1 && PyErr_Occurred()) ? 1 : 0;
        PyErr_Clear();
    } else {
        uv = (unsigned long long)v;
    }
    Py_DECREF(index);
    if (v == -1 && PyErr_Occurred())
        return -1;
    int fits = !overflow;
    if (fits && size < 8) {
        long long lo = is_unsigned ? 0 : -(1LL << (size * 8 - 1));
        long long hi = is_unsigned ? (1LL << (size * 8)) - 1 : (1LL << (size * 8 - 1)) - 1;
        fits = v >= lo && v <= hi;
    } else if (fits && is_unsigned && overflow == 0 && v < 0) {
        fits = 0;
    }
    if (!fits) {
        PyObject *label = param_label(names, i);
        if (label != NULL) {
            PyErr_Format(PyExc_OverflowError, "%U: %R does not fit in %zu bytes (%s)", label, obj,
                         size, is_unsigned ? "unsigned" : "signed");
            Py_DECREF(label);
        }
        return -1;
    }
    if (size == 1 || size == 2 || size == 4 || size == 8) {
        memcpy(dst, &uv, size); /* little-endian: the low bytes */
        return 0;
    }
    return param_error(PyExc_TypeError, names, i, "has a size that no int fits", obj);
}

/* Write argument `obj` for parameter i (code c, size bytes) into dst. */
static int pack_param(cf_state *st, const param_names *names, int i, char c, size_t size,
                      PyObject *obj, CUdevice dev, void *dst)
{
    if (PyBytes_Check(obj)) { /* raw bytes: a struct passed by value */
        if ((size_t)PyBytes_GET_SIZE(obj) != size) {
            PyObject *label = param_label(names, i);
            if (label != NULL) {
                PyErr_Format(PyExc_TypeError, "%U: takes %zu bytes, got bytes of length %zd", label,
                             size, PyBytes_GET_SIZE(obj));
                Py_DECREF(label);
            }
            return -1;
        }
        memcpy(dst, PyBytes_AS_STRING(obj), size);
        return 0;
    }
    if (is_tensor(st, obj)) {
        if (c != 'p' && !(c == '?' && size == sizeof(void *)))
            return param_error(PyExc_TypeError, names, i, "expects a scalar, not a tensor", obj);
        return pack_tensor(st, names, i, obj, dev, dst);
    }
    if (c == 'p' || (c == '?' && obj == Py_None)) {
        unsigned long long p = 0;
        if (obj != Py_None) {
            if (!PyLong_Check(obj))
                return param_error(PyExc_TypeError, names, i,
                                   "expects a CUDA tensor (or an int address)", obj);
            p = PyLong_AsUnsignedLongLong(obj);
            if (p == (unsigned long long)-1 && PyErr_Occurred())
                return -1;
        }
        memcpy(dst, &p, sizeof(void *));
        return 0;
    }
    int want_float = (c == 'f' || c == 'd');
    if (c == '?') /* no declared type: the value's own type decides */
        want_float = PyFloat_Check(obj) || (!PyIndex_Check(obj) && PyNumber_Check(obj));
    if (!want_float)
        return pack_int(names, i, c, size, obj, dst);
    if (!PyFloat_Check(obj) && !PyNumber_Check(obj))
        return param_error(PyExc_TypeError, names, i, "expects a float", obj);
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (size == sizeof(float)) {
        float f = (float)v;
        memcpy(dst, &f, sizeof f);
    } else if (size == sizeof(double)) {
        memcpy(dst, &v, sizeof v);
    } else {
        return param_error(PyExc_TypeError, names, i, "is not a float or double parameter", obj);
    }
    return 0;
}

int cf_pack_args(cf_state *st, const cf_params *p, PyObject *kernel, PyObject *param_names_tuple,
                 PyObject *const *items, Py_ssize_t n, CUdevice dev, unsigned char *buffer,
                 void **params)
{
    param_names names = {kernel, param_names_tuple};
    if (n != p->n_params) {
        PyErr_Format(PyExc_TypeError, "kernel '%U' takes %d arguments, got %zd", kernel,
                     p->n_params, n);
        return -1;
    }
    for (int i = 0; i < p->n_params; i++) {
        if (p->offset[i] + p->size[i] > CF_MAX_PARAM_BYTES) {
            PyErr_Format(PyExc_ValueError, "kernel '%U': parameters exceed %d bytes", kernel,
                         CF_MAX_PARAM_BYTES);
            return -1;
        }
        params[i] = buffer + p->offset[i];
        if (pack_param(st, &names, i, p->codes[i], p->size[i], items[i], dev, params[i]) < 0)
            return -1;
    }
    return 0;
}
