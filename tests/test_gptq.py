"""Calibrated (GPTQ) weight quantization: lower output error than round-to-nearest on held-out data."""
import numpy as np
import pytest

from qconv import quantize_weight, reference
from qconv.gptq import quantize_weight_calibrated
from qconv.testing import sqnr_db


def _correlated_inputs(rng, mix, n, hw):
    """Samples of one distribution: channels mixed by ``mix`` (so the Hessian is far from diagonal)."""
    c = mix.shape[0]
    base = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    return np.einsum("dc,nchw->ndhw", mix, base).astype(np.float32) + np.float32(0.3)


@pytest.mark.parametrize("bits,block,sym,groups,k", [(4, 8, False, 1, 3), (4, 0, True, 1, 1), (8, 0, True, 1, 3),
                                                     (4, 4, False, 2, 3)])
def test_gptq_beats_round_to_nearest_on_held_out_inputs(bits, block, sym, groups, k):
    """Same range rule (min/max per block), so the gain is the error feedback alone."""
    rng = np.random.default_rng(0)
    c, o = 16, 24
    w = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    mix = rng.standard_normal((c, c)).astype(np.float32) / np.sqrt(c)
    calib, held_out = _correlated_inputs(rng, mix, 4, 9), _correlated_inputs(rng, mix, 2, 9)
    pad = k // 2
    g = quantize_weight_calibrated(w, calib, bits, block, sym, groups, padding=pad)
    m = quantize_weight(w, bits, block, sym, groups)
    assert g.q.shape == w.shape and g.qmin <= g.q.min() and g.q.max() <= g.qmax and g.block_size == block
    yf = reference.float_conv2d(held_out, w, padding=pad, groups=groups)
    db_g = sqnr_db(reference.conv2d(held_out, g, padding=pad, act_quant=None), yf)
    db_m = sqnr_db(reference.conv2d(held_out, m, padding=pad, act_quant=None), yf)
    assert db_g > db_m + (0.5 if groups == 1 else 0.1), (db_g, db_m)


def test_gptq_linear_weights_and_bad_arguments():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 32)).astype(np.float32)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    qw = quantize_weight_calibrated(w, x, 4, 16)
    assert qw.q.shape == (8, 32, 1, 1) and qw.n_blocks == 2
    with pytest.raises(ValueError, match="block_size=5"):
        quantize_weight_calibrated(w, x, 4, 5)
    with pytest.raises(ValueError, match="channels"):
        quantize_weight_calibrated(w, x[:, :16], 4, 16)
    with pytest.raises(ValueError, match="range_method"):
        quantize_weight_calibrated(w, x, 4, 16, range_method="kmeans")


def test_gptq_stores_parameters_in_the_default_form():
    """GPTQ follows quantize_weight's stored form: float16 values by default (fixed before the codes and the
    error feedback), float32 on request or when a scale leaves the normal float16 range."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * np.float32(0.2)
    x = rng.standard_normal((2, 16, 6, 6)).astype(np.float32)
    for sym in (True, False):
        qw = quantize_weight_calibrated(w, x, bits=4, block_size=8, symmetric=sym, padding=1)
        assert qw.half_exact
        params = [qw.scales] + ([] if sym else [qw.offsets])
        for p in params:
            assert np.array_equal(p, p.astype(np.float16).astype(np.float32))
        assert not quantize_weight_calibrated(w, x, bits=4, block_size=8, symmetric=sym, padding=1,
                                              scale_dtype="float32").half_exact
    tiny = w * np.float32(1e-6)   # scales below 2^-14: the whole weight keeps float32, no error
    assert not quantize_weight_calibrated(tiny, x, bits=8, padding=1).half_exact
    with pytest.raises(ValueError, match="float16"):
        quantize_weight_calibrated(tiny, x, bits=8, padding=1, scale_dtype="float16")
