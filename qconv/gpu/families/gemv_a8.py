"""``gemv_a8`` (``kernels/gemv_a8.cl``): with ``act_quant="row"``, linear layers on one row (N = H = W = 1) with
int8 activations: x is quantized once (``gemv_a8_c*``: a ``quant_x_a8`` launch first) or by every work-group
into local memory (``gemv_a8f_c*``: one launch), and the buffer weights
(:class:`~qconv.layouts.opencl.OpenCL1x1BufferLayout`) stream through 4-way byte dot products (``dp4a``; PTX on
NVIDIA, a portable fallback elsewhere), integer sums exact; a grid of at most g work-groups per compute unit
loops over tiles of output channels (local sizes ``(l0, SPLIT, g)``)."""
from __future__ import annotations

import numpy as np

from ..context import import_pyopencl
from ..launch import X, Y, Scratch, Step, planned_candidate
from .act_quant import ROW_QUANT_OPTIONS
from .base import cdiv, device_limits, common_options, pow2ceil, pow2floor, scalars

program = "gemv_a8"
variants = A8_VARIANTS = {  # name -> (NC output channels per item, fused); the fused ones first: one launch,
    # faster wherever x's int8 words fit in local memory (the H200, 2026-11-30)
    "gemv_a8f_c1": (1, True), "gemv_a8f_c2": (2, True), "gemv_a8_c1": (1, False), "gemv_a8_c2": (2, False),
}
fixed_local_size = False
# gemv_a8 with per-channel scales sums q * xq over all input channels in int32: exact while K times the
# largest product fits (int8: 128 * 127; int4: (q + 8) * xq, unsigned nibbles, 15 * 127). Longer int8 rows
# (-DA8_WIDE) fold each lane's int32 sum into float before it can overflow and add the lanes in float (int4
# rows that long exceed A8_MAX_NV). Mirrored by an #error in gemv_a8.cl; tests/test_gpu_bounds.py runs both
# sides of the bound. (A first version summed in 64-bit integers in local memory: its unfused launches
# failed with OUT_OF_RESOURCES on the H200.)
A8_EXACT_MAX_IC = {8: (2**31 - 1) // (128 * 127), 4: (2**31 - 1) // (15 * 127)}
# gemv_a8 quantizes x with every float4 of it held in registers by the quantizing items (quant_x_a8's QL, or
# the fused variants' l0 * SPLIT): at most this many float4 per item (more crashed PoCL at 2.1 M channels;
# on a GPU they spill). Longer rows run the float kernels on quantized rows. Mirrored in gemv_a8.cl.
A8_MAX_NV = 256


def unsupported(layer, problem=None, variant=None):
    w = layer.spec.weight
    if not layer.act_row:
        return "it needs act_quant='row' (int8 activations)"
    if layer.path != "1x1" or layer.image:
        return "it needs a linear / 1x1 layer with buffer weights (image=False)"
    if scale_group(layer) is None:
        kc = layer.layout.ic_pack
        return (f"it needs per-channel scales or blocks that are a multiple or a divisor of {kc} input channels "
                f"and of {32 // w.bits} or more, got {w.block_channels}")
    if problem is not None and problem.rows != 1:
        return f"it runs linear layers on one row (N = H = W = 1), got {problem.n}x{problem.h}x{problem.w}"
    if variant is not None and not local_sizes(layer, *A8_VARIANTS[variant]):
        return (f"it needs a local size the device accepts (fused: l0 * SPLIT a power of two, or whole warps on "
                f"NVIDIA, and room for x's int8 words in local memory) and at most {A8_MAX_NV} float4 of x per "
                f"quantizing item (fused: per item of l0 * SPLIT, unfused: of {quant_items(layer)})")
    return None


def candidates(layer, problem) -> list:
    names = [layer.forced_variant] if layer.forced_variant is not None else list(A8_VARIANTS)
    return [_candidate(layer, problem, v) for v in names if unsupported(layer, problem, v) is None]


def scale_group(layer):
    """Input channels per scale group inside a chunk (0: per-channel scales), or None when the blocks do not
    align with the chunks."""
    w = layer.spec.weight
    if w.n_blocks == 1:
        return 0
    kc, bc = layer.layout.ic_pack, w.block_channels
    g = min(bc, kc)
    return g if (bc % kc == 0 or kc % bc == 0) and g % (32 // w.bits) == 0 else None


def wide(layer) -> bool:
    """Per-channel row past A8_EXACT_MAX_IC: gemv_a8 folds its lanes' int32 sums into float."""
    w = layer.spec.weight
    return w.n_blocks == 1 and w.q.shape[1] > A8_EXACT_MAX_IC[w.bits]


def quant_items(layer) -> int:
    """quant_x_a8's work-group size (the unfused variants quantize x in one work-group)."""
    return min(1024, pow2floor(int(layer.device.max_work_group_size)))


def reducible(layer, n) -> bool:
    """gemv_a8f's prologue reduces over its n items: a tree needs a power of two; -DNV_PTX's warp shuffles need
    whole warps (a multiple of 32, at most 32 warps)."""
    return not n & (n - 1) or (layer.nv_ptx and n % 32 == 0 and n <= 1024)


def balanced_sizes(layer, nc, pk) -> list:
    """(l0, SPLIT, g) that spread the output channels evenly: g work-groups per compute unit, each one tile of
    l0 * nc channels, l0 about OCp / (nc * g * units), even, and raised until l0 * SPLIT is whole warps for the
    largest SPLIT <= min(32, pk) that keeps the group at most 1024 items. Power-of-two tiles leave units idle
    or doubly loaded: 4096->11008 in tiles of 64 is 172 tiles, so 40 of 132 units stream two tiles while the
    rest stream one (H200: 13.8 us against 12.3 us for l0 = 42)."""
    ocp = cdiv(layer.spec.weight.out_channels, 4) * 4
    cus = int(layer.device.max_compute_units)
    sizes = []
    for g in (2, 1):
        base = 2 * cdiv(cdiv(ocp, nc * g * cus), 2)
        for l0 in range(base, base + 32, 2):
            split = next((s for s in (32, 16, 8, 4, 2, 1) if s <= pk and l0 * s <= 1024 and (l0 * s) % 32 == 0),
                         None)
            if split is not None:
                sizes.append((l0, split, g))
                break
    return sizes


def local_sizes(layer, nc, fused=False) -> list:
    """(l0, SPLIT, g) to time: local size (l0, SPLIT), g work-groups per compute unit (the grid is at most
    g * compute units groups, each looping over tiles of l0 * nc output channels); the fused variants also hold
    x's int8 words and group sums in local memory."""
    w = layer.spec.weight
    if layer.forced_lws is not None:
        sizes = [(*layer.forced_lws[:2], 1)]
    elif layer.tune == "full":
        sizes = [(a, b, g) for a in (16, 32, 64, 128, 256) for b in (2, 4, 8, 16, 32) for g in (1, 2)]
    elif layer.is_gpu:
        sizes = [(128, 4, 2), (256, 4, 2), (64, 8, 2)]  # the H200's picks (scripts/a8_lab.py)
    else:
        sizes = [(16, 4, 1), (8, 2, 1)]
    ocp = cdiv(w.out_channels, 4) * 4
    kc = layer.layout.ic_pack
    kch = cdiv(w.q.shape[1], kc)
    maxwg, mi, lmem = device_limits(layer)
    maxwg = min(maxwg, 1024)
    p0, pk = pow2ceil(cdiv(ocp, nc)), pow2floor(kch)
    if layer.forced_lws is None:  # powers of two (the prologue's reduction tree), clamped to the problem
        sizes = [(min(a, p0), min(b, pk), g) for a, b, g in sizes]
        if layer.is_gpu and layer.nv_ptx:
            sizes = balanced_sizes(layer, nc, pk) + sizes
    gr = scale_group(layer)
    held = kch * kc + 4 * kch * (kc // gr if gr else 1) if fused else 0  # bytes: xq words, group sums
    if w.n_blocks == 1 and w.bits == 4 and w.q.shape[1] > A8_EXACT_MAX_IC[4]:
        return []  # never reached: A8_MAX_NV stops such rows first (A8_WIDE is int8 only)
    if not fused and cdiv(kch * kc, 4 * quant_items(layer)) > A8_MAX_NV:
        return []  # quant_x_a8 would hold more than A8_MAX_NV float4 per item
    return [(a, b, g) for a, b, g in dict.fromkeys(sizes)
            if a * b <= maxwg and a <= mi[0] and b <= mi[1] and held + 4 * nc * a * b <= lmem
            and not (fused and not reducible(layer, a * b))
            and not (fused and cdiv(kch * kc, 4 * a * b) > A8_MAX_NV)]


def _candidate(layer, problem, name):
    """gemv_a8 (NDRange (G * l0, SPLIT), local (l0, SPLIT), G groups over ceil(OCp / (l0*NC)) tiles, see
    :func:`local_sizes`), after quant_x_a8 (one work-group) unless fused."""
    cl = import_pyopencl()
    wt = layer.spec.weight
    nc, fused = A8_VARIANTS[name]
    ocp = cdiv(wt.out_channels, 4) * 4
    kc = layer.layout.ic_pack
    kch = cdiv(wt.q.shape[1], kc)
    group = scale_group(layer)
    opts = list(layer.layout.build_options) + list(common_options(layer, scale_groups=False))
    if wide(layer):  # past A8_EXACT_MAX_IC: lane sums folded into float
        opts.append("-DA8_WIDE")
    ql = quant_items(layer)
    opts += [f"-DNC={nc}", "-DU=4", f"-DQL={ql}", *ROW_QUANT_OPTIONS]
    if not layer.specialize:  # quant_x_a8 sizes its registers by IC (specialised: in the layer options)
        opts.append(f"-DG_IC={wt.q.shape[1]}")
    if group:
        opts.append(f"-DGROUP_CH={group}")
    if problem.layout == "nchw":
        opts.append("-DOUT_NCHW")
    if layer.nv_ptx:
        opts.append("-DNV_PTX")
    if fused:
        opts.append("-DFUSED")
    opts = tuple(opts)
    scal = scalars(wt.q.shape[1], wt.out_channels)
    xq_bytes = 16 * kch * (2 if wt.bits == 4 else 1)
    gs_bytes = 4 * (1 + (1 if not group else kch * kc // group))  # dx, sums of xq
    cus, b = int(layer.device.max_compute_units), layer.buffers
    # unfused: x's int8 words and sums in scratch buffers of the plan's, one per queue (launches on one queue
    # run in order, so they never share them at the same time)
    xq, gs = Scratch(xq_bytes, "xq"), Scratch(gs_bytes, "group sums")

    def steps(lws):
        l0, split, g = lws
        gopts = opts + (f"-DL0={l0}", f"-DSPLIT={split}")
        ntiles = cdiv(ocp, l0 * nc)
        waves = cdiv(ntiles, g * cus)  # tiles per group, at most
        gws = (cdiv(ntiles, waves) * l0, split)
        red = cl.LocalMemory(4 * nc * l0 * split)
        if fused:
            return [Step(program, gopts, "gemv_a8",
                         (np.int32(ocp), X, b.q, b.scales, b.offsets, b.bias, Y, red, *scal), gws, (l0, split))]
        return [Step(program, opts, "quant_x_a8", (X, xq, gs, cl.LocalMemory(4 * ql), scal[0]), (ql,), (ql,)),
                Step(program, gopts, "gemv_a8",
                     (np.int32(ocp), xq, gs, b.q, b.scales, b.offsets, b.bias, Y, red, *scal), gws, (l0, split))]

    return planned_candidate(layer.ctx, name, program, opts, (ocp, 1, wt.q.shape[1], wt.out_channels),
                             local_sizes(layer, nc, fused), steps, scratch=() if fused else (xq, gs))
