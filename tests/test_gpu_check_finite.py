"""NaN/inf in a ``pyopencl.array.Array`` input (issue 19 item 8): a layer built with ``check_finite=True``
refuses it with ``ValueError`` (counted on the device, NC4HW4 padding lanes left out); by default device inputs
are not scanned (the call stays asynchronous: NaN in, NaN out). Numpy inputs are refused either way."""
import numpy as np
import pytest

import qconv
from qconv.layouts import NC4HW4

from test_gpu_engine import cl_device  # noqa: F401

P4 = NC4HW4(4)


def _layer(device, **opts):
    rng = np.random.default_rng(3)
    w = qconv.quantize_weight(rng.standard_normal((5, 6, 3, 3)).astype(np.float32), bits=8, block_size=0)
    return qconv.Conv2d(w, padding=1, device=device, act_quant=None, tune="none", **opts)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("layout", ["nchw", "nc4hw4"])
def test_check_finite_refuses_nonfinite_device_input(cl_device, bad, layout):
    import pyopencl as cl
    import pyopencl.array as cla

    layer = _layer(cl_device, check_finite=True)
    q = cl.CommandQueue(layer.engine.ctx)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 7, 5)).astype(np.float32)
    xin = x if layout == "nchw" else P4.pack_array(x)
    y_ok = layer(cla.to_device(q, xin), layout).get()  # finite: runs, same result as numpy input
    np.testing.assert_array_equal(y_ok, layer(xin, layout))
    x[1, 4, 6, 2] = bad  # the very last element of sample 1 in channel block 1 (the last, partial block)
    xin = x if layout == "nchw" else P4.pack_array(x)
    with pytest.raises(ValueError, match="1 non-finite"):
        layer(cla.to_device(q, xin), layout)
    with pytest.raises(ValueError, match="non-finite"):
        layer(xin, layout)  # numpy input: refused with or without the option


def test_check_finite_ignores_nc4hw4_padding_lanes(cl_device):
    import pyopencl as cl
    import pyopencl.array as cla

    layer = _layer(cl_device, check_finite=True)
    q = cl.CommandQueue(layer.engine.ctx)
    xp = P4.pack_array(np.ones((1, 6, 4, 4), np.float32))
    xp[-1, ..., 2:] = np.nan  # channels 6, 7: padding lanes
    y = layer(cla.to_device(q, xp), "nc4hw4").get()
    assert np.isfinite(y).all()


def test_device_input_is_not_scanned_by_default(cl_device):
    """No check_finite: no read of x (asynchronous call), NaN flows to the output."""
    import pyopencl as cl
    import pyopencl.array as cla

    layer = _layer(cl_device)
    q = cl.CommandQueue(layer.engine.ctx)
    x = np.ones((1, 6, 4, 4), np.float32)
    x[0, 0, 0, 0] = np.nan
    xd = cla.to_device(q, x)
    y = layer(xd)
    assert isinstance(y, cla.Array)
    assert np.isnan(y.get()).any()
    with pytest.raises(TypeError, match="check_finite"):
        _layer(cl_device, check_finite="yes")
