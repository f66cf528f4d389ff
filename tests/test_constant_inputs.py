"""Constant and all-zero inputs on every engine (the ``qconv_device`` fixture).

The shared strategy (``qconv.testing.strategies.activations``) now draws constant inputs rarely, since a
constant input hides permuted channels or pixels and an all-zero one passes an engine that returns zeros;
these are the dedicated tests of those inputs: the degenerate activation ranges (``lo = 0`` or ``hi = 0``,
range 0, subnormal), borders where padding taps meet a constant, and an all-zero input whose output must be
the bias exactly.
"""
import numpy as np
import pytest

import qconv
from qconv.layouts import NC4HW4
from qconv.testing import assert_matches_reference

P4 = NC4HW4(4)
MODES = {"cpu": ("tensor", "row", "block")}


def _modes(device):
    return MODES.get(device, (None, "row"))


def _layer_case(bits=4, sym=False, block=0):
    rng = np.random.default_rng(7)
    w = qconv.quantize_weight(rng.standard_normal((13, 7, 3, 3)).astype(np.float32), bits, block, sym)
    return w, (rng.standard_normal(13) * 0.5).astype(np.float32)


@pytest.mark.parametrize("value", [1.5, -2.25, 3.7, 1e-30, -1e6, 2.0 ** -140])
@pytest.mark.parametrize("layout", ["nchw", "nc4hw4"])
def test_constant_input_matches_reference(qconv_device, value, layout):
    w, bias = _layer_case()
    x = np.full((2, 7, 6, 5), value, np.float32)
    for act_quant in _modes(qconv_device):
        for activation in (None, "relu"):
            layer = qconv.Conv2d(w, bias, padding=1, activation=activation, device=qconv_device, act_quant=act_quant)
            y = layer(x) if layout == "nchw" else P4.unpack_array(layer(P4.pack_array(x), "nc4hw4"), 13)
            assert_matches_reference(y, x, w, bias, padding=1, activation=activation, act_quant=act_quant)
            # padding taps meet the constant: border outputs differ from the interior (fewer taps)
            if abs(value) >= 1 and activation is None:
                assert not np.allclose(y[:, :, 0, 0], y[:, :, 2, 2])


@pytest.mark.parametrize("bits,sym,block", [(4, False, 0), (8, True, 0), (4, True, 1), (8, False, 1)])
def test_all_zero_input_gives_the_bias(qconv_device, bits, sym, block):
    """An all-zero input: every output is the bias exactly (an engine returning zeros fails)."""
    w, bias = _layer_case(bits, sym, block)
    x = np.zeros((1, 7, 4, 5), np.float32)
    for act_quant in _modes(qconv_device):
        for layout in ("nchw", "nc4hw4"):
            layer = qconv.Conv2d(w, bias, padding=1, device=qconv_device, act_quant=act_quant)
            y = layer(x) if layout == "nchw" else P4.unpack_array(layer(P4.pack_array(x), "nc4hw4"), 13)
            assert np.array_equal(y, np.broadcast_to(bias[None, :, None, None], y.shape)), (act_quant, layout)
            y6 = qconv.Conv2d(w, bias, padding=1, activation="relu6", device=qconv_device, act_quant=act_quant)(x)
            assert np.array_equal(y6, np.broadcast_to(np.clip(bias, 0, 6)[None, :, None, None], y.shape))
    # and a linear layer on one row (the GEMV paths)
    w1 = qconv.quantize_weight(np.random.default_rng(1).standard_normal((9, 40)).astype(np.float32), bits, 0, sym)
    b1 = np.linspace(-1, 1, 9).astype(np.float32)
    for act_quant in _modes(qconv_device):
        y = qconv.Linear(w1, b1, device=qconv_device, act_quant=act_quant)(np.zeros((1, 40), np.float32))
        assert np.array_equal(y, b1[None]), act_quant
