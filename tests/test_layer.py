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


def _empty_batch_checks(device):
    """N = 0 through every public entry point of ``device``: empty outputs of the right shape and dtype."""
    rng = np.random.default_rng(9)
    qw = qconv.quantize_weight(rng.standard_normal((6, 5, 3, 3)).astype(np.float32), 4, 0, False)
    layer = qconv.Conv2d(qw, None, stride=2, padding=1, device=device)
    x0 = np.zeros((0, 5, 7, 8), np.float32)
    y = layer(x0)
    assert y.shape == (0, 6, 4, 4) and y.dtype == np.float32
    y4 = layer(np.zeros((2, 0, 7, 8, 4), np.float32), layout="nc4hw4")
    assert y4.shape == (2, 0, 4, 4, 4) and y4.dtype == np.float32
    assert qconv.conv2d(x0, qw, stride=2, padding=1, device=device).shape == (0, 6, 4, 4)
    assert qconv.conv2d(x0.astype(np.float64), qw, device=device).shape == (0, 6, 5, 6)
    lw = qconv.quantize_weight(rng.standard_normal((9, 33)).astype(np.float32), 8)
    yl = qconv.Linear(lw, device=device)(np.zeros((0, 33), np.float32))
    assert yl.shape == (0, 9) and yl.dtype == np.float32
    # an empty batch is still checked like any input
    with pytest.raises(ValueError, match="channels"):
        layer(np.zeros((0, 4, 7, 8), np.float32))
    with pytest.raises(ValueError, match="empty"):
        layer(np.zeros((1, 5, 0, 8), np.float32))
    with pytest.raises(ValueError, match="output height"):
        qconv.Conv2d(qw, device=device)(np.zeros((0, 5, 2, 8), np.float32))
    with pytest.raises(TypeError, match="floating"):
        layer(np.zeros((0, 5, 7, 8), np.int32))
    with pytest.raises(ValueError, match="channels"):
        qconv.Linear(lw, device=device)(np.zeros((0, 32), np.float32))
    if device == "cpu":  # the static int8 path returns int8
        s = qconv.Conv2d(qw, padding=1, device="cpu", input_qparams=(0.1, 0), output_qparams=(0.1, 0))
        yi = s(np.zeros((0, 5, 7, 8), np.int8))
        assert yi.shape == (0, 6, 7, 8) and yi.dtype == np.int8
    return layer


def test_empty_batch_reference():
    _empty_batch_checks("reference")
    qw = qconv.quantize_weight(np.ones((3, 2, 3, 3), np.float32))
    for aq in ("tensor", "row", "block", None):
        y = reference.conv2d(np.zeros((0, 2, 5, 5), np.float32), qw, np.ones(3, np.float32), padding=1,
                             act_quant=aq, activation="relu")
        assert y.shape == (0, 3, 5, 5) and y.dtype == np.float32
    with pytest.raises(ValueError, match="empty"):
        reference.conv2d(np.zeros((1, 2, 5, 0), np.float32), qw)


def test_empty_batch_on_engines(qconv_device):
    layer = _empty_batch_checks(qconv_device)
    if qconv_device.startswith("opencl"):  # a device array in, a device array out
        import pyopencl.array as cla

        xd = cla.zeros(layer.engine.queue, (0, 5, 7, 8), np.float32)
        yd = layer(xd)
        assert isinstance(yd, cla.Array) and yd.shape == (0, 6, 4, 4)
        with pytest.raises(ValueError, match="channels"):
            layer(cla.zeros(layer.engine.queue, (0, 4, 7, 8), np.float32))


def _padding_lane_checks(device):
    """NaN / inf / large garbage in the input's NC4HW4 padding lanes: the layer neither rejects it nor lets it
    move the result (C = 5 and 6: one and two real lanes in the last quad, 3 and 2 padding lanes)."""
    rng = np.random.default_rng(10)
    for c in (5, 6):
        qw = qconv.quantize_weight(rng.standard_normal((7, c, 3, 3)).astype(np.float32), 4, 0, False)
        layer = qconv.Conv2d(qw, None, padding=1, device=device)
        x = NC4HW4(4).pack_array(rng.standard_normal((2, c, 6, 5)).astype(np.float32))
        clean = layer(x, layout="nc4hw4")
        for garbage in (np.nan, -np.inf, 1e30):
            x[-1, ..., c % 4:] = garbage
            np.testing.assert_array_equal(layer(x, layout="nc4hw4"), clean)
        x[-1, 0, 0, 0, 0] = np.nan   # a real channel is still checked
        with pytest.raises(ValueError, match="NaN"):
            layer(x, layout="nc4hw4")


def test_nc4hw4_padding_lanes_are_ignored_reference():
    _padding_lane_checks("reference")


def test_nc4hw4_padding_lanes_are_ignored_on_engines(qconv_device):
    _padding_lane_checks(qconv_device)


def test_out_is_written_in_place_on_the_cpu(problem):
    """``layer(x, out=y)`` on the CPU writes a C-contiguous ``y`` directly (the engine's own output buffer: the
    same bits as a plain call, NC4HW4 padding lanes zeroed); other ``y`` are filled by a copy; bad ones refused."""
    qw, x, bias = problem
    layer = qconv.Conv2d(qw, bias, stride=2, padding=1, activation="relu6", device="cpu")
    want = layer(x)
    y = np.full(want.shape, np.nan, np.float32)
    assert layer(x, out=y) is y
    np.testing.assert_array_equal(y, want)
    x4, want4 = NC4HW4(4).pack_array(x), NC4HW4(4).pack_array(want)
    y4 = np.full(want4.shape, np.nan, np.float32)
    assert layer(x4, layout="nc4hw4", out=y4) is y4
    np.testing.assert_array_equal(y4, want4)
    strided = np.full(want.shape + (2,), np.nan, np.float32)[..., 0]   # not contiguous: the copy path
    assert layer(x, out=strided) is strided
    np.testing.assert_array_equal(strided, want)
    with pytest.raises(ValueError, match="out has shape"):
        layer(x, out=np.empty(want.shape[:-1] + (want.shape[-1] + 1,), np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        layer(x, out=np.empty(want.shape, np.float64))
    big = np.zeros(x.size + want.size, np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        layer(big[:x.size].reshape(x.shape), out=big[x.size - 1:-1].reshape(want.shape))
    # in place: the call allocates no output of its own (scratch comes from the thread's arena, sized already)
    import tracemalloc
    xl = np.random.default_rng(3).standard_normal((1, 5, 96, 96)).astype(np.float32)
    yl = layer(xl)
    layer(xl, out=yl)
    tracemalloc.start()
    try:
        layer(xl, out=yl)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < yl.nbytes // 4, peak
