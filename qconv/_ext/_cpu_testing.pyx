# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Test-only wrappers of the CPU engine's nogil helpers (declared in ``_cpu.pxd``, defined in ``_cpu.pyx``): each
``_test_*`` runs one helper alone on numpy arrays, so ``tests/test_cpu_*.py`` can check it against numpy; and
``_test_refuse_allocation`` arms the native allocation-refusal hook. Not used by the engine. It ships in the
wheel beside ``_cpu`` (a few tens of KiB): ``qconv.testing`` users and downstream packagers run the CPU tests
against an installed qconv, and a test module missing from the wheel would turn those into skips."""
import numpy as np

from libc.stdint cimport uint8_t, int8_t, uint16_t, int32_t, int64_t
from libc.string cimport memset

from qconv._ext._cpu cimport *
from qconv._ext._cpu import KERNELS

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)


def _test_refuse_allocation(int64_t k):
    """Make the ``k``-th native allocation from now (0 = the next) fail; ``-1`` turns the hook off. Returns the
    previous setting (``-1`` once an armed refusal has happened)."""
    return _refuse_allocations(k)


def _test_pool_hook(int stall_tid=-1, int stall_ms=0, bint count=False):
    """Arm the thread pool's testing hook: worker ``stall_tid`` (-1: none) waits up to ``stall_ms`` before its first
    chunk of each parallel-for while chunks remain; ``count`` zeroes the per-thread chunk counts and counts from
    now (False stops counting)."""
    _pool_testing(stall_tid, stall_ms, count)


def _test_pool_chunks(int threads):
    """Chunks run by each of threads ``0 .. threads-1`` since :func:`_test_pool_hook` started counting (a list)."""
    return [int(_pool_chunks(t)) for t in range(threads)]


cdef extern from *:
    """
    static inline int64_t qc_test_ticket(int64_t *c) { return __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }
    """
    int64_t qc_test_ticket(int64_t *c) nogil


cdef struct _MarkCtx:
    int32_t *tid_of     # (n,) the thread that ran each item (-1 before)
    int32_t *runs       # (n,) times each item ran
    int64_t *order      # (n,) when each item ran: 0, 1, ... over all threads (NULL: not recorded)
    int64_t clock       # the next value of order
    int64_t nested      # items per nested parallel-for (0: none)
    int64_t work        # dependent multiply-adds per item (to give other threads time to join)
    int nthreads


cdef int64_t _mark_nested(void *ctx, int64_t b, int64_t e, int tid) noexcept nogil:
    """Parallel-for body of the nested calls: returns its item count."""
    return e - b


cdef int64_t _mark(void *ctx, int64_t b, int64_t e, int tid) noexcept nogil:
    """Parallel-for body of :func:`_test_parallel_for`: records ``tid`` and a run per item; returns 1 (a chunk)."""
    cdef _MarkCtx *m = <_MarkCtx *> ctx
    cdef int64_t i, k, bad = 0
    cdef double acc = 1.0
    for i in range(b, e):
        for k in range(m.work):
            acc = acc * 0.999999 + 1e-9
        bad += acc < 0   # keeps the loop
        m.tid_of[i] = tid
        m.runs[i] += 1
        if m.order != NULL:
            m.order[i] = qc_test_ticket(&m.clock)
        if m.nested and _parallel_for(m.nested, 1, _mark_nested, NULL, m.nthreads) != m.nested:
            bad += 1
    return 1 + bad * 1000000


def _test_parallel_for(int64_t n, int64_t chunk, int threads, int64_t nested=0, int64_t work=0, bint order=False):
    """``(tid_of, runs, total)`` of one parallel-for over ``n`` items: the thread index that ran each item, how many
    times each ran, and the returned sum (each chunk returns 1). ``nested``: every item also runs a parallel-for of
    that many items from inside the body (it must run inline; a wrong count adds 10**6 to the sum); ``work``:
    dependent multiply-adds per item, so that the other threads have time to join. ``order``: a fourth value, when
    each item ran (int64: 0, 1, ... over all threads)."""
    tid_of = np.full(max(n, 1), -1, np.int32)
    runs = np.zeros(max(n, 1), np.int32)
    when = np.full(max(n, 1), -1, np.int64)
    cdef int32_t[::1] tv = tid_of
    cdef int32_t[::1] rv = runs
    cdef int64_t[::1] ov = when
    cdef _MarkCtx m
    cdef int64_t total
    m.tid_of, m.runs, m.nested, m.work, m.nthreads = &tv[0], &rv[0], nested, work, threads
    m.order, m.clock = (&ov[0] if order else NULL), 0
    with nogil:
        total = _parallel_for(n, chunk, _mark, &m, threads)
    if order:
        return tid_of[:n], runs[:n], int(total), when[:n]
    return tid_of[:n], runs[:n], int(total)


def _test_parallel_for_burst(const int64_t[::1] ns, int threads, int64_t rounds, int64_t work=0):
    """``(runs, wrong)`` of ``rounds`` x ``len(ns)`` parallel-for calls back to back in native code (no Python
    between them), chunk 1, ``work`` multiply-adds per item: ``runs[i]`` how many times item ``i`` ran over all calls, ``wrong`` the calls
    whose returned sum was not their chunk count. A worker late for one call must never claim or count an item
    of the next (expected: ``runs[i]`` = calls with ``n > i``, ``wrong`` 0; the bug hung or crashed)."""
    cdef int64_t nmax = max(ns) if len(ns) else 1, r, c, wrong = 0
    runs = np.zeros(nmax, np.int32)
    tid_of = np.full(nmax, -1, np.int32)
    cdef int32_t[::1] tv = tid_of
    cdef int32_t[::1] rv = runs
    cdef _MarkCtx m
    m.tid_of, m.runs, m.nested, m.work, m.nthreads = &tv[0], &rv[0], 0, work, threads
    m.order, m.clock = NULL, 0
    with nogil:
        for r in range(rounds):
            for c in range(ns.shape[0]):
                if _parallel_for(ns[c], 1, _mark, &m, threads) != ns[c]:
                    wrong += 1
    return runs, int(wrong)


# ----------------------------------------------------------------------------------------------------
# test-only wrappers of the nogil helpers
# ----------------------------------------------------------------------------------------------------
def _test_quantize(x, int nchw_input, int C, const float[::1] qs, const int32_t[::1] z, int qlo, int qhi,
                   const int32_t[::1] chpos, int64_t Ltot1, int64_t GNB, int64_t BCp, str kernel="scalar",
                   int threads=1, int abias=128):
    """``(Q, PS, used_threads)`` of ``x`` (float32 or int8; NCHW or NC4HW4) as the engine builds them (bytes
    ``xq + abias``), quantized on ``threads`` threads whatever the input size."""
    cdef QuantJob q
    cdef int64_t bad
    N = x.shape[0] if nchw_input else x.shape[1]
    Qa = np.zeros((N * x.shape[2] * x.shape[3], Ltot1), np.uint8)
    PSa = np.zeros((N * x.shape[2] * x.shape[3], GNB), np.int32)
    cdef uint8_t[:, ::1] Qv = Qa
    cdef int32_t[:, ::1] PSv = PSa
    if not qc_kernel_supported(KERNELS[kernel]):
        raise ValueError(f"kernel {kernel!r} is not supported by this CPU")
    _fill_quant(&q, x, nchw_input, C, qs, z, qlo, qhi, chpos, Ltot1, GNB, BCp, KERNELS[kernel], &Qv[0, 0], &PSv[0, 0],
                -1, abias)
    with nogil:
        bad = _quantize(&q, threads)
    if bad:
        raise MemoryError("quantization: no memory for the row buffers")
    return Qa, PSa, q.used_threads


cdef void _input_into(ConvJob *j, ConvGeometry geo, int64_t N, int64_t H, int64_t W) except *:
    """The layer constants of ``geo`` and the input size ``(N, H, W)`` (and the output size it gives) into ``j``."""
    _geometry_into(geo, j)
    if N < 1 or H < 1 or W < 1:
        raise ValueError("N, H, W must be >= 1")
    j.N, j.H, j.W = N, H, W
    j.OH, j.OW = geo.out_hw(H, W)
    if j.OH < 1 or j.OW < 1:
        raise ValueError("the input is smaller than the kernel")
    j.OHW = j.OH * j.OW
    j.P = N * j.OHW


def _test_indirect(const uint8_t[:, ::1] Q, const int32_t[:, ::1] PS, ConvGeometry geo not None, int64_t N,
                   int64_t H, int64_t W, int64_t p0, int ncols):
    """``(rows (ncols, K) int64, S (ncols, GNB))`` for columns ``p0 ..`` of layer ``geo`` on an ``(N, H, W)`` input:
    ``rows`` is the ``Q`` pixel row each tap reads, -1 for padding."""
    cdef ConvJob j
    cdef uint8_t zrow[4]
    memset(&j, 0, sizeof(ConvJob))
    _input_into(&j, geo, N, H, W)
    if Q.shape[1] != j.Ltot1 or Q.shape[0] != j.N * j.H * j.W or PS.shape[1] != j.GNB or PS.shape[0] != Q.shape[0]:
        raise ValueError("Q / PS do not match the geometry")
    if p0 < 0 or ncols < 1 or p0 + ncols > j.N * j.OHW:
        raise ValueError("columns out of range")
    j.Q = &Q[0, 0]
    j.PS = &PS[0, 0]
    j.zrow = zrow
    ptrs = np.zeros((ncols, j.K), np.uintp)
    Sa = np.empty((ncols, j.GNB), np.int32)
    cdef uint8_t[::1] pv = ptrs.reshape(-1).view(np.uint8)
    cdef int32_t[:, ::1] Sv = Sa
    with nogil:
        _indirect(&j, p0, ncols, <const uint8_t **> &pv[0], &Sv[0, 0])
    base = <size_t> &Q[0, 0]
    rows = (ptrs.astype(np.int64) - <int64_t> base) // j.Ltot1
    rows[ptrs == <size_t> zrow] = -1
    return rows, Sa


def _test_gemm(const uint8_t[:, ::1] A, const uint8_t[::1] w, int64_t w_bstride, const int32_t[:, ::1] S,
               const int32_t[:, ::1] wsx, const float[:, ::1] scale, offset, const float[::1] dx,
               const float[::1] bias, int nblocks, int taps, int bq, int bits, int zpu, float lo, float hi, str kernel,
               int first=1, int last=1, out=None, int ntiles=1, int64_t w_tstride=0, bint half=False,
               wa=None, int64_t wa_bstride=0, int64_t wa_tstride=0, int kp=0, int amx_min=1, bint asigned=False):
    """One micro-kernel call on a materialised A: ``A`` uint8 ``(ncols, nblocks*taps*bq*4)`` (block-major, each
    block ``taps`` runs of ``4*bq`` bytes, read through an indirection table like the engine's), ``w`` the
    tiles of ``ntiles`` 32-channel tiles (tile ``t``, block ``k`` at ``t*w_tstride + k*w_bstride``), ``S`` int32
    ``(ncols, nblocks)``, ``wsx``/``scale``/``offset`` ``(nblocks, 32*ntiles)``, ``dx`` ``(ncols,)``, ``bias``
    ``(32*ntiles,)``. ``half``: pass ``scale``/``offset`` to the kernel as float16 tables (they must be float16
    values). ``wa``: the same weights as AMX tiles (uint8, :class:`~qconv.layouts.amx.AmxWeightLayout`, block ``k``
    of tile ``t`` at ``t*wa_tstride + k*wa_bstride``, ``kp`` bytes per padded block), read by the ``amx`` kernel
    when ``ncols >= amx_min``. ``asigned``: int8 weights read ``A`` as signed bytes ``xq`` (the AVX2 sign form; the
    other kernels then run the scalar one). Returns (or accumulates into ``out``) float32 ``(ncols, 32*ntiles)``."""
    cdef qc_gemm_args a
    cdef int ncols = A.shape[0]
    cdef const float[:, ::1] off
    cdef int variant = KERNELS[kernel]
    cdef int64_t blq = <int64_t> taps * bq
    cdef int64_t width = <int64_t> QC_UNIT * ntiles
    if not qc_kernel_supported(variant):
        raise ValueError(f"kernel {kernel!r} is not supported by this CPU")
    if taps < 1 or bq < 1 or nblocks < 1 or ntiles < 1 or bits not in (4, 8):
        raise ValueError("taps, bq, nblocks, ntiles must be >= 1 and bits 4 or 8")
    if A.shape[1] < <int64_t> nblocks * blq * 4 or S.shape[0] != ncols or S.shape[1] != nblocks:
        raise ValueError("A / S shapes do not match")
    if wsx.shape[0] != nblocks or wsx.shape[1] != width or scale.shape[0] != nblocks or scale.shape[1] != width:
        raise ValueError("tables must be (nblocks, 32*ntiles)")
    if dx.shape[0] != ncols or bias.shape[0] != width:
        raise ValueError("dx must be (ncols,), bias (32*ntiles,)")
    tile = QC_UNIT * QC_SRC_UNIT if bits == 8 else QC_UNIT * QC_SRC_UNIT // 2
    if w_bstride < 0 or w_tstride < 0 or w.shape[0] < (ntiles - 1) * w_tstride + (nblocks - 1) * w_bstride + blq * tile:
        raise ValueError("w too short")
    if out is None:
        out = np.zeros((ncols, width), np.float32)
    if out.shape != (ncols, width) or out.dtype != np.float32:
        raise ValueError("out must be float32 (ncols, 32*ntiles)")
    ptrs = np.zeros((ncols, taps), np.uintp)
    base = <size_t> &A[0, 0]
    ptrs[:] = base + np.arange(ncols, dtype=np.uintp)[:, None] * A.shape[1] + np.arange(taps, dtype=np.uintp) * (4 * bq)
    cdef uint8_t[::1] pv = ptrs.reshape(-1).view(np.uint8)
    cdef float[:, ::1] o = out
    a.aptr = <const uint8_t *const *> &pv[0]
    a.ldp = taps
    a.a_off = 0
    a.a_bstride = blq * 4
    a.w = &w[0]
    a.w_bstride = w_bstride
    a.w_tstride = w_tstride
    a.ntiles = ntiles
    a.nvalid = <int32_t> width
    a.first, a.last = first, last
    a.colsum = &S[0, 0]
    a.lds = nblocks
    a.wsx = &wsx[0, 0]
    cdef const uint16_t[:, ::1] hs, ho
    a.scale = &scale[0, 0]
    a.offset = NULL
    a.hscale = a.hoffset = NULL
    if offset is not None:
        off = offset
        if off.shape[0] != nblocks or off.shape[1] != width:
            raise ValueError("offset must be (nblocks, 32*ntiles)")
        a.offset = &off[0, 0]
    if half:
        tabs = [np.asarray(scale)] + ([] if offset is None else [np.asarray(offset)])
        if any(not np.array_equal(t.astype(np.float16).astype(np.float32), t) for t in tabs):
            raise ValueError("half=True needs scale / offset values that are float16 numbers")
        hs = np.ascontiguousarray(tabs[0].astype(np.float16)).view(np.uint16)
        a.hscale = &hs[0, 0]
        if offset is not None:
            ho = np.ascontiguousarray(tabs[1].astype(np.float16)).view(np.uint16)
            a.hoffset = &ho[0, 0]
        a.scale = a.offset = NULL
    a.ldt = width
    a.ldtt = QC_UNIT
    a.dx = &dx[0]
    a.dxb = NULL
    a.bias = &bias[0]
    a.out = &o[0, 0]
    a.ldo = width
    a.nblocks, a.taps, a.bq, a.ncols, a.bits, a.zpu = nblocks, taps, bq, ncols, bits, zpu
    a.asigned = asigned
    a.lo, a.hi = lo, hi
    cdef const uint8_t[::1] wav
    a.wa = NULL
    a.wa_bstride, a.wa_tstride, a.kp, a.amx_min = wa_bstride, wa_tstride, kp, amx_min
    if wa is not None:
        wav = wa
        if kp % 64 or kp < 4 * blq or wav.shape[0] < (ntiles - 1) * wa_tstride + (nblocks - 1) * wa_bstride + 32 * kp:
            raise ValueError("wa / kp do not match")
        a.wa = &wav[0]
    with nogil:
        qc_gemm(&a, variant)
    return out


def _test_store(OUT_in, const int32_t[::1] oidx, int64_t p0, int N, int O, int OH, int OW,
                int nc4hw4, int G, int OCp, oscale=None, int ozp=0, str kernel="scalar"):
    """Scatter ``OUT (ncols, G*OCp)`` float32 (columns ``p0 ..``; a copy, which int8 output requantizes in place)
    into a zeroed NCHW / NC4HW4 output and return it."""
    cdef float[:, ::1] OUT = np.array(OUT_in, np.float32, order="C", copy=True)
    cdef ConvJob j
    memset(&j, 0, sizeof(ConvJob))
    j.O, j.OH, j.OW, j.G, j.OCp = O, OH, OW, G, OCp
    j.Og = O // G
    j.OHW = OH * OW
    j.P = N * j.OHW
    j.ldo = OUT.shape[1]
    j.oidx = &oidx[0]
    j.out_nc4hw4 = nc4hw4
    j.out_int8 = oscale is not None
    j.oscale = oscale if oscale is not None else 1.0
    j.ozp = ozp
    j.variant = KERNELS[kernel]
    if not qc_kernel_supported(j.variant):
        raise ValueError(f"kernel {kernel!r} is not supported by this CPU")
    if oidx.shape[0] != O or p0 < 0 or p0 + OUT.shape[0] > j.P or O % G or OUT.shape[1] != G * OCp or OCp % 32:
        raise ValueError("bad store arguments")
    if nc4hw4:
        shape = ((O + 3) // 4, N, OH, OW, 4)
    else:
        shape = (N, O, OH, OW)
    y = np.zeros(shape, np.int8 if oscale is not None else np.float32)
    cdef uint8_t[::1] yb = y.reshape(-1).view(np.uint8)
    j.y = <void *> &yb[0]
    with nogil:
        _store(&j, &OUT[0, 0], p0, OUT.shape[0])
    return y


def _test_block_cols(const float[:, ::1] xp, ConvGeometry geo not None, int64_t N, int64_t H, int64_t W,
                     int64_t p0, int ncols, str kernel="scalar"):
    """``(A (ncols, Lcol) uint8, S (ncols, GNB) int32, DXB (ncols, GNB) float32)`` of ``act_quant="block"`` for
    columns ``p0 ..`` of layer ``geo`` (a block-mode geometry) from the pixel-major float input ``xp (N*H*W, C)``
    of an ``(N, H, W)`` input."""
    cdef ConvJob j
    memset(&j, 0, sizeof(ConvJob))
    _input_into(&j, geo, N, H, W)
    if not j.block_mode:
        raise ValueError("geo is not a block-mode geometry")
    j.variant = KERNELS[kernel]
    if not qc_kernel_supported(j.variant):
        raise ValueError(f"kernel {kernel!r} is not supported by this CPU")
    if (j.C % j.G or (j.C // j.G) % j.AB or j.AB % j.BC or j.NB * j.BC != j.C // j.G or j.BCp < j.BC
            or xp.shape[0] != j.N * j.H * j.W or xp.shape[1] != j.C):
        raise ValueError("bad geometry")
    if p0 < 0 or ncols < 1 or p0 + ncols > j.N * j.OHW:
        raise ValueError("columns out of range")
    j.xp = &xp[0, 0]
    Aa = np.zeros((ncols, j.Lcol), np.uint8)
    Sa = np.zeros((ncols, j.GNB), np.int32)
    Da = np.zeros((ncols, j.GNB), np.float32)
    ptrs = np.zeros(ncols * j.K, np.uintp)
    cdef uint8_t[:, ::1] Av = Aa
    cdef int32_t[:, ::1] Sv = Sa
    cdef float[:, ::1] Dv = Da
    cdef uint8_t[::1] pv = ptrs.view(np.uint8)
    cdef int bad
    with nogil:
        bad = _block_cols(&j, p0, ncols, &Av[0, 0], <const uint8_t **> &pv[0], &Sv[0, 0], &Dv[0, 0])
    if bad:
        raise ValueError("x contains NaN or infinite values")
    return Aa, Sa, Da


def _test_tail(v, int tail, int variant):
    """``qc_tail`` over a copy of the float32 vector ``v`` with the tail activation code ``tail`` and kernel
    ``variant`` (0 scalar, else the AVX2 code where built): the epilogues' hardswish / silu alone."""
    cdef float[::1] out = np.array(v, dtype=np.float32, copy=True).ravel()
    with nogil:
        qc_tail(&out[0], out.shape[0], tail, variant)
    return np.asarray(out)


def _test_hswish_mismatches(int variant):
    """Float32 bit patterns, of all 2^32, where hardswish's two vector forms (the division by 6 and the product by
    1/6 with its correction, ``qc_hswish_*`` of ``qconv_kernels.h``) differ, in the AVX2 code (``variant`` 1) or the
    AVX-512 code (2); -1 where this CPU lacks that code."""
    cdef int64_t n
    with nogil:
        n = qc_hswish_mismatches(variant)
    return int(n)
