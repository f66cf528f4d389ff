"""TiledWeightLayout: exact pack/unpack inverses, the documented index map, padding and int4 nibble folding."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qconv.layouts import all_specs
from qconv.layouts.gemm_tiles import TiledWeightLayout
from qconv.testing import assert_layout_roundtrip


def _random_q(rng, lay, kh, kw):
    lo, hi = (-8, 7) if lay.bits == 4 else (-128, 127)
    return rng.integers(lo, hi + 1, (lay.out_channels, lay.in_channels, kh, kw)).astype(np.int8)


@st.composite
def layouts(draw):
    groups = draw(st.integers(1, 3))
    og = draw(st.sampled_from([1, 3, 5, 16, 31, 32, 33, 40]))
    nb = draw(st.integers(1, 3))
    bc = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 13, 16]))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    bits = draw(st.sampled_from([8, 4]))
    unit = draw(st.sampled_from([4, 8, 16, 32]))
    src_unit = draw(st.sampled_from([4, 8, 16]))
    pack = draw(st.sampled_from([4, 8, 16]))
    lay = TiledWeightLayout(og * groups, bc * nb, kh * kw, nb, bits, groups, unit, src_unit, pack)
    return lay, kh, kw, draw(st.integers(0, 2**31))


@given(layouts())
def test_roundtrip_and_index_map(case):
    lay, kh, kw, seed = case
    rng = np.random.default_rng(seed)
    q = _random_q(rng, lay, kh, kw)
    packed = lay.pack_array(q)
    assert packed.shape == lay.packed_shape and packed.dtype == lay.packed_dtype
    assert packed.nbytes == lay.nbytes
    assert np.array_equal(lay.unpack_array(packed, q.shape), q)
    assert_layout_roundtrip(_Bound(lay, kh, kw), q)
    # the documented position of a few elements
    tiles = packed if lay.bits == 8 else _unfold(lay, packed)
    for _ in range(8):
        o, c, kpos = (int(rng.integers(0, lay.out_channels)), int(rng.integers(0, lay.in_channels)),
                      int(rng.integers(0, kh * kw)))
        g, oo = divmod(o, lay.group_out_channels)
        b, cb = divmod(c, lay.block_channels)
        l = kpos * lay.block_icl + cb
        assert l == lay.l_index(cb, kpos)
        lq, li = divmod(l, lay.src_unit)
        t, oi = divmod(oo, lay.unit)
        assert tiles[g, b, t, lq, oi, li] == q[o, c, kpos // kw, kpos % kw]


def _unfold(lay, packed):
    hi = (packed >> 4).astype(np.int16) - 8
    lo = (packed & 15).astype(np.int16) - 8
    return np.concatenate([hi, lo], axis=-1).reshape(packed.shape[:4] + (lay.unit, lay.src_unit))


class _Bound:
    """A layout bound to a kernel shape, for assert_layout_roundtrip."""

    def __init__(self, lay, kh, kw):
        self.lay, self.shape = lay, (kh, kw)

    def pack_array(self, q):
        return self.lay.pack_array(q)

    def unpack_array(self, packed, shape):
        return self.lay.unpack_array(packed, shape)


@given(layouts())
def test_padding_is_q_zero(case):
    lay, kh, kw, seed = case
    q = np.zeros((lay.out_channels, lay.in_channels, kh, kw), np.int8)
    packed = lay.pack_array(q)
    expect = 0 if lay.bits == 8 else 0x88
    assert (packed.view(np.uint8) == expect).all()


def test_mnn_constants_avx512_like():
    # 64 in-channels, 3x3, per-channel: ICL = 64, blockL = 9*64/4 = 144
    lay = TiledWeightLayout(64, 64, 9, 1, 8, 1, 32, 4, 4)
    assert (lay.block_icl, lay.block_l, lay.oc_tiles, lay.tile_bytes) == (64, 144, 2, 128)
    assert lay.oc_tile_stride == 144 * 128 and lay.block_stride == 2 * 144 * 128
    # generic MNN unit (UNIT 4, SRC_UNIT 16 > P 4): ICL = round_up(IC, 4), L tail padded
    lay = TiledWeightLayout(8, 6, 9, 1, 8, 1, 4, 16, 4)
    assert lay.block_icl == 8 and lay.block_l == -(-9 * 8 // 16)
    lay4 = TiledWeightLayout(32, 8, 1, 1, 4)
    assert lay4.tile_bytes == 64 and lay4.packed_shape == (1, 1, 1, 2, 64)


def test_int4_half_split():
    lay = TiledWeightLayout(32, 4, 1, 1, 4, 1, 32, 4, 4)
    q = np.zeros((32, 4, 1, 1), np.int8)
    q[0, 0] = 7      # tile value 0 -> high nibble of byte 0
    q[16, 0] = -8    # tile value 64 -> low nibble of byte 0
    q[31, 3] = 1     # tile value 127 -> low nibble of byte 63
    b = lay.pack_array(q).reshape(-1)
    assert b[0] == ((7 + 8) << 4) | 0 and b[63] == (8 << 4) | 9


def test_for_weight_and_blocks():
    import qconv
    rng = np.random.default_rng(1)
    w = qconv.quantize_weight(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), bits=4, block_size=2,
                              symmetric=False, groups=2)
    lay = TiledWeightLayout.for_weight(w)
    assert (lay.groups, lay.n_blocks, lay.block_channels, lay.taps, lay.bits) == (2, 2, 2, 9, 4)
    assert np.array_equal(lay.unpack_array(lay.pack_array(w.q), w.q.shape), w.q)


@pytest.mark.parametrize("kwargs, err", [
    (dict(out_channels=0, in_channels=4), ValueError),
    (dict(out_channels=4, in_channels=4, bits=5), ValueError),
    (dict(out_channels=5, in_channels=4, groups=2), ValueError),
    (dict(out_channels=4, in_channels=5, n_blocks=2), ValueError),
    (dict(out_channels=4, in_channels=4, unit=True), ValueError),
])
def test_validation(kwargs, err):
    with pytest.raises(err):
        TiledWeightLayout(**kwargs)


def test_bad_arrays():
    lay = TiledWeightLayout(4, 4, 1, 1, 4)
    with pytest.raises(TypeError):
        lay.pack_array(np.zeros((4, 4, 1, 1), np.float32))
    with pytest.raises(ValueError):
        lay.pack_array(np.zeros((4, 3, 1, 1), np.int8))
    with pytest.raises(ValueError):
        lay.pack_array(np.full((4, 4, 1, 1), 9, np.int8))
    with pytest.raises(ValueError):
        lay.unpack_array(np.zeros((1, 2, 3), np.uint8))


def test_registered():
    assert TiledWeightLayout in all_specs()


@given(TiledWeightLayout.hypothesis_case())
def test_strides_address_the_runs(case):
    """``group_stride``/``block_stride``/``oc_tile_stride`` (what the kernels use) address each (group, block,
    tile) run of ``blockL`` tile rows in the packed bytes, for both orders."""
    spec, q = case
    flat = spec.pack_array(q).reshape(-1).view(np.uint8)
    packed = spec.pack_array(q).view(np.uint8)
    run = spec.block_l * spec.tile_bytes
    assert flat.size == spec.nbytes
    for g in range(spec.groups):
        for k in range(spec.n_blocks):
            for t in range(spec.oc_tiles):
                at = g * spec.group_stride + k * spec.block_stride + t * spec.oc_tile_stride
                want = packed[g, k, t] if spec.order == "block" else packed[g, t, k]
                assert np.array_equal(flat[at:at + run], want.reshape(-1))
