"""OpenCL weight layouts (qconv/layouts/opencl.py): exact inverses, index maps, padding, limits."""
import numpy as np
import pytest
from hypothesis import given

from qconv.layouts.opencl import (OPENCL_INT4, SPECS, OpenCL1x1BufferLayout, OpenCL1x1ImageLayout,
                                  OpenCLConvWeightLayout, OpenCLGemvMMALayout, OpenCLMMAWeightLayout,
                                  OpenCLScaleLayout)
from qconv.testing import assert_layout_roundtrip


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
def test_round_trip(cls):
    @given(cls.hypothesis_case())
    def check(case):
        spec, x = case
        assert_layout_roundtrip(spec, x)
        packed = spec.pack_array(x)
        assert packed.shape == spec.packed_shape(x.shape)

    check()


def test_opencl_specs_are_registered():
    from qconv.layouts import all_specs
    assert set(SPECS) <= set(all_specs())


def test_int4_nibble_order_low_first_offset8():
    assert OPENCL_INT4.pack_array(np.array([1, -1], np.int8)).tolist() == [(7 << 4) | 9]
    assert OPENCL_INT4.pack_array(np.array([-8, 7], np.int8)).tolist() == [0xF0]


@pytest.mark.parametrize("ic_pack", [1, 4])
@pytest.mark.parametrize("bits", [8, 4])
def test_conv_layout_index_map(bits, ic_pack):
    rng = np.random.default_rng(3)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    o, i, kh, kw = 7, 6, 2, 3
    q = rng.integers(lo, hi + 1, (o, i, kh, kw)).astype(np.int8)
    spec = OpenCLConvWeightLayout(bits, ic_pack)
    packed = spec.pack_array(q)
    assert packed.shape == (8 // ic_pack, 2, kh * kw, 4 * ic_pack * bits // 8)
    if bits == 8:
        values = packed.view(np.int8)
    else:
        values = OPENCL_INT4.unpack_array(packed, 4 * ic_pack)
    values = values.reshape(8 // ic_pack, 2, kh * kw, ic_pack, 4)
    for oc in range(8):
        for ic in range(8):
            for k in range(kh * kw):
                want = q[oc, ic, k // kw, k % kw] if oc < o and ic < i else 0
                assert values[ic // ic_pack, oc // 4, k, ic % ic_pack, oc % 4] == want


def test_conv_layout_ic_pack_1_is_mnn_order():
    """ic_pack=1, int8: byte ((i*OCb + oc4)*K + k)*4 + j holds q[4*oc4 + j, i, k] (mnn-semantics 4.3)."""
    rng = np.random.default_rng(4)
    q = rng.integers(-128, 128, (5, 3, 3, 3)).astype(np.int8)
    flat = OpenCLConvWeightLayout(8, 1).pack_array(q).view(np.int8).reshape(-1)
    ocb, k = 2, 9
    for i in range(4):
        for oc in range(8):
            for kpos in range(k):
                want = q[oc, i, kpos // 3, kpos % 3] if oc < 5 and i < 3 else 0
                assert flat[((i * ocb + oc // 4) * k + kpos) * 4 + oc % 4] == want


@pytest.mark.parametrize("bits", [8, 4])
def test_1x1_buffer_index_map_and_padding(bits):
    rng = np.random.default_rng(5)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q = rng.integers(lo, hi + 1, (5, 37)).astype(np.int8)
    spec = OpenCL1x1BufferLayout(bits)
    kc = 16 if bits == 8 else 32
    assert spec.ic_pack == kc and spec.chunk_bytes == 16
    packed = spec.pack_array(q)
    assert packed.shape == (-(-37 // kc), 8, 16)
    vals = packed.view(np.int8) if bits == 8 else OPENCL_INT4.unpack_array(packed, kc)
    for o in range(8):
        for c in range(vals.shape[0] * kc):
            want = q[o, c] if o < 5 and c < 37 else 0
            assert vals[c // kc, o, c % kc] == want
    assert spec.build_options == (f"-DQBITS={bits}", f"-DKC={kc}")


@pytest.mark.parametrize("bits", [8, 4])
def test_gemv_mma_fragment_map(bits):
    """Lane l = 4g + t, k-step m of load kl of tile T holds the PTX A fragment of rows 16T + (g, g+8) and
    columns KT*kl + 16m + (2t, 2t+1, 2t+8, 2t+9): int8 bytes a0..a7, int4 nibbles a0 a2 a4 a6 a1 a3 a5 a7;
    rows past O and channels past I are 0."""
    rng = np.random.default_rng(bits)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    o, i = 37, 150
    q = rng.integers(lo, hi + 1, (o, i)).astype(np.int8)
    spec = OpenCLGemvMMALayout(bits)
    packed = spec.pack_array(q)
    kt = spec.k_per_load
    assert packed.shape == (3, -(-i // kt), 32, 16)
    full = np.zeros((48, packed.shape[1] * kt), np.int8)
    full[:o, :i] = q
    for tile, kl, lane, m in ((0, 0, 0, 0), (1, 1, 5, 1), (2, packed.shape[1] - 1, 31, kt // 16 - 1)):
        g, t = lane // 4, lane % 4
        r0, c0 = 16 * tile, kt * kl + 16 * m
        a = [full[r0 + r, c0 + c] for r, c in ((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1),
                                               (g, 2 * t + 8), (g, 2 * t + 9), (g + 8, 2 * t + 8),
                                               (g + 8, 2 * t + 9))]
        lane_bytes = packed[tile, kl, lane]
        if bits == 8:
            got = lane_bytes[8 * m:8 * m + 8].view(np.int8).tolist()
        else:
            word = int(lane_bytes[4 * m:4 * m + 4].view("<u4")[0])
            nib = [((word >> (4 * p)) & 15) - 8 for p in range(8)]
            got = [nib[p] for p in (0, 4, 1, 5, 2, 6, 3, 7)]  # a0 .. a7
        assert got == a, (tile, kl, lane, m)



@pytest.mark.parametrize("bits", [8, 4])
def test_image_holds_the_buffer_bytes(bits):
    rng = np.random.default_rng(6)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q = rng.integers(lo, hi + 1, (9, 70, 1, 1)).astype(np.int8)
    img = OpenCL1x1ImageLayout(bits)
    tex = img.pack_array(q)
    buf = OpenCL1x1BufferLayout(bits).pack_array(q)
    assert tex.dtype == np.int32 and tex.shape == (buf.shape[0], buf.shape[1], 4)
    assert img.image_shape(q.shape) == (12, buf.shape[0])
    assert np.array_equal(tex.view(np.uint8).reshape(buf.shape), buf)
    assert "-DUSE_IMAGE" in img.build_options


def test_image_limits_decide_fallback():
    assert OpenCL1x1ImageLayout(8, 16384, 16384).fits((16384, 16 * 16384))
    assert not OpenCL1x1ImageLayout(8, 16384, 16384).fits((16385, 16))
    assert not OpenCL1x1ImageLayout(4, 64, 2).fits((8, 65))  # 65 int4 channels -> 3 texel rows
    assert OpenCL1x1ImageLayout(4, 64, 3).fits((8, 65))


def test_scale_layout_padding_and_fp16():
    s = np.array([[1.0, 2.0], [0.5, -3.0], [7.0, 0.25]], np.float32)
    p = OpenCLScaleLayout().pack_array(s)
    assert p.shape == (2, 4) and p.dtype == np.float32
    assert p[:, 3].tolist() == [0.0, 0.0]  # padding is 0, never NaN
    assert p[1].tolist() == [2.0, -3.0, 0.25, 0.0]
    assert OpenCLScaleLayout.lossless(s)
    assert not OpenCLScaleLayout.lossless(np.array([0.1], np.float32))
    assert not OpenCLScaleLayout.lossless(np.array([1e6], np.float32))
    h = OpenCLScaleLayout("float16")
    assert h.pack_array(s).dtype == np.float16 and h.build_options == ("-DSCALE_HALF",)


def test_bad_arguments():
    with pytest.raises(ValueError, match="bits"):
        OpenCLConvWeightLayout(3)
    with pytest.raises(ValueError, match="ic_pack"):
        OpenCLConvWeightLayout(8, 2)
    with pytest.raises(ValueError, match="range"):
        OpenCLConvWeightLayout(4).pack_array(np.full((1, 1, 1, 1), 9, np.int8))
    with pytest.raises(TypeError, match="int8"):
        OpenCL1x1BufferLayout(8).pack_array(np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="1x1"):
        OpenCL1x1BufferLayout(8).pack_array(np.zeros((2, 2, 3, 3), np.int8))
    with pytest.raises(ValueError, match="shape"):
        OpenCLConvWeightLayout(8).unpack_array(np.zeros((1, 1, 1, 16), np.uint8), (1, 5, 1, 1))
    with pytest.raises(ValueError, match="dtype"):
        OpenCLScaleLayout("bfloat16")


def test_mma_digit_copies_and_scales():
    """digits > 1: every 32-channel chunk stored once per digit (the copies next to each other, the same bytes
    as the one-digit layout's chunk), and one scale per copy: the chunk's block scale times 256^(digits-1-d)."""
    rng = np.random.default_rng(4)
    q = rng.integers(-8, 8, (20, 70, 3, 3)).astype(np.int8)
    for bits in (4, 8):
        one = OpenCLMMAWeightLayout(bits, 16).pack_array(q)                 # (32, 3 chunks * 9 taps, step)
        three = OpenCLMMAWeightLayout(bits, 16, digits=3).pack_array(q)     # (32, 9 chunks * 9 taps, step)
        copies = three.reshape(32, 3, 3, 9, -1)                             # (o, chunk, digit, tap, bytes)
        for d in range(3):
            np.testing.assert_array_equal(copies[:, :, d], one.reshape(32, 3, 9, -1))
    lay = OpenCLMMAWeightLayout(8, digits=3)
    assert lay.x_bits == 22
    s = rng.random((5, 2)).astype(np.float32) + 0.5      # blocks of 64 channels over 70 (chunks 0, 1 | 2)
    got = lay.digit_scales(s, 64, 70).reshape(5, 3, 3)
    for c, b in enumerate((0, 0, 1)):
        np.testing.assert_array_equal(got[:, c], s[:, b, None] * np.float32([65536, 256, 1]))
    per_channel = lay.digit_scales(s[:, :1], 0, 70).reshape(5, 3, 3)
    np.testing.assert_array_equal(per_channel[:, 2, 0], s[:, 0] * 65536)
    with pytest.raises(ValueError, match="multiple of 32"):
        lay.digit_scales(s, 16, 70)
    with pytest.raises(ValueError, match="digits must be"):
        OpenCLMMAWeightLayout(8, digits=4)
