# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Native parts of the qconv CPU engine: dynamic quantization, the im2col indirection, the tiled GEMM driver.

Data layouts (bytes unless noted; "pixel" = one (n, h, w) of the input, "column" = one (n, oy, ox) output):

* ``Q``  uint8 ``(N*H*W, GNB*BCp)``: the quantized input per pixel, ``xq + abias`` (``abias`` 128 for int8
  weights -- unsigned bytes for vpdpbusd -- and 0 for int4 weights, whose nibbles are the unsigned operand),
  channels grouped by (group, block), each block padded from ``BC`` to ``BCp = round_up(BC, 4)`` lanes that
  hold the zero point ``zpu = z + abias`` (so they contribute exactly 0).
* ``PS`` int32 ``(N*H*W, GNB)``: per pixel and block, ``sum(xq - z)`` over the block's real channels.
* ``AP`` pointers ``(tile_cols, K)``: the indirection table of a column tile -- tap ``t`` of column ``e`` reads
  the ``Q`` row of the pixel under it, or ``zrow`` (``Ltot1`` bytes of ``zpu``) when it falls in the padding.
  Per (group, block) a tap is ``BCp`` contiguous bytes, exactly the L order ``l = tap*BCp + c`` of
  :class:`qconv.layouts.gemm_tiles.TiledWeightLayout`, so no packed-A copy is made (an "indirect GEMM").
* ``S``  int32 ``(tile_cols, GNB)``: per column and block, ``sum(u)`` over the block's in-image taps.
* ``OUT`` float32 ``(tile_cols, G*OCp)``: kernel output, scattered to the NCHW / NC4HW4 result by ``_store``.

This is the engine's native module: what :mod:`qconv.cpu` uses (:class:`ConvGeometry`, :class:`ConvPlan`, kernel
selection, the activation-range passes). The nogil helpers are declared in ``_cpu.pxd``; ``_cpu_testing.pyx`` wraps
them one by one for the tests (``_test_*``), ``_cpu_probes.pyx`` holds the benchmark's machine-ceiling probes.

Native allocations go through ``qc_alloc``; a refused one becomes a ``MemoryError`` in Python (never a crash).
``qconv._ext._cpu_testing._test_refuse_allocation(k)`` makes the ``k``-th following allocation fail, so tests
can reach every such path.
"""
import numpy as np

from .._validate import TAIL_ACTIVATIONS, tail_code

cimport cython
from libc.stdint cimport uint8_t, int8_t, uint16_t, int32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset
from libc.math cimport fabsf, roundf
from libc.stdlib cimport calloc, free

KERNELS = {"scalar": QC_KERNEL_SCALAR, "avx2": QC_KERNEL_AVX2, "avx512vnni": QC_KERNEL_AVX512VNNI,
           "amx": QC_KERNEL_AMX}
UNIT = QC_UNIT
SRC_UNIT = QC_SRC_UNIT

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)


def kernel_supported(str name):
    """True when this CPU runs the named micro-kernel (``scalar``, ``avx2``, ``avx512vnni``, ``amx``; ``amx`` also
    needs the OS to grant the tile data state, asked once per process)."""
    return bool(qc_kernel_supported(KERNELS[name]))


def hswish_form():
    """``"mul"`` or ``"div"``: how this module's epilogues divide hardswish's product by 6 (``qconv_kernels.h``: the
    product by 1/6 with a remainder correction on Intel CPUs, the division elsewhere, ``$QCONV_HSWISH`` at import
    overriding; the same bits either way)."""
    return "mul" if qc_hs_mul() else "div"


def best_kernel():
    """Name of the fastest micro-kernel this CPU supports (CPUID at run time)."""
    cdef int v = qc_best_kernel()
    return {QC_KERNEL_SCALAR: "scalar", QC_KERNEL_AVX2: "avx2", QC_KERNEL_AVX512VNNI: "avx512vnni",
            QC_KERNEL_AMX: "amx"}[v]


cdef extern from "qconv_pool.h" nogil:
    ctypedef int64_t (*qc_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid) noexcept nogil
    int64_t qc_parallel_for(int64_t n, int64_t chunk, qc_pool_fn fn, void *ctx, int nthreads)
    enum:
        QC_POOL_COUNTED
    ctypedef struct qc_pool_testing:
        int stall_tid, stall_ms, count
        int64_t chunks[64]
    qc_pool_testing qc_pool_test


cdef int64_t _parallel_for(int64_t n, int64_t chunk, pool_fn fn, void *ctx, int nthreads) noexcept nogil:
    """The engine's one parallel-for (``qconv_pool.h``): ``fn(ctx, begin, end, tid)`` over items ``0 .. n-1`` in
    dynamic chunks of ``chunk`` on up to ``nthreads`` threads (``tid`` < ``nthreads``); returns the sum of fn's
    return values."""
    return qc_parallel_for(n, chunk, <qc_pool_fn> fn, ctx, nthreads)


cdef void _pool_testing(int stall_tid, int stall_ms, int count) noexcept nogil:
    """Testing hook of the pool: stall worker ``stall_tid`` (-1: none) up to ``stall_ms`` before its first chunk of
    each call while chunks remain; ``count`` 1 zeroes the per-thread chunk counts and counts from now, 0 stops."""
    cdef int i
    qc_pool_test.stall_tid = stall_tid
    qc_pool_test.stall_ms = stall_ms
    if count:
        for i in range(QC_POOL_COUNTED):
            qc_pool_test.chunks[i] = 0
    qc_pool_test.count = count


cdef int64_t _pool_chunks(int tid) noexcept nogil:
    """Chunks run by thread ``tid`` since the testing hook started counting."""
    return qc_pool_test.chunks[tid] if 0 <= tid < QC_POOL_COUNTED else 0


cdef extern from *:
    """
    #include <stdlib.h>
    /* test hook: >= 0 makes the allocation that finds it at 0 fail (then it stays off); -1 = off */
    static int64_t qc_refuse_countdown = -1;
    static void *qc_alloc(size_t n)
    {
        if (__atomic_load_n(&qc_refuse_countdown, __ATOMIC_RELAXED) >= 0
                && __atomic_fetch_sub(&qc_refuse_countdown, 1, __ATOMIC_RELAXED) == 0)
            return NULL;
        return malloc(n);
    }
    """
    void *qc_alloc(size_t n) nogil
    int64_t qc_refuse_countdown


cdef void *_alloc(size_t n) noexcept nogil:
    """``malloc`` through the refusal hook (for the other native modules)."""
    return qc_alloc(n)


cdef class NativeCall:
    """A layer's prepared call on one input shape that the onnxruntime custom operator runs without Python
    (``qconv_native.h``): made by a CPU plan's ``native`` method, owning the plan's struct (whose first member is the
    ``qc_native``) and references to what it points into. ``address``: the ``qc_native``'s address."""

    @property
    def address(self):
        return <size_t> self.mem

    @property
    def shapes(self):
        """(input shape, output shape) it was prepared for."""
        cdef qc_native *b = <qc_native *> self.mem
        return tuple(b.dims[i] for i in range(b.nd)), tuple(b.odims[i] for i in range(b.ond))

    @property
    def kind(self):
        """The plan that made it: ``"depthwise"`` (float activations), ``"direct int8"``, or ``""`` (another)."""
        k = (<qc_native *> self.mem).kind
        return "depthwise" if k == QC_NATIVE_DW else "direct int8" if k == QC_NATIVE_DI8 else ""

    def set_shapes(self, tuple xshape, tuple yshape):
        """Match inputs of ``xshape`` (into outputs of ``yshape``) instead: the same C-contiguous values under other
        dimensions (a ``QMatMul``'s ``(..., K)`` rows are its engine's ``(rows, K, 1, 1)``)."""
        cdef qc_native *b = <qc_native *> self.mem
        cdef int i
        old_x, old_y = self.shapes
        if (len(xshape) > QC_NATIVE_MAX_DIMS or len(yshape) > QC_NATIVE_MAX_DIMS
                or _count(xshape) != _count(old_x) or _count(yshape) != _count(old_y)):
            raise ValueError(f"shapes {xshape} -> {yshape} do not hold the values of {old_x} -> {old_y}")
        b.nd, b.ond = len(xshape), len(yshape)
        for i in range(b.nd):
            b.dims[i] = xshape[i]
        for i in range(b.ond):
            b.odims[i] = yshape[i]

    def disable(self):
        """From now on the custom operator does not run this call (it takes the Python path): the layer it
        prepared is no longer the node's."""
        (<qc_native *> self.mem).disabled = 1

    def __dealloc__(self):
        free(self.mem)


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


cdef NativeCall _native_call(size_t nbytes, xshape, yshape, int64_t scratch_bytes, keep):
    """A :class:`NativeCall` of a zeroed ``nbytes`` struct (``>= sizeof(qc_native)``) whose ``qc_native`` holds the
    shapes and the scratch size (its ``run`` is the caller's to set); None when out of memory or a shape has more
    than ``QC_NATIVE_MAX_DIMS`` dimensions."""
    cdef NativeCall c
    cdef qc_native *b
    cdef int i
    if len(xshape) > QC_NATIVE_MAX_DIMS or len(yshape) > QC_NATIVE_MAX_DIMS or nbytes < sizeof(qc_native):
        return None
    b = <qc_native *> calloc(1, nbytes)
    if b == NULL:
        return None
    c = NativeCall.__new__(NativeCall)
    c.mem = b
    c.keep = keep
    b.nd, b.ond = len(xshape), len(yshape)
    for i in range(b.nd):
        b.dims[i] = xshape[i]
    for i in range(b.ond):
        b.odims[i] = yshape[i]
    b.scratch_bytes = scratch_bytes
    return c


cdef int64_t _refuse_allocations(int64_t k) noexcept nogil:
    """Make the ``k``-th native allocation from now (0 = the next) fail; ``-1`` turns the hook off. Returns the
    previous setting (``-1`` once an armed refusal has happened)."""
    global qc_refuse_countdown
    cdef int64_t old = qc_refuse_countdown
    qc_refuse_countdown = k if k >= 0 else -1
    return old if old >= 0 else -1


# ----------------------------------------------------------------------------------------------------
# reductions for the dynamic quantization parameters
# ----------------------------------------------------------------------------------------------------
cdef struct _RangeCtx:
    const float *x
    int64_t n, A, N, M, nchunk      # _minmax: values a chunk; _absmax_rows: chunks a row
    float *part
    int variant


cdef int64_t _minmax_chunks(void *ctx, int64_t c0, int64_t c1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_minmax`: the partials of chunks ``c0 .. c1-1`` (``r.nchunk`` values each; an
    empty last chunk holds ``x[0]``, which changes neither bound)."""
    cdef _RangeCtx *r = <_RangeCtx *> ctx
    cdef int64_t c, a, b
    for c in range(c0, c1):
        a = c * r.nchunk
        b = a + r.nchunk if a + r.nchunk < r.n else r.n
        if a >= b:
            r.part[2 * c] = r.x[0]
            r.part[2 * c + 1] = r.x[0]
            continue
        qc_minmax(r.x + a, b - a, &r.part[2 * c], &r.part[2 * c + 1], r.variant)
    return 0


cdef int _minmax(const float *x, int64_t n, int nthreads, float *lo, float *hi, int variant) noexcept nogil:
    """min and max of ``x[0:n]`` (n >= 1), reduced over chunk partials computed by ``nthreads`` threads. The chunks
    (at most 65536 values) are equal and a multiple of ``nthreads`` in number, so the pool's parts give thread t
    the t-th contiguous share of ``x``: about the values that the direct int8 conv's quantization pass (split by
    channel quads) then has that thread read, so they are in its core's cache. Returns 0, or -1 when the partials could not be allocated."""
    cdef int64_t nchunk = (n + 65535) // 65536
    cdef float *part
    cdef int64_t c
    cdef _RangeCtx r
    if nthreads > 1:
        nchunk = (nchunk + nthreads - 1) // nthreads * nthreads
    part = <float *> qc_alloc(2 * nchunk * sizeof(float))
    if part == NULL:
        return -1
    r.x, r.n, r.part, r.variant, r.nchunk = x, n, part, variant, (n + nchunk - 1) // nchunk
    _parallel_for(nchunk, 1, _minmax_chunks, &r, nthreads)
    lo[0] = part[0]
    hi[0] = part[1]
    for c in range(1, nchunk):
        if part[2 * c] < lo[0] or part[2 * c] != part[2 * c]:
            lo[0] = part[2 * c]
        if part[2 * c + 1] > hi[0] or part[2 * c + 1] != part[2 * c + 1]:
            hi[0] = part[2 * c + 1]
    free(part)
    return 0


cdef void _lanes_minmax(const float *x, int64_t npix, int lanes, float *lo, float *hi) noexcept nogil:
    """Fold lanes ``0 .. lanes-1`` of the ``npix`` quads ``x[4*p + lane]`` into ``lo``/``hi`` (NaN sticks, as in
    :func:`_minmax`): the real channels of an NC4HW4 tail quad, its padding lanes left out."""
    cdef int64_t p
    cdef int i
    cdef float v
    for p in range(npix):
        for i in range(lanes):
            v = x[4 * p + i]
            if v < lo[0] or v != v:
                lo[0] = v
            if v > hi[0] or v != v:
                hi[0] = v


cdef int64_t _absmax_chunks(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_absmax_rows`: the partials of items ``i0 .. i1-1`` (a, n, 65536-value chunk)."""
    cdef _RangeCtx *r = <_RangeCtx *> ctx
    cdef int64_t it, a, n, c, s, e
    for it in range(i0, i1):
        c = it % r.nchunk
        n = (it // r.nchunk) % r.N
        a = it // (r.nchunk * r.N)
        s = (a * r.N + n) * r.M + c * 65536
        e = s + 65536
        if e > (a * r.N + n + 1) * r.M:
            e = (a * r.N + n + 1) * r.M
        r.part[it] = qc_absmax(r.x + s, e - s, r.variant)
    return 0


cdef int _absmax_rows(const float *x, int64_t A, int64_t N, int64_t M, int nthreads, float *out,
                      int variant) noexcept nogil:
    """``out[n] = max |x[a, n, m]|`` over a < A, m < M for ``x`` contiguous ``(A, N, M)`` (0 when A == 0).
    Returns 0, or -1 when the partials could not be allocated."""
    cdef int64_t nchunk = (M + 65535) // 65536
    cdef int64_t items = A * N * nchunk
    cdef float *part
    cdef int64_t it, n
    cdef _RangeCtx r
    for n in range(N):
        out[n] = 0
    if items == 0:
        return 0
    part = <float *> qc_alloc(items * sizeof(float))
    if part == NULL:
        return -1
    r.x, r.A, r.N, r.M, r.nchunk, r.part, r.variant = x, A, N, M, nchunk, part, variant
    _parallel_for(items, 1, _absmax_chunks, &r, nthreads)
    for it in range(items):
        n = (it // nchunk) % N
        if part[it] > out[n] or part[it] != part[it]:
            out[n] = part[it]
    free(part)
    return 0


def minmax(const float[::1] x, int threads=1, str kernel="scalar"):
    """``(min, max)`` of a non-empty contiguous float32 array (threaded); both NaN when ``x`` has a NaN."""
    cdef float lo = 0, hi = 0
    cdef int variant = KERNELS[kernel], err
    if x.shape[0] == 0:
        raise ValueError("minmax of an empty array")
    if not qc_kernel_supported(variant):
        raise ValueError(f"kernel {kernel!r} is not supported by this CPU")
    with nogil:
        err = _minmax(&x[0], x.shape[0], threads, &lo, &hi, variant)
    if err:
        raise MemoryError("minmax: no memory for the partial results")
    return float(lo), float(hi)


def absmax_rows(const float[:, :, ::1] x, int threads=1, str kernel="scalar"):
    """float32 ``(N,)``: ``max |x[:, n, :]|`` of a contiguous ``(A, N, M)`` float32 array (NaN where a row has one)."""
    out = np.zeros(x.shape[1], np.float32)
    cdef float[::1] o = out
    cdef int variant = KERNELS[kernel], err
    if not qc_kernel_supported(variant):
        raise ValueError(f"kernel {kernel!r} is not supported by this CPU")
    if x.shape[0] * x.shape[1] * x.shape[2] == 0:
        return out
    with nogil:
        err = _absmax_rows(&x[0, 0, 0], x.shape[0], x.shape[1], x.shape[2], threads, &o[0], variant)
    if err:
        raise MemoryError("absmax_rows: no memory for the partial results")
    return out


# ----------------------------------------------------------------------------------------------------
# quantization of the input into Q / PS
# ----------------------------------------------------------------------------------------------------
cdef struct _QuantCtx:
    QuantJob *q
    int64_t per_img, rph, rows, rowlen
    int tail


cdef int64_t _quant_vectors(void *ctx, int64_t r0, int64_t r1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_quantize` for ``(N, C, 1, 1)`` float input: samples ``r0 .. r1-1``."""
    cdef QuantJob *q = (<_QuantCtx *> ctx).q
    cdef int64_t r
    for r in range(r0, r1):
        qc_quant((<const float *> q.x) + r * q.C, q.C, q.qs[r], q.z[r], q.qlo, q.qhi, q.abias,
                 q.Q + r * q.Ltot1, q.variant)
        if q.Ltot1 > q.C:
            memset(q.Q + r * q.Ltot1 + q.C, <int> ((q.z[r] + q.abias) & 255), q.Ltot1 - q.C)
        qc_block_sums(q.Q + r * q.Ltot1, 1, q.Ltot1, q.GNB, q.BCp, q.z[r] + 128, 0 if q.abias else 0x80,
                      q.PS + r * q.GNB, q.variant)
    return 0


cdef int64_t _quant_runs(void *ctx, int64_t r0, int64_t r1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_quantize`: work items ``r0 .. r1-1`` (a run of image rows of one sample each);
    returns the items whose row buffer could not be allocated."""
    cdef _QuantCtx *qc = <_QuantCtx *> ctx
    cdef QuantJob *q = qc.q
    cdef int64_t per_img = qc.per_img, rph = qc.rph, rows = qc.rows, rowlen = qc.rowlen
    cdef int tail = qc.tail
    cdef int64_t r, n, h, w, c, i, pix0, nh, L, npx, plane
    cdef int64_t fails = 0
    cdef int32_t zn
    cdef uint8_t zpad
    cdef uint8_t *tmp
    cdef uint8_t *qpix
    cdef float *xt
    cdef const int8_t *xi
    cdef const float *xf
    for r in range(r0, r1):
        n = r // per_img
        h = (r % per_img) * rph
        nh = q.H - h if q.H - h < rph else rph
        L = nh * rowlen                      # tmp bytes per channel (row) of this item
        npx = nh * q.W
        pix0 = n * q.H * q.W + h * q.W
        zn = q.z[n]
        # rows*L bytes, then (NC4HW4 with a partial tail quad) L floats for the tail quad's lane-masked copy;
        # L is a multiple of 4 there, so the floats are aligned
        tmp = <uint8_t *> qc_alloc(rows * L + (4 * L if tail else 0))
        if tmp == NULL:
            fails += 1
        else:
            xt = <float *> (tmp + rows * L)
            for c in range(rows):
                # source run: channel c (NCHW) or channel quad c (NC4HW4), rows h .. h+nh-1 of sample n
                if q.nc4hw4:
                    plane = ((c * q.N + n) * q.H + h) * rowlen
                else:
                    plane = ((n * q.C + c) * q.H + h) * rowlen
                if q.int8_input:
                    xi = (<const int8_t *> q.x) + plane
                    for i in range(L):
                        tmp[c * L + i] = <uint8_t> (xi[i] + q.abias)
                else:
                    xf = (<const float *> q.x) + plane
                    if tail and c == rows - 1:
                        for i in range(L):
                            xt[i] = xf[i] if i % 4 < tail else 0
                        xf = xt
                    qc_quant(xf, L, q.qs[n], zn, q.qlo, q.qhi, q.abias, tmp + c * L, q.variant)
            if q.contiguous and not q.nc4hw4:
                qc_transpose_u8(tmp, q.C, npx, L, q.Q + pix0 * q.Ltot1, q.Ltot1)
            elif q.contiguous:
                for c in range(rows):
                    for w in range(npx):
                        memcpy(q.Q + (pix0 + w) * q.Ltot1 + 4 * c, tmp + c * L + 4 * w, 4)
            if q.contiguous and q.Ltot1 > q.C:   # padded lanes (a plain loop: a memset call per pixel costs more)
                zpad = <uint8_t> ((zn + q.abias) & 255)
                for w in range(npx):
                    qpix = q.Q + (pix0 + w) * q.Ltot1
                    for i in range(q.C, q.Ltot1):
                        qpix[i] = zpad
            if not q.contiguous:
                for w in range(npx):
                    qpix = q.Q + (pix0 + w) * q.Ltot1
                    memset(qpix, <int> ((zn + q.abias) & 255), q.Ltot1)
                    for c in range(q.C):
                        qpix[q.chpos[c]] = tmp[(c // 4) * L + c % 4 + 4 * w] if q.nc4hw4 else tmp[c * L + w]
            free(tmp)
            qc_block_sums(q.Q + pix0 * q.Ltot1, npx, q.Ltot1, q.GNB, q.BCp, zn + 128, 0 if q.abias else 0x80,
                          q.PS + pix0 * q.GNB, q.variant)
    return fails


cdef int64_t _quantize(QuantJob *q, int nthreads) noexcept nogil:
    """Fill ``Q``/``PS`` from the input, a run of image rows of one sample per work item; returns the number of
    work items whose scratch could not be allocated (then ``Q``/``PS`` are incomplete: the caller must fail).

    Float input: ``xq = clip(roundf(x*qs[n]) + z[n], qlo, qhi)`` (half away from zero on the float32 product,
    then the zero point, as the oracle); int8 input (static path): ``xq = x``. Each run is quantized
    channel by channel into a ``[C][rows*W]`` buffer (vectorised), transposed into the pixel-major ``Q``
    (padded lanes = ``z + 128``), and ``PS`` is the per-block byte sum minus the padded zero points.
    NC4HW4 padding lanes (channels ``C .. 4*ceil(C/4)-1``) are never read as values: the tail quad is quantized
    from a copy with those lanes zeroed, and only real channels reach ``Q``.
    """
    cdef int64_t rows, rowlen, rph, per_img
    cdef _QuantCtx qc
    qc.q = q
    qc.tail = <int> (q.C % 4) if q.nc4hw4 and not q.int8_input else 0   # real lanes of the tail quad
    if q.nc4hw4:
        rows, rowlen = (q.C + 3) // 4, q.W * 4
    else:
        rows, rowlen = q.C, q.W
    # small inputs (GEMV rows) are quantized by one thread: no cross-thread barrier for tiny work
    cdef int nt = nthreads if q.N * q.H * q.W * q.C >= q.serial_values else 1
    if nt > q.N * q.H:
        nt = <int> (q.N * q.H)
    if q.H * q.W == 1 and not q.nc4hw4 and q.contiguous and not q.int8_input:
        # (N, C, 1, 1) float: each sample is C contiguous floats -> one vector call straight into its Q row
        q.used_threads = nt
        _parallel_for(q.N, 1, _quant_vectors, &qc, nt)
        return 0
    # work item = a run of rph image rows of one sample: the quantizer sees rph*W contiguous values per channel
    # (few calls, few masked tails) and the transpose writes rph*W consecutive pixels
    rph = (512 + rowlen - 1) // rowlen
    per_img = (q.H + rph - 1) // rph
    if q.N * per_img < 2 * nt:               # keep every thread busy on small batches
        per_img = min(q.H, (2 * nt + q.N - 1) // q.N)
    rph = (q.H + per_img - 1) // per_img
    per_img = (q.H + rph - 1) // rph
    q.used_threads = nt
    qc.per_img, qc.rph, qc.rows, qc.rowlen = per_img, rph, rows, rowlen
    return _parallel_for(q.N * per_img, 1, _quant_runs, &qc, nt)


cdef int64_t _float_rows(void *ctx, int64_t r0, int64_t r1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_float_pixels`: work items ``r0 .. r1-1``; returns the non-finite count."""
    cdef QuantJob *q = (<_QuantCtx *> ctx).q
    cdef int64_t rph = (<_QuantCtx *> ctx).rph, per_img = (<_QuantCtx *> ctx).per_img
    cdef int64_t r, n, h, nh, c, pix0, npx, i
    cdef int64_t bad = 0
    cdef float v
    cdef float *xf = <float *> q.Q
    cdef const float *x = <const float *> q.x
    cdef const float *src
    cdef float *dst
    for r in range(r0, r1):
        n = r // per_img
        h = (r % per_img) * rph
        nh = q.H - h if q.H - h < rph else rph
        npx = nh * q.W
        pix0 = (n * q.H + h) * q.W
        if q.Ltot1 > q.C or not q.contiguous:
            memset(xf + pix0 * q.Ltot1, 0, npx * q.Ltot1 * sizeof(float))
        if q.contiguous and not q.nc4hw4:
            bad += qc_pixels_f32(x + (n * q.C * q.H + h) * q.W, q.C, npx, q.H * q.W, xf + pix0 * q.Ltot1, q.Ltot1,
                                 q.variant)
            continue
        for c in range(q.C):
            if q.nc4hw4:
                src = x + ((((c // 4) * q.N + n) * q.H + h) * q.W) * 4 + c % 4
                dst = xf + pix0 * q.Ltot1 + q.chpos[c]
                for i in range(npx):
                    v = src[4 * i]
                    bad += not (v - v == 0)
                    dst[i * q.Ltot1] = v
            else:
                src = x + ((n * q.C + c) * q.H + h) * q.W
                dst = xf + pix0 * q.Ltot1 + q.chpos[c]
                for i in range(npx):
                    v = src[i]
                    bad += not (v - v == 0)
                    dst[i * q.Ltot1] = v
    return bad


cdef int64_t _float_pixels(QuantJob *q, int nthreads) noexcept nogil:
    """``act_quant=None``: the float32 input (NCHW or NC4HW4 pack 4) into pixel-major float rows of ``Ltot1``
    values at ``(float *) Q`` (channel ``c`` at ``chpos[c]``, padded lanes 0), a run of image rows per work item.
    Returns the number of NaN / inf values among the real channels (0: all finite)."""
    cdef _QuantCtx qc
    cdef int nt = nthreads
    qc.q = q
    qc.rph = (1024 + q.W - 1) // q.W
    qc.per_img = (q.H + qc.rph - 1) // qc.rph
    if nt > q.N * qc.per_img:
        nt = <int> (q.N * qc.per_img)
    q.used_threads = nt
    return _parallel_for(q.N * qc.per_img, 1, _float_rows, &qc, nt)


# ----------------------------------------------------------------------------------------------------
# per-tile helpers: im2col blit, GEMM over output-channel tiles, store
# ----------------------------------------------------------------------------------------------------
cdef inline void _next_pixel(int64_t *n, int64_t *oy, int64_t *ox, int64_t OH, int64_t OW) noexcept nogil:
    """Advance the output column ``(n, oy, ox)`` by one in row-major order."""
    ox[0] += 1
    if ox[0] == OW:
        ox[0] = 0
        oy[0] += 1
        if oy[0] == OH:
            oy[0] = 0
            n[0] += 1


cdef void _indirect(const ConvJob *j, int64_t p0, int ncols, const uint8_t **AP, int32_t *S) noexcept nogil:
    """Indirection table of columns ``p0 .. p0+ncols-1``: ``AP[e*K + tap]`` is the ``Q`` pixel row the tap reads
    (stride, padding and dilation applied) or ``zrow`` for out-of-image taps; ``S[e*GNB + b]`` the column's
    block sums (sums of ``PS`` over its in-image taps). Columns whose window lies inside the image (most of
    them) take a loop without bounds checks."""
    # locals: the stores below may alias *j as far as the compiler knows (-fno-strict-aliasing)
    cdef int e, ky, kx, b, t
    cdef int KH = j.KH, KW = j.KW, K = j.K, GNB = j.GNB
    cdef int64_t H = j.H, W = j.W, OH = j.OH, OW = j.OW, sh = j.sh, sw = j.sw, ph = j.ph, pw = j.pw
    cdef int64_t dh = j.dh, dw = j.dw, Ltot1 = j.pix_bytes
    cdef int64_t ylast = (KH - 1) * dh, xlast = (KW - 1) * dw, dhW = dh * W
    cdef const uint8_t *Q = j.Q
    cdef const uint8_t *zrow = j.zrow
    cdef const int32_t *PS = j.PS
    cdef int64_t n, oy, ox, iy, ix, iy0, ix0, row, rb
    cdef int32_t acc
    cdef bint rowok
    cdef const uint8_t **ap
    cdef int32_t *s
    if K == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0:
        # pointwise, stride 1, no padding: column p reads pixel p, its block sums are the pixel's
        for e in range(ncols):
            AP[e] = Q + (p0 + e) * Ltot1
        if PS != NULL:
            memcpy(S, PS + p0 * GNB, ncols * GNB * sizeof(int32_t))
        return
    n = p0 // j.OHW
    oy = (p0 % j.OHW) // OW
    ox = p0 % OW
    for e in range(ncols):
        ap = AP + e * K
        s = S + e * GNB
        iy0 = oy * sh - ph
        ix0 = ox * sw - pw
        if PS == NULL:
            # float activations: pointers only (the kernel needs no block sums)
            for ky in range(KH):
                iy = iy0 + ky * dh
                rowok = 0 <= iy < H
                for kx in range(KW):
                    ix = ix0 + kx * dw
                    ap[ky * KW + kx] = Q + ((n * H + iy) * W + ix) * Ltot1 if rowok and 0 <= ix < W else zrow
            _next_pixel(&n, &oy, &ox, OH, OW)
            continue
        if GNB == 1 and iy0 >= 0 and ix0 >= 0 and iy0 + ylast < H and ix0 + xlast < W:
            # interior column, one block
            acc = 0
            rb = (n * H + iy0) * W + ix0
            t = 0
            for ky in range(KH):
                for kx in range(KW):
                    row = rb + kx * dw
                    acc = acc + PS[row]
                    ap[t] = Q + row * Ltot1
                    t = t + 1
                rb = rb + dhW
            s[0] = acc
            _next_pixel(&n, &oy, &ox, OH, OW)
            continue
        acc = 0
        if GNB > 1:
            for b in range(GNB):
                s[b] = 0
        for ky in range(KH):
            iy = iy0 + ky * dh
            rowok = 0 <= iy < H
            for kx in range(KW):
                ix = ix0 + kx * dw
                if rowok and 0 <= ix < W:
                    row = (n * H + iy) * W + ix
                    ap[ky * KW + kx] = Q + row * Ltot1
                    if GNB == 1:
                        acc = acc + PS[row]
                    else:
                        for b in range(GNB):
                            s[b] += PS[row * GNB + b]
                else:
                    ap[ky * KW + kx] = zrow
        if GNB == 1:
            s[0] = acc
        _next_pixel(&n, &oy, &ox, OH, OW)


cdef inline void _sym_params(float amax, float *qs, float *dx) noexcept nogil:
    """Symmetric int8 parameters of the range ``[-amax, amax]`` (``amax`` finite, >= 0): ``qs = 127/amax``,
    ``dx = amax/127``; 1 and 1 when ``amax`` is 0 or ``127/amax`` overflows (the oracle's rule)."""
    cdef float q
    qs[0] = 1
    dx[0] = 1
    if amax > 0:
        q = <float> 127.0 / amax
        if q <= 3.4028234663852886e38:
            qs[0] = q
            dx[0] = amax / <float> 127.0


cdef int _block_cols(const ConvJob *j, int64_t p0, int ncols, uint8_t *A, const uint8_t **AP, int32_t *S,
                     float *DXB) noexcept nogil:
    """``act_quant="block"``: quantize columns ``p0 .. p0+ncols-1`` into their own ``A`` rows (``Lcol`` bytes each,
    fine block ``f`` at ``f*K*BCp``, tap ``t`` at ``+t*BCp``: the L order of the weight tiles), symmetric per
    (column, group, activation block of ``AB`` channels x all taps) exactly as :func:`qconv.reference.quantize_columns`;
    ``AP`` points each tap at its run, ``S`` gets the per-(column, fine block) sums of ``xq``, ``DXB`` the
    activation scale of each fine block. Returns the number of non-finite block maxima (NaN / inf input)."""
    cdef int e, ky, kx, t, g, b, f, gf
    cdef int K = j.K, KH = j.KH, KW = j.KW, GNB = j.GNB, NB = j.NB, FB = j.BC, BCp = j.BCp, AB = j.AB
    cdef int Cg = j.C // j.G
    cdef int nfpa = j.AB // j.BC
    cdef int nab = Cg // j.AB
    cdef int abias = j.abias
    cdef int64_t Lcol = j.Lcol, blen = <int64_t> j.K * j.BCp, ldx = j.C
    cdef int64_t H = j.H, W = j.W, OH = j.OH, OW = j.OW, sh = j.sh, sw = j.sw, ph = j.ph, pw = j.pw
    cdef int64_t dh = j.dh, dw = j.dw
    cdef int64_t n, oy, ox, iy, ix, iy0, ix0, c0
    cdef int bad = 0
    cdef float amax, v, qs, dx
    cdef uint8_t *col
    cdef uint8_t *dst
    cdef const float **px
    n = p0 // j.OHW
    oy = (p0 % j.OHW) // OW
    ox = p0 % OW
    for e in range(ncols):
        col = A + e * Lcol
        # the column's input pixel per tap (NULL: padding), kept in its own AP row until the row is filled below
        px = <const float **> (AP + e * K)
        iy0 = oy * sh - ph
        ix0 = ox * sw - pw
        for ky in range(KH):
            iy = iy0 + ky * dh
            for kx in range(KW):
                ix = ix0 + kx * dw
                if 0 <= iy < H and 0 <= ix < W:
                    px[ky * KW + kx] = j.xp + ((n * H + iy) * W + ix) * ldx
                else:
                    px[ky * KW + kx] = NULL
        for g in range(j.G):
            for b in range(nab):
                c0 = <int64_t> g * Cg + <int64_t> b * AB
                amax = 0
                for t in range(K):
                    if px[t] != NULL:
                        v = qc_absmax(px[t] + c0, AB, j.variant)
                        if v > amax or v != v:
                            amax = v
                if not (amax <= 3.4028234663852886e38):
                    bad += 1
                _sym_params(amax, &qs, &dx)
                for f in range(nfpa):
                    gf = g * NB + b * nfpa + f
                    dst = col + gf * blen
                    for t in range(K):
                        if px[t] != NULL:
                            qc_quant(px[t] + c0 + f * FB, FB, qs, 0, -127, 127, abias, dst + t * BCp, j.variant)
                            if BCp > FB:
                                memset(dst + t * BCp + FB, abias, BCp - FB)
                        else:
                            memset(dst + t * BCp, abias, BCp)
                    DXB[e * GNB + gf] = dx
        qc_block_sums(col, 1, Lcol, GNB, blen, 128, 0 if abias else 0x80, S + e * GNB, j.variant)
        for t in range(K):
            AP[e * K + t] = col + t * BCp
        _next_pixel(&n, &oy, &ox, OH, OW)
    return bad


cdef void _gemm(const ConvJob *j, const uint8_t **AP, const int32_t *S, const float *dxc, float *OUT, int ncols,
                int g, int k0, int nk, int t0, int nt, int tid) noexcept nogil:
    """Blocks ``k0 .. k0+nk-1`` of channel tiles ``t0 .. t0+nt-1`` of group ``g`` for ``ncols`` columns (table
    ``AP``) into ``OUT``: the float partial sums start at block 0 and are finished after the last block. ``tid``:
    the calling thread's index in the parallel-for (its packed float weights, float activations)."""
    cdef qc_gemm_args a
    # tables are tile-major like the weights: (G, OCU, NB, UNIT)
    cdef int64_t tab = (<int64_t> g * j.OCU + t0) * j.NB * QC_UNIT + <int64_t> k0 * QC_UNIT
    a.aptr = AP
    a.ldp = j.K
    a.a_off = (<int64_t> g * j.NB + k0) * j.a_bs
    a.a_bstride = j.a_bs
    # block mode: the per-(column, block) scales sit beside S in the slot's DXB (same offsets)
    a.dxb = (j.DXB + (S - j.S) + g * j.NB + k0) if j.block_mode else NULL
    a.w = j.w + g * j.w_gstride + k0 * j.w_bstride + t0 * j.w_tstride
    a.w_bstride = j.w_bstride
    a.w_tstride = j.w_tstride
    a.colsum = S + g * j.NB + k0
    a.lds = j.GNB
    a.wsx = j.wsx + tab
    a.scale = (j.scale + tab) if j.scale != NULL else NULL
    a.offset = (j.offset + tab) if j.offset != NULL else NULL
    a.hscale = (j.hscale + tab) if j.hscale != NULL else NULL
    a.hoffset = (j.hoffset + tab) if j.hoffset != NULL else NULL
    a.ldt = QC_UNIT
    a.ldtt = <int64_t> j.NB * QC_UNIT
    a.dx = dxc
    a.bias = j.bias + <int64_t> g * j.OCp + <int64_t> t0 * QC_UNIT
    a.out = OUT + <int64_t> g * j.OCp + <int64_t> t0 * QC_UNIT
    a.ldo = j.ldo
    a.nblocks = nk
    a.ntiles = nt
    a.nvalid = j.Og - t0 * QC_UNIT
    a.first = k0 == 0
    a.last = k0 + nk == j.NB
    a.taps = j.K
    a.bq = j.BCp // 4
    a.ncols = ncols
    a.bits = j.bits
    a.zpu = j.zpu
    a.asigned = j.abias == 0
    a.lo = j.lo
    a.hi = j.hi
    if j.float_act:
        a.wf = j.WF + <int64_t> tid * j.wf_len   # this thread's packed float weights
        qc_gemm_f32(&a, j.variant)
        return
    a.wa = (j.wa + g * j.wa_gstride + k0 * j.wa_bstride + t0 * j.wa_tstride) if j.wa != NULL else NULL
    a.wa_bstride = j.wa_bstride
    a.wa_tstride = j.wa_tstride
    a.kp = j.kp
    a.amx_min = j.amx_min
    qc_gemm(&a, j.variant)


cdef inline void _gemm_range(const ConvJob *j, const uint8_t **AP, const int32_t *S, const float *dxc, float *OUT,
                             int ncols, int g, int t0, int nt, int tid) noexcept nogil:
    """Every block of channel tiles ``t0 .. t0+nt-1`` (the kernels run tiles outer, blocks inner: the tile-major
    weights and tables of each tile are one sequential stream)."""
    _gemm(j, AP, S, dxc, OUT, ncols, g, 0, j.NB, t0, nt, tid)


cdef void _store(const ConvJob *j, float *OUT, int64_t p0, int ncols) noexcept nogil:
    """Scatter ``OUT`` rows (columns ``p0 ..``) into the NCHW or NC4HW4 output (float32, or int8: ``OUT`` is
    requantized in place first, ``qc_requant``)."""
    cdef int o, e, so, run, i
    cdef int64_t n, pix, idx
    cdef float *yf = <float *> j.y
    cdef int8_t *yi = <int8_t *> j.y
    if j.tail:
        qc_tail(OUT, ncols * j.ldo, j.tail, j.variant)
    if j.pa_s != NULL:
        qc_affine_rows(OUT, ncols, j.ldo, j.ldo, j.pa_s, j.pa_t, j.variant)
    if j.out_int8:
        qc_requant(OUT, ncols * j.ldo, j.oscale, j.ozp, j.variant)
    if not j.out_nc4hw4 and not j.out_int8 and j.OHW == 1:
        # (N, O, 1, 1): column p is output row p
        for e in range(ncols):
            if j.G == 1:
                memcpy(yf + (p0 + e) * j.O, OUT + e * j.ldo, j.O * sizeof(float))
            else:
                for o in range(j.O):
                    yf[(p0 + e) * j.O + o] = OUT[e * j.ldo + j.oidx[o]]
        return
    if j.out_nc4hw4 and not j.out_int8 and j.Og % 4 == 0:
        for o in range(0, j.O, 4):
            so = j.oidx[o]
            for e in range(ncols):
                memcpy(yf + ((o >> 2) * j.P + p0 + e) * 4, OUT + e * j.ldo + so, 4 * sizeof(float))
        return
    if j.out_nc4hw4:
        for o in range(j.O):
            so = j.oidx[o]
            for e in range(ncols):
                idx = ((o >> 2) * j.P + p0 + e) * 4 + (o & 3)
                if j.out_int8:
                    yi[idx] = <int8_t> OUT[e * j.ldo + so]
                else:
                    yf[idx] = OUT[e * j.ldo + so]
        return
    # NCHW: per run of the tile's columns inside one image, each channel's pixels are consecutive
    e = 0
    while e < ncols:
        n = (p0 + e) // j.OHW
        pix = p0 + e - n * j.OHW
        run = <int> (ncols - e if ncols - e < j.OHW - pix else j.OHW - pix)
        if not j.out_int8:
            qc_store_nchw(OUT + e * j.ldo, j.ldo, j.G, j.Og, j.OCp, yf + n * j.O * j.OHW + pix, NULL, j.OHW, run,
                          j.variant)
        else:
            qc_store_nchw(OUT + e * j.ldo, j.ldo, j.G, j.Og, j.OCp, NULL, yi + n * j.O * j.OHW + pix, j.OHW, run,
                          j.variant)
        e += run


cdef inline int _tile_inputs(const ConvJob *j, int64_t tile, int slot, int ncols) noexcept nogil:
    """Per-column scales and the indirection table of one column tile, into scratch slot ``slot`` (block mode:
    the quantized columns themselves); returns the number of non-finite block maxima (block mode)."""
    cdef int64_t p0 = tile * j.tile_cols
    cdef int e
    cdef float *dxc = j.DXC + <int64_t> slot * j.tile_cols
    if j.block_mode:
        for e in range(ncols):
            dxc[e] = 1
        return _block_cols(j, p0, ncols, j.A + <int64_t> slot * j.tile_cols * j.Lcol,
                           j.AP + <int64_t> slot * j.tile_cols * j.K, j.S + <int64_t> slot * j.tile_cols * j.GNB,
                           j.DXB + <int64_t> slot * j.tile_cols * j.GNB)
    for e in range(ncols):
        dxc[e] = j.dxn[(p0 + e) // j.OHW]
    _indirect(j, p0, ncols, j.AP + <int64_t> slot * j.tile_cols * j.K, j.S + <int64_t> slot * j.tile_cols * j.GNB)
    return 0


cdef int _tile_all(const ConvJob *j, int64_t tile, int slot) noexcept nogil:
    """One column tile, every output channel: indirection table, GEMM per (group, channel tile), store; ``slot``
    is the calling thread's index (its scratch)."""
    cdef int64_t p0 = tile * j.tile_cols
    cdef int ncols = <int> (j.P - p0 if j.P - p0 < j.tile_cols else j.tile_cols)
    cdef int g
    cdef float *OUT = j.OUT + <int64_t> slot * j.tile_cols * j.ldo
    cdef int bad = _tile_inputs(j, tile, slot, ncols)
    for g in range(j.G):
        _gemm_range(j, j.AP + <int64_t> slot * j.tile_cols * j.K, j.S + <int64_t> slot * j.tile_cols * j.GNB,
                    j.DXC + <int64_t> slot * j.tile_cols, OUT, ncols, g, 0, j.OCU, slot)
    _store(j, OUT, p0, ncols)
    return bad


cdef struct _RunCtx:
    const ConvJob *j
    int chunk, nchunks


cdef int64_t _run_tiles(void *ctx, int64_t t0, int64_t t1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_run`: column tiles ``t0 .. t1-1``, scratch slot ``tid``."""
    cdef int64_t tile, bad = 0
    for tile in range(t0, t1):
        bad += _tile_all((<_RunCtx *> ctx).j, tile, tid)
    return bad


cdef int64_t _run_channels(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body of :func:`_run`'s channel split: items ``i0 .. i1-1`` (column tile, group, chunk of
    channel tiles), each into its column tile's slot."""
    cdef const ConvJob *j = (<_RunCtx *> ctx).j
    cdef int chunk = (<_RunCtx *> ctx).chunk, nchunks = (<_RunCtx *> ctx).nchunks
    cdef int64_t item, tile, p0
    cdef int g, t, ncols
    for item in range(i0, i1):
        tile = item // (j.G * nchunks)
        g = <int> ((item // nchunks) % j.G)
        t = <int> (item % nchunks) * chunk
        p0 = tile * j.tile_cols
        ncols = <int> (j.P - p0 if j.P - p0 < j.tile_cols else j.tile_cols)
        _gemm_range(j, j.AP + tile * j.tile_cols * j.K, j.S + tile * j.tile_cols * j.GNB, j.DXC + tile * j.tile_cols,
                    j.OUT + tile * j.tile_cols * j.ldo, ncols, g, t, chunk if t + chunk <= j.OCU else j.OCU - t, tid)
    return 0


cdef int64_t _run(ConvJob *j, int nthreads) noexcept nogil:
    """The conv over all columns: split over column tiles, or over output-channel tiles when there are fewer
    column tiles than threads. Each (column, channel tile) is computed by the same instructions either way,
    so the result does not depend on the split or the thread count. Sets ``j.used_threads`` and
    ``j.channel_split`` (what ran, for :attr:`qconv.cpu.CpuEngine.last_call`)."""
    cdef int64_t ntiles = (j.P + j.tile_cols - 1) // j.tile_cols
    cdef int64_t tile
    cdef int64_t p0
    cdef int ncols
    cdef int64_t bad = 0
    cdef _RunCtx r
    r.j = j
    j.used_threads = nthreads
    j.channel_split = 0
    if ntiles >= nthreads or nthreads == 1:
        return _parallel_for(ntiles, _chunk_of(ntiles, nthreads), _run_tiles, &r, nthreads)
    j.channel_split = 1
    # channel split: slot = tile index (ntiles < nthreads slots exist); tiny serial set-up and store
    for tile in range(ntiles):
        p0 = tile * j.tile_cols
        ncols = <int> (j.P - p0 if j.P - p0 < j.tile_cols else j.tile_cols)
        bad += _tile_inputs(j, tile, <int> tile, ncols)
    # work item = (column tile, group, chunk of channel tiles); ~4 items per thread for balance
    r.chunk = (j.OCU + 4 * nthreads - 1) // (4 * nthreads)
    r.nchunks = (j.OCU + r.chunk - 1) // r.chunk
    _parallel_for(ntiles * j.G * r.nchunks, 1, _run_channels, &r, nthreads)
    for tile in range(ntiles):
        p0 = tile * j.tile_cols
        ncols = <int> (j.P - p0 if j.P - p0 < j.tile_cols else j.tile_cols)
        _store(j, j.OUT + tile * j.tile_cols * j.ldo, p0, ncols)
    return bad


cdef void _fill_quant(QuantJob *q, x, int nchw_input, int C, const float[::1] qs, const int32_t[::1] z, int qlo,
                      int qhi, const int32_t[::1] chpos, int64_t Ltot1, int64_t GNB, int64_t BCp, int variant,
                      uint8_t *Q, int32_t *PS, int contiguous=-1, int abias=128, int64_t serial_values=0) except *:
    """Fill a :c:type:`QuantJob` for ``x`` (validated shapes) and the prepared channel map; inputs of fewer than
    ``serial_values`` values will be quantized on one thread."""
    cdef int c
    cdef const uint8_t[::1] xb = x.reshape(-1).view(np.uint8)
    q.x = <const void *> &xb[0]
    q.int8_input = x.dtype == np.int8
    q.nc4hw4 = not nchw_input
    if nchw_input:
        q.N, q.C, q.H, q.W = x.shape[0], C, x.shape[2], x.shape[3]
    else:
        q.N, q.C, q.H, q.W = x.shape[1], C, x.shape[2], x.shape[3]
    q.chpos = &chpos[0]
    q.qs = &qs[0]
    q.z = &z[0]
    q.qlo, q.qhi = qlo, qhi
    q.Ltot1, q.GNB, q.BCp = Ltot1, GNB, BCp
    q.contiguous = contiguous
    if contiguous < 0:
        q.contiguous = 1
        for c in range(C):
            if chpos[c] != c:
                q.contiguous = 0
                break
    q.variant = variant
    q.abias = abias
    q.serial_values = serial_values
    q.used_threads = 0
    q.Q = Q
    q.PS = PS


# ----------------------------------------------------------------------------------------------------
# the layer geometry (typed record) and the prepared layer
# ----------------------------------------------------------------------------------------------------
cdef class ConvGeometry:
    """The geometry of one conv layer as the native plan needs it, one typed field per quantity (names as in
    :class:`qconv.layouts.gemm_tiles.TiledWeightLayout`; all keyword-only, ints unless noted):

    ``in_channels``, ``out_channels``, ``groups``; ``n_blocks`` (GEMM blocks per group), ``block_channels``
    (input channels per block), ``block_icl`` (the block's channels rounded up to 4: the tap stride of the L
    order, MNN's ICL); ``kernel_h``/``kernel_w``, ``stride_h``/``stride_w``, ``pad_h``/``pad_w``,
    ``dilation_h``/``dilation_w``; ``oc_tiles`` (32-channel tiles per group), ``bits`` (8 or 4), ``tile_cols``
    (output columns per column tile); ``w_tile_stride``/``w_block_stride``/``w_group_stride`` (bytes between the
    weight tiles' channel tiles, blocks and groups); ``lo``/``hi`` (float activation clamp); ``block_mode`` (1 for
    ``act_quant="block"``) and ``act_block`` (input channels per activation block there, a multiple of
    ``block_channels``; 0 = ``block_channels``); ``signed_input`` (1: the AVX2 sign form); ``tail`` (the activation
    after the clamp, applied to each tile before its store: 0, or :func:`qconv._validate.tail_code`'s code of
    hardswish or silu); ``float_act`` (1:
    ``act_quant=None``, float32 activations: the pixel-major input holds floats and ``qconv_float.h`` runs).

    Derived (properties): ``taps``, ``group_out_channels``, ``gemm_blocks`` (groups * n_blocks), ``oc_padded``.
    """

    def __init__(self, *, int in_channels, int out_channels, int groups, int n_blocks, int block_channels,
                 int block_icl, int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_h, int pad_w,
                 int dilation_h, int dilation_w, int oc_tiles, int bits, int tile_cols, int64_t w_tile_stride,
                 int64_t w_block_stride, int64_t w_group_stride, float lo, float hi, int block_mode=0,
                 int act_block=0, int signed_input=0, int tail=0, int float_act=0):
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups),
                        ("n_blocks", n_blocks), ("block_channels", block_channels), ("kernel_h", kernel_h),
                        ("kernel_w", kernel_w), ("stride_h", stride_h), ("stride_w", stride_w),
                        ("dilation_h", dilation_h), ("dilation_w", dilation_w), ("oc_tiles", oc_tiles),
                        ("tile_cols", tile_cols)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        if tail not in (0,) + tuple(tail_code(a) for a in TAIL_ACTIVATIONS) or float_act not in (0, 1):
            raise ValueError(f"tail must be 0 or a tail activation's code, float_act 0 or 1 (got {tail}, {float_act})")
        if float_act and (block_mode or signed_input):
            raise ValueError("float_act excludes block_mode and signed_input")
        if signed_input not in (0, 1) or (signed_input and bits != 8):
            raise ValueError("signed_input must be 0 or 1, and 1 only with int8 weights")
        if pad_h < 0 or pad_w < 0 or act_block < 0 or w_tile_stride < 0 or w_block_stride < 0 or w_group_stride < 0:
            raise ValueError("paddings, act_block and strides must be >= 0")
        if in_channels % groups or out_channels % groups or (in_channels // groups) != n_blocks * block_channels:
            raise ValueError("groups must divide the channels, n_blocks * block_channels = input channels per group")
        if block_icl < block_channels or block_icl % 4:
            raise ValueError("block_icl must be a multiple of 4 covering block_channels")
        if oc_tiles * QC_UNIT < out_channels // groups:
            raise ValueError("oc_tiles * 32 must cover the output channels per group")
        act_block = act_block or block_channels
        if block_mode and (act_block % block_channels or (in_channels // groups) % act_block):
            raise ValueError("act_block must be a multiple of block_channels and divide the channels per group")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.n_blocks, self.block_channels, self.block_icl = n_blocks, block_channels, block_icl
        self.kernel_h, self.kernel_w, self.stride_h, self.stride_w = kernel_h, kernel_w, stride_h, stride_w
        self.pad_h, self.pad_w, self.dilation_h, self.dilation_w = pad_h, pad_w, dilation_h, dilation_w
        self.oc_tiles, self.bits, self.tile_cols = oc_tiles, bits, tile_cols
        self.w_tile_stride, self.w_block_stride, self.w_group_stride = w_tile_stride, w_block_stride, w_group_stride
        self.lo, self.hi = lo, hi
        self.block_mode, self.act_block = block_mode, act_block
        self.signed_input = signed_input
        self.tail = tail
        self.float_act = float_act

    @property
    def taps(self):
        return self.kernel_h * self.kernel_w

    @property
    def group_out_channels(self):
        return self.out_channels // self.groups

    @property
    def gemm_blocks(self):
        return self.groups * self.n_blocks

    @property
    def oc_padded(self):
        return self.oc_tiles * QC_UNIT

    def out_hw(self, int h, int w):
        """Output size ``(OH, OW)`` of an ``h x w`` input."""
        return ((h + 2 * self.pad_h - self.dilation_h * (self.kernel_h - 1) - 1) // self.stride_h + 1,
                (w + 2 * self.pad_w - self.dilation_w * (self.kernel_w - 1) - 1) // self.stride_w + 1)

    def __repr__(self):
        names = ("in_channels", "out_channels", "groups", "n_blocks", "block_channels", "block_icl", "kernel_h",
                 "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "oc_tiles", "bits",
                 "tile_cols", "w_tile_stride", "w_block_stride", "w_group_stride", "lo", "hi", "block_mode",
                 "act_block", "signed_input", "tail", "float_act")
        return "ConvGeometry(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"


cdef void _geometry_into(ConvGeometry geo, ConvJob *j):
    """The layer constants of ``geo`` into the job (its short C names: C, O, G, Og, NB, BC, BCp = block_icl, K, KH,
    KW, sh, sw, ph, pw, dh, dw, GNB, OCU, OCp, ...) plus what follows from them (abias, Ltot1, ldo, a_bs, Lcol)."""
    j.C, j.O, j.G = geo.in_channels, geo.out_channels, geo.groups
    j.Og = geo.out_channels // geo.groups
    j.NB, j.BC, j.BCp = geo.n_blocks, geo.block_channels, geo.block_icl
    j.KH, j.KW, j.sh, j.sw, j.ph, j.pw, j.dh, j.dw = (geo.kernel_h, geo.kernel_w, geo.stride_h, geo.stride_w,
                                                      geo.pad_h, geo.pad_w, geo.dilation_h, geo.dilation_w)
    j.K = j.KH * j.KW
    j.GNB = j.G * j.NB
    j.OCU = geo.oc_tiles
    j.OCp = geo.oc_tiles * QC_UNIT
    j.bits = geo.bits
    j.tile_cols = geo.tile_cols
    j.abias = 128 if j.bits == 8 and not geo.signed_input else 0
    j.Ltot1 = <int64_t> j.GNB * j.BCp
    j.float_act = geo.float_act
    j.pix_bytes = 4 * j.Ltot1 if j.float_act else j.Ltot1
    j.ldo = <int64_t> j.G * j.OCp
    j.w_tstride, j.w_bstride, j.w_gstride = geo.w_tile_stride, geo.w_block_stride, geo.w_group_stride
    j.lo, j.hi = geo.lo, geo.hi
    j.tail = geo.tail
    j.block_mode = geo.block_mode
    j.AB = geo.act_block
    j.a_bs = (<int64_t> j.K * j.BCp) if j.block_mode else (4 * j.BCp if j.float_act else j.BCp)
    j.Lcol = <int64_t> j.GNB * j.K * j.BCp


cdef class ConvPlan:
    """Prepared weights + geometry of one conv; :meth:`forward` runs quantization and the tiled GEMM.

    Built by :class:`qconv.cpu.CpuEngine`; the arrays are kept alive here and read by the nogil workers.
    ``w``: packed tiles (uint8 view of a tile-major :class:`TiledWeightLayout`); ``wsx`` int32 and
    ``scale``/``offset`` float32 or float16 (both the same dtype), all ``(G, OCU, NB, UNIT)`` (tile-major like the
    weights); ``bias`` float32 ``(G, OCp)``; ``oidx`` int32 ``(O,)``; ``chpos`` int32 ``(C,)``; ``geo``: the
    layer's :class:`ConvGeometry`.
    """
    cdef ConvJob job
    cdef object keep, keep_scratch, pa
    cdef const float[::1] pas, pat
    cdef const uint8_t[::1] w, wa
    cdef const int32_t[::1] wsx, oidx, chpos
    cdef const float[::1] scale, offset, bias
    cdef const uint16_t[::1] hscale, hoffset
    cdef uint8_t[::1] Q, zrow, APb, Ab
    cdef int32_t[::1] PS, S, zb
    cdef float[::1] OUT, DXC, DXBb, WFb, qsb, dxb
    cdef int contiguous, bound_slots
    cdef int64_t bound_pixels
    cdef public int variant
    cdef readonly ConvGeometry geometry
    # (quantization threads, GEMM threads, 1 if the GEMM split output-channel tiles) of the last forward call;
    # quantization threads 0 in block mode (columns are quantized inside the GEMM loop)
    cdef readonly tuple last_threads

    def __init__(self, w, wsx, scale, offset, bias, oidx, chpos, ConvGeometry geo not None, int variant):
        cdef ConvJob *j = &self.job
        self.keep = (w, wsx, scale, offset, bias, oidx, chpos)
        self.w = w
        self.wsx = wsx
        self.bias = bias
        self.oidx = oidx
        self.chpos = chpos
        self.variant = variant
        memset(&self.job, 0, sizeof(ConvJob))
        _geometry_into(geo, j)
        self.geometry = geo
        j.w = &self.w[0]
        j.wsx = &self.wsx[0]
        j.scale = j.offset = NULL
        j.hscale = j.hoffset = NULL
        if scale.dtype == np.float16:
            if offset is not None and offset.dtype != np.float16:
                raise TypeError("scale and offset tables must have the same dtype")
            self.hscale = scale.view(np.uint16)
            j.hscale = &self.hscale[0]
            if offset is not None:
                self.hoffset = offset.view(np.uint16)
                j.hoffset = &self.hoffset[0]
        else:
            self.scale = scale
            j.scale = &self.scale[0]
            if offset is not None:
                self.offset = offset
                j.offset = &self.offset[0]
        j.bias = &self.bias[0]
        j.oidx = &self.oidx[0]
        j.variant = variant
        self.contiguous = int(all(int(chpos[c]) == c for c in range(j.C)))
        self.bound_slots = 0
        self.bound_pixels = -1

    def set_amx(self, wa, int64_t gstride, int64_t bstride, int64_t tstride, int kp, int amx_min=4):
        """Bind the AMX weight tiles: ``wa`` a uint8 view of a tile-major
        :class:`~qconv.layouts.amx.AmxWeightLayout` of the same weights (strides in bytes, ``kp`` its padded block
        bytes, a multiple of 64). With the ``amx`` kernel, GEMM calls of at least ``amx_min`` columns then run on
        AMX tiles (fewer: the VNNI kernel on ``w``; the results are bitwise the same either way)."""
        cdef ConvJob *j = &self.job
        if kp % 64 or kp < j.K * j.BCp or amx_min < 1:
            raise ValueError("kp must be a multiple of 64 covering a block, amx_min >= 1")
        if wa.shape[0] < j.G * gstride:
            raise ValueError("wa too short")
        self.wa = wa
        self.keep = self.keep + (wa,)
        j.wa = &self.wa[0]
        j.wa_gstride, j.wa_bstride, j.wa_tstride, j.kp, j.amx_min = gstride, bstride, tstride, kp, amx_min

    def set_post_affine(self, s, t):
        """``post_affine``: float32 ``(ldo,)`` scale and shift in the out scratch's channel order (padded channels
        anything finite), applied as ``v * s + t`` after the activation; None, None: off."""
        cdef ConvJob *j = &self.job
        if s is None:
            self.pa = None
            j.pa_s = j.pa_t = NULL
            return
        if s.dtype != np.float32 or t.dtype != np.float32 or s.shape[0] != j.ldo or t.shape[0] != j.ldo:
            raise ValueError("post_affine tables must be float32 (ldo,)")
        self.pa = (np.ascontiguousarray(s), np.ascontiguousarray(t))
        self.pas, self.pat = self.pa
        j.pa_s, j.pa_t = &self.pas[0], &self.pat[0]

    @property
    def amx_bound(self):
        """True once :meth:`set_amx` bound AMX tiles."""
        return self.job.wa != NULL

    def bind(self, Q, PS, zrow, AP, S, OUT, DXC, qs, z, dx, int slots, int64_t pixels, A=None, DXB=None, WF=None):
        """Use these scratch arrays (sized by :class:`qconv.cpu.CpuEngine` for ``slots`` threads and an input of
        ``pixels`` = N*H*W; with ``float_act`` ``Q`` holds ``4*Ltot1`` bytes a pixel, ``zrow`` ``4*Ltot1`` bytes, ``PS``
        may be None and ``WF`` float32 holds ``slots * wf_len`` values) in the following :meth:`act_params` / :meth:`forward` calls; ``qs``/``z``/``dx``: the
        per-sample activation parameters, float32 / int32 / float32 ``(N,)``. Block mode also needs ``A`` uint8
        ``(slots*tile_cols*Lcol,)`` and ``DXB`` float32 ``(slots*tile_cols*GNB,)``."""
        cdef ConvJob *j = &self.job
        if qs.shape[0] < 1 or z.shape[0] != qs.shape[0] or dx.shape[0] != qs.shape[0]:
            raise ValueError("qs, z, dx must have one entry per sample")
        self.qsb, self.zb, self.dxb = qs, z, dx
        if j.block_mode:
            if (A is None or DXB is None or A.shape[0] < slots * j.tile_cols * j.Lcol
                    or DXB.shape[0] < slots * j.tile_cols * j.GNB):
                raise ValueError("block mode scratch (A, DXB) missing or too small")
            self.Ab = A
            self.DXBb = DXB
        if (AP.dtype != np.uintp or AP.shape[0] < slots * j.tile_cols * j.K or zrow.shape[0] < j.pix_bytes
                or Q.shape[0] < pixels * j.pix_bytes or (not j.float_act and PS.shape[0] < pixels * j.GNB)
                or S.shape[0] < slots * j.tile_cols * j.GNB or OUT.shape[0] < slots * j.tile_cols * j.ldo
                or DXC.shape[0] < slots * j.tile_cols):
            raise ValueError("scratch buffers too small")
        if j.float_act:
            if WF is None or WF.shape[0] < slots * self.wf_len:
                raise ValueError("float_act scratch (WF) missing or too small")
            self.WFb = WF
        self.Q, self.PS, self.zrow, self.S, self.OUT, self.DXC = Q, PS, zrow, S, OUT, DXC
        self.APb = AP.view(np.uint8)
        self.keep_scratch = (Q, PS, zrow, AP, S, OUT, DXC, qs, z, dx, A, DXB, WF)
        self.bound_slots = slots
        self.bound_pixels = pixels

    def release(self):
        """Drop the bound scratch (the next call needs :meth:`bind` again): the plan then holds no reference to
        the scratch arrays, so whoever owns them (the engine's scratch arena) decides when they are freed."""
        self.Q = self.PS = self.zrow = self.S = self.OUT = self.DXC = self.APb = None
        self.qsb = self.zb = self.dxb = self.Ab = self.DXBb = self.WFb = None
        self.keep_scratch = None
        self.bound_slots = 0
        self.bound_pixels = -1

    @property
    def bound(self):
        """True while scratch is bound (:meth:`bind` ... :meth:`release`)."""
        return self.bound_slots > 0

    @property
    def ldo(self):
        return self.job.ldo

    @property
    def lcol(self):
        return self.job.Lcol

    @property
    def wf_len(self):
        """float_act: floats of one thread's GEMM scratch: a channel tile's block of packed float weights
        (``128 * taps * bq``), then partial sums and block sums of up to ``tile_cols`` columns (``33 * tile_cols``)."""
        return 32 * self.job.K * self.job.BCp + 33 * self.job.tile_cols

    def act_params(self, x, int nchw_input, int row_mode, int threads):
        """Dynamic activation parameters of float32 ``x`` (NCHW, or NC4HW4 pack 4) into the bound ``qs``/``z``/``dx``:
        per tensor (``row_mode`` 0, asymmetric, as :func:`fill_tensor_params`) or per sample (1, symmetric, as
        :func:`fill_row_params`), over the real channels only (NC4HW4 padding lanes are left out). Returns False
        when a real value is NaN or inf; ``MemoryError`` when the native scratch cannot be allocated."""
        cdef const uint8_t[::1] xb = x.reshape(-1).view(np.uint8)
        cdef const float *xf = <const float *> &xb[0]
        cdef int64_t n = x.shape[0] if nchw_input else x.shape[1], A, M, full
        cdef int ok, tail
        cdef int variant = self.job.variant
        if self.bound_slots == 0 or self.qsb.shape[0] < n:
            raise ValueError("qs, z, dx are not bound for this batch")
        if x.dtype != np.float32 or x.size == 0:
            raise ValueError("x must be a non-empty float32 array")
        A = 1 if nchw_input else x.shape[0]
        M = x.size // (A * n)
        tail = 0 if nchw_input else self.job.C % 4     # NC4HW4: real lanes of the last quad (0: all four)
        full = (A - 1 if tail else A) * n * M
        with nogil:
            if row_mode:
                ok = _fill_rows(xf, A, n, M, tail, threads, variant, &self.qsb[0], &self.zb[0], &self.dxb[0])
            else:
                ok = _fill_tensor(xf, full, xf + full, n * M // 4, tail, threads, variant, &self.qsb[0],
                                  &self.zb[0], &self.dxb[0], self.qsb.shape[0])
        if ok < 0:
            raise MemoryError("the CPU engine's activation range pass could not allocate its partial results")
        return ok == 1

    def forward(self, x, int nchw_input, int qlo, int qhi, y, int nc4hw4_output, oscale, int ozp, int threads,
                xp=None, int64_t quant_serial=0):
        """Run the conv on up to ``threads`` threads. ``x``: float32 (or int8 for the static path) NCHW or NC4HW4
        (pack 4), C-contiguous, validated by the engine; the bound ``qs``/``z``/``dx`` hold its per-sample
        parameters; ``y`` the output array (float32, or int8 when ``oscale`` is not None), NCHW or NC4HW4. Scratch
        must be bound (:meth:`bind`) for this input size. Inputs of fewer than ``quant_serial`` values are
        quantized on one thread. Afterwards :attr:`last_threads` says what ran."""
        cdef ConvJob j = self.job
        cdef const float[::1] qs = self.qsb
        cdef const int32_t[::1] z = self.zb
        cdef const float[::1] dx = self.dxb
        cdef QuantJob q
        cdef int64_t N, H, W
        cdef uint8_t[::1] yb = y.reshape(-1).view(np.uint8)
        cdef const float[:, ::1] xpv
        cdef int64_t bad = 0
        if nchw_input:
            N, H, W = x.shape[0], x.shape[2], x.shape[3]
        else:
            N, H, W = x.shape[1], x.shape[2], x.shape[3]
        if self.bound_pixels != N * H * W or threads > self.bound_slots or threads < 1:
            raise ValueError("scratch is not bound for this input size / thread count")
        if qs.shape[0] < N or z.shape[0] < N or dx.shape[0] < N:
            raise ValueError("qs, z, dx need one entry per sample")
        j.N, j.H, j.W = N, H, W
        j.OH, j.OW = y.shape[2], y.shape[3]
        j.OHW = j.OH * j.OW
        j.P = N * j.OHW
        j.Q = &self.Q[0]
        j.PS = NULL if j.float_act else &self.PS[0]
        j.dxn = &dx[0]
        j.zpu = 0 if j.float_act else z[0] + j.abias
        memset(&self.zrow[0], j.zpu & 255, j.pix_bytes)
        j.zrow = &self.zrow[0]
        j.AP = <const uint8_t **> &self.APb[0]
        j.S = &self.S[0]
        j.OUT = &self.OUT[0]
        j.DXC = &self.DXC[0]
        j.y = <void *> &yb[0]
        j.out_nc4hw4 = nc4hw4_output
        j.out_int8 = oscale is not None
        j.oscale = oscale if oscale is not None else 1.0
        j.ozp = ozp
        if j.block_mode:
            if xp is None:
                raise ValueError("block mode needs the pixel-major input xp")
            xpv = xp
            if xpv.shape[0] != N * H * W or xpv.shape[1] != j.C:
                raise ValueError("xp must be (N*H*W, C)")
            j.xp = &xpv[0, 0]
            j.A = &self.Ab[0]
            j.DXB = &self.DXBb[0]
            j.zpu = j.abias
            with nogil:
                bad = _run(&j, threads)
            self.last_threads = (0, j.used_threads, j.channel_split)
            if bad:
                raise ValueError("x contains NaN or infinite values")
            return y
        if j.float_act:
            self._forward_float(&j, x, nchw_input, y, threads)
            return y
        _fill_quant(&q, x, nchw_input, j.C, qs, z, qlo, qhi, self.chpos, j.Ltot1, j.GNB, j.BCp, j.variant,
                    &self.Q[0], &self.PS[0], self.contiguous, j.abias, quant_serial)
        with nogil:
            bad = _quantize(&q, threads)
            if not bad:
                _run(&j, threads)
        if bad:
            raise MemoryError("the CPU engine's quantization pass could not allocate its row buffers")
        self.last_threads = (q.used_threads, j.used_threads, j.channel_split)
        return y

    def native(self, tuple xshape, tuple yshape, int mode, int threads, int act_threads, int64_t quant_serial,
               offsets, int64_t scratch_bytes):
        """:meth:`forward` of NCHW float32 ``x`` of ``xshape`` into NCHW float32 ``y`` of ``yshape`` as a
        :class:`NativeCall` for the custom operator: ``mode`` 0 float activations (``float_act``), 1 per-tensor and
        2 per-row dynamic int8 activations (:meth:`act_params`' range pass, then the quantization) on ``threads``
        threads (the range pass on ``act_threads``; inputs of fewer than ``quant_serial`` values quantized on one);
        ``offsets``: ``{part: byte offset}`` of the parts of :data:`_SCRATCH_PARTS` in a scratch of
        ``scratch_bytes`` bytes, laid out for the slots of :meth:`bind` (the engine's :attr:`threads`). None for a
        plan in block mode; the AMX tiles, when the call is to use them, must be bound first (:meth:`set_amx`)."""
        cdef _GemmNative *d
        cdef NativeCall call
        cdef int i
        if self.job.block_mode or mode not in (0, 1, 2) or (mode == 0) != bool(self.job.float_act):
            return None
        call = _native_call(sizeof(_GemmNative), xshape, yshape, scratch_bytes, self)
        if call is None:
            return None
        d = <_GemmNative *> call.mem
        d.j = self.job
        d.j.N, d.j.H, d.j.W = xshape[0], xshape[2], xshape[3]
        d.j.OH, d.j.OW = yshape[2], yshape[3]
        d.j.OHW = d.j.OH * d.j.OW
        d.j.P = d.j.N * d.j.OHW
        d.j.out_nc4hw4 = d.j.out_int8 = 0
        d.j.oscale, d.j.ozp = 1.0, 0
        d.j.PS = NULL
        d.q.int8_input, d.q.nc4hw4 = 0, 0
        d.q.N, d.q.C, d.q.H, d.q.W = xshape[0], self.job.C, xshape[2], xshape[3]
        d.q.chpos = &self.chpos[0]
        d.q.qlo, d.q.qhi = (0, 0) if mode == 0 else (-128, 127) if mode == 1 else (-127, 127)
        d.q.Ltot1, d.q.GNB, d.q.BCp = self.job.Ltot1, self.job.GNB, self.job.BCp
        d.q.contiguous, d.q.variant = self.contiguous, self.job.variant
        d.q.abias = 0 if mode == 0 else self.job.abias
        d.q.serial_values = quant_serial
        d.q.PS = NULL
        d.threads, d.act_threads, d.mode = threads, act_threads, mode
        d.values = d.q.N * d.q.C * d.q.H * d.q.W
        for i, part in enumerate(_SCRATCH_PARTS):
            d.off[i] = offsets.get(part, 0)
        d.base.run = _gemm_native_run
        return call

    cdef _forward_float(self, ConvJob *j, x, int nchw_input, y, int threads):
        """``float_act``: the float32 input into pixel-major rows of ``Q`` (:func:`_float_pixels`), then the GEMM."""
        cdef QuantJob q
        j.WF = &self.WFb[0]
        j.wf_len = self.wf_len
        _fill_quant(&q, x, nchw_input, j.C, self.qsb, self.zb, 0, 0, self.chpos, j.Ltot1, j.GNB, j.BCp, j.variant,
                    &self.Q[0], NULL, self.contiguous, 0, 0)
        cdef int64_t bad
        with nogil:
            bad = _float_pixels(&q, threads)
            if not bad:
                _run(j, threads)
        if bad:
            raise ValueError("x contains NaN or infinite values")
        self.last_threads = (q.used_threads, j.used_threads, j.channel_split)
        return y


# ----------------------------------------------------------------------------------------------------
# the tiled GEMM as a native call (ConvPlan.native)
# ----------------------------------------------------------------------------------------------------
ctypedef struct _GemmNative:
    qc_native base
    ConvJob j               # the plan's job with this shape's geometry; per-call pointers set by the run
    QuantJob q
    int threads             # GEMM and quantization threads (the engine's serial rule applied)
    int act_threads         # threads of the activation-range pass
    int mode                # 0: float activations, 1: per-tensor int8, 2: per-row (per-sample) int8
    int64_t values          # N*C*H*W
    int64_t off[11]         # byte offsets into the caller's scratch: _SCRATCH_PARTS order


# the scratch parts of a native call, in the order of _GemmNative.off (names as CpuEngine._scratch_sizes')
_SCRATCH_PARTS = ("Q", "PS", "zrow", "AP", "S", "OUT", "DXC", "qs", "z", "dx", "WF")


cdef int64_t _gemm_native_run(const qc_native *nb, const float *x, float *y, void *scratch) noexcept nogil:
    """qc_native.run of :meth:`ConvPlan.native`: :meth:`ConvPlan.forward`'s steps for its mode (the range pass
    and quantization, or the float rows), then the GEMM, on the caller's scratch. 1 (nothing reliable in y) on a
    NaN / inf input or a failed allocation."""
    cdef const _GemmNative *d = <const _GemmNative *> nb
    cdef ConvJob j = d.j
    cdef QuantJob q = d.q
    cdef uint8_t *s = <uint8_t *> scratch
    cdef float *qs = <float *> (s + d.off[7])
    cdef int32_t *z = <int32_t *> (s + d.off[8])
    cdef float *dx = <float *> (s + d.off[9])
    cdef int64_t i
    cdef int ok
    q.x = <const void *> x
    q.Q = s + d.off[0]
    q.qs, q.z = qs, z
    j.Q = q.Q
    j.zrow = s + d.off[2]
    j.AP = <const uint8_t **> (s + d.off[3])
    j.S = <int32_t *> (s + d.off[4])
    j.OUT = <float *> (s + d.off[5])
    j.DXC = <float *> (s + d.off[6])
    j.dxn = dx
    j.y = <void *> y
    if d.mode == 0:
        for i in range(j.N):
            qs[i], z[i], dx[i] = 1, 0, 1
        j.WF = <float *> (s + d.off[10])
        j.zpu = 0
        memset(s + d.off[2], 0, j.pix_bytes)
        if _float_pixels(&q, d.threads):
            return 1
        return 1 if _run(&j, d.threads) else 0
    if d.mode == 1:
        ok = _fill_tensor(x, d.values, x + d.values, d.values // 4, 0, d.act_threads, j.variant, qs, z, dx, j.N)
    else:
        ok = _fill_rows(x, 1, j.N, d.values // j.N, 0, d.act_threads, j.variant, qs, z, dx)
    if ok != 1:
        return 1
    q.PS = <int32_t *> (s + d.off[1])
    j.PS = q.PS
    j.zpu = z[0] + j.abias
    memset(s + d.off[2], j.zpu & 255, j.pix_bytes)
    if _quantize(&q, d.threads):
        return 1
    return 1 if _run(&j, d.threads) else 0


# ----------------------------------------------------------------------------------------------------
# dynamic quantization parameters straight into the engine's per-sample arrays (no numpy scalar math per call)
# ----------------------------------------------------------------------------------------------------
cdef int _fill_tensor(const float *x, int64_t n, const float *tail, int64_t tail_quads, int tail_lanes, int threads,
                      int variant, float *qs, int32_t *z, float *dx, int64_t N) noexcept nogil:
    """``act_quant="tensor"``: the per-tensor parameters of ``x[0:n]`` and of lanes ``0 .. tail_lanes-1`` of the
    ``tail_quads`` quads at ``tail`` (an NC4HW4 tail quad; ``tail_lanes`` 0: none; at least one value in all)
    into ``qs/z/dx[0:N]`` (the arithmetic of :func:`qconv.cpu.engine.tensor_qparams`, in float32).
    Returns 1, 0 when a value is NaN/inf, -1 when out of memory."""
    cdef float lo = 0, hi = 0, rng, q, d, v
    cdef int32_t zz
    cdef int64_t i
    if n > 0:
        if _minmax(x, n, threads, &lo, &hi, variant):
            return -1
    else:
        lo = hi = tail[0]
    if tail_lanes:
        _lanes_minmax(tail, tail_quads, tail_lanes, &lo, &hi)
    if not (lo >= -3.4028234663852886e38 and hi <= 3.4028234663852886e38):
        return 0
    if lo > 0:
        lo = 0
    if hi < 0:
        hi = 0
    rng = hi - lo
    q = 1
    d = 1
    zz = 0
    if rng > 0:
        q = <float> 255.0 / rng
        if q <= 3.4028234663852886e38:
            d = rng / <float> 255.0
            v = -lo * q
            zz = <int32_t> roundf(v) - 128
        else:
            q = 1
    for i in range(N):
        qs[i] = q
        z[i] = zz
        dx[i] = d
    return 1


cdef int _fill_rows(const float *x, int64_t A, int64_t N, int64_t M, int tail_lanes, int threads, int variant,
                    float *qs, int32_t *z, float *dx) noexcept nogil:
    """``act_quant="row"``: per sample ``n`` of ``x (A, N, M)``, ``a = max|x[:, n, :]|``, ``qs = 127/a``, ``dx = a/127``
    (1 and 1 when ``a == 0`` or ``127/a`` overflows), ``z = 0``. ``tail_lanes`` > 0: ``x[A-1]`` is an NC4HW4 tail
    quad ``(N, M/4, 4)`` of which only lanes ``0 .. tail_lanes-1`` count. Returns 1, 0 when a counted value is
    NaN/inf, -1 when out of memory."""
    cdef int64_t n, p, full = A - 1 if tail_lanes else A
    cdef int i
    cdef float a
    cdef const float *t = x + full * N * M
    if _absmax_rows(x, full, N, M, threads, dx, variant):   # dx holds max|x| until _sym_params below
        return -1
    if tail_lanes:
        for n in range(N):
            for p in range(M // 4):
                for i in range(tail_lanes):
                    a = fabsf(t[n * M + 4 * p + i])
                    if a > dx[n] or a != a:
                        dx[n] = a
    for n in range(N):
        a = dx[n]
        if not (a <= 3.4028234663852886e38):
            return 0
        z[n] = 0
        _sym_params(a, &qs[n], &dx[n])
    return 1


cdef struct _D2SCtx:
    const float *x
    float *y
    int64_t C, H, W, b
    int variant


cdef int64_t _d2s_rows(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body of :func:`depth_to_space`: items are (sample, output channel, input row)."""
    cdef _D2SCtx *r = <_D2SCtx *> ctx
    cdef int64_t item, nc, h, hw = r.H * r.W, bb = r.b * r.b
    for item in range(i0, i1):
        nc, h = item // r.H, item % r.H
        qc_depth_to_space_row(r.x + (nc * bb * r.H + h) * r.W, r.y + (nc * r.H + h) * r.b * r.b * r.W,
                              r.b, r.W, hw, r.variant)
    return 0


def depth_to_space(const float[:, :, :, ::1] x, float[:, :, :, ::1] y, int block, int threads=1,
                   str kernel="scalar"):
    """ONNX ``DepthToSpace`` in mode ``CRD`` (a pixel shuffle, :class:`qconv.layouts.DepthToSpace`'s
    ``pack_array``): ``x`` float32 ``(N, C*b*b, H, W)`` into ``y`` float32 ``(N, C, H*b, W*b)``,
    ``y[n, c, h*b + i, w*b + j] = x[n, (c*b + i)*b + j, h, w]`` (values copied: the same bits on every kernel and
    thread count); returns ``y``."""
    cdef _D2SCtx r
    cdef int64_t N = x.shape[0], C, H = x.shape[2], W = x.shape[3]
    if block < 1 or x.shape[1] % (block * block):
        raise ValueError(f"depth_to_space: {x.shape[1]} channels do not split into blocks of {block}x{block}")
    C = x.shape[1] // (block * block)
    if (y.shape[0], y.shape[1], y.shape[2], y.shape[3]) != (N, C, H * block, W * block):
        raise ValueError(f"depth_to_space: y must have shape {(N, C, H * block, W * block)}, got "
                         f"{(y.shape[0], y.shape[1], y.shape[2], y.shape[3])}")
    if N * C * H * W == 0:
        return y
    r.x, r.y, r.C, r.H, r.W, r.b, r.variant = &x[0, 0, 0, 0], &y[0, 0, 0, 0], C, H, W, block, KERNELS[kernel]
    with nogil:
        _parallel_for(N * C * H, 16, _d2s_rows, &r, threads)
    return y


def fill_tensor_params(const float[::1] x, int threads, str kernel, float[::1] qs, int32_t[::1] z, float[::1] dx):
    """``act_quant="tensor"``: fill every entry of ``qs``/``z``/``dx`` with the per-tensor parameters of ``x``
    (the arithmetic of :func:`qconv.cpu.engine.tensor_qparams`, in float32); False when ``x`` has NaN/inf."""
    cdef int ok
    cdef int variant = KERNELS[kernel]
    if x.shape[0] == 0:
        raise ValueError("empty input")
    if z.shape[0] < qs.shape[0] or dx.shape[0] < qs.shape[0]:
        raise ValueError("qs, z, dx must have the same length")
    with nogil:
        ok = _fill_tensor(&x[0], x.shape[0], NULL, 0, 0, threads, variant, &qs[0], &z[0], &dx[0], qs.shape[0])
    if ok < 0:
        raise MemoryError("fill_tensor_params: no memory for the partial results")
    return ok == 1


def fill_row_params(const float[:, :, ::1] x, int threads, str kernel, float[::1] qs, int32_t[::1] z,
                    float[::1] dx):
    """``act_quant="row"``: per sample ``n`` of ``x (A, N, M)``, ``a = max|x[:, n, :]|``, ``qs = 127/a``, ``dx = a/127``
    (1 and 1 when ``a == 0`` or ``127/a`` overflows), ``z = 0``; False when ``x`` has NaN/inf."""
    cdef int ok
    cdef int variant = KERNELS[kernel]
    if qs.shape[0] < x.shape[1] or z.shape[0] < x.shape[1] or dx.shape[0] < x.shape[1]:
        raise ValueError("qs, z, dx need one entry per sample")
    with nogil:
        ok = _fill_rows(&x[0, 0, 0], x.shape[0], x.shape[1], x.shape[2], 0, threads, variant, &qs[0], &z[0], &dx[0])
    if ok < 0:
        raise MemoryError("fill_row_params: no memory for the partial results")
    return ok == 1
