"""Layouts: exact round trips for every spec, and known byte patterns for each nibble order."""
import numpy as np
import pytest
from hypothesis import given

from qconv.layouts import GGUF_Q4, MNN_INT4, NC4HW4, ONNX_INT4, ONNX_UINT4, Int4Packing, pack, unpack
from qconv.testing import assert_layout_roundtrip
from qconv.testing.strategies import layout_cases


@given(layout_cases())
def test_every_layout_round_trips(case):
    spec, x = case
    assert_layout_roundtrip(spec, x)


def test_mnn_int4_even_element_high_nibble_plus_8():
    assert MNN_INT4.pack_array(np.array([-8, 7], np.int8)).tolist() == [0x0F]
    assert MNN_INT4.pack_array(np.array([1, -1, 3], np.int8)).tolist() == [0x97, 0xB8]  # odd tail: q=0


def test_onnx_int4_first_element_low_twos_complement():
    assert ONNX_INT4.pack_array(np.array([1, -1], np.int8)).tolist() == [0xF1]
    assert ONNX_UINT4.pack_array(np.array([3, 12, 5], np.uint8)).tolist() == [0xC3, 0x05]


def test_gguf_split_halves():
    q = np.arange(32, dtype=np.int64) % 16 - 8
    b = GGUF_Q4.pack_array(q)
    assert b.shape == (16,)
    for j in range(16):
        assert b[j] & 15 == q[j] + 8 and b[j] >> 4 == q[j + 16] + 8


def test_int4_refuses_out_of_range_and_bad_args():
    with pytest.raises(ValueError, match="range"):
        MNN_INT4.pack_array(np.array([8], np.int8))
    with pytest.raises(TypeError, match="integers"):
        MNN_INT4.pack_array(np.array([1.0]))
    with pytest.raises(ValueError, match="multiple of 32"):
        GGUF_Q4.pack_array(np.zeros(31, np.int8))
    with pytest.raises(ValueError, match="order"):
        Int4Packing("middle_first")
    with pytest.raises(ValueError, match="bytes"):
        MNN_INT4.unpack_array(np.zeros(3, np.uint8), 7)


def test_nc4hw4_index_map_and_zero_padding():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    for p in (4, 8, 16):
        a = pack(NC4HW4(p), x)
        assert a.shape == (-(-5 // p), 2, 3, 4, p)
        n, c, h, w = 1, 4, 2, 3
        assert a[c // p, n, h, w, c % p] == x[n, c, h, w]
        # the last pack holds channels 4 (P=4) or 0..4 (P=8, 16) and zeros in its padding lanes
        assert a[-1, ..., : 5 - (a.shape[0] - 1) * p].any() and not a[-1, ..., 5 - (a.shape[0] - 1) * p:].any()
        assert np.array_equal(unpack(NC4HW4(p), a, x.shape), x)
    with pytest.raises(ValueError, match="pack"):
        NC4HW4(3)
    with pytest.raises(ValueError, match="channels"):
        NC4HW4(4).unpack_array(pack(NC4HW4(4), x), (2, 9, 3, 4))


@pytest.mark.parametrize("shape", [(1, 0, 3, 3), (0, 0, 2, 2), (0, 5, 1, 1)])
def test_nc4hw4_empty_round_trips(shape):
    # Zero channels or an empty batch pack and unpack like any other shape (numpy's empty-array behaviour).
    for p in (4, 8, 16, 32):
        assert_layout_roundtrip(NC4HW4(p), np.zeros(shape, np.float32))


def test_depth_to_space_index_map():
    """DepthToSpace(b): y[n, c, h*b + i, w*b + j] = x[n, (c*b + i)*b + j, h, w] (ONNX's CRD mode), element by
    element; channels that do not split into b*b blocks are refused."""
    from qconv.layouts import DepthToSpace

    b, n, c, h, w = 3, 2, 2, 3, 4
    x = np.arange(n * c * b * b * h * w, dtype=np.float32).reshape(n, c * b * b, h, w)
    y = DepthToSpace(b).pack_array(x)
    assert y.shape == (n, c, h * b, w * b)
    for idx in np.ndindex(n, c, b, b, h, w):
        nn, cc, i, j, hh, ww = idx
        assert y[nn, cc, hh * b + i, ww * b + j] == x[nn, (cc * b + i) * b + j, hh, ww]
    with pytest.raises(ValueError, match="blocks of 3x3"):
        DepthToSpace(3).pack_array(np.zeros((1, 8, 2, 2), np.float32))
    with pytest.raises(ValueError, match="block must be"):
        DepthToSpace(0)
