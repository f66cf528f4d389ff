"""QuantizedWeight and quantize_weight: ranges, error bounds, MNN form, files, validation."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import qconv
from qconv import QuantizedWeight, quantize_weight
from qconv.testing.strategies import conv_geometries, float_weights, quant_schemes


@st.composite
def weights_and_scheme(draw):
    g = draw(conv_geometries(groups=True))
    scheme = draw(quant_schemes(g.in_per_group))
    w = draw(float_weights((g.o, g.in_per_group) + g.kernel))
    return w, scheme, g.groups


@given(weights_and_scheme())
def test_dequantization_error_is_at_most_half_a_step(case):
    w, scheme, groups = case
    qw = quantize_weight(w, groups=groups, **scheme)
    assert qw.q.dtype == np.int8 and qw.q.shape == w.shape
    assert qw.qmin <= qw.q.min() and qw.q.max() <= qw.qmax
    step = np.repeat(qw.scales, qw.block_len, axis=1).reshape(w.shape)
    err = np.abs(qw.dequantize().astype(np.float64) - w)
    eps = 4 * np.finfo(np.float32).eps * (np.abs(w) + step * (2 ** qw.bits))
    if qw.half_exact:   # float16 scale/offset (relative rounding <= 2**-11) can move the clipped ends
        offset = 0 if qw.offsets is None else np.repeat(np.abs(qw.offsets), qw.block_len, axis=1).reshape(w.shape)
        eps = eps + 2.0 ** -10 * (step * (2 ** qw.bits) + offset)
    assert (err <= step / 2 + eps + 1e-30).all()


@given(weights_and_scheme())
def test_mnn_form_round_trip(case):
    w, scheme, groups = case
    qw = quantize_weight(w, groups=groups, **scheme)
    wb, alpha = qw.to_mnn()
    assert wb.dtype == np.uint8 and alpha.dtype == np.float32
    assert wb.size == qw.nbytes_q
    back = QuantizedWeight.from_mnn(wb, alpha, qw.out_channels, qw.bits, not qw.symmetric, qw.q.shape, groups)
    assert np.array_equal(back.q, qw.q) and np.array_equal(back.scales, qw.scales)
    assert back.block_size == qw.block_size
    if qw.symmetric:
        assert back.offsets is None
    else:  # offset -> min -> offset in float32: equal to rounding of the min + 2^(b-1) s sum
        np.testing.assert_allclose(back.offsets, qw.offsets, rtol=1e-6, atol=1e-6 * float(qw.scales.max()))


def test_mnn_int4_bytes_and_asymmetric_alpha():
    q = np.array([[-8, 7, 0, 1]], np.int8).reshape(1, 4, 1, 1)
    qw = QuantizedWeight(q, np.array([[0.5]], np.float32), np.array([[1.0]], np.float32), 4)
    wb, alpha = qw.to_mnn()
    assert wb.tolist() == [0x0F, 0x89]
    assert alpha.tolist() == [1.0 - 8 * 0.5, 0.5]  # (min, scale): offset = min + 8 * scale


def test_zero_and_constant_blocks_are_exact():
    """float32 form: zero and constant blocks dequantize exactly; float16 form: zero blocks, and asymmetric
    constant blocks of float16 values (s = 0, offset = the value)."""
    w = np.zeros((3, 4, 1, 1), np.float32)
    w[1] = 2.5
    w[2, :2] = -1.25
    for sym in (True, False):
        for bs in (0, 2):
            qw = quantize_weight(w, 4, bs, sym, scale_dtype="float32")
            assert np.isfinite(qw.scales).all()
            d = qw.dequantize()
            assert np.array_equal(d[0], w[0]) and np.array_equal(d[1], w[1])
            if bs:
                assert np.array_equal(d[2], w[2])
            d16 = quantize_weight(w, 4, bs, sym).dequantize()
            assert np.array_equal(d16[0], w[0])
            if not sym:
                assert np.array_equal(d16[1], w[1]) and (not bs or np.array_equal(d16[2], w[2]))


def test_symmetric_ranges_are_restricted():
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    assert quantize_weight(w, 8).q.min() == -127
    assert quantize_weight(w, 4).q.min() == -7
    assert quantize_weight(w, 8, symmetric=False).q.min() == -128
    assert quantize_weight(w, 4, symmetric=False).q.min() == -8


def test_rounding_is_half_away_from_zero():
    w = np.array([[1.0, 0.5, -0.5, -1.0, 0.25]], np.float32) * 127  # scale 1 -> exact ties at +-63.5
    qw = quantize_weight(w, 8)
    assert qw.q.reshape(-1).tolist() == [127, 64, -64, -127, 32]


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    for sym in (True, False):
        for scale_dtype in ("auto", "float32"):
            qw = quantize_weight(rng.standard_normal((4, 6, 3, 3)).astype(np.float32), 4, 3, sym,
                                 scale_dtype=scale_dtype)
            path = tmp_path / f"w{sym}{scale_dtype}.npz"
            qw.save(path)
            assert QuantizedWeight.load(path) == qw


def _bits(a):
    return None if a is None else np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("sym", [True, False])
def test_saved_file_keeps_float16_tables_in_half_the_bytes(tmp_path, sym):
    """half_exact weights store scales/offsets as float16 (half the bytes) and load back bit-identical as
    float32; float32 weights stay float32."""
    w = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    w[3] = 0.0            # zero scales (and offsets) survive the round trip too
    w[5, :32] = -0.0
    sizes = {}
    for scale_dtype in ("auto", "float32"):
        qw = quantize_weight(w, 4, 32, sym, scale_dtype=scale_dtype)
        assert qw.half_exact == (scale_dtype == "auto")
        path = tmp_path / f"{scale_dtype}.npz"
        qw.save(path)
        with np.load(path) as z:
            stored = {k: z[k] for k in ("scales", "offsets") if k in z.files}
        assert set(stored) == ({"scales"} if sym else {"scales", "offsets"})
        assert all(a.dtype == qw.param_dtype for a in stored.values())
        sizes[scale_dtype] = sum(a.nbytes for a in stored.values())
        back = QuantizedWeight.load(path)
        assert back.scales.dtype == np.float32 and back.half_exact == qw.half_exact
        assert np.array_equal(_bits(back.scales), _bits(qw.scales))
        assert (back.offsets is None) == sym and np.array_equal(_bits(back.offsets), _bits(qw.offsets))
        assert np.array_equal(back.q, qw.q)
    assert sizes["auto"] * 2 == sizes["float32"]


def test_load_refuses_corrupt_truncated_and_unknown_versions(tmp_path):
    qw = quantize_weight(np.ones((2, 2), np.float32))
    path = tmp_path / "w.npz"
    qw.save(path)
    data = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt"):
        QuantizedWeight.load(tmp_path / "trunc.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    with pytest.raises(ValueError):
        QuantizedWeight.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "v9.npz", format_version=9, q=qw.q, scales=qw.scales, bits=8, block_size=0)
    with pytest.raises(ValueError, match="version 9"):
        QuantizedWeight.load(tmp_path / "v9.npz")
    np.savez(tmp_path / "obj.npz", format_version=1, q=np.array([object()], dtype=object), scales=qw.scales,
             bits=8, block_size=0)
    with pytest.raises(ValueError):
        QuantizedWeight.load(tmp_path / "obj.npz")


def test_bad_arguments_name_the_problem():
    w = np.ones((4, 6, 3, 3), np.float32)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize_weight(w, bits=3)
    with pytest.raises(ValueError, match=r"block_size=4 .*valid block sizes: \[0, 1, 2, 3, 6\]"):
        quantize_weight(w, block_size=4)
    with pytest.raises(ValueError, match="3 dimensions|2 or 4 dimensions"):
        quantize_weight(np.ones((2, 2, 2), np.float32))
    with pytest.raises(TypeError, match="floating dtype"):
        quantize_weight(np.ones((2, 2), np.int32))
    bad = w.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        quantize_weight(bad)
    with pytest.raises(ValueError, match="outside the int4 range"):
        QuantizedWeight(np.full((1, 1, 1, 1), 9, np.int8), np.ones((1, 1), np.float32), None, 4)
    with pytest.raises(TypeError, match="int8"):
        QuantizedWeight(np.zeros((1, 1, 1, 1), np.int16), np.ones((1, 1), np.float32), None, 8)
    with pytest.raises(ValueError, match="scales must have shape"):
        QuantizedWeight(np.zeros((2, 1, 1, 1), np.int8), np.ones((1, 1), np.float32), None, 8)
    with pytest.raises(ValueError, match="groups"):
        quantize_weight(np.ones((3, 2), np.float32), groups=2)


def test_sizes():
    qw = quantize_weight(np.ones((8, 33), np.float32), 4, 11, False)
    assert qw.nbytes_float == 8 * 33 * 4
    assert qw.half_exact and qw.param_dtype == np.float16
    assert qw.nbytes == (8 * 33 + 1) // 2 + 2 * 2 * 8 * 3
    assert qw.n_blocks == 3 and qw.block_len == 11 and qw.in_channels == 33
    assert "int4 asym block 11" in repr(qw)
    assert qconv.quantize_weight(np.ones((8, 33), np.float32)).nbytes == 8 * 33 + 2 * 8
    assert qconv.quantize_weight(np.ones((8, 33), np.float32), scale_dtype="float32").nbytes == 8 * 33 + 4 * 8


@given(weights_and_scheme())
def test_mse_method_is_never_worse_than_minmax_for_any_block(case):
    w, scheme, groups = case
    a = quantize_weight(w, groups=groups, **scheme)
    b = quantize_weight(w, groups=groups, method="mse", **scheme)
    assert b.qmin <= b.q.min() and b.q.max() <= b.qmax and b.symmetric == a.symmetric

    def block_err(qw):
        d = qw.dequantize().astype(np.float64).reshape(qw.out_channels, qw.n_blocks, -1)
        return ((d - w.reshape(d.shape)) ** 2).sum(axis=2)

    assert (block_err(b) <= block_err(a)).all()
    c = quantize_weight(w, groups=groups, method="mse", **scheme)
    assert c == b  # deterministic


def test_mse_method_improves_int4_on_gaussian_weights():
    w = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32)
    a = quantize_weight(w, 4, 32, False)
    b = quantize_weight(w, 4, 32, False, method="mse")
    assert ((b.dequantize() - w) ** 2).sum() < 0.9 * ((a.dequantize() - w) ** 2).sum()
    with pytest.raises(ValueError, match="method"):
        quantize_weight(w, method="kmeans")


@given(float_weights((6, 16, 3, 3)), st.sampled_from([(8, 0), (4, 0), (4, 8), (8, 4)]), st.booleans())
def test_float16_scales(w, scheme, symmetric):
    """scale_dtype="float16": scales/offsets are float16 values, q fits the rounded ones as well as minmax."""
    bits, block = scheme
    try:
        q16 = quantize_weight(w, bits, block, symmetric, scale_dtype="float16")
    except ValueError as exc:
        assert "float16" in str(exc)
        return
    q32 = quantize_weight(w, bits, block, symmetric, scale_dtype="float32")
    assert q16.half_exact and q16.scales.dtype == np.float32
    err16 = np.abs(q16.dequantize() - w).max()
    err32 = np.abs(q32.dequantize() - w).max()
    # the rounded scale/offset move the grid by < 2^-11 relative: the error grows by at most that much
    span = float(np.abs(w).max())
    assert err16 <= err32 + 2.0 ** -10 * span * 16 + 1e-6


def test_float16_scales_errors():
    w = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_weight(w, scale_dtype="bfloat16")
    with pytest.raises(ValueError, match="float16 range"):
        quantize_weight(w * 1e8, scale_dtype="float16")
    with pytest.raises(ValueError, match="normal float16"):
        quantize_weight(w * 1e-6, scale_dtype="float16")
    assert not quantize_weight(w * 0.1, scale_dtype="float32").half_exact


def _old_float32_rule(w, bits, block, symmetric):
    """qconv 0.2's quantize_weight(method="minmax") with float32 scales, copied here: the reference that
    scale_dtype="float32" must still match bit for bit."""
    qmin, qmax = {(8, True): (-127, 127), (8, False): (-128, 127), (4, True): (-7, 7), (4, False): (-8, 7)}[
        (bits, symmetric)]
    o, ipg = w.shape[0], w.shape[1]
    blocks = w.reshape(o, ipg // block if block else 1, -1)

    def rnd(x):
        x = np.asarray(x, dtype=np.float64)
        return np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5))

    if symmetric:
        s = (np.abs(blocks).max(axis=2) / np.float32(qmax)).astype(np.float32)
        q = rnd(blocks / np.where(s > 0, s, np.float32(1))[:, :, None])
        a = None
    else:
        lo, hi = blocks.min(axis=2), blocks.max(axis=2)
        s = ((hi - lo) / np.float32(2 ** bits - 1)).astype(np.float32)
        a = np.where(s > 0, lo - np.float32(qmin) * s, lo).astype(np.float32)
        q = rnd((blocks - lo[:, :, None]) / np.where(s > 0, s, np.float32(1))[:, :, None]) + qmin
    q = np.clip(np.where((s > 0)[:, :, None], q, 0), qmin, qmax)
    return q.astype(np.int8).reshape(w.shape), s, a


@given(weights_and_scheme())
def test_explicit_float32_gives_the_old_weights_bit_for_bit(case):
    w, scheme, groups = case
    qw = quantize_weight(w, groups=groups, scale_dtype="float32", **scheme)
    q, s, a = _old_float32_rule(w, scheme["bits"], scheme["block_size"], scheme["symmetric"])
    assert np.array_equal(qw.q, q) and np.array_equal(_bits(qw.scales), _bits(s))
    assert np.array_equal(_bits(qw.offsets), _bits(a))


@given(weights_and_scheme())
def test_default_stores_float16_values_chosen_before_the_codes(case):
    """The default form is scale_dtype="float16" whenever every value is in the normal float16 range, else
    float32 for the whole weight (no error)."""
    w, scheme, groups = case
    qw = quantize_weight(w, groups=groups, **scheme)
    try:
        want = quantize_weight(w, groups=groups, scale_dtype="float16", **scheme)
    except ValueError:
        want = quantize_weight(w, groups=groups, scale_dtype="float32", **scheme)
        assert not qw.half_exact
    assert qw == want
    assert qw.param_dtype == (np.float16 if qw.half_exact else np.float32)
    params = qw.scales.size * (1 if qw.symmetric else 2)
    assert qw.nbytes == qw.nbytes_q + params * qw.param_dtype.itemsize


def test_default_is_float16_exact_for_ordinary_weights():
    w = np.random.default_rng(2).standard_normal((32, 64, 3, 3)).astype(np.float32) * np.float32(0.05)
    for bits, block, sym in ((8, 0, True), (8, 32, True), (4, 0, True), (4, 32, True), (4, 32, False),
                             (4, 16, False)):
        qw = quantize_weight(w, bits, block, sym)
        assert qw.half_exact and qw.scales.dtype == np.float32
        assert np.array_equal(qw.scales.astype(np.float16).astype(np.float32), qw.scales)
        assert qw == quantize_weight(w, bits, block, sym, scale_dtype="float16")
        assert qw != quantize_weight(w, bits, block, sym, scale_dtype="float32")


@pytest.mark.parametrize("factor, sym", [(1e-6, True), (1e-6, False), (1e8, True), (1e8, False)])
def test_default_falls_back_to_float32_outside_the_float16_range(factor, sym):
    """A scale below 2**-14 or a scale/offset above 65504 anywhere: the whole weight keeps float32 scales,
    exactly as scale_dtype="float32" gives them, with no error (explicit float16 still refuses)."""
    w = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    w[5] *= np.float32(factor)   # one channel out of range
    qw = quantize_weight(w, 4, 16, sym)
    assert not qw.half_exact and qw.param_dtype == np.float32
    assert qw == quantize_weight(w, 4, 16, sym, scale_dtype="float32")
    with pytest.raises(ValueError, match="float16"):
        quantize_weight(w, 4, 16, sym, scale_dtype="float16")


def test_default_falls_back_for_an_offset_beyond_float16():
    """Scales in range, an offset (about the block minimum) above 65504: float32 for the whole weight."""
    w = np.random.default_rng(4).standard_normal((4, 32)).astype(np.float32)
    w[2] += np.float32(70000.0)
    qw = quantize_weight(w, 8, 0, False)
    assert float(qw.scales.max()) < 1 and float(qw.offsets.max()) > 65504
    assert not qw.half_exact and qw == quantize_weight(w, 8, 0, False, scale_dtype="float32")


@pytest.mark.parametrize("method", ["minmax", "mse"])
def test_asymmetric_range_overflow_names_the_problem(method):
    # max - min of [-3e38, 3e38] overflows float32: the error says so instead of "non-finite scales".
    w = np.zeros((2, 8), np.float32)
    w[1, 0], w[1, 1] = -3e38, 3e38
    with pytest.raises(ValueError, match=r"max - min of output channel 1, block 0 overflows float32"):
        qconv.quantize_weight(w, bits=8, symmetric=False, method=method)
    qconv.quantize_weight(w, bits=8, symmetric=True, method=method)   # the symmetric range is finite


def test_default_falls_back_for_a_constant_block_below_float16_normals():
    """An asymmetric constant block (s = 0) is carried by its offset alone: a nonzero value below 2**-14 would
    lose its precision in float16 (or flush to 0), so the weight keeps float32 and the block stays exact."""
    w = np.random.default_rng(7).standard_normal((4, 32)).astype(np.float32)
    w[1, :16] = np.float32(3e-7)
    qw = quantize_weight(w, 4, 16, False)
    assert not qw.half_exact and np.array_equal(qw.dequantize()[1, :16, 0, 0], w[1, :16])
    with pytest.raises(ValueError, match="normal float16"):
        quantize_weight(w, 4, 16, False, scale_dtype="float16")
    w[1, :16] = np.float32(0.375)   # a float16 value: kept exactly in the float16 form
    qw = quantize_weight(w, 4, 16, False)
    assert qw.half_exact and np.array_equal(qw.dequantize()[1, :16, 0, 0], w[1, :16])


@given(weights_and_scheme(), st.sampled_from(["auto", "float32"]), st.sampled_from(["minmax", "mse"]))
def test_zero_point_form_puts_zero_on_the_grid(case, scale_dtype, method):
    """zero_point=True: offset = -z*s with an integer z in [qmin, qmax], so 0 dequantizes to exactly 0 (every
    exact-zero weight stays 0), and the minmax error stays within half a step (one step at a clipped end)."""
    w, scheme, groups = case
    scheme = {**scheme, "symmetric": False}
    qw = quantize_weight(w, groups=groups, scale_dtype=scale_dtype, method=method, zero_point=True, **scheme)
    assert qw.qmin <= qw.q.min() and qw.q.max() <= qw.qmax
    s = qw.scales.astype(np.float64)
    z = np.where(s > 0, -qw.offsets / np.where(s > 0, s, 1), 0)
    assert (z == np.round(z)).all() and (qw.qmin <= z).all() and (z <= qw.qmax).all()
    assert (qw.offsets[s == 0] == 0).all()
    deq = qw.dequantize()
    assert (deq[w == 0] == 0).all()
    if method == "minmax":
        step = np.repeat(qw.scales, qw.block_len, axis=1).reshape(w.shape).astype(np.float64)
        err = np.abs(deq.astype(np.float64) - w)
        assert (err <= step * (1 + 2.0 ** -9) + 8 * np.finfo(np.float32).eps * np.abs(w) + 1e-30).all()


def test_zero_point_form_has_no_common_offset_error():
    """The reason for zero_point=True: in a row whose range is set by two large weights, the many small weights
    round to the grid point nearest 0. With the float minimum (asym) that point is off 0 by the same amount for
    all of them, so their errors add up coherently; on the zero-point grid it is 0 and their errors cancel."""
    rng = np.random.default_rng(3)
    w = np.concatenate([[-0.3, 1.0], rng.standard_normal(4094) * 1e-4]).astype(np.float32).reshape(1, -1)
    bulk = np.s_[0, 2:]
    mean_err = {zp: float((quantize_weight(w, 8, 0, False, zero_point=zp).dequantize().reshape(w.shape) - w)[bulk].mean())
                for zp in (False, True)}
    step = 1.3 / 255
    assert abs(mean_err[False]) > 0.1 * step and abs(mean_err[True]) < 1e-3 * step, mean_err


def test_zero_point_arguments_are_checked():
    w = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="asymmetric form"):
        quantize_weight(w, zero_point=True)
    with pytest.raises(ValueError, match="not float16 values"):
        quantize_weight(w, symmetric=False, zero_point=True, scale_dtype="float16")
    with pytest.raises(TypeError, match="zero_point must be a bool"):
        quantize_weight(w, symmetric=False, zero_point=1)
