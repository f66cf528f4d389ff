# cython: language_level=3
"""qconv's onnxruntime custom operators ``ai.qconv::QConv``, ``ai.qconv::QMatMul`` and ``ai.qconv::QFused`` (one or
more inputs), native (``qconv_ort.h``).

This module's own file is the custom-op library a session registers (:func:`library_path`). Each node of those
types carries one string attribute, ``qconv_key``; at kernel creation the resolver given to :func:`install` maps
it to a prepared Python kernel, which the kernel holds a reference to until onnxruntime destroys it. A node
without that attribute (a string), or whose key the resolver does not know, fails kernel creation with an error
saying so; an onnxruntime older than 1.16 fails the library's registration (``qconv_ort.h``). A compute
call takes the GIL and passes the kernel numpy views of onnxruntime's own memory, no copies:

1. ``x``: the float32 input tensor, read-only (``QFused``: ``x1, x2, ...``);
2. ``kernel.out_shape(x.shape)`` (``out_shape(x1.shape, x2.shape, ...)``) -> the output shape, for which
   onnxruntime allocates the output tensor;
3. ``kernel(x, y)`` (``kernel(x1, x2, ..., y)``) writes the result into ``y``, the view of that tensor.

A Python exception in steps 2-3 goes to the error hook given to :func:`install` and fails the node with its
message (onnxruntime's ``run`` then raises); neither view outlives the call.

:func:`run_native` runs the same prepared calls for the layers' numpy path (:class:`qconv.Conv2d`), on the same
per-thread scratch (``qconv_native_scratch.h``: one per process, so it lives here).
"""
cimport numpy as cnp
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free

from ._cpu cimport qc_native, NativeCall

cnp.import_array()

cdef extern from "Python.h":
    int Py_IsInitialized() nogil

cdef extern from "qconv_ort.h" nogil:
    ctypedef struct OrtStatus
    ctypedef struct OrtKernelInfo
    ctypedef struct OrtKernelContext
    ctypedef void *const *qc_ort_api
    ctypedef struct qc_ort_op:
        const char *name
    ctypedef OrtStatus *(*qc_ort_create_fn)(const qc_ort_op *, qc_ort_api, const OrtKernelInfo *, void **)
    ctypedef OrtStatus *(*qc_ort_compute_fn)(void *, OrtKernelContext *)
    ctypedef void (*qc_ort_destroy_fn)(void *)
    qc_ort_create_fn qc_ort_create
    qc_ort_compute_fn qc_ort_compute
    qc_ort_destroy_fn qc_ort_destroy
    OrtStatus *qc_ort_status(qc_ort_api api, const char *msg)
    OrtStatus *qc_ort_wrap(qc_ort_api api, OrtStatus *s, const char *what)
    OrtStatus *qc_ort_attr_string(qc_ort_api api, const OrtKernelInfo *info, const char *name, char **out)
    OrtStatus *qc_ort_input(qc_ort_api api, OrtKernelContext *ctx, size_t i, const float **data, int64_t *dims,
                            size_t cap, size_t *nd)
    OrtStatus *qc_ort_output(qc_ort_api api, OrtKernelContext *ctx, size_t i, const int64_t *dims, size_t nd,
                             float **data)
    OrtStatus *qc_ort_input_count(qc_ort_api api, OrtKernelContext *ctx, size_t *n)

DEF MAX_DIMS = 8
DEF MAX_INPUTS = 64
cdef const char *_KEY = "qconv_key"
KEY_ATTR = _KEY.decode()   # the node attribute naming its prepared kernel
cdef const char *_NO_KEY = ("qconv: an ai.qconv node needs the string attribute 'qconv_key' naming its prepared "
                            "kernel, which qconv.onnx.InferenceSession adds: run a model of qconv.onnx.quantize_model "
                            "through qconv.onnx.InferenceSession")

cdef object _resolve = None    # key (str) -> prepared kernel
cdef object _on_error = None   # exception -> None


cdef extern from "qconv_native_scratch.h" nogil:
    void *qc_native_scratch(int64_t nbytes)


ctypedef struct _kernel:
    qc_ort_api api
    PyObject *obj
    const qc_native *nat   # the kernel's native call (kernel.native(shape)), NULL until its first call offers one
    int asked              # 1 once kernel.native was asked (once per kernel)

cdef bint _native_on = True


def set_native(bint on) -> None:
    """Whether kernels' native calls run (default True), and :func:`run_native`; False sends every call through
    Python (tests compare the two)."""
    global _native_on
    _native_on = on


def install(resolve, on_error) -> None:
    """``resolve(key)`` -> the prepared kernel of a node (raises for an unknown key); ``on_error(exc)`` receives an
    exception a kernel raised (the node then fails with its message)."""
    global _resolve, _on_error
    _resolve, _on_error = resolve, on_error


def library_path() -> str:
    """The file to pass to ``onnxruntime.SessionOptions.register_custom_ops_library``."""
    return __file__


cdef OrtStatus *_error(qc_ort_api api, exc) noexcept:
    if _on_error is not None:
        try:
            _on_error(exc)
        except BaseException:
            pass
    msg = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
    return qc_ort_status(api, msg)


cdef OrtStatus *_create(const qc_ort_op *op, qc_ort_api api, const OrtKernelInfo *info, void **out) noexcept nogil:
    cdef char *key = NULL
    cdef OrtStatus *s = qc_ort_attr_string(api, info, _KEY, &key)
    out[0] = NULL
    if s != NULL:
        return qc_ort_wrap(api, s, _NO_KEY)
    cdef _kernel *k = <_kernel *>malloc(sizeof(_kernel))
    if k == NULL:
        free(key)
        return qc_ort_status(api, "qconv: out of memory creating a kernel")
    k.api = api
    k.nat = NULL
    k.asked = 0
    with gil:
        try:
            if _resolve is None:
                raise RuntimeError("qconv: the native operators are not installed")
            obj = _resolve(key.decode("utf-8"))
            Py_INCREF(obj)
            k.obj = <PyObject *>obj
        except BaseException as exc:
            s = _error(api, exc)
    free(key)
    if s != NULL:
        free(k)
        return s
    out[0] = k
    return NULL


cdef OrtStatus *_run(_kernel *k, OrtKernelContext *ctx, size_t n, const float **xs, int64_t *dims,
                     size_t *nds) noexcept:
    """Input i: xs[i], its nds[i] dimensions at dims + i*MAX_DIMS."""
    cdef cnp.npy_intp shape[MAX_DIMS]
    cdef int64_t odims[MAX_DIMS]
    cdef float *y = NULL
    cdef size_t i, j, ond
    cdef OrtStatus *s
    kernel = <object>k.obj
    try:
        arrays = []
        for i in range(n):
            for j in range(nds[i]):
                shape[j] = dims[i * MAX_DIMS + j]
            xa = cnp.PyArray_SimpleNewFromData(<int>nds[i], shape, cnp.NPY_FLOAT32, <void *>xs[i])
            cnp.PyArray_CLEARFLAGS(xa, cnp.NPY_ARRAY_WRITEABLE)
            arrays.append(xa)
        oshape = kernel.out_shape(*[a.shape for a in arrays])
        ond = len(oshape)
        if ond > MAX_DIMS:
            raise ValueError(f"qconv: an output of {ond} dimensions")
        for i in range(ond):
            odims[i] = oshape[i]
            shape[i] = oshape[i]
        s = qc_ort_output(k.api, ctx, 0, odims, ond, &y)
        if s != NULL:
            return s
        ya = cnp.PyArray_SimpleNewFromData(<int>ond, shape, cnp.NPY_FLOAT32, <void *>y)
        kernel(*arrays, ya)
        if not k.asked and n == 1:
            k.asked = 1
            native = getattr(kernel, "native", None)
            call = native(arrays[0].shape) if native is not None else None
            if call is not None:   # the kernel keeps it alive as long as itself (never replaced)
                k.nat = <const qc_native *><size_t>call.address
        return NULL
    except BaseException as exc:
        return _error(k.api, exc)


cdef OrtStatus *_compute(void *kp, OrtKernelContext *ctx) noexcept nogil:
    cdef _kernel *k = <_kernel *>kp
    cdef const float *xs[MAX_INPUTS]
    cdef int64_t dims[MAX_INPUTS * MAX_DIMS]
    cdef size_t nds[MAX_INPUTS]
    cdef size_t n = 0, i
    cdef OrtStatus *s = qc_ort_input_count(k.api, ctx, &n)
    if s != NULL:
        return s
    if n > MAX_INPUTS:
        return qc_ort_status(k.api, "qconv: a node of more than 64 inputs")
    for i in range(n):
        s = qc_ort_input(k.api, ctx, i, &xs[i], dims + i * MAX_DIMS, MAX_DIMS, &nds[i])
        if s != NULL:
            return s
    if k.nat != NULL and _native_on and n == 1:
        if _native(k, ctx, xs[0], dims, nds[0], &s):
            return NULL
        if s != NULL:   # onnxruntime could not allocate the output
            return s
    with gil:
        return _run(k, ctx, n, xs, dims, nds)


cdef bint _native(_kernel *k, OrtKernelContext *ctx, const float *x, const int64_t *dims, size_t nd,
                  OrtStatus **status) noexcept nogil:
    """The kernel's native call when x has the shape it was prepared for; False when it did not run (another
    shape, no scratch memory; ``*status``: onnxruntime's error when it could not allocate the output) or found
    something wrong (a NaN / inf input): the Python path then runs the call (and raises)."""
    cdef const qc_native *c = k.nat
    cdef float *y = NULL
    cdef void *scratch = NULL
    cdef size_t i
    if c.disabled or <size_t>c.nd != nd:
        return False
    for i in range(nd):
        if c.dims[i] != dims[i]:
            return False
    if c.scratch_bytes:
        scratch = qc_native_scratch(c.scratch_bytes)
        if scratch == NULL:
            return False
    status[0] = qc_ort_output(k.api, ctx, 0, c.odims, c.ond, &y)
    if status[0] != NULL:
        return False
    return c.run(c, x, y, scratch) == 0


def run_native(NativeCall call, cnp.ndarray x, cnp.ndarray y) -> bool:
    """Run ``call`` (a layer's prepared call, :meth:`qconv.cpu.CpuEngine.native_call`) on ``x`` into ``y`` with the
    calling thread's scratch, without the GIL. ``x`` and ``y``: float32 C-contiguous arrays of the call's shapes
    (``y`` writable). True when ``y`` holds the result; False when the call did not run (native calls off, another
    shape or dtype, a disabled call, no scratch memory) or found something wrong (a NaN / inf input): the caller
    then takes its checked path, which raises the error."""
    cdef const qc_native *c = <const qc_native *> call.mem
    cdef const float *xp
    cdef float *yp
    cdef void *scratch = NULL
    cdef int i
    cdef int64_t r
    if (not _native_on or c.disabled or x.ndim != c.nd or y.ndim != c.ond
            or cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or cnp.PyArray_TYPE(y) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(x) or not cnp.PyArray_IS_C_CONTIGUOUS(y)
            or not cnp.PyArray_ISWRITEABLE(y)):
        return False
    for i in range(c.nd):
        if x.shape[i] != c.dims[i]:
            return False
    for i in range(c.ond):
        if y.shape[i] != c.odims[i]:
            return False
    xp = <const float *> cnp.PyArray_DATA(x)
    yp = <float *> cnp.PyArray_DATA(y)
    with nogil:
        if c.scratch_bytes:
            scratch = qc_native_scratch(c.scratch_bytes)
        r = c.run(c, xp, yp, scratch) if scratch != NULL or not c.scratch_bytes else -1
    return r == 0


cdef void _destroy(void *kp) noexcept nogil:
    cdef _kernel *k = <_kernel *>kp
    if k == NULL:
        return
    if Py_IsInitialized():
        with gil:
            Py_DECREF(<object>k.obj)
    free(k)


qc_ort_create = _create
qc_ort_compute = _compute
qc_ort_destroy = _destroy
