"""Activation quantization (``kernels/act_quant.cl``) for ``act_quant="row"``: ``quant_rows`` (x quantized to
int8 per sample exactly as the oracle does, then dequantized into a scratch buffer for the float kernels) or
``quant_rows_i8`` (int8 words for :mod:`.conv_mma`); in one launch for inputs of at most :data:`ONE_GROUP_MAX`
elements, after ``row_amax`` (partial maxima of ``|x|`` per sample) above. Not a kernel family of its own
candidates: :func:`wrap` puts its launches in front of the float families' candidates (``gemv_a8`` and
``conv_mma`` quantize x themselves)."""
from __future__ import annotations

import numpy as np

from ..context import import_pyopencl
from ..launch import X, Scratch, Step, planned_candidate, remap
from .base import cdiv, pow2floor

program = "act_quant"
ROW_QUANT_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt",)
QUANTIZING = ("gemv_a8", "conv_mma")  # programs that quantize x themselves (after row_amax, for conv_mma)


def unsupported(layer, problem=None, variant=None):
    if not layer.act_row:
        return "it quantizes activations for act_quant='row' only"
    if not layer.exact_division:
        return (f"{layer.device.name} lacks correctly rounded float32 division (CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT), "
                f"which quantizing exactly like the oracle needs; use act_quant=None on this device")
    return None


# inputs of at most this many elements (all samples) are quantized in one launch by one work-group per sample
# (ONE_GROUP): on the H200 (2026-12-01) a launch costs ~16 us of host time, more than a 1024-item group's two passes
# over 50 Ki elements (batch-1 3x3 256@14 +a8: 48.6 -> 24.8-31.4 us to return, kernels 50.1 -> 30.8 us); larger
# inputs keep row_amax's many groups (batch 32 of the same in 256-item groups per sample: kernels 53 -> 68 us)
ONE_GROUP_MAX = 1 << 17


def sample_elements(layer, problem) -> int:
    """Elements of one sample as the quantizing kernels see it (NC4HW4: padding lanes included)."""
    c, hw = layer.spec.in_channels, problem.h * problem.w
    return (c if problem.layout == "nchw" else cdiv(c, 4) * 4) * hw


def row_quant(layer, problem, kernel: str, outs: tuple, work: int, options: tuple = ()):
    """The launches of act_quant="row" in front of a kernel: ``(steps, scratch)``, ``steps`` the
    :class:`~qconv.gpu.launch.Step` list of ``kernel`` (``quant_rows``, ``quant_rows_i8`` or
    ``quant_rows_digits``) with its output arguments ``outs`` (Scratch / buffers), preceded by ``row_amax`` (G partial maxima per sample into a Scratch,
    then part of ``scratch``) unless the input has at most :data:`ONE_GROUP_MAX` elements (one work-group of up
    to 1024 items per sample then takes the max itself, one launch). ``work``: 32-bit items of ``kernel`` per
    sample (its groups per sample: ceil(work / (4 L)), at most 4096); ``options``: more build options of
    ``kernel`` (``quant_rows_digits``: DIGITS, X_BITS)."""
    cl = import_pyopencl()
    n, per_sample = problem.n, sample_elements(layer, problem)
    ql = min(256, pow2floor(int(layer.device.max_work_group_size)))
    opts = ROW_QUANT_OPTIONS + (("-DIN_NCHW",) if problem.layout == "nchw" else ()) + tuple(options)
    args = (np.int32(per_sample), np.int32(n), np.int32(layer.spec.in_channels), np.int32(problem.h * problem.w))
    if n * per_sample <= ONE_GROUP_MAX:
        l1 = min(1024, pow2floor(int(layer.device.max_work_group_size)))
        return [Step(program, opts + ("-DONE_GROUP",), kernel,
                     (X, X, np.int32(0), cl.LocalMemory(4 * l1), *outs, *args), (l1, n), (l1, 1))], ()
    red = cl.LocalMemory(4 * ql)
    g_amax = max(1, min(64, cdiv(per_sample, 8 * ql)))
    g_quant = max(1, min(4096, cdiv(work, 4 * ql)))
    part = Scratch(4 * n * g_amax, "partial amax")
    return [Step(program, opts, "row_amax", (X, part, red, *args), (g_amax * ql, n), (ql, 1)),
            Step(program, opts, kernel, (X, part, np.int32(g_amax), red, *outs, *args), (g_quant * ql, n),
                 (ql, 1))], (part,)


def wrap(layer, problem, cands) -> list:
    """act_quant="row" for the float kernels: each candidate's launch first runs :func:`row_quant`'s launches
    (``quant_rows``: x quantized and dequantized per sample) into a scratch buffer of its plan's, one per queue
    (launches on one queue run in order, so they never share it at the same time), then the float kernel on it.
    The tuner times every launch. Float activations, or candidates that quantize x themselves: as they are."""
    if not layer.act_row:
        return cands
    per_sample = sample_elements(layer, problem)

    def wrapped(cand):
        inner = cand.info["steps"]
        xd = Scratch(4 * problem.n * per_sample, "quantized x")
        quant, scratch = row_quant(layer, problem, "quant_rows", (xd,), per_sample)

        def steps(lws):
            return quant + remap(inner(lws), {X: xd})

        return planned_candidate(layer.ctx, cand.variant, cand.program,
                                 cand.options + ("act_quant=row: quant_rows first",),  # own cache key
                                 cand.signature, cand.local_sizes, steps, scratch=(xd,) + scratch)

    return [cand if cand.program in QUANTIZING else wrapped(cand) for cand in cands]
