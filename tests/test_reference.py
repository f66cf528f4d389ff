"""The oracle against plain float64 convolutions, and its activation quantization."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qconv import quantize_weight, reference
from qconv.testing.strategies import activations, conv_geometries, quantized_weights


@st.composite
def problems(draw, **geom):
    g = draw(conv_geometries(groups=True, **geom))
    qw = draw(quantized_weights(g))
    x = draw(activations((g.n, g.c, g.h, g.w)))
    bias = draw(st.one_of(st.none(), st.just(np.linspace(-1, 1, g.o, dtype=np.float32))))
    return g, qw, x, bias


def _rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


@given(problems(), st.sampled_from(["tensor", "row"]))
def test_oracle_equals_float64_conv_of_dequantized_operands(p, mode):
    g, qw, x, bias = p
    y = reference.conv2d(x, qw, bias, act_quant=mode, **g.conv_kwargs())
    xd = reference.quantize_activation(x, mode).dequantize()
    want = reference.float_conv2d(xd, qw.dequantize(), bias, groups=g.groups, **g.conv_kwargs())
    assert y.dtype == np.float32 and y.shape == (g.n, g.o) + g.out_hw
    assert _rel(y, want) <= 1e-6


@given(problems())
def test_float_activation_mode_is_a_float_conv(p):
    g, qw, x, bias = p
    y = reference.conv2d(x, qw, bias, act_quant=None, **g.conv_kwargs())
    want = reference.float_conv2d(x, qw.dequantize(), bias, groups=g.groups, **g.conv_kwargs())
    assert _rel(y, want) <= 1e-6


@given(problems(), st.sampled_from(["tensor", "row"]))
def test_activation_error_bound(p, mode):
    """|y_quant - y_float| <= sum over taps |w| * dx/2 (each activation is off by at most half a step)."""
    g, qw, x, _ = p
    aq = reference.quantize_activation(x, mode)
    dx = aq.per_sample(g.n)[0].astype(np.float64)
    assert (np.abs(aq.dequantize().astype(np.float64) - x) <= dx.reshape(-1, 1, 1, 1) / 2 * (1 + 1e-5) + 1e-30).all()
    yq = reference.conv2d(x, qw, act_quant=mode, **g.conv_kwargs())
    yf = reference.conv2d(x, qw, act_quant=None, **g.conv_kwargs())
    wabs = np.abs(qw.dequantize())
    ones = np.ones_like(x) * (dx.reshape(-1, 1, 1, 1) / 2).astype(np.float32)
    bound = reference.float_conv2d(ones, wabs, groups=g.groups, **g.conv_kwargs()).astype(np.float64)
    assert (np.abs(yq.astype(np.float64) - yf) <= bound * (1 + 1e-4) + 1e-5 * np.abs(yf).max() + 1e-30).all()


@given(activations((2, 3, 4, 5)))
def test_tensor_quantization_keeps_zero_exact(x):
    aq = reference.quantize_activation(x, "tensor")
    z = int(aq.zero[0])
    assert -128 <= z <= 127
    assert aq.xq.min() >= -128 and aq.xq.max() <= 127
    # the zero point is an exact quantized zero: zeros added to x change neither the scale nor the zero
    # point, quantize to z and dequantize to exactly 0.0 ...
    xz = np.concatenate([x, np.zeros_like(x[:1])])
    az = reference.quantize_activation(xz, "tensor")
    assert az.scale[0] == aq.scale[0] and az.zero[0] == z
    assert (az.xq[-1] == z).all() and not az.dequantize()[-1].any()
    if (x == 0).any():
        assert (aq.xq[x == 0] == z).all()
    # ... so padding taps contribute nothing: padding equals an explicitly zero-padded input, bit for bit
    # (also for an all-positive input, whose range must still reach 0)
    w = quantize_weight(np.random.default_rng(0).standard_normal((2, 3, 3, 3)).astype(np.float32))
    for xx in (x, np.abs(x) + np.float32(0.5)):
        xp = np.pad(xx, ((0, 0), (0, 0), (2, 2), (1, 1)))
        assert np.array_equal(reference.conv2d(xx, w, padding=(2, 1)), reference.conv2d(xp, w, padding=0))


def test_constant_and_zero_inputs_are_exact():
    for v in (0.0, 3.7, -2.25):
        x = np.full((1, 2, 3, 3), v, np.float32)
        d = reference.quantize_activation(x, "tensor").dequantize()
        np.testing.assert_allclose(d, x, rtol=1e-6, atol=0)
        d = reference.quantize_activation(x, "row").dequantize()
        np.testing.assert_allclose(d, x, rtol=1e-6, atol=0)


def test_row_mode_rows_are_independent():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16, 1, 1)).astype(np.float32)
    x[2] *= 100
    qw = quantize_weight(rng.standard_normal((8, 16)).astype(np.float32), 4, 8)
    full = reference.conv2d(x, qw, act_quant="row")
    for n in range(4):
        assert np.array_equal(reference.conv2d(x[n:n + 1], qw, act_quant="row"), full[n:n + 1])


def test_integer_parts_are_exact_and_consistent():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    qw = quantize_weight(rng.standard_normal((4, 6, 3, 3)).astype(np.float32), 8, 2, False)
    a, s, aq = reference.integer_parts(x, qw, padding=1)
    assert a.dtype == np.int64 and a.shape == (2, 4, 5, 5, 3) and s.shape == (2, 1, 5, 5, 3)
    # a direct loop over one output pixel with explicit padding
    u = aq.xq.astype(np.int64) - int(aq.zero[0])
    up = np.pad(u, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patch = up[1, :, 0:3, 2:5]  # n=1, oy=0, ox=2
    for k in range(3):
        blk = patch[2 * k: 2 * k + 2]
        assert s[1, 0, 0, 2, k] == blk.sum()
        for o in range(4):
            assert a[1, o, 0, 2, k] == (qw.q[o, 2 * k: 2 * k + 2].astype(np.int64) * blk).sum()


def test_activations_relu_relu6():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32) * 10
    qw = quantize_weight(rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
    y = reference.conv2d(x, qw, padding=1)
    assert np.array_equal(reference.conv2d(x, qw, padding=1, activation="relu"), np.maximum(y, 0))
    assert np.array_equal(reference.conv2d(x, qw, padding=1, activation="relu6"), np.clip(y, 0, 6))


def test_bad_input_names_the_argument():
    qw = quantize_weight(np.ones((2, 3, 3, 3), np.float32))
    x = np.ones((1, 3, 5, 5), np.float32)
    with pytest.raises(ValueError, match="4 dimensions"):
        reference.conv2d(x[0], qw)
    with pytest.raises(ValueError, match="channels"):
        reference.conv2d(np.ones((1, 4, 5, 5), np.float32), qw)
    with pytest.raises(TypeError, match="floating"):
        reference.conv2d(x.astype(np.int64), qw)
    with pytest.raises(ValueError, match="padding must be >= 0"):
        reference.conv2d(x, qw, padding=-1)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        reference.conv2d(x, qw, stride=0)
    with pytest.raises(ValueError, match="output height would be"):
        reference.conv2d(np.ones((1, 3, 2, 5), np.float32), qw)
    with pytest.raises(ValueError, match="act_quant"):
        reference.conv2d(x, qw, act_quant="channel")
    with pytest.raises(ValueError, match="activation"):
        reference.conv2d(x, qw, activation="gelu")
    with pytest.raises(ValueError, match="bias must have shape"):
        reference.conv2d(x, qw, bias=np.ones(3, np.float32))
    bad = x.copy()
    bad[0, 0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        reference.conv2d(bad, qw)
    with pytest.raises(TypeError, match="QuantizedWeight"):
        reference.conv2d(x, np.ones((2, 3, 3, 3), np.float32))


@given(problems(max_channels=16), st.data())
def test_block_mode_equals_float64_of_dequantized_columns(p, data):
    g, qw, x, bias = p
    ipg = g.in_per_group
    wb = qw.block_channels
    choices = [d for d in range(1, ipg + 1) if ipg % d == 0 and (wb % d == 0 or d % wb == 0)]
    ab = data.draw(st.sampled_from(choices))
    y = reference.conv2d(x, qw, bias, act_quant="block", act_block=ab, **g.conv_kwargs())
    # explicit: quantize each im2col column per block, dequantize, float64 matmul
    spec = reference._spec(qw, bias, g.stride, g.padding, g.dilation, None, "block", ab)
    cols = reference._columns(x.astype(np.float64), spec)
    vq, dx = reference.quantize_columns(cols, ab * qw.taps)
    deq = (vq.astype(np.float64).reshape(*dx.shape, -1) * dx[..., None]).reshape(cols.shape)
    w = qw.dequantize(np.float64).reshape(g.groups, g.o // g.groups, -1)
    want = np.einsum("pgl,gol->pgo", deq, w).reshape(g.n, *g.out_hw, g.o).transpose(0, 3, 1, 2)
    if bias is not None:
        want = want + bias.reshape(1, -1, 1, 1)
    assert _rel(y, want) <= 1e-6


def test_block_mode_beats_tensor_mode_on_outliers():
    """A few input channels x1000 (with weights /1000, so they do not dominate the output, as in LLMs)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256, 1, 1)).astype(np.float32)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    ch = rng.choice(256, 3, replace=False)
    x[:, ch] *= 1000
    w[:, ch] /= 1000
    qw = quantize_weight(w, 8, 16, False)
    ref = reference.conv2d(x, qw, act_quant=None)
    from qconv.testing import sqnr_db
    tensor = sqnr_db(reference.conv2d(x, qw, act_quant="tensor"), ref)
    block = sqnr_db(reference.conv2d(x, qw, act_quant="block", act_block=8), ref)
    assert block - tensor > 10, (tensor, block)


def test_act_block_must_fit_the_weight_blocks():
    qw = quantize_weight(np.ones((2, 12, 1, 1), np.float32), 8, 4)
    x = np.ones((1, 12, 2, 2), np.float32)
    with pytest.raises(ValueError, match="act_block=5"):
        reference.conv2d(x, qw, act_quant="block", act_block=5)
    with pytest.raises(ValueError, match="act_block=6"):
        reference.conv2d(x, qw, act_quant="block", act_block=6)  # neither divides nor is a multiple of 4
    reference.conv2d(x, qw, act_quant="block", act_block=2)
    reference.conv2d(x, qw, act_quant="block", act_block=12)


def test_tiny_ranges_quantize_to_zero_without_overflow():
    x = np.full((2, 3, 2, 2), 1e-39, np.float32)
    for mode in ("tensor", "row"):
        aq = reference.quantize_activation(x, mode)
        assert np.isfinite(aq.scale).all() and not aq.xq.any()
    qw = quantize_weight(np.ones((2, 3, 1, 1), np.float32))
    assert np.isfinite(reference.conv2d(x, qw, act_quant="block")).all()
