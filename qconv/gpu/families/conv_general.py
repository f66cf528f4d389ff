"""``conv_general`` (``kernels/conv_general.cl``): any kernel size, stride, padding, dilation and groups, weights
in :class:`~qconv.layouts.opencl.OpenCLConvWeightLayout`; ``CB`` blocks of 4 output channels x ``HB`` rows x
``WB`` columns per work-item, optionally split-K over the input channels (local size ``(l0, l1, SPLIT)``)."""
from __future__ import annotations

import numpy as np

from ..context import import_pyopencl
from ..launch import X, Y, Step, planned_candidate
from .base import cdiv, device_limits, io_options, pow2ceil, pow2floor, roundup, scalars

program = "conv_general"
variants = GENERAL_VARIANTS = {  # name -> (CB blocks of 4 output channels, HB rows, WB columns)
    "c4h1w1": (1, 1, 1), "c4h1w2": (1, 1, 2), "c4h4w1": (1, 4, 1), "c8h2w1": (2, 2, 1),
    "c8h4w1": (2, 4, 1), "c4h1w4": (1, 1, 4), "c8h1w4": (2, 1, 4),
    "c4h2w4": (1, 2, 4), "c8h2w4": (2, 2, 4), "c16h1w4": (4, 1, 4), "c8h1w8": (2, 1, 8),
}
fixed_local_size = False


def unsupported(layer, problem=None, variant=None):
    if layer.path != "general":
        return ("it reads the general conv weights; this layer is an ungrouped 1x1 conv with stride 1 and no "
                "padding, whose weights are in the 1x1 layout (conv_1x1)")
    return None


def order(layer, oh, ow, o4, n=1) -> list:
    """Variants, the heuristic's favourite first."""
    names = []
    if layer.is_gpu and n * oh * ow * o4 >= 262144 and ow >= 4:
        # big problems: more outputs per item amortise the weight decode and the input loads
        names += [v for v, ok in (("c8h2w4", oh >= 2 and o4 >= 2), ("c16h1w4", o4 >= 4),
                                  ("c8h1w8", ow >= 8 and o4 >= 2)) if ok]
    if ow >= 4:
        names += ["c8h1w4", "c4h1w4"] if o4 >= 2 else ["c4h1w4"]
    if oh >= 4:
        names += ["c8h4w1", "c4h4w1"] if o4 >= 2 else ["c4h4w1"]
    if ow >= 2:
        names.append("c4h1w2")
    if oh >= 2 and o4 >= 2:
        names.append("c8h2w1")
    names.append("c4h1w1")
    return names + [v for v in GENERAL_VARIANTS if v not in names]


def local_sizes(layer, g0, g1, ic4=1, per_item=4) -> list:
    """Local sizes (l0, l1) or, with split-K over input channels, (l0, l1, SPLIT)."""
    if layer.forced_lws is not None:
        return [layer.forced_lws]
    maxwg, mi, lmem = device_limits(layer)
    local_floats = lmem // 4 - 256
    p0, p1 = pow2ceil(g0), pow2ceil(g1)
    if layer.tune == "full":
        sizes = [(a, b) for a in (1, 2, 4, 8, 16, 32, 64, 128, 256) for b in (1, 2, 4, 8, 16, 32, 64)
                 if a <= p0 and b <= p1 and 8 <= a * b <= min(maxwg, 1024)]
    else:
        l0 = min(64, p0)
        l1 = min(max(1, 64 // l0), p1)
        sizes = [(l0, l1), (16, 4), (32, 2), (8, 8), (64, 1), (32, 4), (4, 16)]
        sizes = [(min(a, p0), min(b, p1)) for a, b in sizes]
    if layer.is_gpu and g0 * g1 < 65536 and ic4 >= 4 and len(mi) > 2:
        # too few outputs to fill a GPU: split the input channels over dim 2 (first when very few)
        pk = pow2floor(ic4)
        split = [(min(32, p0), min(2, p1), min(8, pk)), (min(32, p0), 1, min(16, pk)),
                 (min(16, p0), min(2, p1), min(16, pk)), (min(64, p0), 1, min(4, pk)),
                 (min(32, p0), min(2, p1), min(4, pk)), (min(16, p0), 1, min(32, pk))]
        if layer.tune == "full":
            split += [(a, b, k) for a in (8, 16, 32, 64) for b in (1, 2) for k in (2, 4, 8, 16, 32)
                      if a <= p0 and b <= p1 and k <= pk]
        split = [sz for sz in split if sz[0] * sz[1] * sz[2] * per_item <= local_floats
                 and sz[0] * sz[1] * sz[2] <= min(maxwg, 1024) and sz[2] <= mi[2] and sz[2] > 1]
        sizes = split + sizes if g0 * g1 < 16384 else sizes[:3] + split + sizes[3:]
    sizes = [sz for sz in dict.fromkeys(sizes) if sz[0] * sz[1] <= maxwg and sz[0] <= mi[0] and sz[1] <= mi[1]]
    if not layer.is_gpu:
        sizes = [None] + sizes  # PoCL: its own choice is good and avoids a per-size compile
    return sizes or [None]


def candidates(layer, problem) -> list:
    s, wt = layer.spec, layer.spec.weight
    n, h, w, oh, ow = problem[1:]
    o4 = cdiv(wt.out_channels, 4)
    ipg = wt.q.shape[1]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = s.kernel_size, s.stride, s.padding, s.dilation
    names = order(layer, oh, ow, o4, n)
    if layer.forced_variant is not None:
        names = [layer.forced_variant]
    elif layer.tune == "fast":
        names = names[:3]
    scal = [n, h, w, oh, ow, ipg, wt.out_channels, wt.groups, kh, kw, sh, sw, ph, pw, dh, dw]
    return [_candidate(layer, name, problem, o4, ipg, scal) for name in names]


def _candidate(layer, name, problem, o4, ipg, scal):
    """One conv_general launch: NDRange (g0, g1[, SPLIT]) rounded up to the local size, g0 = ceil(O4/CB) *
    ceil(OW/WB), g1 = N * ceil(OH/HB)."""
    cb, hb, wb = GENERAL_VARIANTS[name]
    n, oh, ow = problem.n, problem.oh, problem.ow
    g0, g1 = cdiv(o4, cb) * cdiv(ow, wb), n * cdiv(oh, hb)
    per_item = cb * hb * wb * 4
    opts = list(layer.base_options) + [f"-DCB={cb}", f"-DHB={hb}", f"-DWB={wb}"] + list(io_options(layer, problem))
    if o4 % cb:
        opts.append("-DC_LEAVE")
    if oh % hb:
        opts.append("-DH_LEAVE")
    if ow % wb:
        opts.append("-DW_LEAVE")
    opts = tuple(opts)
    b, args = layer.buffers, scalars(*scal)

    def steps(lws):
        cl = import_pyopencl()
        split = 1 if lws is None or len(lws) < 3 else lws[2]
        kopts = opts + (f"-DSPLIT={split}",) if split > 1 else opts
        if lws is None:
            gws, local = (g0, g1, 1), None
        else:
            gws, local = (roundup(g0, lws[0]), roundup(g1, lws[1]), split), (lws[0], lws[1], split)
        nloc = 1 if lws is None else lws[0] * lws[1] * split * per_item if split > 1 else 1
        return [Step(program, kopts, program, (np.int32(g0), np.int32(g1), X, b.q, b.scales, b.offsets, b.bias, Y,
                                               cl.LocalMemory(4 * max(1, nloc)), *args), gws, local)]

    return planned_candidate(layer.ctx, name, program, opts, (g0, g1) + tuple(scal),
                             local_sizes(layer, g0, g1, cdiv(ipg, 4), per_item), steps)
