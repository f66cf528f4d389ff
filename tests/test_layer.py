"""The public layer API on the reference engine (engine-independent behaviour)."""
import numpy as np
import pytest

import qconv
from qconv import reference
from qconv.layouts import NC4HW4


@pytest.fixture
def problem():
    rng = np.random.default_rng(7)
    qw = qconv.quantize_weight(rng.standard_normal((6, 5, 3, 3)).astype(np.float32), 4, 0, False)
    x = rng.standard_normal((2, 5, 7, 8)).astype(np.float32)
    return qw, x, rng.standard_normal(6).astype(np.float32)


def test_reference_engine_matches_oracle_and_nc4hw4(problem):
    qw, x, bias = problem
    layer = qconv.Conv2d(qw, bias, stride=2, padding=1, activation="relu6", device="reference")
    y = layer(x)
    assert np.array_equal(y, reference.conv2d(x, qw, bias, 2, 1, 1, "relu6", "tensor"))
    y4 = layer(NC4HW4(4).pack_array(x), layout="nc4hw4")
    assert y4.shape == (2, 2, 4, 4, 4)
    assert np.array_equal(NC4HW4(4).unpack_array(y4, y.shape), y)
    assert not y4[1, :, :, :, 2:].any()  # padding lanes of channels 6, 7 are zero
    assert "reference" in repr(layer) and "int4 asym" in repr(layer)


def test_functional_and_linear(problem):
    qw, x, bias = problem
    assert np.array_equal(qconv.conv2d(x, qw, bias, padding=1, device="reference"),
                          reference.conv2d(x, qw, bias, padding=1))
    rng = np.random.default_rng(1)
    lw = qconv.quantize_weight(rng.standard_normal((9, 33)).astype(np.float32), 8)
    lin = qconv.Linear(lw, device="reference")
    xs = rng.standard_normal((3, 33)).astype(np.float32)
    y = lin(xs)
    assert y.shape == (3, 9) and lin.spec.act_quant == "row"
    assert np.array_equal(y, reference.conv2d(xs[:, :, None, None], lw, act_quant="row")[:, :, 0, 0])


def test_layer_bad_input_is_a_clear_error(problem):
    qw, x, bias = problem
    layer = qconv.Conv2d(qw, device="reference", padding=1)
    with pytest.raises(ValueError, match="channels"):
        layer(x[:, :4])
    with pytest.raises(ValueError, match="NCHW"):
        layer(x[0])
    with pytest.raises(TypeError, match="floating"):
        layer(x.astype(np.int32))
    with pytest.raises(ValueError, match="layout"):
        layer(x, layout="nhwc")
    with pytest.raises(ValueError, match="NC4HW4"):
        layer(x, layout="nc4hw4")
    with pytest.raises(ValueError, match="device"):
        qconv.Conv2d(qw, device="tpu")
    with pytest.raises(ValueError, match="act_quant"):
        qconv.Conv2d(qw, device="reference", act_quant="channel")
    with pytest.raises(TypeError, match="QuantizedWeight"):
        qconv.Conv2d(np.ones((2, 2, 1, 1), np.float32), device="reference")
    with pytest.raises(ValueError, match="Linear needs"):
        qconv.Linear(qw, device="reference")
    with pytest.raises(ValueError, match="threads must be >= 1"):
        qconv.Conv2d(qw, device="reference", threads=0)


def test_memory_guard_refuses_before_allocating(problem, monkeypatch):
    qw, x, _ = problem
    monkeypatch.setenv("QCONV_MAX_BYTES", "1000")
    layer = qconv.Conv2d(qw, device="reference", padding=1)
    with pytest.raises(MemoryError, match="the output would need"):
        layer(np.zeros((64, 5, 64, 64), np.float32))


def test_available_devices_lists_reference_first():
    devs = qconv.available_devices()
    assert devs[0] == "reference"
