"""qconv.testing: a property-testing kit for downstream tools.

* :mod:`qconv.testing.strategies` — hypothesis strategies (geometries, schemes, weights, activations,
  layouts).
* :func:`assert_layout_roundtrip`, :func:`assert_matches_reference`, :func:`assert_sqnr` — the
  tolerance rules qconv's own tests use (see :mod:`qconv.testing.asserts`).
* The pytest plugin (:mod:`qconv.testing.plugin`, entry point ``pytest11``): ``--qconv-device`` and the
  ``qconv_device`` fixture, hypothesis profiles ``qconv-ci`` / ``qconv-dev``.
"""
from .asserts import (RTOL_FLOAT, RTOL_QUANTIZED, assert_layout_roundtrip, assert_matches_reference,
                      assert_sqnr, magnitude, sqnr_db)

__all__ = ["assert_layout_roundtrip", "assert_matches_reference", "assert_sqnr", "sqnr_db", "magnitude",
           "RTOL_QUANTIZED", "RTOL_FLOAT"]
