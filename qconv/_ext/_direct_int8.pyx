# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The direct int8 conv of the qconv CPU engine (kernels ``"amx"`` and ``"avx512vnni"``, ``act_quant="tensor"`` or
the static int8 path, one group, weights per channel or in blocks of a multiple of 4 channels; any stride, padding
and dilation).

:class:`DirectInt8Plan` runs such a layer without im2col, indirection table or transposing store: the input is
quantized once into padded quad-major phase planes from which AMX loads its B tiles in place (the VNNI kernel: its
16-pixel vectors), the weights are the A tiles of an :class:`~qconv.layouts.amx.AmxConvWeightLayout` (VNNI
broadcasts from their rows), and 16-channel x 16-pixel accumulators are stored straight into NCHW rows. The math,
the buffer layout and the epilogue (the tiled GEMM's float operations, so results are bitwise those of the tiled
GEMM path) are in ``qconv_direct_int8.h``.
"""
import numpy as np

from .._validate import tail_code

from libc.stdint cimport uint8_t, int8_t, int32_t, int64_t
from . import _cpu
from ._cpu cimport (_parallel_for, _chunk_of, _fill_tensor, qc_native, NativeCall, _native_call, qc_hs_init,
                    QC_NATIVE_DI8)

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)


cdef int64_t _quant_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    cdef int64_t i
    for i in range(i0, i1):
        qc_di8_quant(<const qc_di8_job *> ctx, i)
    return 0


cdef int64_t _psum_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    cdef int64_t i
    for i in range(i0, i1):
        qc_di8_psum(<const qc_di8_job *> ctx, i)
    return 0


cdef int64_t _run_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    qc_di8_amx_run(<const qc_di8_job *> ctx, i0, i1)
    return 0


cdef int64_t _vnni_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    qc_di8_vnni_run(<const qc_di8_job *> ctx, i0, i1)
    return 0


cdef void _prepasses(qc_di8_job *j, int threads) noexcept nogil:
    """The passes before the compute items over ``j`` (x, scratch and activation parameters set): the quantized
    phase planes, then the pixel sums (weights with offsets)."""
    cdef int64_t nq
    j.qbands = qc_di8_quant_bands(j, threads)
    nq = qc_di8_quant_items(j)
    _parallel_for(nq, _chunk_of(nq, threads), _quant_items, j, threads)
    if j.psum != NULL:
        _parallel_for(j.N * j.rows, 4, _psum_items, j, threads)


cdef void _passes(qc_di8_job *j, int64_t items, int64_t chunk, bint amx, int threads) noexcept nogil:
    """The plan's passes over ``j`` (x, y, scratch and activation parameters set): :func:`_prepasses`, then the
    compute items."""
    _prepasses(j, threads)
    _parallel_for(items, chunk, _run_items if amx else _vnni_items, j, threads)


cdef int _native_job(const _Di8Native *d, qc_di8_job *j, const float *x, float *y, void *scratch) noexcept nogil:
    """``j`` = the prepared call's job on ``x`` into ``y`` with its ``scratch``: the per-tensor activation parameters
    (the engine's fill_tensor_params) and the scratch pointers set; nonzero: a NaN / inf input (or no memory)."""
    cdef uint8_t *s = <uint8_t *> scratch
    cdef float *qs = <float *> (s + d.params_at)
    cdef int32_t *z = <int32_t *> (qs + d.j.N)
    cdef float *dx = <float *> (z + d.j.N)
    j[0] = d.j
    if _fill_tensor(x, d.count, NULL, 0, 0, d.nt, d.variant, qs, z, dx, j.N) != 1:
        return 1
    j.x, j.y = x, y
    j.qs, j.z, j.dx = qs, z, dx
    j.xq = s
    j.psum = <int32_t *> (s + d.psum_at) if j.offset != NULL else NULL
    return 0


cdef int64_t _di8_native_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    """qc_native.run of :meth:`DirectInt8Plan.native`: :func:`_native_job`, then the plan's passes (nonzero: a
    NaN / inf input, or no memory)."""
    cdef const _Di8Native *d = <const _Di8Native *> n
    cdef qc_di8_job j
    if _native_job(d, &j, x, y, scratch):
        return 1
    _passes(&j, d.items, d.chunk, d.amx, d.nt)
    return 0


def is_direct_int8(spec, bint static_input=False) -> bool:
    """True when ``spec`` (:class:`~qconv.geometry.ConvSpec`) is a layer this path runs: one group, per-channel
    weights or blocks of a multiple of 4 channels, dynamic per-tensor activations (``act_quant="tensor"``) or
    (``static_input``) an int8 input with its own scale and zero point; any stride, padding, dilation."""
    from ..layouts.amx import AmxConvWeightLayout
    w = spec.weight
    return AmxConvWeightLayout.supports(w) and (static_input or spec.act_quant == "tensor") and w.bits in (4, 8)


cdef class DirectInt8Plan:
    """Prepared weights of one layer for the direct int8 conv on ``kernel`` (``"amx"`` or ``"avx512vnni"``).

    ``spec``: the layer's :class:`~qconv.geometry.ConvSpec` (:func:`is_direct_int8`); ``layout``: its
    :class:`~qconv.layouts.amx.AmxConvWeightLayout`; ``post_affine``: None or float32 ``(O,)`` scale and shift
    applied after the activation (the session's fused BatchNorm-like tail); ``output_qparams``: None (float32
    output) or the static int8 output's ``(scale, zero_point)``. Per call, :meth:`forward` takes the per-sample
    activation parameters (``qs``, ``z``, ``dx``, as :func:`qconv._ext._cpu.fill_tensor_params` fills them; for an
    int8 input 1, its zero point and its scale) and a uint8 scratch of :meth:`scratch_bytes`.
    """
    cdef qc_di8_job job
    cdef object keep
    cdef const int8_t[::1] wa
    cdef const int32_t[::1] wsx
    cdef const float[::1] scale, offset, bias, pas, pat
    cdef int64_t[::1] toff
    cdef readonly object layout
    cdef readonly str kernel
    cdef bint use_amx
    cdef readonly bint out_int8
    cdef int64_t shape_key[5]   # the (N, H, W, OH, OW) the job is set up for

    def __init__(self, spec, layout, post_affine=None, str kernel="amx", output_qparams=None, bint static_input=False):
        cdef qc_di8_job *j = &self.job
        if kernel not in ("amx", "avx512vnni"):
            raise ValueError(f"kernel must be 'amx' or 'avx512vnni', got {kernel!r}")
        self.kernel = kernel
        self.use_amx = kernel == "amx"
        self.shape_key[0] = -1
        if not is_direct_int8(spec, static_input):
            raise ValueError("the direct int8 conv runs one-group layers (per channel, or blocks of a multiple of 4 "
                             "channels) with act_quant='tensor' or a static int8 input")
        self.out_int8 = output_qparams is not None
        j.oscale, j.ozp = (output_qparams[0], output_qparams[1]) if self.out_int8 else (1.0, 0)
        w = spec.weight
        o, ocp = w.out_channels, layout.oc_padded
        kh, kw = w.kernel_size
        (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
        from ..cpu.scratch import aligned   # (qconv.cpu imports this module)
        wa = aligned(layout.pack_array(w.q).reshape(-1))   # 64-byte aligned tile rows
        nb = w.n_blocks

        def table(values, dtype=np.float32):
            """(O, nb) per channel and block -> (nb, ocp), block-major, padded channels 0"""
            t = np.zeros((nb, ocp), dtype)
            t[:, :o] = np.asarray(values).reshape(o, nb).T
            return t.reshape(-1)

        def channels(values):
            """(O,) per channel -> (ocp,), padded channels 0"""
            t = np.zeros(ocp, np.float32)
            t[:o] = np.asarray(values, np.float32).reshape(o)
            return t

        # per channel and block: the sum of its codes over the block's channels and all taps
        wsx = table(w.q.reshape(o, nb, -1).astype(np.int64).sum(axis=2).astype(np.int32), np.int32)
        scale = table(w.scales)
        offset = None if w.offsets is None else table(w.offsets)
        bias = channels(spec.bias_or_zeros())
        self.keep = (wa, wsx, scale, offset, bias)
        self.layout = layout
        self.wa, self.wsx, self.scale, self.bias = wa, wsx, scale, bias
        j.wa, j.wsx, j.scale, j.bias = &self.wa[0], &self.wsx[0], &self.scale[0], &self.bias[0]
        j.offset = NULL
        if offset is not None:
            self.offset = offset
            j.offset = &self.offset[0]
        j.pa_s = j.pa_t = NULL
        if post_affine is not None:
            self.pas, self.pat = channels(post_affine[0]), channels(post_affine[1])
            j.pa_s, j.pa_t = &self.pas[0], &self.pat[0]
        act = spec.activation
        j.lo, j.hi = (0.0, 6.0) if act == "relu6" else (0.0, np.inf) if act == "relu" else (-np.inf, np.inf)
        j.tail = tail_code(act)
        j.C, j.O, j.KH, j.KW, j.sh, j.sw, j.dh, j.dw, j.pt, j.pl = w.in_channels, o, kh, kw, sh, sw, dh, dw, ph, pw
        j.quads, j.kg, j.steps, j.otiles = layout.quads, layout.kg, layout.steps, layout.oc_tiles
        j.nblocks, j.bq, j.spb = nb, layout.block_quads, layout.block_steps
        j.planes = layout.quads_padded if self.use_amx else layout.quads
        self.toff = np.zeros(kh * kw, np.int64)

    cdef void _shape(self, int64_t N, int64_t H, int64_t W, int64_t OH, int64_t OW):
        cdef qc_di8_job *j = &self.job
        cdef int64_t *k = self.shape_key
        if k[0] == N and k[1] == H and k[2] == W and k[3] == OH and k[4] == OW:
            return
        k[0], k[1], k[2], k[3], k[4] = N, H, W, OH, OW
        j.N, j.H, j.W, j.OH, j.OW = N, H, W, OH, OW
        qc_di8_setup(j)
        qc_di8_offsets(j, &self.toff[0])
        j.toff = &self.toff[0]

    def scratch_bytes(self, int64_t N, int64_t H, int64_t W, int64_t OH, int64_t OW):
        """Bytes of scratch a call on an ``(N, C, H, W)`` input with ``(OH, OW)`` outputs needs: the padded
        quantized input (from the first 64-byte boundary), then (weights with offsets) the int32 pixel sums."""
        self._shape(N, H, W, OH, OW)
        cdef int64_t nb = 64 + N * self.job.sample_bytes
        if self.job.offset != NULL:
            nb += 4 * N * self.job.nblocks * self.job.psum_len + 64
        return nb

    @property
    def nbytes(self):
        """Bytes of the prepared weights and tables one call reads."""
        return int(sum(a.nbytes for a in self.keep if a is not None))

    def native(self, tuple xshape, tuple yshape, int threads):
        """The engine's direct int8 call (per-tensor activation parameters, then :meth:`forward`) of NCHW float32
        ``x`` of ``xshape`` into float32 ``y`` of ``yshape`` on ``threads`` threads, as a
        :class:`~qconv._ext._cpu.NativeCall` for the custom operator; None when out of memory (or the plan has an
        int8 output)."""
        cdef _Di8Native *d
        cdef NativeCall call
        cdef int64_t N = xshape[0], H = xshape[2], W = xshape[3], OH = yshape[2], OW = yshape[3], nb
        cdef int64_t[::1] tv
        if self.out_int8:
            return None
        self._shape(N, H, W, OH, OW)
        nb = (N * self.job.sample_bytes + 63) // 64 * 64
        psum_at = nb
        if self.job.offset != NULL:
            nb += (4 * N * self.job.nblocks * self.job.psum_len + 63) // 64 * 64
        toff = np.zeros(self.toff.shape[0], np.int64)   # its own: the plan's follow the last forward's shape
        call = _native_call(sizeof(_Di8Native), xshape, yshape, nb + 12 * N, (self, toff))
        if call is None:
            return None
        d = <_Di8Native *> call.mem
        d.j = self.job
        tv = toff
        qc_di8_offsets(&d.j, &tv[0])
        d.j.toff = &tv[0]
        d.j.xi, d.j.yi = NULL, NULL
        d.j.qlo, d.j.qhi = -128, 127
        d.nt, d.amx, d.variant = threads, self.use_amx, _cpu.KERNELS[self.kernel]
        d.items = qc_di8_amx_items(&d.j) if self.use_amx else qc_di8_vnni_items(&d.j)
        d.chunk = max(1, d.items // (8 * threads))
        d.count = N * self.job.C * H * W
        d.psum_at, d.params_at = psum_at, nb
        d.base.run = _di8_native_run
        d.base.kind = QC_NATIVE_DI8
        return call

    def forward(self, x, y, qs, z, dx, uint8_t[::1] scratch, int threads):
        """``y`` (NCHW, C-contiguous; int8 when the plan has ``output_qparams``, else float32) = the layer on NCHW
        ``x`` (C-contiguous; float32 and finite, or int8: the static path), with the per-sample activation
        parameters ``qs`` float32, ``z`` int32, ``dx`` float32 ``(N,)`` (clip range [-128, 127]); ``scratch``: at
        least :meth:`scratch_bytes` bytes. Returns ``y``."""
        cdef qc_di8_job *j = &self.job
        cdef const float[:, :, :, ::1] xv
        cdef const int8_t[:, :, :, ::1] xiv
        cdef float[:, :, :, ::1] yv
        cdef int8_t[:, :, :, ::1] yiv
        if (y.dtype == np.int8) != self.out_int8:
            raise ValueError(f"y must be {'int8' if self.out_int8 else 'float32'} for this plan, got {y.dtype}")
        cdef const float[::1] qsv = qs
        cdef const int32_t[::1] zv = z
        cdef const float[::1] dxv = dx
        cdef int64_t N = x.shape[0], nb, chunk, items
        if x.shape[1] != j.C or y.shape[1] != j.O or y.shape[0] != N or qs.shape[0] < N:
            raise ValueError("x, y or the activation parameters do not match this layer")
        if scratch.shape[0] < self.scratch_bytes(N, x.shape[2], x.shape[3], y.shape[2], y.shape[3]):
            raise ValueError("scratch too small")
        j.x, j.xi, j.y, j.yi = NULL, NULL, NULL, NULL
        if x.dtype == np.int8:
            xiv = x
            j.xi = &xiv[0, 0, 0, 0]
        else:
            xv = x
            j.x = &xv[0, 0, 0, 0]
        if self.out_int8:
            yiv = y
            j.yi = &yiv[0, 0, 0, 0]
        else:
            yv = y
            j.y = &yv[0, 0, 0, 0]
        j.qs, j.z, j.dx = &qsv[0], &zv[0], &dxv[0]
        j.qlo, j.qhi = -128, 127
        cdef int64_t a0 = (-<int64_t> <size_t> &scratch[0]) & 63   # 64-byte aligned tile rows (0 from the arena)
        j.xq = &scratch[a0]
        nb = a0 + N * j.sample_bytes
        j.psum = NULL
        if j.offset != NULL:
            nb = (nb + 63) // 64 * 64
            j.psum = <int32_t *> &scratch[nb]
        cdef bint amx = self.use_amx
        items = qc_di8_amx_items(j) if amx else qc_di8_vnni_items(j)
        chunk = max(1, items // (8 * threads))
        with nogil:
            _passes(j, items, chunk, amx, threads)
        return y
