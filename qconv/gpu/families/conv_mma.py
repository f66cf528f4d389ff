"""``conv_mma`` (``kernels/conv_mma.cl``): with ``act_quant="row"``, ungrouped convs and batched linear layers as
an implicit GEMM on int8 tensor cores (``mma_<TM>x<TN>``; PTX ``mma.sync`` on NVIDIA sm_80+, the tuner's first
choice there; elsewhere only when forced, as an emulation), after ``quant_rows_i8`` (:mod:`.act_quant`; with
``row_amax`` first for large inputs); weights in :class:`~qconv.layouts.opencl.OpenCLMMAWeightLayout`. Its
"local sizes" are ``(NTH, KSUB)``: KSUB layout steps per stage is a build option the tuner picks."""
from __future__ import annotations

from ... import _validate as V
from ...layouts.opencl import OpenCLMMAWeightLayout
from ..launch import Y, Scratch, Step, planned_candidate
from . import act_quant
from .base import cdiv, geometry, scalars

program = "conv_mma"
variants = MMA_VARIANTS = {  # name -> (WM, WN warps, MT, NT m16n8k32 tiles per warp): TM = 16*MT*WM output
    # channels x TN = 8*NT*WN pixels per work-group of 32*WM*WN items
    "mma_64x32": (2, 2, 2, 2), "mma_32x64": (2, 2, 1, 4), "mma_64x64": (2, 2, 2, 4), "mma_128x64": (2, 2, 4, 4),
    "mma_64x128": (2, 2, 2, 8), "mma_128x128": (2, 4, 4, 4),
}
fixed_local_size = True


def unsupported(layer, problem=None, variant=None):
    s, w = layer.spec, layer.spec.weight
    taps = s.kernel_size[0] * s.kernel_size[1]
    if not layer.act_row:
        return "it needs act_quant='row' (int8 activations)"
    if w.groups != 1:
        return "it needs an ungrouped conv"
    if w.n_blocks > 1 and w.block_channels % OpenCLMMAWeightLayout.STEP_CHANNELS:
        return f"its scale blocks must be a multiple of 32 input channels, got {w.block_channels}"
    span = taps * (w.block_channels // 32 if w.n_blocks > 1 else 1)
    if span > 4096:  # int32 sums of one block: 4096 steps of 32 products of at most 128*127
        return f"a scale block spans {span} steps of 32 channels x 1 tap; at most 4096 keep int32 exact"
    return None


def names(layer, p) -> list:
    """Tiles worth timing for ``p`` output pixels ([] off the devices with int8 mma.sync, or for one row)."""
    if not layer.mma_native or p < 2:
        return []  # one row: gemv_a8 streams the weights faster
    # the H200's picks (scripts/mma_lab.py): small tiles keep more loads in flight per register
    out = ["mma_64x32", "mma_32x64", "mma_64x64"] if p < 4096 else ["mma_64x64", "mma_64x32", "mma_32x64"]
    out += [v for v in MMA_VARIANTS if v not in out]
    return out if layer.tune == "full" else out[:2] if layer.tune == "fast" else out[:1]


def candidates(layer, problem) -> list:
    if layer.forced_variant is not None:
        return [_candidate(layer, problem, layer.forced_variant)]
    return [_candidate(layer, problem, v) for v in names(layer, problem.pixels)]


def ksubs(layer, name) -> list:
    """Layout steps per stage (KSUB) to time, most first: divisors of the steps that keep scale blocks whole,
    whose double-buffered tiles fit local memory and whose prefetch fits 16 uint4 an item."""
    s, wt = layer.spec, layer.spec.weight
    wm, wn, mt, nt = MMA_VARIANTS[name]
    nth, tm, tn = 32 * wm * wn, 16 * mt * wm, 8 * nt * wn
    taps = s.kernel_size[0] * s.kernel_size[1]
    ksteps = cdiv(wt.q.shape[1], 32) * taps
    block = min(ksteps, 4096) if wt.n_blocks == 1 else wt.block_channels // 32 * taps
    sq = 2 if wt.bits == 8 else 1
    lmem = int(layer.device.local_mem_size) - 1024
    ok = []
    for k in (4, 2, 6, 3, 8, 5, 7, 1):  # the H200's order (scripts/mma_lab.py): 4 or 2 won every case
        tile = 2 * k * (tm + tn) * 32 + (2 * k * tn * 8 if wt.offsets is not None else 0)
        loads = cdiv(tm * sq * k, nth) + cdiv(tn * 2 * k, nth)
        if ksteps % k == 0 and (block % k == 0 or k % block == 0) and tile <= lmem and (loads <= 16 or k == 1):
            ok.append(k)
    return ok


def _candidate(layer, problem, name):
    """quant_rows_i8 (act_quant.cl, after row_amax for large inputs), then conv_mma (NDRange
    (ceil(P/TN) * NTH, ceil(O/TM)), local (NTH, 1))."""
    s, wt = layer.spec, layer.spec.weight
    n, h, w, oh, ow = problem[1:]
    wm, wn, mt, nt = MMA_VARIANTS[name]
    nth, tm, tn = 32 * wm * wn, 16 * mt * wm, 8 * nt * wn
    wlayout = OpenCLMMAWeightLayout(wt.bits)
    wbuf = layer.weights_in(wlayout)
    opts = list(wlayout.build_options) + list(layer.scale_layout.options_for(wt.n_blocks, wt.block_channels,
                                                                             wt.offsets is not None))
    opts += ["-DHAS_BIAS"] if s.bias is not None else []
    if s.activation:
        opts.append(f"-DACT={V.ACTIVATION_CODES[s.activation]}")
    if problem.layout == "nchw":
        opts.append("-DOUT_NCHW")
    # the emulation elsewhere is a test vehicle, built unoptimised: PoCL 5's optimiser miscompiles it for
    # some tiles (mma_128x64 on int8: a segfault inside the work-group function)
    opts.append("-DNV_PTX" if layer.mma_native else "-cl-opt-disable")
    opts += [f"-DG_{k}={v}" for k, v in geometry(s)]
    opts += [f"-DWM={wm}", f"-DWN={wn}", f"-DMT={mt}", f"-DNT={nt}"]
    opts = tuple(opts)
    xq_bytes = cdiv(s.in_channels, 32) * 32 * n * h * w
    xq, dx = Scratch(xq_bytes, "xq words"), Scratch(4 * n, "dx")
    quant, qscratch = act_quant.row_quant(layer, problem, "quant_rows_i8", (xq, dx), xq_bytes // (4 * n))
    gsize = (cdiv(n * oh * ow, tn) * nth, cdiv(wt.out_channels, tm))
    scal, b = scalars(n, h, w, oh, ow), layer.buffers
    sizes = [(nth, k) for k in ksubs(layer, name)]
    if layer.tune != "full":
        sizes = sizes[:2]
    def steps(lws):
        ksub = (lws or sizes[0])[1]
        return quant + [Step(program, opts + (f"-DKSUB={ksub}",), program,
                             (xq, dx, wbuf, b.scales, b.offsets, b.bias, Y, *scal), gsize, (nth, 1))]

    # scratch per queue (launches on one queue run in order), in this order in info["state"]["scratch"]
    return planned_candidate(layer.ctx, name, program, opts, gsize + (n, h, w, oh, ow), sizes, steps,
                             scratch=(xq, dx) + qscratch)
