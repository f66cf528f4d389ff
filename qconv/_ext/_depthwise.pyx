# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The depthwise path of the qconv CPU engine (``groups == in_channels``, ``out_channels = M * groups``).

:class:`DepthwisePlan` runs a depthwise layer without the general tiled GEMM (which pads every one-channel group
to a 32-channel tile and a 4-value reduction step, and runs one tiny GEMM per group):

1. activation parameters (``act_quant="tensor"`` / ``"row"``) from the CPU engine's own native reductions
   (:func:`qconv._ext._cpu.minmax` / :func:`~qconv._ext._cpu.absmax_rows`) and arithmetic
   (:func:`qconv.cpu.engine.tensor_qparams` / :func:`~qconv.cpu.engine.row_qparams`);
2. the depthwise conv (``qconv_depthwise.h``): work items (sample, channel, band of output rows) over the threads,
   each on a padded float plane of its channel, its input rows quantized as they are read (the engine's element
   quantizer ``qc_quant``: one pass over the input, no quantized copy of it; the static int8 path reads its int8
   input, ``act_quant="block"`` its float input, quantized per output window), exact integer sums, the GEMM kernels' float epilogue (bitwise
   the general path's results), stored to NCHW / NC4HW4, float32 or int8 (static ``output_qparams``). Float
   activations into NCHW float outputs (NC4HW4 too with channel multiplier 1) run on AVX2 in blocks of 8 channels
   instead (items: sample, block, band; the channels in the vector lanes), with the same bits; with float
   activations an asymmetric weight is prepared dequantized (``q*s + a``, scale 1), so it runs as a symmetric one.
   On AVX-512 CPUs, NCHW to NCHW with stride 1 or 2 and "same" padding, they run as flat planes instead
   (``qc_dw_item_flat``: items of 4 channels and a band; a channel's output plane as one run of 16-pixel vectors,
   each tap a masked load, :meth:`DepthwisePlan.flat_masks`), again with the same bits, where that measured faster
   (:data:`FLAT_MAX_TAPS_WIDTH_S1`).

Results do not depend on the thread count or the band size.
"""
import math

import numpy as np

from .._validate import tail_code

from libc.stdint cimport uint8_t, uint16_t, int8_t, int32_t, int64_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset

from . import _cpu
from ._cpu cimport _parallel_for, _chunk_of, qc_native, NativeCall, _native_call, qc_hs_init, QC_NATIVE_DW

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)




EXACT_TAPS = QC_DW_EXACT_TAPS
# float32 values of one thread's padded plane per band (the band is cut to keep the plane in L1 / L2)
PLANE_FLOATS = 8192
# the most entries of a flat planes' mask table (2 bytes each); larger planes take the channel blocks
FLAT_MASKS_MAX = 1 << 22
# stride 1 with more taps x output width than this takes the channel blocks, whose rows of taps load each input pixel
# once per kernel row; the flat planes load a tap's 16 pixels once per tap. Flat against blocks (2026-12-06, Zen 4, 2
# threads): 5x5 at 28 wide and below 0.79-0.95x the time, at 40 wide (PP-OCRv4 det) 1.17-1.32x, at 56-80 1.11-1.22x
FLAT_MAX_TAPS_WIDTH_S1 = 800
# ... unless the kernel has at most this many taps: with the parallel-for's chunks of several items (_chunk_of) flat
# 3x3 planes took 0.65-0.91x the blocks' time at every width measured, 28 to 320 (16@112 57 against 65 us, 32@224 365
# against 471, 16@320 514 against 563; the night of 2026-12-06, Zen 4, 2 threads)
FLAT_ANY_WIDTH_TAPS = 9

_engine_mod = None


def _qparams():
    """``qconv.cpu.engine`` (imported on first use: the engine imports this module)."""
    global _engine_mod
    if _engine_mod is None:
        from ..cpu import engine as _e
        _engine_mod = _e
    return _engine_mod


def is_depthwise(spec):
    """True when ``spec`` (:class:`~qconv.geometry.ConvSpec`) is a depthwise conv this path runs:
    ``groups == in_channels > 1`` (one input channel per group, any channel multiplier ``M = out/in``; a
    one-channel input with ``groups=1`` is an ordinary conv, left to the GEMM)."""
    w = spec.weight
    return w.groups == w.in_channels and w.groups > 1 and w.q.shape[1] == 1


cdef struct _RunCtx:
    const qc_dw_job *j
    int64_t nf, npt
    float **scr             # (nt,) thread tid's scratch, set up at its first item
    const float ***ptrs     # (nt,)
    int64_t *fails          # (nt,) items thread tid could not run (no scratch)
    char *tried             # (nt,) 1 once thread tid tried to allocate


cdef int64_t _items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body: work items ``i0 .. i1-1`` on thread ``tid``'s scratch (allocated and set up at its first
    chunk); returns the block-mode non-finite count."""
    cdef _RunCtx *r = <_RunCtx *> ctx
    cdef int64_t item, bad = 0
    if not r.tried[tid]:
        r.tried[tid] = 1
        r.scr[tid] = <float *> malloc(r.nf * sizeof(float))
        r.ptrs[tid] = <const float **> malloc(r.npt * sizeof(float *))
        if r.scr[tid] != NULL and r.ptrs[tid] != NULL:
            qc_dw_thread_setup(r.j, r.scr[tid], r.ptrs[tid])
    if r.scr[tid] == NULL or r.ptrs[tid] == NULL:
        r.fails[tid] += i1 - i0
        return 0
    for item in range(i0, i1):
        bad += qc_dw_item(r.j, item, r.scr[tid], r.ptrs[tid])
    return bad


cdef int64_t _run(qc_dw_job *j, int nt, int64_t *fails) noexcept nogil:
    """Every work item on ``nt`` threads (one scratch per thread); returns the block-mode non-finite count and sets
    ``fails`` to the items that found no scratch."""
    cdef int64_t nitems = qc_dw_items(j), bad = 0
    cdef int t
    cdef _RunCtx r
    r.j = j
    r.nf, r.npt = qc_dw_scratch_floats(j), qc_dw_scratch_ptrs(j)
    r.scr = <float **> calloc(nt, sizeof(float *))
    r.ptrs = <const float ***> calloc(nt, sizeof(float **))
    r.fails = <int64_t *> calloc(nt, sizeof(int64_t))
    r.tried = <char *> calloc(nt, 1)
    fails[0] = 0
    if r.scr == NULL or r.ptrs == NULL or r.fails == NULL or r.tried == NULL:
        fails[0] = nitems
    else:
        bad = _parallel_for(nitems, _chunk_of(nitems, nt), _items, &r, nt)
        for t in range(nt):
            fails[0] += r.fails[t]
            free(r.scr[t])
            free(r.ptrs[t])
    free(r.scr)
    free(r.ptrs)
    free(r.fails)
    free(r.tried)
    return bad


cdef int64_t _dw_native_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    """qc_native.run of :meth:`DepthwisePlan.native`: the prepared job on ``x`` into ``y`` (nonzero: a NaN / inf
    input, or no scratch: the Python path runs again and raises)."""
    cdef const _DwNative *d = <const _DwNative *> n
    cdef qc_dw_job j = d.j
    cdef int64_t fails = 0, bad
    j.x = <const void *> x
    j.y = <void *> y
    bad = _run(&j, d.nt, &fails)
    return bad != 0 or fails != 0


cdef class DepthwisePlan:
    """Prepared depthwise layer (built by :class:`qconv.cpu.CpuEngine` when :func:`is_depthwise` holds).

    ``spec``: the :class:`~qconv.geometry.ConvSpec` (act_quant ``"tensor"``, ``"row"``, ``"block"`` or None: float
    activations, the input rows taken as they are and summed in float32);
    ``kernel``: the engine's kernel name (``"scalar"`` runs the portable code, the others AVX2 + FMA);
    ``input_qparams`` / ``output_qparams``: the engine's static int8 ``(scale, zero_point)`` pairs or None.

    Prepared arrays: ``wq`` float32 ``(O, KH*KW)`` (the integer weights; with float activations and offsets the
    dequantized ones), ``scale`` / ``offset`` / ``bias`` float32 ``(O,)`` (one block per output channel: a group has
    one input channel, so per-channel and blockwise weights coincide; ``offset`` None when symmetric, and with float
    activations).
    """
    cdef readonly object spec, kernel, mode
    cdef readonly int M, variant, vec, v512
    cdef object wq, scale, offset, bias, input_qparams, output_qparams, pa_s, pa_t
    cdef object qs, z, dx, _shape_key, _shape_val
    cdef int KH, KW, sh, sw, ph, pw, dh, dw, C, out_int8, ozp, tail_act, kind
    cdef float lo, hi, oscale
    # (quantization threads, conv threads) of the last forward call; quantization threads always 0: no separate
    # quantization pass runs (each conv thread quantizes the input rows it reads)
    cdef readonly tuple last_threads
    # the code the last forward call ran: "flat" (qc_dw_item_flat), "blocks" (qc_dw_item_c8) or "planes"
    cdef readonly str last_path

    def __init__(self, spec, str kernel, input_qparams=None, output_qparams=None):
        if not is_depthwise(spec):
            raise ValueError("not a depthwise conv (groups must equal in_channels)")
        w = spec.weight
        if w.n_blocks != 1:
            raise ValueError("a depthwise weight has one block per output channel")
        self.spec = spec
        self.kernel = kernel
        self.variant = _cpu.KERNELS[kernel]
        self.vec = 0 if kernel == "scalar" else 1
        self.v512 = kernel in ("avx512vnni", "amx")   # the flat planes (qc_dw_item_flat) need AVX-512
        self.input_qparams = input_qparams
        self.output_qparams = output_qparams
        self.mode = "static" if input_qparams is not None else spec.act_quant or "float"
        if self.mode not in ("static", "tensor", "row", "block", "float"):
            raise ValueError(f"act_quant {spec.act_quant!r} is not supported by the depthwise path")
        self.kind = {"static": 1, "block": 2, "float": 3}.get(self.mode, 0)   # qc_dw_job.kind
        o = w.out_channels
        self.M = o // w.in_channels
        if self.mode == "float" and w.offsets is not None:
            # float activations: sum_t (q_t*s + a) x_t is conv(x, the dequantized weight), as the oracle defines
            # it; taken as a weight of scale 1, the offset costs no input sums and the channel blocks run it
            self.wq = np.ascontiguousarray(w.dequantize().reshape(-1), dtype=np.float32)
            self.scale, self.offset = np.ones(o, np.float32), None
        else:
            self.wq = np.ascontiguousarray(w.q.reshape(-1), dtype=np.float32)   # (O, KH*KW) flattened
            self.scale = np.ascontiguousarray(w.scales.reshape(o), dtype=np.float32)
            self.offset = None if w.offsets is None else np.ascontiguousarray(w.offsets.reshape(o), dtype=np.float32)
        self.bias = np.ascontiguousarray(spec.bias_or_zeros(), dtype=np.float32).reshape(o)
        self.last_threads = None
        self.qs = self.z = self.dx = None
        self._shape_key = None
        self.C = w.in_channels
        (self.KH, self.KW), (self.sh, self.sw) = spec.kernel_size, spec.stride
        (self.ph, self.pw), (self.dh, self.dw) = spec.padding, spec.dilation
        act = spec.activation
        self.lo = 0.0 if act in ("relu", "relu6") else -np.inf
        self.hi = 6.0 if act == "relu6" else np.inf
        self.tail_act = tail_code(act)
        pa = spec.post_affine
        self.pa_s = None if pa is None else np.ascontiguousarray(pa[0], np.float32)
        self.pa_t = None if pa is None else np.ascontiguousarray(pa[1], np.float32)
        self.out_int8 = output_qparams is not None
        self.oscale = output_qparams[0] if output_qparams is not None else 1.0
        self.ozp = output_qparams[1] if output_qparams is not None else 0

    @property
    def nbytes(self):
        """Bytes of the prepared weights and tables."""
        return int(sum(a.nbytes for a in (self.wq, self.scale, self.bias) + (() if self.offset is None
                                                                            else (self.offset,))))

    def _params(self, x, bint nchw, int n, int threads, bint rows_cover=False):
        """Per-sample ``qs`` / ``z`` / ``dx`` (float32 / int32 / float32 ``(N,)``) and the clamp ``(qlo, qhi)``.
        ``rows_cover``: the bands' row fills read every input value (float activations then check them there and
        skip the range pass)."""
        if self.qs is None or self.qs.shape[0] != n:   # reused between calls (calls are serialised by the engine)
            self.qs, self.z, self.dx = np.ones(n, np.float32), np.zeros(n, np.int32), np.ones(n, np.float32)
        qs, z, dx = self.qs, self.z, self.dx
        if self.mode == "static":
            scale, zp = self.input_qparams
            z[:] = zp
            dx[:] = scale
            return qs, z, dx, -128, 127
        if self.mode == "block" or (self.mode == "float" and rows_cover):
            return qs, z, dx, -127, 127
        c = self.C
        tail = 0 if nchw else c % 4
        last = x.shape[0] - 1
        full = x if not tail else x[:last]
        e = _qparams()
        if self.mode in ("tensor", "float"):   # float: the range pass only refuses NaN / inf
            if full.size:
                lo, hi = _cpu.minmax(full.reshape(-1), threads, self.kernel)
            else:
                lo, hi = np.nan, np.nan
            if tail:
                t = x[last, ..., :tail]
                tl, th = float(t.min()), float(t.max())
                lo = tl if full.size == 0 or tl < lo or tl != tl else lo
                hi = th if full.size == 0 or th > hi or th != th else hi
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise ValueError("x contains NaN or infinite values")
            if self.mode == "float":
                return qs, z, dx, -127, 127
            q, d, zz = e.tensor_qparams(lo, hi)
            qs.fill(q)
            dx.fill(d)
            z.fill(zz)
            return qs, z, dx, -128, 127
        # row: per sample
        if nchw:
            amax = _cpu.absmax_rows(x.reshape(1, n, -1), threads, self.kernel)
        else:
            if full.shape[0]:
                amax = _cpu.absmax_rows(full.reshape(full.shape[0], n, -1), threads, self.kernel)
            else:
                amax = np.zeros(n, np.float32)
            if tail:
                amax = np.maximum(amax, np.abs(x[last, ..., :tail]).reshape(n, -1).max(axis=1))
        if not np.isfinite(amax).all():
            raise ValueError("x contains NaN or infinite values")
        q, d = e.row_qparams(amax)
        qs[:] = q
        dx[:] = d
        return qs, z, dx, -127, 127

    def band_rows(self, int64_t n, int64_t h, int64_t w, int threads, bint blocks=False):
        """Output rows per work item for an ``(n, C, h, w)`` input: the padded plane of a band stays within
        :data:`PLANE_FLOATS` floats (``blocks``: items of 8 channels, 8 times that), and there are at least
        ``4*threads`` items where the layer allows."""
        s = self.spec
        (kh, _), (sh, sw), (ph, pw), (dh, _) = s.kernel_size, s.stride, s.padding, s.dilation
        oh, _ = s.out_hw(h, w)
        rs = sw * ((w + 2 * pw + sw - 1) // sw)
        band = max(1, (PLANE_FLOATS // rs - (kh - 1) * dh - 1) // sh + 1)
        planes = n * (-(-s.in_channels // 8) if blocks else s.in_channels)
        if planes * -(-oh // band) < 4 * threads:
            band = max(1, -(-oh // -(-4 * threads // planes)))
        return int(min(band, oh))

    def flat_masks(self, int64_t h, int64_t w):
        """The flat planes' tap masks for an ``(h, w)`` input (``qc_dw_item_flat``): uint16 ``(ceil(OH*OW/16),
        KH*KW)``, bit ``l`` of entry ``(v, t)`` set when output pixel ``16 v + l`` (row-major, below ``OH*OW``)
        reads an in-image value at tap ``t``."""
        s = self.spec
        oh, ow = s.out_hw(h, w)
        nv = (oh * ow + 15) // 16
        p = np.arange(nv * 16, dtype=np.int32)
        oy, ox = p // ow, p % ow
        ky = np.repeat(np.arange(self.KH, dtype=np.int32), self.KW)
        kx = np.tile(np.arange(self.KW, dtype=np.int32), self.KH)
        iy = (oy * self.sh - self.ph)[:, None] + ky * self.dh
        ix = (ox * self.sw - self.pw)[:, None] + kx * self.dw
        ok = (p < oh * ow)[:, None] & (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        bits = ok.reshape(nv, 16, -1).astype(np.uint32) << np.arange(16, dtype=np.uint32)[None, :, None]
        return np.ascontiguousarray(bits.sum(axis=1, dtype=np.uint32).astype(np.uint16))

    def flat_band(self, int64_t n, int64_t oh, int64_t ow, int threads):
        """Output rows per work item of the flat planes (``QC_DW_FG`` channels an item): whole planes when that makes
        at least ``4*threads`` items, else bands of whole 16-pixel vectors (a multiple of ``16 / gcd(OW, 16)`` rows) that make as many."""
        # (module directive cdivision: ceilings as (a + b - 1) // b on positive numbers)
        cdef int64_t planes = n * ((self.C + QC_DW_FG - 1) // QC_DW_FG)   # work items of whole planes
        cdef int64_t parts, band, q
        if planes >= 4 * threads:
            return int(oh)
        parts = (4 * threads + planes - 1) // planes
        band = (oh + parts - 1) // parts
        q = 16 // math.gcd(int(ow), 16)
        return int(min((band + q - 1) // q * q, oh))

    def channel_blocks(self, int nc4hw4_output):
        """Whether a call into NC4HW4 (``nc4hw4_output`` 1) or NCHW output runs in blocks of 8 channels
        (``qc_dw_c8``) rather than one channel's planes at a time."""
        cdef qc_dw_job j
        memset(&j, 0, sizeof(j))
        j.vec, j.kind, j.M = self.vec, self.kind, self.M
        j.out_nc4hw4 = nc4hw4_output
        j.out_int8 = self.out_int8
        j.offset = NULL if self.offset is None else &j.lo   # only tested against NULL
        return qc_dw_c8(&j) != 0

    def forward(self, x, int nchw_input, y, int nc4hw4_output, int threads, int param_threads=1):
        """Run the layer. ``x``: float32 (int8 on the static path) C-contiguous NCHW ``(N, C, H, W)`` or NC4HW4
        ``(ceil(C/4), N, H, W, 4)`` (its padding lanes ignored), validated by the engine; ``y``: the output array
        (float32, or int8 with ``output_qparams``), NCHW ``(N, O, OH, OW)`` or NC4HW4 ``(ceil(O/4), N, OH, OW, 4)``
        (the caller zeroes its padding lanes). ``threads``: conv threads (each quantizes the input rows it reads);
        ``param_threads``: threads of the range pass. Returns ``y``."""
        cdef qc_dw_job j
        cdef const uint8_t[::1] xb = x.reshape(-1).view(np.uint8)
        cdef uint8_t[::1] yb = y.reshape(-1).view(np.uint8)
        cdef int64_t N, H, W, bad = 0, fails = 0
        cdef int qlo, qhi, nt
        if nchw_input:
            N, H, W = x.shape[0], x.shape[2], x.shape[3]
        else:
            N, H, W = x.shape[1], x.shape[2], x.shape[3]
        qs, z, dx, qlo, qhi = self._params(x, nchw_input != 0, N, param_threads, self._covers(H, W))
        self._fill_job(&j, N, H, W, nchw_input, nc4hw4_output, threads, qs, z, dx, qlo, qhi)
        j.x = <const void *> &xb[0]
        j.y = <void *> &yb[0]
        nt = threads
        with nogil:
            bad = _run(&j, nt, &fails)
        if fails:
            raise MemoryError("the depthwise path could not allocate its scratch")
        self.last_threads = (0, nt)
        self.last_path = "flat" if j.flat else "blocks" if qc_dw_c8(&j) else "planes"
        if bad:
            raise ValueError("x contains NaN or infinite values")
        return y

    def native(self, tuple xshape, tuple yshape, int threads):
        """The call of :meth:`forward` (NCHW float32 ``x`` of ``xshape`` into NCHW float32 ``y`` of ``yshape``,
        ``threads`` threads) as a :class:`~qconv._ext._cpu.NativeCall` for the custom operator; None where a call
        must look at ``x`` first (activation ranges of ``act_quant`` "tensor" / "row" / "block") or the output is int8."""
        cdef _DwNative *d
        cdef NativeCall call
        cdef int64_t N = xshape[0], H = xshape[2], W = xshape[3]
        if self.mode != "float" or self.out_int8 or not self._covers(H, W):
            return None
        qs, z, dx, qlo, qhi = self._params(None, True, N, 1, True)
        call = _native_call(sizeof(_DwNative), xshape, yshape, 0, None)
        if call is None:
            return None
        d = <_DwNative *> call.mem
        fmask = self._fill_job(&d.j, N, H, W, 1, 0, threads, qs, z, dx, qlo, qhi)
        call.keep = (self, qs, z, dx, fmask)
        d.nt = threads
        d.base.run = _dw_native_run
        d.base.kind = QC_NATIVE_DW
        return call

    def _covers(self, int64_t H, int64_t W):
        """Whether the bands' row fills read every input value (rows -ph .. (oh-1)*sh + (KH-1)*dh - ph, contiguously
        when a band's rows overlap the next band's)."""
        oh = self.spec.out_hw(H, W)[0]
        return ((self.KH - 1) * self.dh + 1 >= self.sh
                and (oh - 1) * self.sh + (self.KH - 1) * self.dh - self.ph >= H - 1)

    cdef object _fill_job(self, qc_dw_job *j, int64_t N, int64_t H, int64_t W, int nchw_input, int nc4hw4_output,
                          int threads, qs, z, dx, int qlo, int qhi):
        """Every field of ``j`` but ``x`` and ``y`` for a call on ``(N, H, W)`` input (the band and the flat planes'
        masks memoised per shape); returns the masks array ``j.fmask`` points into (or None)."""
        cdef const float[::1] qsv = qs, dxv = dx, wqv = self.wq, scv = self.scale, biv = self.bias
        cdef const float[::1] ofv, pasv, patv
        cdef const int32_t[::1] zv = z
        cdef const uint16_t[::1] fmv
        key = (N, H, W, threads, nchw_input, nc4hw4_output)
        if key != self._shape_key:
            # the band and the flat planes' masks: below, once the job says which path runs
            self._shape_val = self.spec.out_hw(H, W) + (0, None)
            self._shape_key = key
        oh, ow, band, fmask = self._shape_val
        j.N, j.C, j.H, j.W, j.OH, j.OW = N, self.C, H, W, oh, ow
        j.M, j.KH, j.KW, j.sh, j.sw, j.ph, j.pw, j.dh, j.dw = (self.M, self.KH, self.KW, self.sh, self.sw, self.ph,
                                                               self.pw, self.dh, self.dw)
        j.in_nc4hw4 = not nchw_input
        j.z = &zv[0]
        j.dx = &dxv[0]
        j.qs = &qsv[0]
        j.qlo, j.qhi, j.variant = qlo, qhi, self.variant
        j.wq = &wqv[0]
        j.scale = &scv[0]
        j.bias = &biv[0]
        j.offset = NULL
        if self.offset is not None:
            ofv = self.offset
            j.offset = &ofv[0]
        j.lo, j.hi = self.lo, self.hi
        j.tail = self.tail_act
        j.pa_s = j.pa_t = NULL
        if self.pa_s is not None:
            pasv, patv = self.pa_s, self.pa_t
            j.pa_s, j.pa_t = &pasv[0], &patv[0]
        j.out_nc4hw4 = nc4hw4_output
        j.out_int8, j.oscale, j.ozp = self.out_int8, self.oscale, self.ozp
        j.vec = self.vec
        j.kind = self.kind
        j.x = NULL
        j.y = NULL
        j.flat, j.fmask = 0, NULL
        j.xplane, j.xrow0 = 0, 0
        if not band:
            if (self.v512 and qc_dw_flat_ok(j) and (self.sh == 2 or self.KH * self.KW <= FLAT_ANY_WIDTH_TAPS
                                                    or self.KH * self.KW * ow <= FLAT_MAX_TAPS_WIDTH_S1)
                    and (oh * ow + 15) // 16 * self.KH * self.KW <= FLAT_MASKS_MAX):
                fmask = self.flat_masks(H, W)
                band = self.flat_band(N, oh, ow, threads)
            else:
                band = self.band_rows(N, H, W, threads, qc_dw_c8(j))
            self._shape_val = (oh, ow, band, fmask)
        if fmask is not None:
            fmv = fmask.reshape(-1)
            j.flat, j.fmask = 1, &fmv[0]
        j.band = band
        return fmask
