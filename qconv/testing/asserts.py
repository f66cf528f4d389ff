"""Assertions with the tolerance rules qconv's own tests use.

Rules:

* Integer parts (quantized activations, the integer sums ``A`` and ``S``) must match **exactly**.
* Float outputs may differ only by float rounding order. Every output is a sum of terms
  ``w * x`` (plus bias), so the bound is relative to the magnitude of those terms:
  ``|y - ref| <= rtol * M`` with ``M = max over outputs of (sum |w_deq| * |x_deq| + |bias|)``.
  ``rtol`` is ``1e-5`` for engines that quantize activations (same ``act_quant`` as the oracle;
  float32 epilogue) and ``1e-4`` for float-activation engines (``act_quant=None``; float32
  accumulation over long reductions).
"""
from __future__ import annotations

import numpy as np

from .. import reference
from ..layouts import pack, unpack

RTOL_QUANTIZED = 1e-5
RTOL_FLOAT = 1e-4


def assert_layout_roundtrip(spec, x) -> None:
    """``unpack(spec, pack(spec, x), x.shape) == x`` bit-exactly (dtype and shape too)."""
    x = np.asarray(x)
    back = unpack(spec, pack(spec, x), x.shape)
    back = np.asarray(back)
    if back.shape != x.shape or back.dtype != x.dtype:
        raise AssertionError(f"{spec}: round trip changed shape/dtype {x.shape}/{x.dtype} -> "
                             f"{back.shape}/{back.dtype}")
    if not np.array_equal(back.view(np.uint8) if back.dtype.kind == "f" else back,
                          x.view(np.uint8) if x.dtype.kind == "f" else x):
        bad = np.argwhere(back != x)
        raise AssertionError(f"{spec}: round trip differs at {len(bad)} positions, first {bad[0].tolist()}")


def magnitude(x, weight, bias=None, stride=1, padding=0, dilation=1, act_quant="tensor") -> float:
    """``max(sum |w_deq| * |x_deq| + |bias|)``: the scale of float rounding errors of a conv output."""
    xd = np.asarray(x, np.float32)
    if act_quant is not None:
        xd = reference.quantize_activation(xd, act_quant).dequantize()
    wabs = np.abs(weight.dequantize())
    b = None if bias is None else np.abs(np.asarray(bias, np.float32))
    m = reference.float_conv2d(np.abs(xd), wabs, b, stride, padding, dilation, weight.groups)
    return float(m.max()) if m.size else 0.0


def assert_matches_reference(y, x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None,
                             act_quant="tensor", rtol=None) -> None:
    """Compare an engine's float32 NCHW output ``y`` with :func:`qconv.reference.conv2d` (see module rules)."""
    ref = reference.conv2d(x, weight, bias, stride, padding, dilation, activation, act_quant)
    y = np.asarray(y)
    if y.shape != ref.shape:
        raise AssertionError(f"output shape {y.shape} != reference shape {ref.shape}")
    if y.dtype != np.float32:
        raise AssertionError(f"output dtype {y.dtype} != float32")
    if not np.isfinite(y).all():
        raise AssertionError(f"output has {int((~np.isfinite(y)).sum())} non-finite values")
    if rtol is None:
        rtol = RTOL_QUANTIZED if act_quant is not None else RTOL_FLOAT
    tol = rtol * max(magnitude(x, weight, bias, stride, padding, dilation, act_quant), 1e-30)
    err = np.abs(y.astype(np.float64) - ref.astype(np.float64))
    worst = float(err.max())
    if worst > tol:
        idx = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(f"max |y - ref| = {worst:.3e} > tol {tol:.3e} (rtol {rtol}) at {idx}: "
                             f"y={y[idx]!r} ref={ref[idx]!r}")


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


def assert_sqnr(y, ref, min_db: float) -> float:
    """Assert ``sqnr_db(y, ref) >= min_db``; returns the SQNR."""
    db = sqnr_db(y, ref)
    if not db >= min_db:
        raise AssertionError(f"SQNR {db:.2f} dB < required {min_db:.2f} dB")
    return db
