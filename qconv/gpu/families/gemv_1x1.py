"""``gemv_1x1`` (``kernels/conv_1x1.cl``, kernel ``gemv_1x1``): linear layers on one row (N = H = W = 1) with
float activations from buffer weights (:class:`~qconv.layouts.opencl.OpenCL1x1BufferLayout`): each item issues
``U`` 16-byte weight loads before it decodes any; NDRange ``(ceil(OCp / l0) * l0, SPLIT)``, local size
``(l0, SPLIT)`` (split-K)."""
from __future__ import annotations

import numpy as np

from ..context import import_pyopencl
from ..launch import X, Y, Step, planned_candidate
from .base import cdiv, device_limits, io_options, pow2ceil, pow2floor, roundup, scalars

program = "conv_1x1"
variants = GEMV_VARIANTS = {  # name -> U: 16-byte weight chunks per item loaded before any is used
    "gemv_u4": 4, "gemv_u8": 8,
}
fixed_local_size = False


def unsupported(layer, problem=None, variant=None):
    w = layer.spec.weight
    if layer.path != "1x1":
        return "it runs linear layers (ungrouped 1x1 convs with stride 1 and no padding) only"
    if layer.image:
        return "it reads buffer weights; pass image=False"
    if w.n_blocks > 1 and layer.layout.scale_group(w.block_channels) is None:
        return f"it needs scale blocks of a multiple of 4 input channels, got {w.block_channels}"
    if problem is not None and problem.rows != 1:
        return f"it runs linear layers on one row (N = H = W = 1), got {problem.n}x{problem.h}x{problem.w}"
    return None


def candidates(layer, problem) -> list:
    if layer.forced_variant is not None:
        names = [layer.forced_variant]
    else:
        names = list(GEMV_VARIANTS) if layer.tune == "full" else ["gemv_u4"]
    return [_candidate(layer, problem, name) for name in names]


def local_sizes(layer, ocp, kch, ngr) -> list:
    if layer.forced_lws is not None:
        return [layer.forced_lws[:2]]
    maxwg, mi, lmem = device_limits(layer)
    local_floats = lmem // 4 - 256 - ngr
    p0, pk = pow2ceil(ocp), pow2floor(kch)
    if layer.tune == "full":
        sizes = [(a, b) for a in (16, 32, 64, 128, 256) for b in (1, 2, 4, 8, 16, 32, 64)]
    else:
        sizes = [(32, 16), (128, 4), (64, 8)]  # the H200's picks (8192->28672: 32x16)
    ok = []
    for a, b in sizes:
        a, b = min(a, p0), min(b, pk)
        if a * b <= min(maxwg, 1024) and a <= mi[0] and b <= mi[1] and a * b <= local_floats:
            ok.append((a, b))
    return list(dict.fromkeys(ok)) or [(1, 1)]


def _candidate(layer, problem, name):
    wt = layer.spec.weight
    ocp = cdiv(wt.out_channels, 4) * 4
    kc = layer.layout.ic_pack
    kch = cdiv(wt.q.shape[1], kc)
    if wt.offsets is None:
        ngr = 0  # floats of sums of x per scale group (asymmetric weights)
    elif wt.n_blocks == 1:
        ngr = kch
    else:
        ngr = kch * (kc // layer.layout.scale_group(wt.block_channels))
    opts = tuple(layer.base_options) + (f"-DU={GEMV_VARIANTS[name]}",) + io_options(layer, problem)
    scal = scalars(wt.q.shape[1], wt.out_channels)
    b = layer.buffers

    def steps(lws):
        cl = import_pyopencl()
        lws = (1, 1) if lws is None else lws  # sx lives after l0 * SPLIT floats: the size must be known
        split = lws[1]
        args = (np.int32(ocp), X, b.q, b.scales, b.offsets, b.bias, Y, cl.LocalMemory(4 * (lws[0] * split + ngr)),
                *scal)
        return [Step(program, opts + (f"-DSPLIT={split}",), "gemv_1x1", args, (roundup(ocp, lws[0]), split),
                     tuple(lws))]

    return planned_candidate(layer.ctx, name, program, opts, (ocp, 1, wt.q.shape[1], wt.out_channels),
                             local_sizes(layer, ocp, kch, ngr), steps)

