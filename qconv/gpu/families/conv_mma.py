"""``conv_mma`` (``kernels/conv_mma.cl``): ungrouped convs and batched linear layers as an implicit GEMM on int8
tensor cores (PTX ``mma.sync`` on NVIDIA sm_80+; elsewhere only when forced, as an emulation); weights in
:class:`~qconv.layouts.opencl.OpenCLMMAWeightLayout`. Its "local sizes" are ``(NTH, KSUB)``: KSUB layout steps
per stage is a build option the tuner picks.

* ``mma_<TM>x<TN>``, with ``act_quant="row"``: after ``quant_rows_i8`` (:mod:`.act_quant`; with ``row_amax``
  first for large inputs), the tuner's first choice there.
* ``mma_x3_<TM>x<TN>``, float activations: after ``quant_rows_digits``, which writes each sample as
  :data:`DIGITS` base-256 digits of ``rint(x * 2^sh)`` (22 bits, max |x| in ``[2^21, 2^22)``) as int8 chunks
  of their own, against weights whose every 32-channel chunk is stored once per digit
  (``OpenCLMMAWeightLayout(digits=3)``, scales times ``256^k`` per copy): the integer sums are ``q X``
  exactly, x's rounding (at most ``2^-22 max |x|`` of its sample) is the only change from the float kernels.
  Offered for batches of :data:`SPLIT_MIN_BATCH` samples or more, with weights of at most
  :data:`SPLIT_MAX_BYTES` once tripled.
"""
from __future__ import annotations

from ... import _validate as V
from ...layouts.opencl import OpenCLMMAWeightLayout
from ..launch import Y, Scratch, Step, planned_candidate
from . import act_quant
from .base import cdiv, geometry, scalars

program = "conv_mma"
TILES = {  # name -> (WM, WN warps, MT, NT m16n8k32 tiles per warp): TM = 16*MT*WM output
    # channels x TN = 8*NT*WN pixels per work-group of 32*WM*WN items
    "64x32": (2, 2, 2, 2), "32x64": (2, 2, 1, 4), "64x64": (2, 2, 2, 4), "128x64": (2, 2, 4, 4),
    "64x128": (2, 2, 2, 8), "128x128": (2, 4, 4, 4),
}
DIGITS = 3               # base-256 digits of float activations
SPLIT = "mma_x3_"        # variant prefix of the float-activation tiles
# batch-1 convs stay with the float kernels: on an H100 (2026-12-06) the tuner picked mma_x3 tiles for some of PP-OCRv4
# det's 640x640 layers, timed alone, and the device graph ran slower (2.21-2.47 ms a run against 2.68-3.24 with them)
SPLIT_MIN_BATCH = 8
SPLIT_MAX_BYTES = 64 << 20   # the tripled weights' device bytes at most (batched linear layers of LLM size: no)
MMA_VARIANTS = {f"mma_{t}": v for t, v in TILES.items()}
variants = {**MMA_VARIANTS, **{SPLIT + t: v for t, v in TILES.items()}}
fixed_local_size = True


def _split(layer, variant=None) -> bool:
    """Float activations through :data:`DIGITS` digits (the variant's, else the layer's act_quant)."""
    return variant.startswith(SPLIT) if variant is not None else not layer.act_row


def unsupported(layer, problem=None, variant=None):
    s, w = layer.spec, layer.spec.weight
    taps = s.kernel_size[0] * s.kernel_size[1]
    split = _split(layer, variant)
    if split and layer.act_row:
        return "its float-activation tiles (mma_x3_*) need act_quant=None; with 'row' use the mma_* tiles"
    if not split and not layer.act_row:
        return "it needs act_quant='row' (int8 activations), or one of the float-activation tiles mma_x3_*"
    if w.groups != 1:
        return "it needs an ungrouped conv"
    if w.n_blocks > 1 and w.block_channels % OpenCLMMAWeightLayout.STEP_CHANNELS:
        return f"its scale blocks must be a multiple of 32 input channels, got {w.block_channels}"
    # int32 sums of one block (float activations: one 32-channel chunk) of at most 4096 steps of 32 products of
    # at most 128*127
    span = taps * (1 if split else w.block_channels // 32 if w.n_blocks > 1 else 1)
    if span > 4096:
        return f"a scale block spans {span} steps of 32 channels x 1 tap; at most 4096 keep int32 exact"
    if split:
        nbytes = OpenCLMMAWeightLayout(w.bits, digits=DIGITS).nbytes(w.q.shape)
        if nbytes > SPLIT_MAX_BYTES:
            return (f"its weights take {nbytes} bytes once stored for {DIGITS} digits of x, more than "
                    f"{SPLIT_MAX_BYTES}")
    return None


def names(layer, p, n=1) -> list:
    """Tiles worth timing for ``p`` output pixels of ``n`` samples ([] off the devices with int8 mma.sync, for
    one row, and for float activations on batches under :data:`SPLIT_MIN_BATCH`)."""
    if not layer.mma_native or p < 2 or (not layer.act_row and n < SPLIT_MIN_BATCH):
        return []  # one row: gemv_a8 streams the weights faster
    # the H200's picks (scripts/mma_lab.py): small tiles keep more loads in flight per register
    out = ["64x32", "32x64", "64x64"] if p < 4096 else ["64x64", "64x32", "32x64"]
    out += [t for t in TILES if t not in out]
    out = out if layer.tune == "full" else out[:2] if layer.tune == "fast" else out[:1]
    return [("mma_" if layer.act_row else SPLIT) + t for t in out]


def candidates(layer, problem) -> list:
    if layer.forced_variant is not None:
        return [_candidate(layer, problem, layer.forced_variant)]
    return [_candidate(layer, problem, v) for v in names(layer, problem.pixels, problem.n)]


def ksubs(layer, name) -> list:
    """Layout steps per stage (KSUB) to time, most first: divisors of the steps that keep scale blocks whole,
    whose double-buffered tiles fit local memory and whose prefetch fits 16 uint4 an item."""
    s, wt = layer.spec, layer.spec.weight
    wm, wn, mt, nt = variants[name]
    nth, tm, tn = 32 * wm * wn, 16 * mt * wm, 8 * nt * wn
    taps = s.kernel_size[0] * s.kernel_size[1]
    split = _split(layer, name)
    ksteps = cdiv(wt.q.shape[1], 32) * taps * (DIGITS if split else 1)
    block = taps if split else min(ksteps, 4096) if wt.n_blocks == 1 else wt.block_channels // 32 * taps
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
    """quant_rows_i8 (float activations: quant_rows_digits; act_quant.cl, after row_amax for large inputs), then
    conv_mma (NDRange (ceil(P/TN) * NTH, ceil(O/TM)), local (NTH, 1))."""
    s, wt = layer.spec, layer.spec.weight
    n, h, w, oh, ow = problem[1:]
    wm, wn, mt, nt = variants[name]
    nth, tm, tn = 32 * wm * wn, 16 * mt * wm, 8 * nt * wn
    split = _split(layer, name)
    wlayout = OpenCLMMAWeightLayout(wt.bits, digits=DIGITS if split else 1)
    wbuf = layer.weights_in(wlayout)
    b = layer.buffers
    geo = dict(geometry(s))
    if split:   # virtual input channels: one 32-channel chunk per digit, scales per chunk
        ws, wo = layer.digit_scales_in(wlayout)
        geo["IC"] = DIGITS * cdiv(s.in_channels, 32) * 32
        opts = ["-DBLOCK_CH=32"] + (["-DASYM"] if wt.offsets is not None else [])
    else:
        ws, wo = b.scales, b.offsets
        opts = list(layer.scale_layout.options_for(wt.n_blocks, wt.block_channels, wt.offsets is not None))
    opts = list(wlayout.build_options) + opts
    opts += ["-DHAS_BIAS"] if s.bias is not None else []
    if s.activation:
        opts.append(f"-DACT={V.ACTIVATION_CODES[s.activation]}")
    if problem.layout == "nchw":
        opts.append("-DOUT_NCHW")
    # the emulation elsewhere is a test vehicle, built unoptimised: PoCL 5's optimiser miscompiles it for
    # some tiles (mma_128x64 on int8: a segfault inside the work-group function)
    opts.append("-DNV_PTX" if layer.mma_native else "-cl-opt-disable")
    opts += [f"-DG_{k}={v}" for k, v in geo.items()]
    opts += [f"-DWM={wm}", f"-DWN={wn}", f"-DMT={mt}", f"-DNT={nt}"]
    opts = tuple(opts)
    xq_bytes = geo["IC"] * n * h * w if split else cdiv(s.in_channels, 32) * 32 * n * h * w
    xq, dx = Scratch(xq_bytes, "xq words"), Scratch(4 * n, "dx")
    qkernel = "quant_rows_digits" if split else "quant_rows_i8"
    extra = (f"-DDIGITS={DIGITS}", f"-DX_BITS={wlayout.x_bits}") if split else ()
    words = xq_bytes // (4 * n * (DIGITS if split else 1))   # 32-bit words of x per sample
    quant, qscratch = act_quant.row_quant(layer, problem, qkernel, (xq, dx), words,
                                          extra)
    gsize = (cdiv(n * oh * ow, tn) * nth, cdiv(wt.out_channels, tm))
    scal = scalars(n, h, w, oh, ow)
    sizes = [(nth, k) for k in ksubs(layer, name)]
    if layer.tune != "full":
        sizes = sizes[:2]
    def steps(lws):
        ksub = (lws or sizes[0])[1]
        return quant + [Step(program, opts + (f"-DKSUB={ksub}",), program,
                             (xq, dx, wbuf, ws, wo, b.bias, Y, *scal), gsize, (nth, 1))]

    # scratch per queue (launches on one queue run in order), in this order in info["state"]["scratch"]
    return planned_candidate(layer.ctx, name, program, opts, gsize + (n, h, w, oh, ow), sizes, steps,
                             scratch=(xq, dx) + qscratch)
