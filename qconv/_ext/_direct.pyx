# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The direct float-activation path of the qconv CPU engine (``act_quant=None``; grouped convs whose groups have
a multiple of 4 output channels too).

:class:`DirectPlan` runs a layer with float activations without the tiled GEMM's two transposes: output pixels
sit in the vector lanes, so the NCHW input is read as it is (a 1x1 stride-1 conv reads it in place, others build
a strip of im2col rows per 24 output pixels) and every result row is stored where NCHW wants it. The math and the
micro-kernel are in ``qconv_direct.h``. Per call: the weight is dequantized to float32 into a buffer freed at the
end of the call, then the strips (sample, 24 output pixels) run over the threads.
Results do not depend on the thread count.
"""
import numpy as np

from .._validate import tail_code

from libc.stdint cimport uint8_t, int32_t, int64_t
from libc.string cimport memset

from ..layouts.int4 import ONNX_INT4
from ._cpu cimport _parallel_for, _chunk_of, qc_native, NativeCall, _native_call, qc_hs_init

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)


cdef extern from "qconv_direct.h" nogil:
    enum:
        QC_DIRECT_NP
        QC_DIRECT_NP512
        QC_DIRECT_MR
        QC_DIRECT_NS
        QC_WINO_MIN_PIXELS
    ctypedef struct qc_direct_job:
        int64_t N, C, H, W, OH, OW, K
        int32_t KH, KW, sh, sw, ph, pw, dh, dw
        int32_t O, OCB, NB, G
        int64_t kblock
        const uint8_t *q
        int32_t bits
        const float *scale
        const float *offset
        const float *bias
        float lo, hi
        int32_t tail
        const float *pa_s
        const float *pa_t
        const float *x
        int32_t in_nc4hw4, out_nc4hw4
        float *y
        int32_t vec
        int32_t np
        int32_t ns
        int64_t ips
        int32_t winograd, wino
        int32_t in_place
        int64_t Hph, Wph
        const float *xp
        const int64_t *koff
        const float *wf
    void qc_direct_setup(qc_direct_job *j)
    int32_t qc_direct_max_ns(const qc_direct_job *j)
    int64_t qc_direct_sample(const qc_direct_job *j)
    int64_t qc_direct_slack(const qc_direct_job *j)
    int64_t qc_direct_items(const qc_direct_job *j)
    int64_t qc_direct_strips(const qc_direct_job *j)
    int64_t qc_direct_thread_floats(const qc_direct_job *j)
    int64_t qc_direct_wf_floats(const qc_direct_job *j)
    void qc_direct_offsets(const qc_direct_job *j, int64_t *koff)
    int64_t qc_direct_pad_bands(const qc_direct_job *j, int threads)
    int qc_direct_pad(const qc_direct_job *j, int64_t i, int64_t bands, float *xp)
    void qc_direct_dequant(const qc_direct_job *j, int64_t ocb, float *wf)
    int qc_direct_item(const qc_direct_job *j, int64_t item, float *scratch)


# grid pixels a strip: AVX2 and portable C, and the AVX-512 micro-kernel (kernels "avx512vnni" and "amx")
STRIP_PIXELS = QC_DIRECT_NP
STRIP_PIXELS_AVX512 = QC_DIRECT_NP512
AVX512_KERNELS = ("avx512vnni", "amx")
CHANNELS_PER_BLOCK = QC_DIRECT_MR
# output pixels a sample from which 3x3 stride-1 layers run Winograd F(2x2, 3x3) (qconv_winograd.h)
WINOGRAD_MIN_PIXELS = QC_WINO_MIN_PIXELS
# Winograd's output tile (F(2x2, 3x3)): the outputs one input patch gives (qconv.metrics.tolerance's ``tile``)
WINOGRAD_TILE = (2, 2)


def is_direct(spec):
    """True when ``spec`` (:class:`~qconv.geometry.ConvSpec`) is a layer this path runs: float activations
    (``act_quant=None``) and one group, or groups of a multiple of 4 output channels each (a micro-tile's
    channels then share their input planes)."""
    w = spec.weight
    return spec.act_quant is None and (w.groups == 1 or (w.out_channels // w.groups) % 4 == 0)


cdef int64_t _layout(qc_direct_job *j, int nt, int64_t *parts) noexcept nogil:
    """Float offsets in the caller's buffer of koff (K int64), wf, xp (0 floats in place) and the threads' scratch;
    returns the floats needed."""
    qc_direct_setup(j)
    # strips an item: up to QC_DIRECT_NS, but at least 4 items a thread where the layer has them; the items of a
    # sample split its strips evenly, and their count is a multiple of the threads where the strips allow
    cdef int64_t strips = qc_direct_strips(j)
    j.ns = 1 if j.wino else max(1, min(qc_direct_max_ns(j), j.N * strips // (4 * nt)))
    j.ips = (strips + j.ns - 1) // j.ns
    while (j.N * j.ips) % nt and j.ips < strips:
        j.ips += 1
    parts[0] = 0
    parts[1] = 2 * j.K
    parts[2] = parts[1] + qc_direct_wf_floats(j)
    parts[3] = parts[2] + (0 if j.in_place else j.N * qc_direct_sample(j) + qc_direct_slack(j))
    return parts[3] + nt * qc_direct_thread_floats(j)


cdef struct _RunCtx:
    const qc_direct_job *j
    float *xp
    float *wf
    float *scratch      # thread tid's at scratch + tid * nf
    int64_t nf
    int64_t npad, bands # phase-plane items (sample, channel, row band) before the weight blocks' (0 in place)


cdef int64_t _prepare(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body: items ``i0 .. i1-1``, the phase planes' row bands (items below ``npad``), then the
    dequantized weight of a channel block each; returns the non-finite count."""
    cdef _RunCtx *r = <_RunCtx *> ctx
    cdef int64_t i, bad = 0
    for i in range(i0, i1):
        if i < r.npad:
            bad += qc_direct_pad(r.j, i, r.bands, r.xp)
        else:
            qc_direct_dequant(r.j, i - r.npad, r.wf)
    return bad


cdef int64_t _strip_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body: items (strips) ``i0 .. i1-1`` on thread ``tid``'s scratch; returns the non-finite count."""
    cdef _RunCtx *r = <_RunCtx *> ctx
    cdef int64_t i, bad = 0
    for i in range(i0, i1):
        bad += qc_direct_item(r.j, i, r.scratch + tid * r.nf)
    return bad


cdef int64_t _run(qc_direct_job *j, int nt, float *buf) noexcept nogil:
    """Phase planes (unless in place) and the dequantized weight, then every strip (two parallel-for calls: every
    block is in wf before any strip reads it); returns the NaN / inf count."""
    cdef int64_t parts[4]
    cdef int64_t npl, n, bad
    cdef int64_t *koff
    cdef _RunCtx r
    _layout(j, nt, parts)
    koff = <int64_t *> (buf + parts[0])
    r.j = j
    r.wf = buf + parts[1]
    r.xp = buf + parts[2]
    r.scratch = buf + parts[3]
    r.nf = qc_direct_thread_floats(j)
    r.npad, r.bands = 0, 1
    qc_direct_offsets(j, koff)
    j.koff, j.wf = koff, r.wf
    if j.in_place:
        j.xp = j.x
    else:
        npl = j.N * qc_direct_sample(j)
        memset(r.xp + npl, 0, qc_direct_slack(j) * sizeof(float))
        j.xp = r.xp
        r.bands = qc_direct_pad_bands(j, nt)
        r.npad = j.N * j.C * r.bands
    n = r.npad + j.OCB
    bad = _parallel_for(n, _chunk_of(n, nt), _prepare, &r, nt)
    if bad:
        return bad
    return _parallel_for(qc_direct_items(j), _chunk_of(qc_direct_items(j), nt), _strip_items, &r, nt)


ctypedef struct _DirectNative:
    qc_native base
    qc_direct_job j     # shape, weights and epilogue (the run sets x, y and the buffer's parts)
    int nt


cdef int64_t _direct_native_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    """qc_native.run of :meth:`DirectPlan.native` (nonzero: a NaN / inf input)."""
    cdef const _DirectNative *d = <const _DirectNative *> n
    cdef qc_direct_job j = d.j
    j.x = x
    j.y = y
    return _run(&j, d.nt, <float *> scratch) != 0


cdef class DirectPlan:
    """Prepared float-activation layer (built by :class:`qconv.cpu.CpuEngine` when :func:`is_direct` holds).

    ``spec``: the :class:`~qconv.geometry.ConvSpec`; ``kernel``: the engine's kernel name (``"scalar"`` runs the
    portable code, the others AVX2 + FMA).

    Prepared arrays: ``q`` uint8 ``(ceil(O/4), K, 4)`` the int8 codes, or ``(ceil(O/4), K, 2)`` two int4 codes a
    byte (channel 2m low nibble, 2m+1 high), ``K = (C/groups)*KH*KW`` in ``(c, ky, kx)`` order, four output channels
    interleaved; ``scale`` / ``offset`` float32 ``(O, n_blocks)``
    (``offset`` None when symmetric); ``bias`` float32 ``(O,)``.
    """
    cdef readonly object spec, kernel
    cdef readonly int vec
    # Winograd F(2x2, 3x3) where the layer allows it (3x3, stride 1, dilation 1, NCHW, AVX2; qconv_winograd.h)
    cdef public bint winograd
    # True when the last forward call ran Winograd
    cdef readonly bint last_winograd
    cdef object q, scale, offset, bias, pa_s, pa_t
    cdef int C, O, OCB, NB, G, KH, KW, sh, sw, ph, pw, dh, dw, tail, bits
    cdef int64_t K, kblock
    cdef float lo, hi
    # (quantization threads, conv threads) of the last forward call (no quantization pass: 0)
    cdef readonly tuple last_threads

    def __init__(self, spec, str kernel, bint winograd=True):
        if not is_direct(spec):
            raise ValueError("the direct path takes float activations (act_quant=None) and one group, or groups "
                             "of a multiple of 4 output channels")
        w = spec.weight
        self.spec = spec
        self.kernel = kernel
        self.vec = 0 if kernel == "scalar" else 2 if kernel in AVX512_KERNELS else 1
        self.winograd = winograd
        self.last_winograd = False
        o, c = w.out_channels, w.in_channels
        (self.KH, self.KW), (self.sh, self.sw) = spec.kernel_size, spec.stride
        (self.ph, self.pw), (self.dh, self.dw) = spec.padding, spec.dilation
        self.C, self.O, self.OCB, self.NB, self.G = c, o, -(-o // 4), w.n_blocks, w.groups
        self.K = c // w.groups * self.KH * self.KW
        self.kblock = w.block_channels * self.KH * self.KW
        q = np.zeros((self.OCB * 4, self.K), np.int8)
        q[:o] = w.q.reshape(o, self.K)
        q = np.ascontiguousarray(q.reshape(self.OCB, 4, self.K).transpose(0, 2, 1))
        # int4: two codes a byte (ONNX's packing: channel 2m in the low nibble, 2m+1 in the high one, q & 15)
        self.q = ONNX_INT4.pack_array(q) if w.bits == 4 else q.view(np.uint8)
        self.bits = w.bits
        self.scale = np.ascontiguousarray(w.scales, np.float32).reshape(o, self.NB)
        self.offset = None if w.offsets is None else np.ascontiguousarray(w.offsets, np.float32).reshape(o, self.NB)
        self.bias = np.ascontiguousarray(spec.bias_or_zeros(), dtype=np.float32).reshape(o)
        act = spec.activation
        self.lo = 0.0 if act in ("relu", "relu6") else -np.inf
        self.hi = 6.0 if act == "relu6" else np.inf
        self.tail = tail_code(act)
        pa = spec.post_affine
        self.pa_s = None if pa is None else np.ascontiguousarray(pa[0], np.float32)
        self.pa_t = None if pa is None else np.ascontiguousarray(pa[1], np.float32)
        self.last_threads = None

    @property
    def nbytes(self):
        """Bytes of the prepared codes and tables."""
        return int(sum(a.nbytes for a in (self.q, self.scale, self.bias) + (() if self.offset is None
                                                                           else (self.offset,))))

    cdef void _job(self, qc_direct_job *j, tuple shape, bint nchw_input, bint nc4hw4_output):
        """The shape and mode fields of ``j`` for input of ``shape`` (pointers are the caller's)."""
        if nchw_input:
            j.N, j.H, j.W = shape[0], shape[2], shape[3]
        else:
            j.N, j.H, j.W = shape[1], shape[2], shape[3]
        oh, ow = self.spec.out_hw(j.H, j.W)
        j.C, j.OH, j.OW, j.K = self.C, oh, ow, self.K
        j.KH, j.KW, j.sh, j.sw, j.ph, j.pw, j.dh, j.dw = (self.KH, self.KW, self.sh, self.sw, self.ph, self.pw,
                                                          self.dh, self.dw)
        j.O, j.OCB, j.NB, j.G, j.kblock = self.O, self.OCB, self.NB, self.G, self.kblock
        j.in_nc4hw4 = not nchw_input
        j.out_nc4hw4 = nc4hw4_output
        j.vec = self.vec
        j.winograd = self.winograd

    def buffer_floats(self, x, int nchw_input, int threads, nc4hw4_output=None):
        """float32 values of the buffer :meth:`forward` needs for ``x`` on ``threads`` threads (the output in
        the input's layout unless ``nc4hw4_output`` says): the tap offsets, the dequantized weight (Winograd: its
        transform), the phase planes of the input (none for an in-place 1x1 conv) and each thread's scratch."""
        cdef qc_direct_job j
        cdef int64_t parts[4]
        self._job(&j, x.shape, nchw_input, not nchw_input if nc4hw4_output is None else nc4hw4_output)
        return _layout(&j, threads, parts)

    cdef void _bind(self, qc_direct_job *j):
        """The weight, table and epilogue fields of ``j`` (pointers into this plan's arrays)."""
        cdef const uint8_t[:, :, ::1] qv = self.q
        cdef const float[:, ::1] scv = self.scale
        cdef const float[:, ::1] ofv
        cdef const float[::1] biv = self.bias
        cdef const float[::1] pasv, patv
        j.q = &qv[0, 0, 0]
        j.bits = self.bits
        j.scale = &scv[0, 0]
        j.offset = NULL
        if self.offset is not None:
            ofv = self.offset
            j.offset = &ofv[0, 0]
        j.bias = &biv[0]
        j.lo, j.hi, j.tail = self.lo, self.hi, self.tail
        j.pa_s = j.pa_t = NULL
        if self.pa_s is not None:
            pasv, patv = self.pa_s, self.pa_t
            j.pa_s, j.pa_t = &pasv[0], &patv[0]

    def native(self, tuple xshape, tuple yshape, int threads):
        """The call of :meth:`forward` (NCHW float32 ``x`` of ``xshape`` into NCHW float32 ``y`` of ``yshape``,
        ``threads`` threads, the buffer from the caller's scratch) as a :class:`~qconv._ext._cpu.NativeCall` for the
        custom operator, or None when out of memory."""
        cdef _DirectNative *d
        cdef NativeCall call
        cdef int64_t parts[4]
        cdef qc_direct_job j
        self._job(&j, xshape, 1, 0)
        nbytes = 4 * _layout(&j, threads, parts)
        call = _native_call(sizeof(_DirectNative), xshape, yshape, nbytes, self)
        if call is None:
            return None
        d = <_DirectNative *> call.mem
        self._job(&d.j, xshape, 1, 0)
        self._bind(&d.j)
        d.nt = threads
        d.base.run = _direct_native_run
        return call

    def forward(self, x, int nchw_input, y, int nc4hw4_output, int threads, buf):
        """Run the layer. ``x``: float32 C-contiguous NCHW ``(N, C, H, W)`` or NC4HW4 ``(ceil(C/4), N, H, W, 4)``
        (its padding lanes ignored), validated by the engine; ``y``: float32 NCHW ``(N, O, OH, OW)`` or NC4HW4
        ``(ceil(O/4), N, OH, OW, 4)`` (the caller zeroes its padding lanes); ``buf``: float32 scratch of at least
        :meth:`buffer_floats` values (the engine's arena), 8-byte aligned. Returns ``y``; a ValueError when the
        input holds NaN / inf."""
        cdef qc_direct_job j
        cdef const float[::1] xv = x.reshape(-1)
        cdef float[::1] yv = y.reshape(-1)
        cdef float[::1] bv = buf
        cdef int64_t bad = 0
        cdef int nt = threads
        self._job(&j, x.shape, nchw_input, nc4hw4_output)
        if bv.shape[0] < self.buffer_floats(x, nchw_input, threads, nc4hw4_output) or (<size_t> &bv[0]) % 8:
            raise ValueError("buf is too small or not 8-byte aligned")
        self._bind(&j)
        j.x = &xv[0]
        j.y = &yv[0]
        with nogil:
            bad = _run(&j, nt, &bv[0])
        self.last_threads = (0, nt)
        self.last_winograd = j.wino
        if bad:
            raise ValueError("x contains NaN or infinite values")
        return y
