"""``conv_1x1`` (``kernels/conv_1x1.cl``, kernel ``conv_1x1``): 1x1, stride-1, unpadded, ungrouped convs as a GEMM
over rows ``(n, h, w)``: ``NC`` = 1, 2 or 4 output channels per work-item from a buffer
(:class:`~qconv.layouts.opencl.OpenCL1x1BufferLayout`, variants ``buf_c<NC>_r<NB>``) or 1 or 2 from an Image2D
(:class:`~qconv.layouts.opencl.OpenCL1x1ImageLayout`, ``img_c<NC>_r<NB>``), ``NB`` = 1, 2 or 4 rows per
work-item, split-K over the work-group (local size ``(l0, SPLIT)``). The one-row GEMV of the same program is
:mod:`.gemv_1x1`."""
from __future__ import annotations

import numpy as np

from ..context import import_pyopencl
from ..launch import X, Y, Step, planned_candidate
from .base import cdiv, device_limits, io_options, pow2ceil, pow2floor, roundup, scalars

program = "conv_1x1"
fixed_local_size = False


def onex1_variants(image: bool) -> dict:
    """name -> (NC output channels per item, NB rows per item) of the 1x1 kernels."""
    ncs = (1, 2) if image else (4, 2, 1)
    store = "img" if image else "buf"
    return {f"{store}_c{nc}_r{nb}": (nc, nb) for nc in ncs for nb in (1, 2, 4)}


variants = {**onex1_variants(False), **onex1_variants(True)}


def unsupported(layer, problem=None, variant=None):
    if layer.path != "1x1":
        return "it runs ungrouped 1x1 convs with stride 1 and no padding only"
    if variant is not None and variant.startswith("buf") and layer.image:
        return "it reads buffer weights; pass image=False"
    if variant is not None and variant.startswith("img") and not layer.image:
        return "it reads Image2D weights, and this layer's are in a buffer (image=False, or they do not fit)"
    return None


def order(layer, m, names) -> list:
    """Variants for ``m`` rows, the heuristic's favourite first."""
    nb = 1 if m == 1 else 2 if m < 8 else 4
    first = [f"{'img_c2' if layer.image else 'buf_c4'}_r{nb}", f"{'img_c1' if layer.image else 'buf_c2'}_r{nb}"]
    if nb > 1:
        first.append(f"{'img_c2' if layer.image else 'buf_c4'}_r{nb // 2}")
    else:
        first.append(f"{'img_c1' if layer.image else 'buf_c1'}_r1")
    return first + [v for v in names if v not in first and (names[v][1] <= max(1, m))]


def local_sizes(layer, g0, g2, kch, per_item) -> list:
    """Local sizes (l0, SPLIT): l0 output-channel groups x SPLIT slices of the input chunks."""
    if layer.forced_lws is not None:
        return [layer.forced_lws[:2]]
    maxwg, mi, lmem = device_limits(layer)
    local_floats = lmem // 4 - 256
    p0, pk = pow2ceil(g0), pow2floor(kch)
    if layer.tune == "full":
        sizes = [(a, b) for a in (1, 2, 4, 8, 16, 32, 64, 128, 256) for b in (1, 2, 4, 8, 16, 32, 64, 128)
                 if a <= p0 and b <= pk and 8 <= a * b <= min(maxwg, 1024)]
    elif g0 * g2 < 16384:  # few rows: split K
        split = min(32, pk)
        guess = (max(1, min(256 // split, p0)), split)
        sizes = [guess, (16, min(16, pk)), (8, min(32, pk)), (32, min(8, pk)), (64, min(4, pk)), (4, min(64, pk))]
    else:
        sizes = [(min(64, p0), 1), (min(32, p0), 1), (min(128, p0), 1), (min(16, p0), min(4, pk))]
    ok = []
    for a, b in dict.fromkeys(sizes):
        a, b = min(a, p0), min(b, pk)
        if a * b <= maxwg and a <= mi[0] and b <= mi[1] and a * b * per_item <= local_floats:
            ok.append((a, b))
    ok = list(dict.fromkeys(ok))
    if not layer.is_gpu:
        ok = [None] + ok
    return ok or [None]


def candidates(layer, problem) -> list:
    names = onex1_variants(layer.image)
    order_ = order(layer, problem.rows, names)
    if layer.forced_variant in names:
        order_ = [layer.forced_variant]
    elif layer.tune == "fast":
        order_ = order_[:3]
    return [_candidate(layer, problem, name, *names[name]) for name in order_]


def _candidate(layer, problem, name, nc, nb):
    """One conv_1x1 launch: NDRange (OCp / NC rounded up to l0, SPLIT, ceil(M / NB))."""
    wt = layer.spec.weight
    hw, m = problem.h * problem.w, problem.rows
    g0, g2 = cdiv(wt.out_channels, 4) * 4 // nc, cdiv(m, nb)
    kch = cdiv(wt.q.shape[1], layer.layout.ic_pack)
    opts = tuple(layer.base_options) + (f"-DNC={nc}", f"-DNB={nb}") + io_options(layer, problem)
    scal = [m, hw, wt.q.shape[1], wt.out_channels]
    b, args = layer.buffers, scalars(*scal)

    def steps(lws):
        cl = import_pyopencl()
        if lws is None:
            gws, local, nloc = (g0, 1, g2), None, 1
        else:
            gws, local, nloc = (roundup(g0, lws[0]), lws[1], g2), (lws[0], lws[1], 1), lws[0] * lws[1] * nb * nc
        return [Step(program, opts + (f"-DSPLIT={1 if lws is None else lws[1]}",), program,
                     (np.int32(g0), np.int32(g2), X, b.q, b.scales, b.offsets, b.bias, Y,
                      cl.LocalMemory(4 * max(1, nloc)), *args), gws, local)]

    return planned_candidate(layer.ctx, name, program, opts, (g0, g2) + tuple(scal),
                             local_sizes(layer, g0, g2, kch, nb * nc), steps)
