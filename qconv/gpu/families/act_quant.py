"""Activation quantization (``kernels/act_quant.cl``) for ``act_quant="row"``: ``row_amax`` (partial maxima of
``|x|`` per sample) and ``quant_rows`` (x quantized to int8 per sample exactly as the oracle does, then
dequantized into a scratch buffer for the float kernels) or ``quant_rows_i8`` (int8 words for
:mod:`.conv_mma`). Not a kernel family of its own candidates: :func:`wrap` puts its launches in front of the
float families' candidates (``gemv_a8`` and ``conv_mma`` quantize x themselves)."""
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


def row_amax(layer, problem):
    """The first launch of act_quant="row": ``(opts, args, G, L, step)`` where ``step(part)`` is the
    :class:`~qconv.gpu.launch.Step` of row_amax (G partial maxima per sample into Scratch ``part``, 4*N*G bytes;
    local size L); ``args``: (E elements per sample, N, C, HW) as the quantizing kernels take them too."""
    cl = import_pyopencl()
    c, n, hw = layer.spec.in_channels, problem.n, problem.h * problem.w
    per_sample = (c if problem.layout == "nchw" else cdiv(c, 4) * 4) * hw
    ql = min(256, pow2floor(int(layer.device.max_work_group_size)))
    g_amax = max(1, min(64, cdiv(per_sample, 8 * ql)))
    opts = ROW_QUANT_OPTIONS + (("-DIN_NCHW",) if problem.layout == "nchw" else ())
    args = (np.int32(per_sample), np.int32(n), np.int32(c), np.int32(hw))

    def step(part):
        return Step(program, opts, "row_amax", (X, part, cl.LocalMemory(4 * ql), *args), (g_amax * ql, n), (ql, 1))

    return opts, args, g_amax, ql, step


def wrap(layer, problem, cands) -> list:
    """act_quant="row" for the float kernels: each candidate's launch first runs ``row_amax`` and ``quant_rows``
    (x quantized and dequantized per sample) into a scratch buffer of its plan's, one per queue (launches on
    one queue run in order, so they never share it at the same time), then the float kernel on it. The tuner
    times all three launches. Float activations, or candidates that quantize x themselves: as they are."""
    if not layer.act_row:
        return cands
    opts, qargs, g_amax, ql, amax_step = row_amax(layer, problem)
    n = problem.n
    in_elems = n * int(qargs[0])
    g_quant = max(1, min(4096, cdiv(int(qargs[0]), 4 * ql)))

    def wrapped(cand):
        inner = cand.info["steps"]
        xd, part = Scratch(4 * in_elems, "quantized x"), Scratch(4 * n * g_amax, "partial amax")

        def steps(lws):
            return [amax_step(part),
                    Step(program, opts, "quant_rows", (X, part, np.int32(g_amax), xd, *qargs),
                         (g_quant * ql, n), (ql, 1))] + remap(inner(lws), {X: xd})

        return planned_candidate(layer.ctx, cand.variant, cand.program,
                                 cand.options + ("act_quant=row: row_amax + quant_rows first",),  # own cache key
                                 cand.signature, cand.local_sizes, steps, scratch=(xd, part))

    return [cand if cand.program in QUANTIZING else wrapped(cand) for cand in cands]
