"""``conv_gemm`` (``kernels/conv_gemm.cl``): ungrouped convs of either path as a tiled implicit GEMM
(``gemm_<TM>x<TN>[k<KS>]``: TM output channels x TN pixels per work-group, RM x RN per work-item, KS-way
split-K, weights decoded once per tile into local memory). It reads the path's own weights
(:class:`~qconv.layouts.opencl.OpenCLConvWeightLayout` with ``ic_pack=4``, or the 1x1 buffer layout), so the
tuner picks between it and the per-item kernels without a second copy. For batched layers; its local size is
fixed by the variant."""
from __future__ import annotations

from ..launch import X, Y, Step, planned_candidate
from .base import cdiv, geometry, io_options, pow2ceil, scalars

program = "conv_gemm"
variants = GEMM_VARIANTS = {  # name -> (TM output channels, TN pixels per work-group, RM, RN per work-item, KS)
    "gemm_128x128": (128, 128, 8, 8, 1), "gemm_128x64": (128, 64, 8, 4, 1), "gemm_64x128": (64, 128, 4, 8, 1),
    "gemm_64x64": (64, 64, 4, 4, 1), "gemm_128x32": (128, 32, 8, 4, 1), "gemm_64x32": (64, 32, 4, 4, 1),
    "gemm_64x16": (64, 16, 4, 2, 1), "gemm_32x32": (32, 32, 4, 4, 1),
    "gemm_128x8": (128, 8, 8, 2, 1), "gemm_64x8": (64, 8, 4, 2, 1),
    "gemm_32x32k2": (32, 32, 4, 4, 2),
    "gemm_128x32k2": (128, 32, 8, 4, 2), "gemm_64x32k2": (64, 32, 4, 4, 2), "gemm_128x8k2": (128, 8, 8, 2, 2),
    "gemm_64x8k4": (64, 8, 4, 2, 4),
}
fixed_local_size = True


def unsupported(layer, problem=None, variant=None):
    w = layer.spec.weight
    if w.groups != 1:
        return "it needs an ungrouped conv"
    if layer.path == "general" and layer.layout.ic_pack != 4:
        return f"it needs an ungrouped conv's weights with ic_pack=4, got ic_pack={layer.layout.ic_pack}"
    if layer.image:
        return "it reads buffer weights; pass image=False"
    if variant is not None and not fits(layer, variant):
        return (f"its tiles do not fit {layer.device.name}'s local memory for this kernel size (or its split-K "
                f"sums its weight tiles)")
    return None


def fits(layer, variant) -> bool:
    """The variant's local tiles fit the device (and its split-K sums fit its weight tiles)."""
    tm, tn, _, _, ks = GEMM_VARIANTS[variant]
    kt = 32 if layer.path == "1x1" else 4 * layer.spec.kernel_size[0] * layer.spec.kernel_size[1]
    return (ks * kt * (tm + tn + 8) <= int(layer.device.local_mem_size) // 4
            and (ks == 1 or tm * tn <= kt * (tm + 4)))


def groups(layer, variant, p) -> float:
    """Work-groups x split-K slices of a tile over ``p`` pixels, scaled by the used share of a tile taller
    than OC."""
    tm, tn, _, _, ks = GEMM_VARIANTS[variant]
    oc = layer.spec.weight.out_channels
    return cdiv(p, tn) * cdiv(oc, tm) * ks * min(1.0, oc / tm)


def names(layer, p) -> list:
    """Tiles worth timing for ``p`` output pixels, best guess first ([] under 8 pixels or with a forced
    local size: the GEMM's is fixed)."""
    if layer.forced_lws is not None or p < 8:
        return []
    if p <= 8:
        out = ["gemm_64x8k4", "gemm_64x8", "gemm_128x8k2"]
    elif p <= 32:
        out = ["gemm_128x32k2", "gemm_64x8k4", "gemm_64x32k2"]
    else:
        out = ["gemm_128x32", "gemm_64x64", "gemm_128x64"]
        if groups(layer, out[0], p) < 2 * int(layer.device.max_compute_units):
            # under two waves of 128x32 tiles (batch-1 convs): smaller tiles, most work-groups first
            small = ["gemm_64x32", "gemm_64x16", "gemm_32x32", "gemm_32x32k2", "gemm_64x32k2"]
            out = sorted(small, key=lambda v: -groups(layer, v, p)) + out
    if layer.tune == "full":
        out += [v for v in GEMM_VARIANTS if v not in out and GEMM_VARIANTS[v][1] <= max(8, pow2ceil(p))]
    out = [v for v in out if fits(layer, v)]
    return out[:2] if layer.tune == "fast" else out


def candidates(layer, problem) -> list:
    if layer.forced_variant is not None:
        return [_candidate(layer, problem, layer.forced_variant)]
    return [_candidate(layer, problem, v) for v in names(layer, problem.pixels)]


def _candidate(layer, problem, name):
    """One conv_gemm launch: NDRange (ceil(P/TN) * TN/RN, ceil(O/TM) * TM/RM, KS), local (TN/RN, TM/RM, KS)."""
    wt = layer.spec.weight
    n, h, w, oh, ow = problem[1:]
    tm, tn, rm, rn, ks = GEMM_VARIANTS[name]
    opts = list(layer.base_options) + [f"-DTM={tm}", f"-DTN={tn}", f"-DRM={rm}", f"-DRN={rn}", f"-DKS={ks}"]
    opts += io_options(layer, problem)
    if layer.path == "1x1":
        opts.append("-DWL_1X1")
        if problem.layout == "nchw" and h * w == 1:
            opts.append("-DB_KFAST")
    if not layer.specialize:  # specialised, the layer options hold the geometry
        geo = geometry(layer.spec)[:2] if layer.path == "1x1" else geometry(layer.spec, groups=True)
        opts += [f"-DG_{k}={v}" for k, v in geo]
    if layer.path == "1x1" and wt.n_blocks > 1 and wt.block_channels % 4 == 0:  # the general path's have it
        opts.append("-DBLOCK_ALIGN4")
    opts = tuple(opts)
    lws = (tn // rn, tm // rm, ks)
    gsize = (cdiv(n * oh * ow, tn) * lws[0], cdiv(wt.out_channels, tm) * lws[1], ks)
    b, scal = layer.buffers, [n, h, w, oh, ow]
    args = (X, b.q, b.scales, b.offsets, b.bias, Y, *scalars(*scal))

    def steps(lws):
        return [Step(program, opts, program, args, gsize, lws)]

    return planned_candidate(layer.ctx, name, program, opts, gsize + tuple(scal), [lws], steps)
