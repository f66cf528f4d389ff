"""conv_mma: ungrouped convs with ``act_quant="row"`` as an implicit GEMM on int8 tensor cores.

Every variant is forced, so it runs on every visible OpenCL device: PoCL in CI computes each mma fragment's
products from local memory (``dot32``), the H200 run executes the PTX ``mma.sync`` (same kernel, same
tiles, staging, scale folding and epilogue). Integer sums are exact, so outputs match the oracle to 1e-5.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qconv
from qconv import gpu
from qconv.geometry import ConvSpec
from qconv.gpu.families import Problem, conv_mma
from qconv.layouts import NC4HW4
from qconv.testing import assert_matches_reference
from qconv.testing.strategies import activations, conv_geometries

from test_gpu_engine import _PROP, _draw_layer, _forward, _weight, cl_device  # noqa: F401


def _mma_engine(weight, bias=None, stride=1, padding=0, dilation=1, activation=None, device=None, **opts):
    spec = ConvSpec(weight, bias, stride, padding, dilation, activation, "row")
    opts.setdefault("tune", "none")
    return gpu.OpenCLEngine(spec, device=device, **opts)


@pytest.mark.parametrize("layout", ["nchw", "nc4hw4"])
def test_conv_mma_quantizes_in_one_or_two_launches(cl_device, layout, monkeypatch):
    """Samples quantized by one work-group each (one launch) or after row_amax (two): the same bits."""
    from qconv.gpu.families import act_quant

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 37, 6, 5)).astype(np.float32)
    x[1] *= 50
    weight = _weight(rng, 20, 37, 3, 8, 0, True)
    ys = []
    for limit in (act_quant.ONE_GROUP_MAX, 0):
        monkeypatch.setattr(act_quant, "ONE_GROUP_MAX", limit)
        eng = _mma_engine(weight, None, 1, 1, 1, None, cl_device, variant="mma_64x32")
        ys.append(_forward(eng, x, layout))
        assert ("row_amax" in eng.describe()) == (limit == 0), eng.describe()
    assert np.array_equal(ys[0], ys[1])
    assert_matches_reference(ys[0], x, weight, None, 1, 1, 1, None, act_quant="row")


@settings(_PROP, max_examples=14)
@given(data=st.data())
def test_conv_mma_matches_reference(cl_device, data):
    """Every tile, both layouts, odd channel counts (padding of the 32-channel steps and of the tiles),
    strides, padding, dilation, batches, int8/int4, per-channel and blockwise (asymmetric) scales."""
    pointwise = data.draw(st.booleans())
    geo = data.draw(conv_geometries(pointwise=pointwise, max_channels=70 if pointwise else 40,
                                    max_out_channels=40, max_spatial=9, max_kernel=3, max_batch=3))
    weight, bias, act = _draw_layer(data, geo)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    variant = data.draw(st.sampled_from(sorted(gpu.MMA_VARIANTS)))
    x = data.draw(activations((geo.n, geo.c, geo.h, geo.w)))
    try:
        eng = _mma_engine(weight, bias, geo.stride, geo.padding, geo.dilation, act, cl_device, variant=variant)
    except ValueError as exc:
        assert weight.n_blocks > 1 and weight.block_channels % 32 and "multiple of 32" in str(exc)
        return
    y = _forward(eng, x, layout)
    assert eng.plans[(layout, geo.n, geo.h, geo.w)].cand.program == "conv_mma"
    assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, act_quant="row")


@pytest.mark.parametrize("bits,block,sym,k", [(8, 0, True, 3), (4, 32, False, 3), (4, 64, True, 3),
                                              (4, 32, False, 1), (8, 64, False, 1)])
def test_conv_mma_every_stage_depth(cl_device, bits, block, sym, k):
    """Several tiles both ways, several scale blocks and every KSUB the tuner may pick (layout steps per
    stage: blocks that end inside a stage, stages inside a block): a fold of the int32 sums at the wrong
    step, a wrong block's scale or offset sum, or a stale double buffer shows here."""
    import pyopencl.array as cla

    rng = np.random.default_rng(bits + block + k)
    weight = _weight(rng, 150, 192, k, bits, block, sym)
    bias = rng.standard_normal(150).astype(np.float32)
    x = rng.standard_normal((2, 192, 9, 8)).astype(np.float32)
    ref = qconv.reference.conv2d(x, weight, bias, 1, k // 2, act_quant="row")
    for variant in ("mma_64x64", "mma_128x128"):
        eng = _mma_engine(weight, bias, 1, k // 2, device=cl_device, variant=variant)
        xd = cla.to_device(eng.queue, x)
        yd = eng.forward(xd)
        plan = eng.plans[("nchw", 2, 9, 8)]
        ksubs = [ks for _, ks in conv_mma.candidates(eng, Problem("nchw", 2, 9, 8, 9, 8))[0].local_sizes]
        assert ksubs == conv_mma.ksubs(eng, variant)[:2] and len(conv_mma.ksubs(eng, variant)) >= (2 if k == 1 else 1)
        for lws in [(32 * np.prod(gpu.MMA_VARIANTS[variant][:2]), ks) for ks in conv_mma.ksubs(eng, variant)]:
            yd.fill(np.float32(np.nan))
            plan.cand.launch(eng.queue, lws, (xd.base_data, yd.base_data)).wait()
            np.testing.assert_allclose(yd.get(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=str(lws))


def test_quant_rows_i8_is_the_oracles_quantization(cl_device):
    """The int8 words conv_mma reads are reference.quantize_activation(x, "row") in NC4HW4(32) (padding
    channels 0), with dx per sample; ties round away from zero, an all-zero sample gives dx = 1."""
    import pyopencl as cl

    rng = np.random.default_rng(5)
    weight = _weight(rng, 8, 37, 1)
    x = (rng.integers(-40, 41, (3, 37, 2, 3)) / 8).astype(np.float32)  # many ties at 127/amax steps
    x[1] = 0
    for layout in ("nchw", "nc4hw4"):
        eng = _mma_engine(weight, device=cl_device, variant="mma_32x64")
        _forward(eng, x, layout)
        state = eng.plans[(layout, 3, 2, 3)].cand.info["state"]
        xq_buf, dx_buf = state["scratch"][eng.queue.int_ptr][:2]  # (+ row_amax's partials for large samples)
        words = np.empty(2 * 3 * 2 * 3 * 8, np.uint32)
        dx = np.empty(3, np.float32)
        cl.enqueue_copy(eng.queue, words, xq_buf)
        cl.enqueue_copy(eng.queue, dx, dx_buf)
        eng.queue.finish()
        aq = qconv.reference.quantize_activation(x, "row")
        np.testing.assert_array_equal(words.view(np.int8).reshape(2, 3, 2, 3, 32), NC4HW4(32).pack_array(aq.xq))
        np.testing.assert_array_equal(dx, aq.scale)


def test_conv_mma_refuses_what_it_cannot_run(cl_device):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="multiple of 32"):
        _mma_engine(_weight(rng, 4, 32, 1, 4, 16, True), device=cl_device, variant="mma_64x64")
    with pytest.raises(ValueError, match="ungrouped"):
        _mma_engine(_weight(rng, 4, 8, 3, groups=2), device=cl_device, variant="mma_64x64")
    with pytest.raises(ValueError, match="act_quant='row'"):  # float activations: no int8 operands
        spec = ConvSpec(_weight(rng, 4, 8, 1), None, 1, 0, 1, None, None)
        gpu.OpenCLEngine(spec, device=cl_device, variant="mma_64x64")
    with pytest.raises(ValueError, match="fixed local size"):
        _mma_engine(_weight(rng, 4, 8, 1), device=cl_device, variant="mma_64x64", local_size=(4, 4, 1))
