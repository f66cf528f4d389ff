"""gemv_mma: linear layers on one row with float activations on int8 tensor cores (x as the base-256 digits of
rint(x * 2^sh), exact integer sums, one rounding per layer or scale block).

The variant is forced, so it runs on every visible OpenCL device: PoCL in CI emulates each mma through local
memory (same fragments, layout, scale folding and epilogue; integer sums, so the same bits as the tensor
cores), the H200 run executes the PTX ``mma.sync``. The float-activation tolerance applies (``RTOL_FLOAT``).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qconv
from qconv import gpu
from qconv.testing import assert_matches_reference
from qconv.testing.strategies import activations, conv_geometries

from test_gpu_engine import _PROP, _draw_layer, _engine, _forward, _weight, cl_device  # noqa: F401


@settings(_PROP, max_examples=12)
@given(data=st.data())
def test_gemv_mma_matches_reference(cl_device, data):
    """Odd channel counts (padding of the 16-row tiles and of the 64/32-channel loads), both layouts,
    int8/int4, per-channel and blockwise scales (blocks that do not fit the loads are refused), bias and
    activations, one or two warps per work-group."""
    geo = data.draw(conv_geometries(pointwise=True, max_channels=200, max_out_channels=40, max_spatial=1,
                                    max_batch=1))
    # scale blocks the loads take: 16, 32 or a multiple of 64 channels (the others are refused, tested below)
    weight, bias, act = _draw_layer(data, geo, block_filter=lambda b: b in (16, 32) or b % 64 == 0)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    split = data.draw(st.sampled_from([None, 1, 2]))
    variant = data.draw(st.sampled_from(sorted(gpu.GEMV_MMA_VARIANTS)))
    x = data.draw(activations((1, geo.c, 1, 1)))
    lws = None if split is None else (32, split, 1)
    eng = _engine(weight, bias, activation=act, device=cl_device, image=False, variant=variant, local_size=lws)
    y = _forward(eng, x, layout)
    assert eng.plans[(layout, 1, 1, 1)].cand.program == "gemv_mma"
    assert_matches_reference(y, x, weight, bias, activation=act, act_quant=None)


SCHEMES = [(4, 0, True), (8, 0, False), (4, 32, False), (8, 32, True), (4, 128, True), (4, 128, False), (8, 16, False), (8, 64, True)]


@pytest.mark.parametrize("variant", sorted(gpu.GEMV_MMA_VARIANTS))
@pytest.mark.parametrize("bits,block,sym", SCHEMES)
def test_gemv_mma_many_tiles_and_ranges(cl_device, bits, block, sym, variant):
    """More 16-row tiles than work-groups, K over several warps and loads (blocks inside a load, loads
    inside a block), fp16 scales, and inputs whose range needs the 2^sh scaling: huge, tiny (down to
    subnormal) and mixed magnitudes; every variant (loads in flight, the next batch loaded ahead or not)."""
    rng = np.random.default_rng(bits + block)
    w = _weight(rng, 300, 512, 1, bits, block, sym)
    half = lambda a: None if a is None else a.astype(np.float16).astype(np.float32)  # noqa: E731
    w16 = qconv.QuantizedWeight(w.q, half(w.scales), half(w.offsets), bits, block)
    bias = rng.standard_normal(300).astype(np.float32)
    x = rng.standard_normal((1, 512, 1, 1)).astype(np.float32)
    for split in (1, 2):
        eng = _engine(w16, bias, device=cl_device, image=False, variant=variant, local_size=(32, split, 1))
        assert eng.scale_layout.dtype == "float16"
        for xs in (x, x * np.float32(1e30), x * np.float32(1e-30), x * np.float32(1e-39),
                   x * np.logspace(-6, 6, 512, dtype=np.float32).reshape(1, 512, 1, 1), np.zeros_like(x)):
            assert_matches_reference(eng.forward(xs), xs, w16, bias, act_quant=None)


def test_gemv_mma_candidates_and_errors(cl_device):
    rng = np.random.default_rng(3)
    w = _weight(rng, 20, 96, 1, 4, 32, False)
    eng = _engine(w, device=cl_device, image=False)
    names = [c.variant for c in eng._plan_for("nchw", 1, 1, 1)[0].cand]
    assert ("gemv_mma" in names) == eng.mma_native  # offered where the tensor cores run (NVIDIA sm_80+)
    forced = _engine(w, device=cl_device, image=False, variant="gemv_mma")
    with pytest.raises(ValueError, match="one row"):
        forced.forward(np.zeros((2, 96, 1, 1), np.float32))
    with pytest.raises(ValueError, match="scale blocks"):
        _engine(_weight(rng, 4, 96, 1, 4, 48, True), device=cl_device, image=False, variant="gemv_mma")
    for lws in ((16, 2, 1), (32, 64, 1)):  # not whole warps; over 1024 items
        with pytest.raises(ValueError, match="local_size"):
            _engine(w, device=cl_device, image=False, variant="gemv_mma", local_size=lws).forward(
                np.zeros((1, 96, 1, 1), np.float32))
    with pytest.raises(ValueError, match="variant"):
        gpu.OpenCLEngine(qconv.geometry.ConvSpec(w, act_quant="row"), device=cl_device, variant="gemv_mma")
    forced.forward(np.ones((1, 96, 1, 1), np.float32))
    assert "gemv_mma" in forced.describe()


def test_gemv_mma_non_finite_input_and_channel_limit(cl_device):
    """Any NaN or inf in x makes every output NaN (integer sums cannot carry them); layers past the int32
    sums' channel limit are refused (by that limit or, first, by the device's local memory)."""
    from qconv.gpu.families import gemv_mma

    rng = np.random.default_rng(5)
    w = _weight(rng, 24, 96, 1, 4, 0, True)
    eng = _engine(w, device=cl_device, image=False, variant="gemv_mma")
    x = rng.standard_normal((1, 96, 1, 1)).astype(np.float32)
    assert np.isfinite(eng.forward(x)).all()
    for bad in (np.nan, np.inf, -np.inf):
        xb = x.copy()
        xb[0, 50, 0, 0] = bad
        assert np.isnan(eng.forward(xb)).all()
    big = _weight(rng, 1, gemv_mma.MAX_CHANNELS + 64, 1, 4, 0, True)
    why = gemv_mma.unsupported(_engine(big, device=cl_device, image=False), None, "gemv_mma")
    assert why is not None and ("int32 sums" in why or "local memory" in why), why
