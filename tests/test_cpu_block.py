"""``act_quant="block"`` in the CPU engine: per (output pixel, block of ``act_block`` input channels x all taps)
symmetric int8 activations, against the oracle (:func:`qconv.reference.conv2d`, ``quantize_columns``,
``block_integer_parts``): the quantized columns, their sums and scales exactly, the output within the 1e-5 rule."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._cpu")

from qconv import quantize_weight, reference  # noqa: E402
from qconv._ext import _cpu, _cpu_testing  # noqa: E402
from qconv.cpu import KERNEL_NAMES, CpuEngine  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts.nc4hw4 import NC4HW4  # noqa: E402
from qconv.testing import assert_matches_reference, sqnr_db, strategies as qst  # noqa: E402

KERNELS = [k for k in KERNEL_NAMES if _cpu.kernel_supported(k)]
P4 = NC4HW4(4)


def _act_blocks(ipg, wb):
    return [a for a in range(1, ipg + 1) if ipg % a == 0 and (wb % a == 0 or a % wb == 0)]


@st.composite
def block_cases(draw):
    geo = draw(qst.conv_geometries(groups=True, max_spatial=9, max_channels=20, max_out_channels=40))
    weight = draw(qst.quantized_weights(geo))
    ipg = weight.q.shape[1]
    ab = draw(st.sampled_from([0] + _act_blocks(ipg, weight.block_channels)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = draw(qst.activations((geo.n, geo.c, geo.h, geo.w)))
    if draw(st.booleans()):  # outlier channels
        x = x.copy()
        x[:, rng.integers(0, geo.c, 2)] *= 1000
    bias = rng.standard_normal(geo.o).astype(np.float32) if draw(st.booleans()) else None
    act = draw(st.sampled_from([None, "relu", "relu6"]))
    return geo, weight, x, bias, act, ab


def _check(y, x, weight, bias, geo, act, ab):
    """The per-output 1e-5 rule (qconv.metrics) with the block-quantized columns' |x_deq|."""
    assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, "block",
                             act_block=ab)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=block_cases(), layout=st.sampled_from(["nchw", "nc4hw4"]), threads=st.sampled_from([1, 2]),
       tile_cols=st.sampled_from([16, 1, 5, 14, 17, 32]))
@settings(deadline=None)
def test_block_mode_matches_reference(kernel, case, layout, threads, tile_cols):
    geo, weight, x, bias, act, ab = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, "block", ab)
    eng = CpuEngine(spec, threads=threads, kernel=kernel, tile_cols=tile_cols)
    if layout == "nchw":
        y = eng.forward(x)
    else:
        yp = eng.forward(P4.pack_array(x), "nc4hw4")
        oh, ow = spec.out_hw(geo.h, geo.w)
        y = P4.unpack_array(yp, (geo.n, geo.o, oh, ow))
    _check(y, x, weight, bias, geo, act, ab)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=block_cases())
@settings(deadline=None, max_examples=40)
def test_block_columns_integer_parts_exact(kernel, case):
    """The quantized columns, their per-fine-block sums and scales equal the oracle's bit for bit."""
    geo, weight, x, bias, act, ab = case
    spec = ConvSpec(weight, None, geo.stride, geo.padding, geo.dilation, None, "block", ab)
    eng = CpuEngine(spec, threads=1, kernel=kernel, depthwise=False)  # the GEMM path's block columns
    lay = eng.layout
    n, c, h, w = x.shape
    oh, ow = spec.out_hw(h, w)
    g, taps, fb = weight.groups, weight.taps, spec.fine_block_channels
    xp = np.ascontiguousarray(x.transpose(0, 2, 3, 1).reshape(-1, c))
    p = n * oh * ow
    A, S, D = _cpu_testing._test_block_cols(xp, eng.geometry, n, h, w, 0, p, kernel)
    cols = reference._columns(x.astype(np.float64), spec)
    vq, dx = reference.quantize_columns(cols, spec.act_block * taps)
    nf = c // g // fb
    bcp = lay.block_icl
    # A rows: (P, G*nf, taps, BCp); oracle columns in OIHW order: (P, G, nf, fb, taps)
    a = A.reshape(p, g, nf, taps, bcp)
    # int8 weights store xq + 128, unless in the AVX2 sign form (signed xq, as int4 weights)
    unsigned = weight.bits == 8 and not eng.geometry.signed_input
    got = a[..., :fb].astype(np.int16) - 128 if unsigned else a[..., :fb].view(np.int8).astype(np.int16)
    want = vq.reshape(p, g, nf, fb, taps).transpose(0, 1, 2, 4, 3)
    np.testing.assert_array_equal(got, want)
    pad = a[..., fb:]
    assert (pad == (128 if unsigned else 0)).all()
    _, s_ref, dx_ref = reference.block_integer_parts(x, weight, geo.stride, geo.padding, geo.dilation, ab)
    np.testing.assert_array_equal(S.reshape(p, g * nf), s_ref.transpose(0, 2, 3, 1, 4).reshape(p, g * nf))
    dxf = np.repeat(dx.reshape(p, g, -1), spec.act_block // fb, axis=2).reshape(p, g * nf)
    np.testing.assert_array_equal(D, dxf)
    np.testing.assert_array_equal(dx.reshape(-1), dx_ref.transpose(0, 2, 3, 1, 4).reshape(-1))


@pytest.mark.parametrize("bits,block,sym,ab", [(8, 0, True, 0), (4, 32, False, 32), (4, 32, True, 8),
                                               (8, 16, False, 64), (4, 64, False, 16)])
@pytest.mark.parametrize("n", [1, 3])
def test_block_mode_linear_shapes(bits, block, sym, ab, n):
    """GEMV / small-batch Linear shapes (1x1, H = W = 1): the path without the pixel-major copy."""
    rng = np.random.default_rng(bits + block + n)
    w = rng.standard_normal((80, 256)).astype(np.float32)
    x = rng.standard_normal((n, 256, 1, 1)).astype(np.float32)
    x[:, 7] *= 500
    qw = quantize_weight(w, bits, block, sym)
    bias = rng.standard_normal(80).astype(np.float32)
    class G:  # noqa: N801 - minimal geometry record for _check
        stride, padding, dilation = (1, 1), (0, 0), (1, 1)
    for kernel in KERNELS:
        for threads in (1, 2):
            eng = CpuEngine(ConvSpec(qw, bias, act_quant="block", act_block=ab), threads=threads, kernel=kernel)
            _check(eng.forward(x), x, qw, bias, G, None, ab)


def test_block_mode_non_finite_input_raises():
    qw = quantize_weight(np.ones((4, 8, 3, 3), np.float32), 8, 4)
    eng = CpuEngine(ConvSpec(qw, padding=1, act_quant="block"), threads=2)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((1, 8, 5, 5), np.float32)
        x[0, 3, 2, 2] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            eng.forward(x)
    y = eng.forward(np.full((1, 8, 5, 5), 1e-39, np.float32))  # tiny ranges quantize to 0, no overflow
    assert np.isfinite(y).all() and (y == 0).all()


def test_block_mode_beats_tensor_mode_on_outliers_cpu():
    """As tests/test_reference.py::test_block_mode_beats_tensor_mode_on_outliers, on the CPU engine."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256, 1, 1)).astype(np.float32)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    ch = rng.choice(256, 3, replace=False)
    x[:, ch] *= 1000
    w[:, ch] /= 1000
    qw = quantize_weight(w, 8, 16, False)
    ref = reference.conv2d(x, qw, act_quant=None)
    tensor = sqnr_db(CpuEngine(ConvSpec(qw, act_quant="tensor")).forward(x), ref)
    block = sqnr_db(CpuEngine(ConvSpec(qw, act_quant="block", act_block=8)).forward(x), ref)
    assert block - tensor > 10, (tensor, block)


def test_block_mode_public_layer():
    import qconv
    rng = np.random.default_rng(1)
    qw = quantize_weight(rng.standard_normal((16, 32, 3, 3)).astype(np.float32), 4, 16, False)
    x = rng.standard_normal((2, 32, 7, 7)).astype(np.float32)
    layer = qconv.Conv2d(qw, padding=1, act_quant="block", act_block=8)
    ref = reference.conv2d(x, qw, padding=1, act_quant="block", act_block=8)
    assert np.abs(layer(x) - ref).max() <= 1e-5 * np.abs(ref).max() * 10
    assert "act_quant=block" in repr(layer) or "block" in layer.engine.describe()


@given(st.lists(st.floats(-2.0**120, 2.0**120, width=32), min_size=1, max_size=300), st.sampled_from([1, 3]),
       st.sampled_from(KERNELS))
@settings(deadline=None)
def test_native_act_params_match_python(values, n, kernel):
    """``fill_tensor_params`` / ``fill_row_params`` (used per call) equal ``tensor_qparams`` / ``row_qparams``."""
    from qconv.cpu import row_qparams, tensor_qparams
    x = np.array(values * n, np.float32)
    qs, z, dx = np.empty(n, np.float32), np.empty(n, np.int32), np.empty(n, np.float32)
    assert _cpu.fill_tensor_params(x, 2, kernel, qs, z, dx)
    q0, d0, z0 = tensor_qparams(float(x.min()), float(x.max()))
    assert (qs == q0).all() and (dx == d0).all() and (z == z0).all()
    xr = (x.reshape(n, -1) * np.arange(1, n + 1, dtype=np.float32)[:, None] / n).astype(np.float32)
    assert _cpu.fill_row_params(xr.reshape(1, n, -1), 2, kernel, qs, z, dx)
    q1, d1 = row_qparams(np.abs(xr).max(axis=1))
    assert (qs == q1).all() and (dx == d1).all() and (z == 0).all()
    for bad in (np.nan, np.inf):
        y = x.copy()
        y[len(y) // 2] = bad
        assert not _cpu.fill_tensor_params(y, 1, kernel, qs, z, dx)
        assert not _cpu.fill_row_params(y.reshape(1, 1, -1), 1, kernel, qs[:1], z[:1], dx[:1])
