"""``gemv_mma`` (``kernels/gemv_mma.cl``): with float activations, linear layers on one row on int8 tensor cores
(PTX ``mma.sync`` m16n8k32 on NVIDIA sm_80+, offered to the tuner there; elsewhere only when forced, as an
emulation): x as the four signed base-256 digits of ``rint(x * 2^sh)`` (``max |x| * 2^sh`` in ``[2^28, 2^29)``),
weights in :class:`~qconv.layouts.opencl.OpenCLGemvMMALayout` (block scales and offsets in
:class:`~qconv.layouts.opencl.OpenCLGemvMMAScaleLayout`), exact integer sums, one rounding per layer or scale
block; local sizes ``(32, SPLIT, g)``."""
from __future__ import annotations

from ...layouts.opencl import OpenCLGemvMMALayout, OpenCLGemvMMAScaleLayout
from ..launch import X, Y, Step, planned_candidate
from .base import cdiv, common_options, scalars

program = "gemv_mma"
variants = GEMV_MMA_VARIANTS = {  # name -> (U: a batch of 16-byte loads per lane, PIPE: the next batch in flight)
    "gemv_mma": (8, False),
    "gemv_mma_u4": (4, False),
    "gemv_mma_p4": (4, True),
}
MAX_CHANNELS = 131071  # int32 column sums: each product 16 q d (or q d) is at most 2^14
fixed_local_size = False


def unsupported(layer, problem=None, variant=None):
    w = layer.spec.weight
    if layer.act_row:
        return "it needs float activations (act_quant=None)"
    if layer.path != "1x1" or layer.image:
        return "it needs a linear / 1x1 layer with buffer weights (image=False)"
    kt = OpenCLGemvMMALayout(w.bits).k_per_load
    if w.n_blocks > 1:
        bc = w.block_channels
        if bc % 16 or (kt % bc and bc % kt):
            return f"its scale blocks must be 16, 32{', 64' if w.bits == 4 else ''} or a multiple of {kt} " \
                   f"input channels, got {bc}"
    ks = cdiv(w.q.shape[1], kt) * kt // 16
    # x's digits, sums of x (per block; with offsets per 16-channel step too), max |x| and the warps' int64
    # parts (32 warps at most), the emulation's tiles
    need = (64 * ks + 4 * cdiv(w.q.shape[1], 16) + (4 * ks if w.offsets is not None else 0) + 4 * 1024 + 8 * 1024
            + (0 if layer.mma_native else 4 * 32 * 192))
    if need > int(layer.device.local_mem_size):
        return (f"x's digits need {need} bytes of local memory for {w.q.shape[1]} input channels; "
                f"{layer.device.name} has {int(layer.device.local_mem_size)}")
    if w.q.shape[1] > MAX_CHANNELS:
        return f"its int32 sums take at most {MAX_CHANNELS} input channels, got {w.q.shape[1]}"
    if problem is not None and problem.rows != 1:
        return f"it runs linear layers on one row (N = H = W = 1), got {problem.n}x{problem.h}x{problem.w}"
    return None


def candidates(layer, problem) -> list:
    """Offered where PTX mma.sync runs (NVIDIA sm_80+); elsewhere only when forced (an emulation)."""
    if layer.forced_variant is not None:
        return [_candidate(layer, problem, layer.forced_variant)]
    return [_candidate(layer, problem, v) for v in GEMV_MMA_VARIANTS] if layer.mma_native else []


def local_sizes(layer) -> list:
    """(32, SPLIT, g) to time: SPLIT warps a work-group, at most g work-groups per compute unit."""
    maxwg = min(int(layer.device.max_work_group_size), 1024)
    forced = layer.forced_lws
    if forced is not None:
        split = forced[1]
        if forced[0] != 32 or 32 * split > maxwg or not (layer.mma_native or not split & (split - 1)):
            raise ValueError(f"gemv_mma runs work-groups of (32, SPLIT) items: local_size must be (32, SPLIT, 1) "
                             f"with 32 * SPLIT <= {maxwg} (and SPLIT a power of two off NVIDIA), got {forced!r}")
        return [(32, split, 1)]
    if layer.mma_native:
        sizes = [(32, 16, 2), (32, 8, 4), (32, 16, 4)]  # the H200's best (scripts/gemv_mma_lab.py)
    else:
        sizes = [(32, 2, 1), (32, 1, 1)]
    return [sz for sz in sizes if sz[0] * sz[1] <= maxwg]


def _candidate(layer, problem, name):
    """gemv_mma (local (32, SPLIT), at most g * compute units work-groups over ceil(O/16) tiles)."""
    wt = layer.spec.weight
    u, pipe = GEMV_MMA_VARIANTS[name]
    wlayout = OpenCLGemvMMALayout(wt.bits)
    wq = layer.weights_in(wlayout)
    opts = list(common_options(layer, scale_groups=False)) + list(wlayout.build_options)
    opts.append(f"-DU={u}")
    if pipe:
        opts.append("-DPIPE")
    if not layer.specialize:  # local memory sized by IC (specialised: in the layer options)
        opts.append(f"-DG_IC={wt.q.shape[1]}")
    if problem.layout == "nchw":
        opts.append("-DOUT_NCHW")
    if layer.mma_native:
        opts.append("-DNV_PTX")
    opts = tuple(opts)
    scal = scalars(wt.q.shape[1], wt.out_channels)
    cus, tiles, b = int(layer.device.max_compute_units), cdiv(wt.out_channels, 16), layer.buffers
    if wt.n_blocks > 1:  # both in one stream, in the order of the lanes' folds
        ws = wo = layer.scales_in(OpenCLGemvMMAScaleLayout(layer.scale_layout.dtype, wt.offsets is not None))
    else:
        ws, wo = b.scales, b.offsets

    def steps(lws):
        _, split, g = lws
        groups = min(tiles, g * cus)
        return [Step(program, opts + (f"-DSPLIT={split}",), program,
                     (X, wq, ws, wo, b.bias, Y, *scal), (32 * groups, split), (32, split))]

    return planned_candidate(layer.ctx, name, program, opts,
                             (cdiv(wt.out_channels, 4) * 4, 1, wt.q.shape[1], wt.out_channels),
                             local_sizes(layer), steps)
