"""Assertions with the tolerance rules qconv's own tests use.

Rules (the numbers and the magnitude live in :mod:`qconv.metrics`, shared with ``inspect``):

* Integer parts (quantized activations, the integer sums ``A`` and ``S``) must match **exactly**.
* Float outputs may differ only by float rounding order. Every output is a sum of terms
  ``w * x`` (plus bias), so the bound is relative to the magnitude of **that output's** terms:
  ``|y - ref| <= rtol * M`` at each element, with ``M = sum |w_deq| * |x_deq| + |bias|`` at that
  element (:func:`qconv.metrics.output_magnitude`; float32's smallest normal number where ``M`` is 0).
  ``rtol`` is ``1e-5`` for engines that quantize activations (same ``act_quant`` as the oracle;
  float32 epilogue) and ``1e-4`` for float-activation engines (``act_quant=None``; float32
  accumulation over long reductions). A channel that is zeroed, permuted or scaled is caught wherever
  its outputs are larger than ``rtol`` times their own magnitude, however large the other channels are.
* Winograd F(2x2, 3x3) (the CPU's float-activation 3x3 path) computes a 2x2 output tile from one input patch:
  there ``M`` is the largest magnitude of the output's tile (``tile=(2, 2)``; measured: at most 1.3e-6 of it over
  400 drawn layers, while against an output's own magnitude up to 4.6e-4, at outputs whose own terms are small).
"""
from __future__ import annotations

import numpy as np

from .. import reference
from ..layouts import pack, unpack
from ..metrics import RTOL_FLOAT, RTOL_QUANTIZED, magnitude, output_magnitude, rtol_for, sqnr_db, tolerance

__all__ = ["assert_layout_roundtrip", "assert_matches_reference", "assert_sqnr", "sqnr_db", "magnitude",
           "output_magnitude", "tolerance", "RTOL_QUANTIZED", "RTOL_FLOAT"]


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


def assert_matches_reference(y, x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None,
                             act_quant="tensor", rtol=None, act_block: int = 0, tile=None) -> None:
    """Compare an engine's float32 NCHW output ``y`` with :func:`qconv.reference.conv2d` (see module rules;
    ``tile``: Winograd's output tiles, see :func:`qconv.metrics.tolerance`)."""
    ref = reference.conv2d(x, weight, bias, stride, padding, dilation, activation, act_quant, act_block)
    y = np.asarray(y)
    if y.shape != ref.shape:
        raise AssertionError(f"output shape {y.shape} != reference shape {ref.shape}")
    if y.dtype != np.float32:
        raise AssertionError(f"output dtype {y.dtype} != float32")
    if not np.isfinite(y).all():
        raise AssertionError(f"output has {int((~np.isfinite(y)).sum())} non-finite values")
    if rtol is None:
        rtol = rtol_for(act_quant)
    tol = tolerance(x, weight, bias, stride, padding, dilation, act_quant, act_block, rtol, tile)
    err = np.abs(y.astype(np.float64) - ref.astype(np.float64))
    bad = err > tol
    if bad.any():
        ratio = np.where(bad, err / tol, 0)
        idx = np.unravel_index(int(ratio.argmax()), err.shape)
        raise AssertionError(f"{int(bad.sum())} of {err.size} outputs outside |y - ref| <= {rtol} * M "
                             f"(per-output magnitude M); worst at {idx}: y={y[idx]!r} ref={ref[idx]!r} "
                             f"|y - ref| = {err[idx]:.3e} > tol {tol[idx]:.3e}")


def assert_sqnr(y, ref, min_db: float) -> float:
    """Assert ``sqnr_db(y, ref) >= min_db``; returns the SQNR."""
    db = sqnr_db(y, ref)
    if not db >= min_db:
        raise AssertionError(f"SQNR {db:.2f} dB < required {min_db:.2f} dB")
    return db
