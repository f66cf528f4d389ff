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


def _drawn_case(data, device, variants, act_quant):
    """A drawn conv (odd channel counts: padding of the 32-channel steps and of the tiles; strides, padding,
    dilation, batches, int8/int4, per-channel and blockwise asymmetric scales) run by a forced conv_mma tile of
    ``variants`` in a drawn layout: ``(geo, weight, bias, act, x, y)``, or None when the weight's blocks are not
    a multiple of 32 channels (refused with that reason)."""
    pointwise = data.draw(st.booleans())
    geo = data.draw(conv_geometries(pointwise=pointwise, max_channels=70 if pointwise else 40,
                                    max_out_channels=40, max_spatial=9, max_kernel=3, max_batch=3))
    weight, bias, act = _draw_layer(data, geo)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    variant = data.draw(st.sampled_from(variants))
    x = data.draw(activations((geo.n, geo.c, geo.h, geo.w)))
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, act_quant)
    try:
        eng = gpu.OpenCLEngine(spec, device=device, tune="none", variant=variant)
    except ValueError as exc:
        assert weight.n_blocks > 1 and weight.block_channels % 32 and "multiple of 32" in str(exc)
        return None
    y = _forward(eng, x, layout)
    assert eng.plans[(layout, geo.n, geo.h, geo.w)].cand.program == "conv_mma"
    return geo, weight, bias, act, x, y


@settings(_PROP, max_examples=14)
@given(data=st.data())
def test_conv_mma_matches_reference(cl_device, data):
    """Every int8-activation tile against the oracle (see _drawn_case)."""
    case = _drawn_case(data, cl_device, sorted(gpu.MMA_VARIANTS), "row")
    if case is not None:
        geo, weight, bias, act, x, y = case
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


# {{{ float activations: x as three base-256 digits (mma_x3_*)

X3_VARIANTS = sorted(v for v in conv_mma.variants if v.startswith(conv_mma.SPLIT))


def _x3_tolerance(x, weight, bias, stride, padding, dilation, act):
    """The float kernels' tolerance plus what x's rounding to 22 bits of its sample's max |x| can move an output:
    |x - X 2^-sh| <= 2^-22 max |x_n|, times sum |w_deq| over the output channel's weights (times 1.5, the
    steepest slope of the activations drawn: hard-swish at 3)."""
    tol = qconv.testing.tolerance(x, weight, bias, stride, padding, dilation, None)
    amax = np.abs(x).reshape(x.shape[0], -1).max(axis=1).astype(np.float64)
    wsum = np.abs(weight.dequantize().astype(np.float64)).reshape(weight.out_channels, -1).sum(axis=1)
    return tol + 1.5 * 2.0 ** -22 * amax[:, None, None, None] * wsum[None, :, None, None]


def _x3_engine(weight, bias=None, stride=1, padding=0, dilation=1, activation=None, device=None, **opts):
    spec = ConvSpec(weight, bias, stride, padding, dilation, activation, None)
    opts.setdefault("tune", "none")
    return gpu.OpenCLEngine(spec, device=device, **opts)


@settings(_PROP, max_examples=10)
@given(data=st.data())
def test_conv_mma_x3_matches_float_reference(cl_device, data):
    """Float activations on the int8 tensor-core GEMM, every tile (see _drawn_case), against the float oracle
    within the float tolerance plus x's documented rounding."""
    case = _drawn_case(data, cl_device, X3_VARIANTS, None)
    if case is None:
        return
    geo, weight, bias, act, x, y = case
    ref = qconv.reference.conv2d(x, weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    tol = _x3_tolerance(x, weight, bias, geo.stride, geo.padding, geo.dilation, act)
    err = np.abs(y.astype(np.float64) - ref)
    assert (err <= tol).all(), f"{int((err > tol).sum())} outputs off; worst ratio {float((err / tol).max()):.3g}"


def test_quant_rows_digits_are_x_at_22_bits(cl_device):
    """The words conv_mma reads for float activations: X = rint(x 2^sh) (ties to even), max |x| 2^sh in
    [2^21, 2^22), as three signed base-256 digits in chunks 3c + d of NC4HW4(32) int8 (padding channels 0), and
    dx = 2^-sh; an all-zero sample gives X = 0, dx = 1."""
    import pyopencl as cl

    rng = np.random.default_rng(6)
    weight = _weight(rng, 8, 37, 1)
    x = rng.standard_normal((3, 37, 2, 3)).astype(np.float32)
    x[0, 0, 0, 0] = 1.0                                        # max |x| 1: sh = 21
    x[0, 1:3, 0, 0] = np.float32([3, 5]) * np.float32(2 ** -22)   # ties: 1.5 -> 2, 2.5 -> 2
    x[0] = np.clip(x[0], -1, 1)
    x[1] = 0
    x[2] *= 1e-30                                              # tiny: sh near its 126 bound
    for layout in ("nchw", "nc4hw4"):
        eng = _x3_engine(weight, device=cl_device, variant="mma_x3_32x64")
        _forward(eng, x, layout)
        state = eng.plans[(layout, 3, 2, 3)].cand.info["state"]
        xq_buf, dx_buf = state["scratch"][eng.queue.int_ptr][:2]
        words = np.empty(6 * 3 * 2 * 3 * 8, np.uint32)
        dx = np.empty(3, np.float32)
        cl.enqueue_copy(eng.queue, words, xq_buf)
        cl.enqueue_copy(eng.queue, dx, dx_buf)
        eng.queue.finish()
        amax = np.abs(x).reshape(3, -1).max(axis=1)
        sh = np.where(amax > 0, np.clip(22 - np.frexp(amax)[1], -126, 126), 0)
        X = np.rint(x.astype(np.float64) * np.exp2(sh)[:, None, None, None]).astype(np.int64)
        assert X[0, 1, 0, 0] == 2 and X[0, 2, 0, 0] == 2 and np.abs(X).max() <= 2 ** 22
        lo = (X + 128) % 256 - 128
        mid = ((X - lo) // 256 + 128) % 256 - 128
        hi = (X - lo - 256 * mid) // 65536
        digits = [hi, mid, lo]
        got = words.view(np.int8).reshape(2, 3, 3, 2, 3, 32)      # (chunk, digit, n, h, w, channel)
        for d in range(3):
            np.testing.assert_array_equal(got[:, d], NC4HW4(32).pack_array(digits[d].astype(np.int8)),
                                          err_msg=f"digit {d}, {layout}")
        np.testing.assert_array_equal(dx, np.exp2(-sh).astype(np.float32))


def test_conv_mma_x3_refusals_and_offers(cl_device, monkeypatch):
    """The float-activation tiles refuse int8 activations and weights whose three copies pass SPLIT_MAX_BYTES;
    the engine offers them (on devices with int8 mma.sync) for batches of SPLIT_MIN_BATCH samples or more, the
    int8 tiles with act_quant='row' only."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="act_quant=None"):
        _mma_engine(_weight(rng, 4, 32, 1), device=cl_device, variant="mma_x3_64x32")
    monkeypatch.setattr(conv_mma, "SPLIT_MAX_BYTES", 1000)
    with pytest.raises(ValueError, match="more than 1000"):
        _x3_engine(_weight(rng, 4, 32, 3), device=cl_device, variant="mma_x3_64x32")
    layer = SimpleNamespace(mma_native=True, act_row=False, tune="fast")
    assert conv_mma.names(layer, 25600, 1) == []
    assert conv_mma.names(layer, 8192, conv_mma.SPLIT_MIN_BATCH) == ["mma_x3_64x64", "mma_x3_64x32"]
    assert conv_mma.names(SimpleNamespace(mma_native=True, act_row=True, tune="none"), 8) == ["mma_64x32"]
    assert conv_mma.names(SimpleNamespace(mma_native=False, act_row=False, tune="full"), 8192, 32) == []

# }}}
