# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Fused elementwise chains of the CPU session (:mod:`qconv.onnx.fusion`): one pass over the NCHW output rows.

A program is a list of instructions over row slots. Slots ``0 .. L-1`` are the leaves (the fused node's
inputs as the chain reads them), the others temporaries; the last instruction writes the output. Per output row
``(n, c, y)`` of ``W`` floats a leaf is:

* kind 0, full: row ``(n, c, y // fh)`` of a ``(N, C, H/fh, W/fw)`` tensor, each value repeated ``fw`` times
  (``fh = fw = 1``: the row itself, read in place): a nearest Resize by integer factors, pushed to the leaf;
* kind 1, per channel: the value ``[n or 0, c]`` of a ``(N or 1, C, 1, 1)`` tensor, on the whole row;
* kind 2, scalar: the one value of a one-element tensor.

Every instruction runs over the row in float32, one operation at a time, in the chain's order: the float
operations of onnxruntime's ops, bit for bit. The row loop is
``qconv_fused.h`` (AVX2 where the CPU has it); rows go over the engine's parallel-for. A program without Resize leaves
takes the rows of a plane a few at a time (``ROW_FLOATS``): a row is then ``g`` output rows, ``g`` dividing ``H``.
"""
import numpy as np

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport malloc, free

from ._cpu cimport _parallel_for, pool_fn, qc_native, NativeCall, _native_call, qc_hs_init

qc_hs_init()   # hardswish's division by 6 for this CPU, in this module's copy of the flag (qconv_kernels.h)

# instruction codes (qconv.onnx.fusion.OPS holds the names)
OP_CODES = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Relu": 10, "HardSigmoid": 11, "Clip": 13, "HardSwish": 14}
# the squeeze-excitation gate's elementwise ops (excite_gate) and a conv step's activations
GATE_OPS = {"Relu": 10, "HardSigmoid": 11, "Clip": 13, "HardSwish": 14, "Sigmoid": 20}
GATE_ACTS = {None: 0, "relu": 1, "relu6": 2, "hardswish": 3, "silu": 4}
KIND_FULL, KIND_CHANNEL, KIND_SCALAR = 0, 1, 2
# a program without Resize leaves runs over rows of up to this many floats: a plane's rows are merged (each row's
# fixed cost made an Add + Relu over 440 planes of 7x7 6x numpy's time, 2026-12-06); a row's temporaries stay in L1
ROW_FLOATS = 512
# floats a chunk of rows at least, and outputs below which one thread runs the program (waking the pool cost more
# than it gave: the Add + Relu over 440x7x7 took 23 us on 2 threads, numpy 11)
CHUNK_FLOATS = 4096
SERIAL_FLOATS = 32768


cdef extern from "qconv_fused.h" nogil:
    ctypedef struct qc_fused_job:
        int64_t N, C, H, W
        int32_t nleaves, nslots, nins
        const float **leaf
        const int32_t *kind
        const int32_t *fh
        const int32_t *fw
        const int64_t *ln
        const int64_t *lh
        const int64_t *lw
        const int32_t *ins
        const float *par
        float *y
        float *scratch
        int64_t per_thread
    ctypedef int64_t (*rows_fn)(void *, int64_t, int64_t, int) noexcept nogil
    rows_fn qc_fused_rows()
    ctypedef struct qc_se_job:
        const float *x
        const float *g
        float *out
        float *y
        int64_t HW
    rows_fn qc_se_rows(int which)
    void qc_gate_conv(const float *v, int64_t N, int64_t C, const float *wt, const float *b, int64_t O, int act,
                      const float *ps, const float *pt, float *u)
    void qc_gate_op(float *v, int64_t n, int op, float p0, float p1)


cdef class Program:
    """A checked program (module docstring), built once per fused node. ``fh``, ``fw``: int32 per leaf; ``ins``:
    int32 ``(nins, 4)`` (op, dst, a, b or -1); ``par``: float32 ``(nins, 2)``; ``nslots``: leaves + temporaries
    (at most 64). ValueError for an unknown operation, a slot out of range or read before it is written."""
    cdef readonly int nleaves, nslots
    cdef object fh, fw, ins, par
    cdef bint merge

    def __init__(self, fh, fw, ins, par, int nslots):
        self.fh = np.ascontiguousarray(fh, np.int32).reshape(-1)
        self.fw = np.ascontiguousarray(fw, np.int32).reshape(-1)
        self.ins = np.ascontiguousarray(ins, np.int32)
        self.par = np.ascontiguousarray(par, np.float32)
        L = self.nleaves = len(self.fh)
        self.nslots = nslots
        codes = self.ins
        if (nslots > 64 or L > nslots or len(self.fw) != L or codes.ndim != 2 or codes.shape[0] < 1
                or codes.shape[1] != 4 or self.par.shape != (codes.shape[0], 2)):
            raise ValueError("a fused program needs 1 .. 64 slots and at least one instruction")
        if (self.fh < 1).any() or (self.fw < 1).any():
            raise ValueError("a fused program's repeat factors must be >= 1")
        if (not np.isin(codes[:, 0], list(OP_CODES.values())).all() or (codes[:, 1] < L).any()
                or (codes[:, 1] >= nslots).any() or (codes[:, 2:] >= nslots).any() or (codes[:, 2] < 0).any()
                or (codes[:, 3] < -1).any()):
            raise ValueError("a fused program names an unknown operation or a slot out of range")
        self.merge = not (self.fh > 1).any() and not (self.fw > 1).any()
        ready = set(range(L))
        for op, dst, a, b in codes.tolist():
            if a not in ready or (b >= 0 and b not in ready):
                raise ValueError("a fused program reads a slot before an instruction writes it")
            ready.add(dst)

    def run(self, list leaves, kinds, y, int threads):
        """Runs into ``y`` (float32 C-contiguous ``(N, C, H, W)``). ``leaves``: float32 C-contiguous arrays, one a
        leaf, of their ``kinds`` (int32 a leaf: 0 a ``(N, C, H/fh, W/fw)`` tensor, 1 ``(N or 1, C, 1, 1)``, 2 one
        value; checked against ``y``)."""
        cdef qc_fused_job j
        cdef int L = self.nleaves, i
        cdef int32_t[::1] kv = np.ascontiguousarray(kinds, np.int32)
        cdef int32_t[::1] fhv = self.fh
        cdef int32_t[::1] fwv = self.fw
        cdef int32_t[:, ::1] iv = self.ins
        cdef float[:, ::1] pv = self.par
        cdef float[:, :, :, ::1] yv = y
        cdef int64_t[::1] ln = np.ones(max(L, 1), np.int64)
        cdef int64_t[::1] lh = np.ones(max(L, 1), np.int64)
        cdef int64_t[::1] lw = np.ones(max(L, 1), np.int64)
        cdef const float[::1] lv
        cdef int64_t chunk
        cdef int nt
        n, c, h, w = y.shape
        if len(leaves) != L or kv.shape[0] != L:
            raise ValueError(f"the program takes {L} leaves, got {len(leaves)} and {kv.shape[0]} kinds")
        for i in range(L):
            a, k = leaves[i], kv[i]
            if a.dtype != np.float32 or not a.flags.c_contiguous:
                raise ValueError(f"leaf {i} must be float32 C-contiguous")
            if k == 0:
                if a.shape != (n, c, h // fhv[i], w // fwv[i]) or h % fhv[i] or w % fwv[i]:
                    raise ValueError(f"leaf {i} of shape {a.shape} is no full leaf of {y.shape} / ({fhv[i]}, {fwv[i]})")
                lh[i], lw[i] = a.shape[2], a.shape[3]
            elif k == 1:
                ln[i] = a.shape[0] if a.ndim == 4 else 1
                if a.size != ln[i] * c or ln[i] not in (1, n):
                    raise ValueError(f"leaf {i} of shape {a.shape} is no per-channel leaf of {y.shape}")
            elif k != 2 or a.size < 1:
                raise ValueError(f"leaf {i}: kind {k} of shape {a.shape}")
        if self.merge and w < ROW_FLOATS:   # no Resize: g rows of a plane are one row of g*w
            g = min(h, ROW_FLOATS // w)
            while h % g:
                g -= 1
            h, w = h // g, w * g
            for i in range(L):
                if kv[i] == 0:
                    lh[i], lw[i] = h, w
        j.N, j.C, j.H, j.W = n, c, h, w
        j.nleaves, j.nslots, j.nins = L, self.nslots, iv.shape[0]
        j.kind, j.fh, j.fw, j.ln, j.lh, j.lw = &kv[0], &fhv[0], &fwv[0], &ln[0], &lh[0], &lw[0]
        j.ins, j.par, j.y = &iv[0, 0], &pv[0, 0], &yv[0, 0, 0, 0]
        j.per_thread = self.nslots * j.W + 16
        scratch = np.empty(max(1, threads) * j.per_thread, np.float32)
        cdef float[::1] sv = scratch
        j.scratch = &sv[0]
        j.leaf = <const float **> malloc(L * sizeof(float *))
        if j.leaf == NULL:
            raise MemoryError()
        try:
            for i in range(L):
                lv = leaves[i].reshape(-1)
                j.leaf[i] = &lv[0]
            chunk = max(8, CHUNK_FLOATS // j.W)
            nt = 1 if j.N * j.C * j.H * j.W < SERIAL_FLOATS else threads
            with nogil:
                _parallel_for(j.N * j.C * j.H, chunk, <pool_fn> qc_fused_rows(), &j, nt)
        finally:
            free(j.leaf)
        return y


def channel_means(const float[:, :, :, ::1] x, float[:, ::1] out, int threads):
    """``out[n, c]`` = the mean of plane ``x[n, c]`` (float32 ``(N, C, H, W)`` -> ``(N, C)``; the sum in the order
    ``qconv_fused.h`` states, the same on every thread count). Returns ``out``."""
    cdef qc_se_job j
    cdef int64_t rows = x.shape[0] * x.shape[1]
    if out.shape[0] != x.shape[0] or out.shape[1] != x.shape[1]:
        raise ValueError(f"out must be ({x.shape[0]}, {x.shape[1]}), got {tuple(out.shape)}")
    j.HW = x.shape[2] * x.shape[3]
    if rows == 0 or j.HW == 0:
        raise ValueError("channel_means needs non-empty planes")
    j.x, j.out = &x[0, 0, 0, 0], &out[0, 0]
    with nogil:
        _parallel_for(rows, max(1, 4096 // j.HW), <pool_fn> qc_se_rows(0), &j, threads)
    return out


def scale_channels(const float[:, :, :, ::1] x, const float[:, ::1] g, float[:, :, :, ::1] y, int threads):
    """``y[n, c] = x[n, c] * g[n, c]`` (float32 ``(N, C, H, W)``, ``g`` ``(N, C)``; ``y`` apart from ``x``). Returns
    ``y``."""
    cdef qc_se_job j
    cdef int64_t rows = x.shape[0] * x.shape[1]
    if (y.shape[0] != x.shape[0] or y.shape[1] != x.shape[1] or y.shape[2] != x.shape[2] or y.shape[3] != x.shape[3]
            or g.shape[0] != x.shape[0] or g.shape[1] != x.shape[1]):
        raise ValueError("scale_channels: x and y must have one shape, g one value per (n, c)")
    j.HW = x.shape[2] * x.shape[3]
    if rows == 0 or j.HW == 0:
        return y
    j.x, j.g, j.y = &x[0, 0, 0, 0], &g[0, 0], &y[0, 0, 0, 0]
    with nogil:
        _parallel_for(rows, max(1, 4096 // j.HW), <pool_fn> qc_se_rows(1), &j, threads)
    return y


def excite_gate(const float[:, ::1] means, list steps):
    """A squeeze-excitation gate on the channel means ``(N, C)`` (float32): ``steps`` in order, each
    ``("Conv", wt, b, act, ps, pt)`` (``wt`` float32 C-contiguous ``(C, O)``: the 1x1 weight transposed; ``b``
    ``(O,)``; ``act`` a code of :data:`GATE_ACTS`; ``ps``, ``pt`` ``(O,)`` or None: a post_affine) or ``(op, p0,
    p1)`` (``op`` a code of :data:`GATE_OPS`), in ``qconv_fused.h``'s float32 arithmetic. Returns a new float32
    ``(N, C_last)``."""
    cdef float[:, ::1] v = np.array(means, np.float32)
    cdef float[:, ::1] u
    cdef const float[:, ::1] w
    cdef const float[::1] b, ps, pt
    cdef const float *pps
    cdef const float *ppt
    cdef int act, op
    cdef float p0, p1
    for step in steps:
        if step[0] == "Conv":
            w, b = step[1], step[2]
            if w.shape[0] != v.shape[1] or b.shape[0] != w.shape[1]:
                raise ValueError(f"a gate conv of transposed weight {tuple(w.shape)} on {v.shape[1]} channels")
            act = step[3]
            pps = ppt = NULL
            if step[4] is not None:
                ps, pt = step[4], step[5]
                if ps.shape[0] != w.shape[1] or pt.shape[0] != w.shape[1]:
                    raise ValueError("a gate conv's post_affine must have one value per output channel")
                pps, ppt = &ps[0], &pt[0]
            u = np.empty((v.shape[0], w.shape[1]), np.float32)
            with nogil:
                qc_gate_conv(&v[0, 0], v.shape[0], v.shape[1], &w[0, 0], &b[0], w.shape[1], act, pps, ppt, &u[0, 0])
            v = u
        else:
            op, p0, p1 = step[0], step[1], step[2]
            with nogil:
                qc_gate_op(&v[0, 0], v.shape[0] * v.shape[1], op, p0, p1)
    return np.asarray(v)


# the most gate steps a native squeeze-excitation call holds (a block has 3-6)
DEF GATE_MAX_STEPS = 16

ctypedef struct _GateStep:
    int conv                    # 1: qc_gate_conv, 0: qc_gate_op
    const float *w              # conv: (cin, cout) transposed weight, bias, post_affine or NULL
    const float *b
    const float *ps
    const float *pt
    int64_t cout
    int act, op
    float p0, p1


ctypedef struct _ExciteNative:
    qc_native base
    int64_t N, C, HW, width     # width: the most channels a gate value has
    int nsteps, threads
    _GateStep steps[GATE_MAX_STEPS]


cdef int64_t _excite_native_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    """qc_native.run of :func:`excite_native`: channel_means, the gate (excite_gate's steps), scale_channels, as the
    Python kernel calls them (nonzero: a mean is NaN / inf)."""
    cdef const _ExciteNative *d = <const _ExciteNative *> n
    cdef float *bufs[2]
    cdef float *v = <float *> scratch
    cdef qc_se_job j
    cdef int64_t i, c = d.C, rows = d.N * d.C, chunk = max(1, 4096 // d.HW)
    cdef int k, cur = 0
    cdef const _GateStep *st
    bufs[0] = v + d.N * d.width
    bufs[1] = bufs[0] + d.N * d.width
    j.HW, j.x, j.out = d.HW, x, v
    _parallel_for(rows, chunk, <pool_fn> qc_se_rows(0), &j, d.threads)
    for i in range(rows):
        if v[i] - v[i] != 0:
            return 1
    for k in range(d.nsteps):
        st = &d.steps[k]
        if st.conv:
            qc_gate_conv(v, d.N, c, st.w, st.b, st.cout, st.act, st.ps, st.pt, bufs[cur])
            v, c, cur = bufs[cur], st.cout, 1 - cur
        else:
            qc_gate_op(v, d.N * c, st.op, st.p0, st.p1)
    j.x, j.g, j.y = x, v, y
    _parallel_for(rows, chunk, <pool_fn> qc_se_rows(1), &j, d.threads)
    return 0


def excite_native(tuple shape, list steps, int threads):
    """A squeeze-excitation call (``channel_means``, ``excite_gate(means, steps)``, ``scale_channels``; float32
    NCHW ``x`` of ``shape`` into ``y`` of the same shape on ``threads`` threads) as a
    :class:`~qconv._ext._cpu.NativeCall` for the custom operator; None when the steps are more than it holds,
    do not end on ``C`` channels, or the planes are empty."""
    cdef _ExciteNative *d
    cdef NativeCall call
    cdef const float[:, ::1] w
    cdef const float[::1] b, ps, pt
    cdef int64_t N = shape[0], C = shape[1], H = shape[2], W = shape[3], c = shape[1], width = shape[1]
    cdef int k
    if len(steps) > GATE_MAX_STEPS or N * C * H * W == 0:
        return None
    for step in steps:
        if step[0] == "Conv":
            if step[1].shape[0] != c:
                return None
            c = step[1].shape[1]
            width = max(width, c)
    if c != C:
        return None
    call = _native_call(sizeof(_ExciteNative), shape, shape, 4 * 3 * N * width, steps)
    if call is None:
        return None
    d = <_ExciteNative *> call.mem
    d.N, d.C, d.HW, d.width, d.nsteps, d.threads = N, C, H * W, width, len(steps), threads
    for k, step in enumerate(steps):
        if step[0] == "Conv":
            w, b = step[1], step[2]
            d.steps[k].conv, d.steps[k].w, d.steps[k].b, d.steps[k].cout, d.steps[k].act = 1, &w[0, 0], &b[0], \
                w.shape[1], step[3]
            d.steps[k].ps = d.steps[k].pt = NULL
            if step[4] is not None:
                ps, pt = step[4], step[5]
                d.steps[k].ps, d.steps[k].pt = &ps[0], &pt[0]
        else:
            d.steps[k].conv, d.steps[k].op, d.steps[k].p0, d.steps[k].p1 = 0, step[0], step[1], step[2]
    d.base.run = _excite_native_run
    return call


ctypedef struct _PoolNative:
    qc_native base
    int64_t rows, HW
    int threads


cdef int64_t _pool_native_run(const qc_native *n, const float *x, float *y, void *scratch) noexcept nogil:
    """qc_native.run of :func:`pool_native`: channel_means straight into ``y``."""
    cdef const _PoolNative *d = <const _PoolNative *> n
    cdef qc_se_job j
    j.HW, j.x, j.out = d.HW, x, y
    _parallel_for(d.rows, max(1, 4096 // d.HW), <pool_fn> qc_se_rows(0), &j, d.threads)
    return 0


def pool_native(tuple shape, int threads):
    """A global average pool (``channel_means`` of float32 NCHW ``x`` of ``shape`` into ``y`` ``(N, C, 1, 1)`` on
    ``threads`` threads) as a :class:`~qconv._ext._cpu.NativeCall` for the custom operator; None for empty planes."""
    cdef _PoolNative *d
    cdef NativeCall call
    if len(shape) != 4 or shape[0] * shape[1] * shape[2] * shape[3] == 0:
        return None
    call = _native_call(sizeof(_PoolNative), shape, (shape[0], shape[1], 1, 1), 0, None)
    if call is None:
        return None
    d = <_PoolNative *> call.mem
    d.rows, d.HW, d.threads = shape[0] * shape[1], shape[2] * shape[3], threads
    d.base.run = _pool_native_run
    return call
