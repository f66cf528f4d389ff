"""Accuracy metrics shared by the tools (``python -m qconv inspect``) and the tests (:mod:`qconv.testing`).

* :func:`sqnr_db` — signal-to-quantization-noise ratio in dB.
* :func:`output_magnitude` — per output element, the sum of the magnitudes of the terms that make it:
  the scale of the float rounding error an engine may make there.
* :func:`tolerance` / :func:`within_tolerance` — the per-output tolerance rule of every engine test:

  ``|y - ref| <= rtol * M`` at **each** output element, with
  ``M = sum over its taps of |w_deq| * |x_deq| + |bias|`` at that element (:func:`output_magnitude`).
  ``rtol`` is :data:`RTOL_QUANTIZED` (``1e-5``) for engines that quantize activations like the oracle
  (exact integer sums, float32 epilogue) and :data:`RTOL_FLOAT` (``1e-4``) for float-activation engines
  (float32 accumulation over long reductions).

  For asymmetric weights ``|w_deq|`` is taken as ``|q| * scale + |offset|``: the engines form
  ``scale * A + offset * S`` (or ``q * scale + offset``) in float32, so their rounding scales with the two
  parts, which can be much larger than their sum (``w_deq`` near 0 in a block whose range is wide). For
  symmetric weights it is exactly ``|w_deq|``.

  Floor: where ``rtol * M`` is below float32's smallest normal number (``M == 0`` in practice: every term
  and the bias are exactly 0) the tolerance is that number, ``FLT_MIN ~ 1.2e-38``: results there are
  subnormal, which OpenCL devices may flush to zero; everywhere else the bound is purely relative.
"""
from __future__ import annotations

import numpy as np

RTOL_QUANTIZED = 1e-5
RTOL_FLOAT = 1e-4
ATOL_FLOOR = float(np.finfo(np.float32).tiny)

__all__ = ["RTOL_QUANTIZED", "RTOL_FLOAT", "ATOL_FLOOR", "sqnr_db", "output_magnitude", "magnitude", "rtol_for",
           "tolerance", "within_tolerance"]


def sqnr_db(y, ref) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum ref^2 / sum (y-ref)^2)`` in dB (inf when equal)."""
    ref = np.asarray(ref, np.float64)
    noise = float(((np.asarray(y, np.float64) - ref) ** 2).sum())
    signal = float((ref ** 2).sum())
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * np.log10(signal / noise)


def rtol_for(act_quant) -> float:
    """:data:`RTOL_QUANTIZED` when activations are quantized (``act_quant`` not None), else :data:`RTOL_FLOAT`."""
    return RTOL_QUANTIZED if act_quant is not None else RTOL_FLOAT


def _abs_input_columns(x, spec) -> np.ndarray:
    """``|x_deq|`` as im2col columns ``(P, G, L)`` (float64) for ``spec.act_quant``."""
    from . import reference

    x = reference._check_input(x, spec)
    aq = spec.act_quant
    if aq == "block":
        cols = reference._columns(x.astype(np.float64), spec)
        vq, dx = reference.quantize_columns(cols, spec.act_block * spec.weight.taps)
        p, g, length = vq.shape
        deq = np.abs(vq.astype(np.float64)).reshape(p, g, dx.shape[2], -1) * dx.astype(np.float64)[..., None]
        return deq.reshape(p, g, length)
    if aq is not None:
        x = reference.quantize_activation(x, aq).dequantize()
    return reference._columns(np.abs(x.astype(np.float64)), spec)


def output_magnitude(x, weight, bias=None, stride=1, padding=0, dilation=1, act_quant="tensor",
                     act_block: int = 0) -> np.ndarray:
    """Per output element ``sum |w_deq| * |x_deq| + |bias|`` as float64 ``(N, O, OH, OW)`` (see the module
    docstring; ``x_deq`` is the input as ``act_quant`` quantizes it, ``x`` itself for ``None``)."""
    from .geometry import ConvSpec

    spec = ConvSpec(weight, bias, stride, padding, dilation, None, act_quant, act_block)
    cols = _abs_input_columns(x, spec)  # (P, G, L)
    n = np.asarray(x).shape[0]
    oh, ow = spec.out_hw(np.asarray(x).shape[2], np.asarray(x).shape[3])
    o, g = weight.out_channels, weight.groups
    wabs = np.abs(weight.blocks().astype(np.float64)) * weight.scales.astype(np.float64)[:, :, None]
    if weight.offsets is not None:
        wabs = wabs + np.abs(weight.offsets.astype(np.float64))[:, :, None]
    wm = np.ascontiguousarray(wabs.reshape(g, o // g, -1).transpose(0, 2, 1))  # (G, L, O/G)
    cols = np.ascontiguousarray(cols.transpose(1, 0, 2))  # (G, P, L): contiguous operands go through BLAS
    m = np.matmul(cols, wm).transpose(1, 0, 2).reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    m = m + np.abs(spec.bias_or_zeros().astype(np.float64)).reshape(1, o, 1, 1)
    return np.ascontiguousarray(m)


def magnitude(x, weight, bias=None, stride=1, padding=0, dilation=1, act_quant="tensor", act_block: int = 0) -> float:
    """The largest :func:`output_magnitude` of the output (0 for an empty output)."""
    m = output_magnitude(x, weight, bias, stride, padding, dilation, act_quant, act_block)
    return float(m.max()) if m.size else 0.0


def tolerance(x, weight, bias=None, stride=1, padding=0, dilation=1, act_quant="tensor", act_block: int = 0,
              rtol=None, tile: tuple[int, int] | None = None) -> np.ndarray:
    """Per output element the allowed ``|y - ref|``: ``max(rtol * output_magnitude, ATOL_FLOOR)``.

    ``tile``: ``(th, tw)`` output tiles (from output pixel (0, 0)) computed together from one input patch, as
    Winograd F(2x2, 3x3) does (``(2, 2)``): the magnitude of an output is then the largest of its tile's, since the
    transforms mix the patch's terms (an output whose own terms are all 0 comes out as a rounding residue of its
    neighbours', not as an exact 0)."""
    if rtol is None:
        rtol = rtol_for(act_quant)
    m = output_magnitude(x, weight, bias, stride, padding, dilation, act_quant, act_block)
    if tile is not None:
        m = tile_max(m, tile)
    return np.maximum(rtol * m, ATOL_FLOOR)


def tile_max(m: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """``m`` ``(N, O, OH, OW)`` with each element replaced by the largest of its ``(th, tw)`` tile (tiles from
    (0, 0); partial tiles at the bottom and right edges)."""
    th, tw = tile
    n, o, oh, ow = m.shape
    padded = np.zeros((n, o, -(-oh // th) * th, -(-ow // tw) * tw), m.dtype)
    padded[:, :, :oh, :ow] = m
    big = padded.reshape(n, o, padded.shape[2] // th, th, padded.shape[3] // tw, tw).max(axis=(3, 5))
    return np.repeat(np.repeat(big, th, axis=2), tw, axis=3)[:, :, :oh, :ow]


def within_tolerance(y, ref, tol) -> np.ndarray:
    """Elementwise ``|y - ref| <= tol`` (in float64; NaN anywhere is outside)."""
    err = np.abs(np.asarray(y, np.float64) - np.asarray(ref, np.float64))
    return err <= tol
