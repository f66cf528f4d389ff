"""GGUF Q4_0 / Q4_1 / Q8_0 blocks: numpy round trips always; gguf-py's numpy quants as the oracle."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import qconv
from qconv.interop import gguf_format as gf
from qconv.interop._common import exact_values
from interop_support import assert_same_values, check_report, raw_weights

TYPES = ("Q4_0", "Q4_1", "Q8_0")
GGUF_SHAPES = dict(ipg=(32, 64, 96, 16), kernels=((1, 1), (2, 1)))  # K = I*kh*kw a multiple of 32


def block_values(data, qtype) -> np.ndarray:
    """Exact float64 (rows, K) values of GGUF blocks, decoded from the byte table of the docs."""
    size = gf.BLOCK_BYTES[qtype]
    b = data.reshape(data.shape[0], -1, size)
    d = b[:, :, :2].copy().view("<f2").astype(np.float64)
    if qtype == "Q8_0":
        return (b[:, :, 2:].copy().view(np.int8) * d).reshape(data.shape[0], -1)
    qs = b[:, :, 4:] if qtype == "Q4_1" else b[:, :, 2:]
    nib = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float64)  # byte j: element j low, j+16 high
    if qtype == "Q4_0":
        return ((nib - 8) * d).reshape(data.shape[0], -1)
    m = b[:, :, 2:4].copy().view("<f2").astype(np.float64)
    return (nib * d + m).reshape(data.shape[0], -1)


def test_block_byte_layout():
    codes = np.arange(32) % 16 - 8  # element j -> j % 16 - 8
    data = gf._encode(codes.reshape(1, 1, 32).astype(np.int8), np.array([[0.5]]), None, "Q4_0")
    assert data.shape == (1, 18) and data[0, :2].view("<f2")[0] == 0.5
    assert data[0, 2] == (0 | 0 << 4) and data[0, 3] == (1 | 1 << 4)  # byte j: elements j and j + 16
    qw, report = gf.read_gguf(data, "Q4_0")
    assert report.lossless and qw.q.ravel().tolist() == codes.tolist() and not qw.symmetric  # -8: zero offsets


@given(raw_weights(bits=(4,), fp16=True, kinds=("symmetric", "zero_offsets"), block32=True, **GGUF_SHAPES))
def test_q4_0_keeps_codes(qw):
    data, report = gf.write_gguf(qw, "Q4_0")
    assert report.lossless and not report.notes
    back, report2 = gf.read_gguf(data, "Q4_0", shape=qw.q.shape, groups=qw.groups)
    assert report2.lossless
    assert_same_values(back, qw)
    np.testing.assert_array_equal(back.q, qw.q)
    assert back.half_exact   # fp16 d: the CPU engine keeps float16 tables for GGUF weights


@given(raw_weights(fp16=True, block32=True, **GGUF_SHAPES), st.sampled_from(TYPES))
def test_write_then_read(qw, qtype):
    data, report = gf.write_gguf(qw, qtype)
    assert data.shape == (qw.out_channels, qw.q[0].size // 32 * gf.BLOCK_BYTES[qtype])
    check_report(report, exact_values(qw), block_values(data, qtype))
    back, report2 = gf.read_gguf(data, qtype, shape=qw.q.shape, groups=qw.groups)
    check_report(report2, block_values(data, qtype), exact_values(back))
    if report.lossless and report2.lossless:
        assert_same_values(back, qw)


def test_refusals_and_requantization():
    qw = qconv.quantize_weight(np.ones((2, 48), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        gf.write_gguf(qw, "Q8_0")
    qw = qconv.quantize_weight(np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32), bits=4,
                               block_size=16, symmetric=False)
    data, report = gf.write_gguf(qw, "Q4_0")
    assert not report.lossless and "requantized" in report.notes[0]
    with pytest.raises(ValueError, match="one of"):
        gf.write_gguf(qw, "Q5_K")
    with pytest.raises(ValueError, match="inside the 3x3 taps"):  # 32-element blocks cut 3x3 taps
        gf.read_gguf(gf.quantize_gguf(np.arange(288.0).reshape(1, 288), "Q8_0"), "Q8_0", shape=(1, 32, 3, 3))


# --- gguf-py oracle ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quants():
    gguf = pytest.importorskip("gguf", reason="gguf not installed: gguf-py oracle tests skipped")
    return gguf.quants, gguf.GGMLQuantizationType


@st.composite
def float_rows(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows, nb = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    w = rng.standard_normal((rows, nb * 32)).astype(np.float32) * np.float32(10.0 ** rng.uniform(-3, 2))
    kind = draw(st.sampled_from(["normal", "zero_block", "constant", "ties", "positive"]))
    if kind == "zero_block":
        w[0, :32] = 0
    elif kind == "constant":
        w[0] = np.float32(-0.37)
    elif kind == "ties":
        w = (np.round(w * 2) / 2).astype(np.float32)
    elif kind == "positive":
        w = np.abs(w) + np.float32(0.5)
    return w


@given(float_rows(), st.sampled_from(TYPES))
def test_quantizer_and_reader_match_gguf(quants, w, qtype):
    q, T = quants
    ref = q.quantize(w, T[qtype])
    np.testing.assert_array_equal(gf.quantize_gguf(w, qtype), ref)
    qw, report = gf.read_gguf(ref, qtype)
    check_report(report, block_values(ref, qtype), exact_values(qw))
    deq = q.dequantize(ref, T[qtype])
    if report.lossless:  # gguf rounds each value once in float32
        np.testing.assert_array_equal(exact_values(qw).astype(np.float32), deq)
    np.testing.assert_allclose(qw.dequantize().reshape(deq.shape), deq, rtol=1e-6, atol=1e-6 * np.abs(deq).max())
    data, report2 = gf.write_gguf(qw, qtype)
    if report.lossless:
        assert report2.lossless
        np.testing.assert_array_equal(block_values(data, qtype), block_values(ref, qtype))  # bytes but -0.0 scales
    check_report(report2, exact_values(qw), block_values(data, qtype))


def test_gguf_enum_accepted(quants):
    q, T = quants
    w = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    qw, report = gf.read_gguf(q.quantize(w, T.Q4_1), T.Q4_1)
    assert report.lossless and qw.bits == 4 and qw.block_size == 32


@pytest.mark.parametrize("bits, block, qtype", [(8, 0, "Q8_0"), (8, 32, "Q8_0"), (4, 32, "Q4_0")])
def test_default_symmetric_weights_write_losslessly(bits, block, qtype):
    """quantize_weight's default (float16 scales chosen before the codes) is GGUF's own form: Q8_0/Q4_0 keep it
    exactly, both ways; float32 scales are rounded to fp16 on the way (lossy)."""
    w = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    qw = qconv.quantize_weight(w, bits, block)
    data, report = gf.write_gguf(qw, qtype)
    assert report.lossless and not report.notes
    back, report2 = gf.read_gguf(data, qtype, groups=qw.groups)
    assert report2.lossless and np.array_equal(back.dequantize(), qw.dequantize())
    assert not gf.write_gguf(qconv.quantize_weight(w, bits, block, scale_dtype="float32"), qtype)[1].lossless
