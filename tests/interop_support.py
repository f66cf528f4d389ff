"""Shared hypothesis strategy and checks of the tests/test_interop_*.py files (numpy only)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from qconv import QuantizedWeight
from qconv.interop._common import exact_values

KINDS = ("symmetric", "asymmetric", "zero_offsets", "integer_zero")


@st.composite
def raw_weights(draw, bits=(4, 8), ipg=(1, 2, 3, 5, 6, 7, 8, 12, 13, 16), kernels=((1, 1), (3, 3), (1, 3), (2, 1)),
                kinds=KINDS, fp16=None, zero_scales=True, block32=False) -> QuantizedWeight:
    """QuantizedWeight from raw parameters: odd/prime sizes, any divisor block size, all four offset kinds.

    ``symmetric``: offsets None, q in [-qmax, qmax]. ``asymmetric``: random float offsets, full range.
    ``zero_offsets``: offsets all 0 with the full range (-8 / -128 used symmetrically, like Q4_0).
    ``integer_zero``: offset = -z*s for an integer z (what integer-zero formats hold exactly).
    ``fp16``: scales that are float16 numbers (None: drawn). ``zero_scales``: some blocks get s = 0
    (constant blocks). ``block32``: K and the blocks are whole multiples of 32 elements (GGUF).
    """
    o = draw(st.sampled_from([1, 2, 3, 5, 7]))
    kh, kw = draw(st.sampled_from(kernels))
    ch = draw(st.sampled_from([c for c in ipg if not block32 or c * kh * kw % 32 == 0]))
    groups = draw(st.sampled_from([g for g in (1, 2, 3) if o % g == 0]))
    divisors = [d for d in range(1, ch + 1) if ch % d == 0 and (not block32 or d * kh * kw % 32 == 0)]
    block = draw(st.sampled_from([0] + divisors))
    nbits = draw(st.sampled_from(bits))
    kind = draw(st.sampled_from(kinds))
    fp16 = draw(st.booleans()) if fp16 is None else fp16
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    nb = ch // block if block else 1
    half = 1 << (nbits - 1)
    lo = -(half - 1) if kind == "symmetric" else -half
    q = rng.integers(lo, half, size=(o, ch, kh, kw)).astype(np.int8)
    scales = (10.0 ** rng.uniform(-4, 1, size=(o, nb))).astype(np.float16 if fp16 else np.float32).astype(np.float32)
    if zero_scales:
        scales[rng.random((o, nb)) < 0.15] = 0
    zeros = rng.integers(-half, half, size=(o, nb))
    offsets = {"symmetric": None, "zero_offsets": np.zeros((o, nb), np.float32),
               "asymmetric": (rng.standard_normal((o, nb)) * 4 * scales + (scales == 0) * 0.37).astype(np.float32),
               "integer_zero": (-zeros * scales.astype(np.float64)).astype(np.float32)}[kind]
    return QuantizedWeight(q, scales, offsets, nbits, block, groups)


def check_report(report, source, result) -> None:
    """The report tells the truth: its error is the largest difference of the exact float64 values."""
    err = float(np.max(np.abs(np.asarray(source, np.float64) - np.asarray(result, np.float64))))
    assert report.max_abs_error == err, (report, err)
    assert report.lossless == (err == 0.0), report
    assert report.lossless or report.notes, report


def assert_same_values(a: QuantizedWeight, b: QuantizedWeight) -> None:
    """Same shape, groups and exact dequantized values (bits may differ: 4-bit codes fit 8-bit formats)."""
    assert a.q.shape == b.q.shape and a.groups == b.groups
    np.testing.assert_array_equal(exact_values(a), exact_values(b))


def normalized(qw: QuantizedWeight) -> QuantizedWeight:
    """``block_size == I/groups`` -> 0 (the same blocks)."""
    if qw.block_size == qw.q.shape[1]:
        return QuantizedWeight(qw.q, qw.scales, qw.offsets, qw.bits, 0, qw.groups)
    return qw
