"""Shared converter machinery (numpy only): reports, block regrouping, zero-point domains."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qconv import QuantizedWeight
from qconv.interop import ConversionReport
from qconv.interop._common import (exact_values, from_integer_domain, reblock, regroup, repeat_blocks,
                                   to_integer_domain)
from interop_support import assert_same_values, check_report, raw_weights


def test_report_compare():
    r = ConversionReport.compare(np.array([1.0, 2.0]), np.array([1.0, 2.5]), ["why"])
    assert r == ConversionReport(False, 0.5, ("why",))
    assert ConversionReport.compare(np.zeros(3), np.zeros(3)).lossless


def test_regroup_absorbs_ragged_tail_and_prefers_format_block():
    k = 48
    s = repeat_blocks(np.array([[1.0, 2.0]]), 32, k)  # blocks of 32 over 48: the tail block has 16
    block, (sb,) = regroup((1, k, 1, 1), [s], prefer=32)
    assert block == 16 and sb.tolist() == [[1.0, 1.0, 2.0]]
    same = repeat_blocks(np.array([[3.0, 3.0]]), 8, 16)
    assert regroup((1, 16, 1, 1), [same], prefer=8)[0] == 8   # the format's own block first
    assert regroup((1, 16, 1, 1), [same])[0] == 0              # else the coarsest: per channel


def test_regroup_refuses_parameters_inside_the_taps():
    s = repeat_blocks(np.array([[1.0, 2.0, 3.0]]), 32, 72)  # 32-element blocks over 8 channels x 3x3 taps
    with pytest.raises(ValueError, match="inside the 3x3 taps"):
        regroup((1, 8, 3, 3), [s])


def test_reblock():
    p = np.array([[1.0, 2.0, 3.0]], np.float32)  # QuantizedWeight blocks of 16, K = 48
    assert reblock(p, 16, 48, 8).tolist() == [[1, 1, 2, 2, 3, 3]]
    assert reblock(p[:, :1], 48, 48, 32).tolist() == [[1, 1]]  # ragged format tail
    with pytest.raises(ValueError, match="straddle"):
        reblock(p, 16, 48, 32)


def test_integer_zero_is_exact_and_shift_prefers_zero():
    codes = np.array([[0, 255, 128, 3], [130, 140, 135, 129]])
    scale = np.full((2, 4), 0.1, np.float32)
    zero = np.array([[128] * 4, [131] * 4])
    qw, report = from_integer_domain(codes, scale, zero, bits=8, signed=False, shape=(2, 4, 1, 1))
    assert report.lossless and qw.symmetric is False
    assert qw.q[1].ravel().tolist() == [-1, 9, 4, -2] and qw.offsets[1, 0] == 0  # c = z: offset 0
    assert qw.q[0].ravel().tolist() == [-128, 127, 0, -125] and qw.offsets[0, 0] == 0
    qw, _ = from_integer_domain(codes[1:], scale[1:], zero[1:], bits=8, signed=False, shape=(1, 4, 1, 1))
    assert qw.symmetric  # every offset 0 and no -128


def test_integer_zero_power_of_two_shift():
    # codes 100..200 with z = 3: c = z does not fit int8; c - z = 128 (a power of two) keeps the offset exact
    codes = np.array([[100, 200, 150, 120]])
    scale = np.full((1, 4), np.float32(0.1))
    qw, report = from_integer_domain(codes, scale, np.full((1, 4), 3), bits=8, signed=False, shape=(1, 4, 1, 1))
    assert report.lossless
    assert qw.offsets[0, 0] == np.float32(128) * np.float32(0.1) and qw.q.max() == 200 - 131


@given(raw_weights(), st.booleans(), st.sampled_from(["int", "float"]))
def test_integer_domain_round_trip(qw, signed, zero):
    codes, s, z, report = to_integer_domain(qw, bits=qw.bits, signed=signed, zero=zero)
    src = (codes - repeat_blocks(z, qw.block_len, codes.shape[1]).astype(np.float64)) \
        * repeat_blocks(s, qw.block_len, codes.shape[1]).astype(np.float64)
    check_report(report, exact_values(qw), src)
    if qw.offsets is None or (zero == "int" and not qw.offsets.any()):
        assert report.lossless
    k = codes.shape[1]
    back, report2 = from_integer_domain(codes, repeat_blocks(s, qw.block_len, k), repeat_blocks(z, qw.block_len, k),
                                        bits=qw.bits, signed=signed, shape=qw.q.shape, groups=qw.groups,
                                        prefer=qw.block_channels)
    check_report(report2, src, exact_values(back))
    assert back.block_size in (qw.block_size, 0)
    if report.lossless and report2.lossless:
        assert_same_values(back, qw)


@given(raw_weights(kinds=("asymmetric",), zero_scales=False))
def test_rounded_integer_zero_error_is_half_a_step(qw):
    codes, s, z, report = to_integer_domain(qw, bits=qw.bits, signed=False)
    if not any("clipped" in n for n in report.notes):
        assert report.max_abs_error <= 0.5 * float(qw.scales.max()) * (1 + 1e-6)


def test_constant_block_is_written_exactly():
    qw = QuantizedWeight(np.zeros((2, 4, 1, 1), np.int8), np.zeros((2, 1), np.float32),
                         np.array([[0.37], [-2.5]], np.float32), 8)
    for signed in (True, False):
        codes, s, z, report = to_integer_domain(qw, bits=8, signed=signed)
        assert report.lossless
        assert s.ravel().tolist() == [np.float32(0.37), 2.5]
