"""How a third-party tool tests itself against qconv (run: ``pytest examples/downstream_test.py``).

The "tool" here is a tiny converter to a made-up GEMV format ("colmajor-u4"): int4 weights stored
column-major (K-major) as unsigned nibbles with the first value in the low nibble, plus a numpy GEMV
that reads it. qconv provides the strategies, the oracle and the tolerance rules; the
``qconv_device`` fixture of qconv's pytest plugin also runs the same weights through qconv's engines.
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import qconv
from qconv.layouts import ONNX_UINT4
from qconv.testing import assert_matches_reference, assert_sqnr
from qconv.testing.strategies import activations, conv_geometries, quantized_weights


# --- the third-party tool under test ----------------------------------------------------------------
def to_colmajor_u4(qw: qconv.QuantizedWeight):
    """QuantizedWeight (O, K, 1, 1) int4 -> (packed uint8 (K, ceil(O/2)), scales (O, nb), offsets (O, nb))."""
    q = qw.q.reshape(qw.out_channels, -1).T  # (K, O)
    packed = ONNX_UINT4.pack_array((q.astype(np.int16) + 8).astype(np.uint8))
    offsets = qw.offsets if qw.offsets is not None else np.zeros_like(qw.scales)
    return packed, qw.scales, offsets


def gemv_colmajor_u4(x, packed, scales, offsets, out_channels):
    """float32 x (N, K) times the dequantized weight -> (N, O)."""
    k = packed.shape[0]
    q = ONNX_UINT4.unpack_array(packed, (k, out_channels)).astype(np.float32) - 8  # (K, O)
    blk = k // scales.shape[1]
    s = np.repeat(scales.T, blk, axis=0)
    a = np.repeat(offsets.T, blk, axis=0)
    return x @ (q * s + a)


# --- its tests, written with qconv.testing --------------------------------------------------------
@st.composite
def linear_problems(draw):
    g = draw(conv_geometries(pointwise=True, max_spatial=1, max_channels=64, max_out_channels=33))
    qw = draw(quantized_weights(g, bits=(4,)))
    x = draw(activations((g.n, g.c), constant=False))
    return qw, x


@given(linear_problems())
def test_converter_round_trips_the_integers(problem):
    qw, _ = problem
    packed, _, _ = to_colmajor_u4(qw)
    back = ONNX_UINT4.unpack_array(packed, (qw.in_channels, qw.out_channels)).astype(np.int16) - 8
    assert np.array_equal(back.T, qw.q.reshape(qw.out_channels, -1))


@given(linear_problems())
def test_gemv_matches_the_qconv_oracle(problem):
    qw, x = problem
    y = gemv_colmajor_u4(x, *to_colmajor_u4(qw), qw.out_channels).astype(np.float32)
    # float activations: compare with act_quant=None under qconv's float tolerance rule
    assert_matches_reference(y[:, :, None, None], x[:, :, None, None], qw, act_quant=None)


def test_qconv_engines_agree_with_our_gemv(qconv_device):
    rng = np.random.default_rng(0)
    qw = qconv.quantize_weight(rng.standard_normal((48, 96)).astype(np.float32), bits=4, block_size=32,
                               symmetric=False)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    ours = gemv_colmajor_u4(x, *to_colmajor_u4(qw), qw.out_channels)
    theirs = qconv.Linear(qw, device=qconv_device)(x)
    assert_sqnr(theirs, ours, 30.0)  # int8 activations on the CPU: ~40 dB; float on OpenCL: exact-ish
