"""qconv.testing: a property-testing kit for downstream tools.

* :mod:`qconv.testing.strategies` — hypothesis strategies (geometries, schemes, weights, activations,
  layouts).
* :func:`assert_layout_roundtrip`, :func:`assert_matches_reference`, :func:`assert_sqnr` — the
  tolerance rules qconv's own tests use (see :mod:`qconv.testing.asserts`).
* The metrics behind them, re-exported from :mod:`qconv.metrics` (where the tools import them from):
  :func:`sqnr_db`, :func:`magnitude`, :func:`output_magnitude`, :func:`tolerance`, ``RTOL_QUANTIZED``,
  ``RTOL_FLOAT``.
* The pytest plugin (:mod:`qconv.testing.plugin`, entry point ``pytest11``): ``--qconv-device`` and the
  ``qconv_device`` fixture, hypothesis profiles ``qconv-ci`` / ``qconv-dev``.
"""
from ..metrics import RTOL_FLOAT, RTOL_QUANTIZED, magnitude, output_magnitude, sqnr_db, tolerance
from .asserts import assert_layout_roundtrip, assert_matches_reference, assert_sqnr

__all__ = ["assert_layout_roundtrip", "assert_matches_reference", "assert_sqnr", "sqnr_db", "magnitude",
           "output_magnitude", "tolerance", "RTOL_QUANTIZED", "RTOL_FLOAT"]
