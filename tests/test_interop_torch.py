"""PyTorch converters: torchao's unpacked form from numpy always; torch.ao quantized tensors with torch."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qconv.interop import torch_format as tf
from qconv.interop._common import exact_values
from interop_support import assert_same_values, check_report, normalized, raw_weights


def test_unpacked_numpy_blocked_linear_and_conv():
    rng = np.random.default_rng(0)
    qdata = rng.integers(-8, 8, size=(3, 64)).astype(np.int8)
    scale = rng.uniform(0.01, 1, size=(3, 2)).astype(np.float16).astype(np.float32)  # z*s exact in float32
    zero = rng.integers(-8, 8, size=(3, 2)).astype(np.int8)
    qw, report = tf.read_torch_unpacked(qdata, scale, zero, (1, 32), bits=4)
    assert report.lossless and qw.block_size == 32 and qw.bits == 4
    expect = (qdata - np.repeat(zero, 32, axis=1).astype(np.float64)) * np.repeat(scale, 32, axis=1)
    np.testing.assert_array_equal(exact_values(qw), expect)
    conv = rng.integers(-128, 128, size=(2, 6, 3, 3)).astype(np.int8)
    qw, report = tf.read_torch_unpacked(conv, np.array([0.5, 0.25, 1, 2], np.float32), None, (1, 3, 3, 3))
    assert report.lossless and qw.block_size == 3 and qw.q.shape == (2, 6, 3, 3)
    with pytest.raises(ValueError, match="expected 4 values"):
        tf.read_torch_unpacked(conv, np.ones(3, np.float32), None, (1, 3, 3, 3))
    with pytest.raises(ValueError, match="inside the 3x3 taps"):
        tf.read_torch_unpacked(conv, np.arange(1, 37, dtype=np.float32), None, (1, 1, 1, 3))


# --- torch -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch.ao converter tests skipped")
    import warnings
    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
    return torch


def test_torch_ao_modules(torch):
    torch.manual_seed(0)
    conv = torch.ao.nn.quantized.Conv2d(6, 4, 3, groups=2)
    w = torch.quantize_per_channel(torch.randn(4, 3, 3, 3), (torch.rand(4) / 10 + 0.01).double(),  # observers: fp32
                                   torch.zeros(4, dtype=torch.int64), 0, torch.qint8)
    conv.set_weight_bias(w, None)
    qw, report = tf.read_torch(conv)
    assert report.lossless and qw.groups == 2 and (qw.offsets is None or not qw.offsets.any())
    np.testing.assert_array_equal(qw.dequantize(), conv.weight().dequantize().numpy())
    lin = torch.ao.nn.quantized.dynamic.Linear(12, 5)
    qw, report = tf.read_torch(lin)
    assert report.lossless and qw.q.shape == (5, 12, 1, 1)
    np.testing.assert_array_equal(qw.dequantize()[:, :, 0, 0], lin.weight().dequantize().numpy())
    t, report = tf.write_torch(qw, linear=True)
    lin.set_weight_bias(t, None)
    assert report.lossless and torch.equal(lin.weight().dequantize(), torch.from_numpy(qw.dequantize()[:, :, 0, 0]))


@pytest.mark.parametrize("kind", ["tensor_qint8", "tensor_quint8", "channel_qint8", "channel_quint8", "float_qparams"])
def test_quantized_tensor_schemes(torch, kind):
    torch.manual_seed(1)
    w = torch.randn(5, 7, 1, 3)
    scales = torch.rand(5, dtype=torch.float64) / 10 + 0.01
    if kind.startswith("tensor"):
        dtype = torch.qint8 if kind.endswith("qint8") else torch.quint8
        t = torch.quantize_per_tensor(w, 0.05, 3 if dtype == torch.qint8 else 131, dtype)
    elif kind.startswith("channel"):
        dtype = torch.qint8 if kind.endswith("qint8") else torch.quint8
        zeros = torch.tensor([0, 3, -5, 7, 1]) + (0 if dtype == torch.qint8 else 128)
        t = torch.quantize_per_channel(w, scales, zeros, 0, dtype)
    else:
        t = torch.quantize_per_channel(w[:, :, 0, 0], scales.float(), torch.tensor([0.5, -1.25, 3, 0, 2]), 0,
                                       torch.quint8)
    qw, report = tf.read_torch(t)
    codes = t.int_repr().numpy().astype(np.float64).reshape(5, -1)
    if t.qscheme() == torch.per_tensor_affine:
        expect = (codes - t.q_zero_point()) * t.q_scale()
    else:
        expect = (codes - t.q_per_channel_zero_points().numpy()[:, None]) * t.q_per_channel_scales().numpy()[:, None]
    check_report(report, expect, exact_values(qw))
    np.testing.assert_allclose(qw.dequantize().reshape(5, -1), t.dequantize().numpy().reshape(5, -1), rtol=1e-6,
                               atol=1e-7)
    assert report.max_abs_error <= 1e-7 * np.abs(expect).max()  # float64 scales rounded to float32, at most


@settings(max_examples=15)
@given(raw_weights(kinds=("symmetric", "integer_zero", "asymmetric"), fp16=True))
def test_write_torch_round_trip(torch, qw):
    try:
        t, report = tf.write_torch(qw)
    except ValueError as exc:
        assert "one scale per output channel" in str(exc)
        return
    assert t.qscheme() == torch.per_channel_affine and t.dtype == torch.qint8
    z = t.q_per_channel_zero_points().numpy()[:, None].astype(np.float64)
    check_report(report, exact_values(qw), (t.int_repr().numpy().reshape(qw.out_channels, -1) - z)
                 * t.q_per_channel_scales().numpy()[:, None])
    back, report2 = tf.read_torch(t, groups=qw.groups)
    if qw.symmetric:  # torch.ao holds int8 only
        assert back == normalized(replace(qw, bits=8))
    elif report.lossless and report2.lossless:
        assert_same_values(back, qw)


@settings(max_examples=15)
@given(raw_weights(), st.sampled_from(["int", "float"]), st.booleans())
def test_unpacked_round_trip(torch, qw, zero, linear):
    u, report = tf.write_torch_unpacked(qw, zero=zero, linear=linear)
    assert u.qdata.dtype == torch.int8 and u.scale.dtype == torch.float32
    assert u.zero_point.dtype == (torch.int8 if zero == "int" else torch.float32)
    back, report2 = tf.read_torch_unpacked(*u, bits=qw.bits, groups=qw.groups)
    src = (u.qdata.numpy().reshape(qw.out_channels, -1).astype(np.float64)
           - tf._expand(u.zero_point.numpy(), tuple(u.qdata.shape), u.block_size).reshape(qw.out_channels, -1))
    src = src * tf._expand(u.scale.numpy(), tuple(u.qdata.shape), u.block_size).reshape(qw.out_channels, -1)
    check_report(report, exact_values(qw), src)
    check_report(report2, src, exact_values(back))
    if qw.offsets is None:
        assert report.lossless and report2.lossless
        if not linear:
            assert back == normalized(qw)
