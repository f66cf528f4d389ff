"""OpenCL engine (qconv/gpu): output equals the oracle (act_quant=None) to 1e-4 over the property space,
every kernel variant, both layouts, numpy and pyopencl.array inputs, padding lanes, fallbacks.

Runs on every visible OpenCL device (PoCL in CI) with ``tune="none"`` (the tuning test is
``test_gpu_tuning.py``); skipped with a reason when no device is visible.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qconv
from qconv import gpu
from qconv.geometry import ConvSpec
from qconv.layouts import NC4HW4
from qconv.testing import assert_matches_reference
from qconv.testing.strategies import activations, conv_geometries, quantized_weights

DEVICES = gpu.devices()
NO_DEVICE = "no OpenCL device is visible (install one, e.g. `apt-get install pocl-opencl-icd`)"
P4 = NC4HW4(4)


@pytest.fixture(scope="module", params=DEVICES or [None])
def cl_device(request):
    if request.param is None:
        pytest.skip(NO_DEVICE)
    return request.param


def _engine(weight, bias=None, stride=1, padding=0, dilation=1, activation=None, device=None, **opts):
    spec = ConvSpec(weight, bias, stride, padding, dilation, activation, None)
    opts.setdefault("tune", "none")
    return gpu.OpenCLEngine(spec, device=device, **opts)


def _forward(engine, x, layout):
    """Run in ``layout``; return NCHW numpy."""
    if layout == "nchw":
        return engine.forward(x, "nchw")
    y = engine.forward(P4.pack_array(x), "nc4hw4")
    assert y.shape == P4.packed_shape((x.shape[0], engine.spec.out_channels, y.shape[2], y.shape[3]))
    if engine.spec.out_channels % 4:
        assert not y[-1, ..., engine.spec.out_channels % 4:].any(), "padding lanes must be written as 0"
    return P4.unpack_array(y, engine.spec.out_channels)


def _weight(rng, o, i, k, bits=8, block=0, sym=True, groups=1, scale_dtype="auto"):
    w = rng.standard_normal((o, i // groups) + ((k, k) if isinstance(k, int) else tuple(k))).astype(np.float32)
    return qconv.quantize_weight(w, bits=bits, block_size=block, symmetric=sym, groups=groups, scale_dtype=scale_dtype)


_PROP = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# {{{ property tests


def _draw_layer(data, geo, **weight_opts):
    """A quantized weight for ``geo`` (``weight_opts``: of ``quantized_weights``), an optional bias and an
    activation (hypothesis draws)."""
    weight = data.draw(quantized_weights(geo, **weight_opts))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    bias = rng.standard_normal(geo.o).astype(np.float32) if data.draw(st.booleans()) else None
    return weight, bias, data.draw(st.sampled_from([None, "relu", "relu6", "hardswish", "silu"]))


@_PROP
@given(data=st.data())
def test_general_matches_reference(cl_device, data):
    geo = data.draw(conv_geometries(groups=True, max_channels=20, max_out_channels=20, max_spatial=10))
    weight, bias, act = _draw_layer(data, geo)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    variant = data.draw(st.sampled_from([None] + list(gpu.GENERAL_VARIANTS)))
    x = data.draw(activations((geo.n, geo.c, geo.h, geo.w)))
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    if spec.is_pointwise and geo.groups == 1:
        variant = None
    eng = gpu.OpenCLEngine(spec, device=cl_device, tune="none", variant=variant)
    y = _forward(eng, x, layout)
    assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, act_quant=None)


@_PROP
@given(data=st.data())
def test_1x1_matches_reference(cl_device, data):
    """GEMV/GEMM kernels: every variant, split-K local sizes, images, H = W = 1 and batches."""
    geo = data.draw(conv_geometries(pointwise=True, max_channels=80, max_out_channels=20, max_spatial=3,
                                    max_batch=5))
    weight, bias, act = _draw_layer(data, geo)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    image = data.draw(st.booleans())
    variants = gpu.onex1_variants(image)
    variant = data.draw(st.sampled_from(sorted(variants)))
    lws = data.draw(st.sampled_from([None, (1, 2, 1), (2, 4, 1), (4, 1, 1), (1, 8, 1)]))
    x = data.draw(activations((geo.n, geo.c, geo.h, geo.w)))
    spec = ConvSpec(weight, bias, 1, 0, 1, act, None)
    eng = gpu.OpenCLEngine(spec, device=cl_device, tune="none", image=image, variant=variant, local_size=lws)
    assert eng.forced_variant[3:] == variant[3:]  # an image variant falls back to its buffer twin
    y = _forward(eng, x, layout)
    assert_matches_reference(y, x, weight, bias, act_quant=None, activation=act)


@settings(_PROP, max_examples=12)
@given(data=st.data())
def test_gemm_matches_reference(cl_device, data):
    """The tiled GEMM (both weight layouts): odd channel counts, strides, padding, dilation, blocks."""
    pointwise = data.draw(st.booleans())
    geo = data.draw(conv_geometries(pointwise=pointwise, max_channels=40 if pointwise else 14,
                                    max_out_channels=70, max_spatial=9, max_kernel=3, max_batch=3))
    weight, bias, act = _draw_layer(data, geo)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    variant = data.draw(st.sampled_from(sorted(gpu.GEMM_VARIANTS)))
    x = data.draw(activations((geo.n, geo.c, geo.h, geo.w)))
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    try:
        eng = gpu.OpenCLEngine(spec, device=cl_device, tune="none", variant=variant, image=False)
    except ValueError as exc:  # split-K sums do not fit the K tiles of a small kernel: an unsplit tile
        assert "do not fit" in str(exc)
        variant = data.draw(st.sampled_from(sorted(v for v, t in gpu.GEMM_VARIANTS.items() if t[4] == 1)))
        eng = gpu.OpenCLEngine(spec, device=cl_device, tune="none", variant=variant, image=False)
    y = _forward(eng, x, layout)
    assert eng.plans[(layout, geo.n, geo.h, geo.w)].cand.program == "conv_gemm"
    assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, act_quant=None)


def _image_ok(device):
    _, dev = gpu.resolve(device)
    return bool(dev.image_support)

# }}}


# {{{ variants and paths

@pytest.mark.parametrize("variant", list(gpu.GENERAL_VARIANTS))
@pytest.mark.parametrize("bits,block,sym", [(8, 0, False), (4, 4, True), (4, 3, False)])
def test_every_general_variant(cl_device, variant, bits, block, sym):
    rng = np.random.default_rng(11)
    w = _weight(rng, 13, 12, (3, 2), bits, block, sym)
    b = rng.standard_normal(13).astype(np.float32)
    x = rng.standard_normal((2, 12, 11, 9)).astype(np.float32)
    eng = _engine(w, b, (2, 1), (1, 2), (2, 1), "relu6", cl_device, variant=variant)
    for layout in ("nchw", "nc4hw4"):
        assert_matches_reference(_forward(eng, x, layout), x, w, b, (2, 1), (1, 2), (2, 1), "relu6",
                                 act_quant=None)
    assert eng.plans[("nchw", 2, 11, 9)].variant == variant


@pytest.mark.parametrize("variant,lws", [("c4h1w1", (4, 2, 4)), ("c8h1w4", (2, 2, 8)), ("c8h2w4", (1, 1, 3))])
@pytest.mark.parametrize("bits,block,sym", [(8, 0, False), (4, 8, False), (4, 3, True), (4, 0, True)])
def test_general_split_k(cl_device, variant, lws, bits, block, sym):
    """Split-K over input channels (local size (l0, l1, SPLIT)): ranges aligned to scale blocks, empty
    ranges for the last lanes, launch padding in dims 0/1, grouped convs."""
    rng = np.random.default_rng(17)
    for groups, o, i in ((1, 13, 24), (2, 8, 24)):
        w = _weight(rng, o, i, (3, 3), bits, block if 12 % max(block, 1) == 0 or groups == 1 else 4, sym,
                    groups=groups)
        b = rng.standard_normal(o).astype(np.float32)
        x = rng.standard_normal((2, i, 7, 6)).astype(np.float32)
        eng = _engine(w, b, 1, 1, 1, "relu", cl_device, variant=variant, local_size=lws)
        for layout in ("nchw", "nc4hw4"):
            assert_matches_reference(_forward(eng, x, layout), x, w, b, 1, 1, 1, "relu", act_quant=None)


@pytest.mark.parametrize("variant", list(gpu.GEMM_VARIANTS))
def test_every_gemm_variant(cl_device, variant):
    """Both weight layouts, tiles larger than the problem, K tiles past I, fewer K tiles than split-K slices."""
    rng = np.random.default_rng(19)
    cases = [((13, 10, 3), (2, 1), (1, 2), (2, 1), (2, 10, 11, 9), (4, 5, False), "nc4hw4"),
             ((9, 70, 1), 1, 0, 1, (11, 70, 1, 1), (8, 35, False), "nchw")]
    for (o, i, k), s, p, d, xshape, (bits, block, sym), layout in cases:
        w = _weight(rng, o, i, k, bits, block, sym)
        b = rng.standard_normal(o).astype(np.float32)
        x = rng.standard_normal(xshape).astype(np.float32)
        eng = _engine(w, b, s, p, d, "relu6", cl_device, variant=variant, image=False)
        assert_matches_reference(_forward(eng, x, layout), x, w, b, s, p, d, "relu6", act_quant=None)
        assert eng.plans[(layout,) + xshape[:1] + xshape[2:]].variant == variant


def test_gemm_candidates(cl_device):
    """Batched ungrouped problems get GEMM candidates; grouped convs and ic_pack=1 cannot use it."""
    rng = np.random.default_rng(20)
    w = _weight(rng, 16, 8, 3, 4, 0, False)
    eng = _engine(w, None, 1, 1, 1, None, cl_device, tune="fast")
    names = [c.variant for c in eng._plan_for("nchw", 2, 8, 8)[0].cand]
    assert sum(v in gpu.GEMM_VARIANTS for v in names) == 2 and len(names) == 5
    with pytest.raises(ValueError, match="do not fit"):  # a strided 1x1 conv: K tiles of 4, too small
        _engine(_weight(rng, 16, 8, 1), None, 2, device=cl_device, variant="gemm_128x32k2")
    assert not any(c.variant in gpu.GEMM_VARIANTS for c in eng._plan_for("nchw", 1, 2, 2)[0].cand)
    with pytest.raises(ValueError, match="ungrouped"):
        _engine(_weight(rng, 4, 4, 3, groups=2), device=cl_device, variant="gemm_64x64")
    with pytest.raises(ValueError, match="ungrouped"):
        _engine(w, device=cl_device, variant="gemm_64x64", ic_pack=1)
    with pytest.raises(ValueError, match="fixed local size"):
        _engine(w, device=cl_device, variant="gemm_64x64", local_size=(4, 4))


@pytest.mark.parametrize("groups,o,i", [(3, 6, 9), (5, 5, 5), (4, 8, 4), (2, 10, 14)])
def test_groups_and_depthwise(cl_device, groups, o, i):
    rng = np.random.default_rng(groups)
    w = _weight(rng, o, i, 3, 4, 0, False, groups)
    x = rng.standard_normal((2, i, 7, 6)).astype(np.float32)
    eng = _engine(w, None, 1, 1, 1, None, cl_device)
    for layout in ("nchw", "nc4hw4"):
        assert_matches_reference(_forward(eng, x, layout), x, w, None, 1, 1, 1, act_quant=None)


@pytest.mark.parametrize("k", [(1, 3), (3, 3)])
def test_ic_pack_1_mnn_layout(cl_device, k):
    rng = np.random.default_rng(2)
    w = _weight(rng, 7, 10, k, 4, 5, False)
    x = rng.standard_normal((1, 10, 6, 6)).astype(np.float32)
    pad = k[0] // 2
    eng = _engine(w, None, 1, pad, 1, None, cl_device, ic_pack=1, variant="c8h2w1")
    assert_matches_reference(eng.forward(x), x, w, None, 1, pad, 1, act_quant=None)


@settings(_PROP, max_examples=10)
@given(data=st.data())
def test_gemv_kernel_matches_reference(cl_device, data):
    """gemv_1x1 (one row): every U, split-K local sizes, both layouts, odd channel counts, all schemes."""
    geo = data.draw(conv_geometries(pointwise=True, max_channels=72, max_out_channels=13, max_spatial=1,
                                    max_batch=1))
    weight, bias, act = _draw_layer(data, geo, block_filter=lambda b: b % 4 == 0)  # others: test_gemv_candidates
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    variant = data.draw(st.sampled_from(sorted(gpu.GEMV_VARIANTS)))
    lws = data.draw(st.sampled_from([None, (1, 2, 1), (4, 4, 1), (8, 1, 1), (2, 8, 1)]))
    x = data.draw(activations((1, geo.c, 1, 1)))
    spec = ConvSpec(weight, bias, 1, 0, 1, act, None)
    eng = gpu.OpenCLEngine(spec, device=cl_device, tune="none", image=False, variant=variant, local_size=lws)
    y = _forward(eng, x, layout)
    assert eng.plans[(layout, 1, 1, 1)].variant == variant
    assert_matches_reference(y, x, weight, bias, act_quant=None, activation=act)


def test_gemv_candidates(cl_device):
    """gemv_1x1 is offered for one row on buffer weights only; forced, other shapes are refused."""
    rng = np.random.default_rng(3)
    w = _weight(rng, 12, 64, 1, 4, 32, False)
    eng = _engine(w, device=cl_device, image=False)
    assert "gemv_u4" in {c.variant for c in eng._plan_for("nchw", 1, 1, 1)[0].cand}
    assert not any(c.variant in gpu.GEMV_VARIANTS for c in eng._plan_for("nchw", 2, 1, 1)[0].cand)
    assert not any(c.variant in gpu.GEMV_VARIANTS for c in eng._plan_for("nchw", 1, 2, 1)[0].cand)
    forced = _engine(w, device=cl_device, image=False, variant="gemv_u8")
    with pytest.raises(ValueError, match="one row"):  # it computes one row only
        forced.forward(rng.standard_normal((3, 64, 1, 1)).astype(np.float32))
    if _engine(w, device=cl_device, image=True).image:
        with pytest.raises(ValueError, match="buffer"):
            _engine(w, device=cl_device, image=True, variant="gemv_u4")
    with pytest.raises(ValueError, match="multiple of 4"):
        _engine(_weight(rng, 4, 12, 1, 8, 6, True), device=cl_device, variant="gemv_u4")


@pytest.mark.parametrize("bits,block,sym", [(8, 0, True), (4, 32, False), (4, 0, True), (8, 64, False)])
def test_gemv_long_k_split(cl_device, bits, block, sym):
    """A linear layer 1000+ wide: many K chunks, split over the work-group."""
    rng = np.random.default_rng(7)
    w = _weight(rng, 37, 1024, 1, bits, block, sym)
    for n in (1, 3):
        x = rng.standard_normal((n, 1024, 1, 1)).astype(np.float32)
        for lws in ((4, 16, 1), (1, 32, 1)):
            eng = _engine(w, None, device=cl_device, variant="buf_c4_r2", local_size=lws)
            assert_matches_reference(eng.forward(x), x, w, act_quant=None)
    x = rng.standard_normal((1, 1024, 1, 1)).astype(np.float32)
    for variant, lws in (("gemv_u8", (4, 16, 1)), ("gemv_u4", (8, 4, 1))):
        eng = _engine(w, None, device=cl_device, variant=variant, local_size=lws, image=False)
        assert_matches_reference(eng.forward(x), x, w, act_quant=None)


def test_image_fallback_to_buffer(cl_device):
    if not _image_ok(cl_device):
        pytest.skip("device has no image support")
    rng = np.random.default_rng(8)
    w = _weight(rng, 9, 40, 1, 4, 0, False)
    x = rng.standard_normal((2, 40, 2, 3)).astype(np.float32)
    big = _engine(w, device=cl_device, image=True, image_limits=(12, 2))  # 2 texel rows of 32 int4 fit
    small = _engine(w, device=cl_device, image=True, image_limits=(8, 2))  # width 12 > 8: buffer
    assert big.image and not small.image
    forced = _engine(w, device=cl_device, image=True, image_limits=(8, 2), variant="img_c2_r1")
    assert not forced.image and forced.forced_variant == "buf_c2_r1"
    assert "image" in big.describe() and "buffer" in small.describe()
    for eng in (big, small):
        assert_matches_reference(eng.forward(x), x, w, act_quant=None)


def test_fp16_scales(cl_device):
    rng = np.random.default_rng(9)
    w = _weight(rng, 11, 24, 3, 4, 8, False, scale_dtype="float32")
    x = rng.standard_normal((1, 24, 5, 5)).astype(np.float32)
    # scales exactly representable in fp16 -> "auto" stores them as fp16, results stay exact
    w16 = qconv.QuantizedWeight(w.q, w.scales.astype(np.float16).astype(np.float32),
                                w.offsets.astype(np.float16).astype(np.float32), 4, 8)
    eng = _engine(w16, None, 1, 1, 1, None, cl_device)
    assert eng.scale_layout.dtype == "float16"
    assert_matches_reference(eng.forward(x), x, w16, None, 1, 1, act_quant=None)
    assert _engine(w, None, 1, 1, 1, None, cl_device).scale_layout.dtype == "float32"
    # forced fp16 of inexact scales: rounding of the scales only (relative 2**-11)
    forced = _engine(w, None, 1, 1, 1, None, cl_device, scale_dtype="float16")
    assert_matches_reference(forced.forward(x), x, w, None, 1, 1, act_quant=None, rtol=2e-3)
    w1 = _weight(rng, 6, 64, 1, 8, 16, False)
    w1 = qconv.QuantizedWeight(w1.q, w1.scales.astype(np.float16).astype(np.float32),
                               w1.offsets.astype(np.float16).astype(np.float32), 8, 16)
    x1 = rng.standard_normal((3, 64, 1, 1)).astype(np.float32)
    assert_matches_reference(_engine(w1, device=cl_device).forward(x1), x1, w1, act_quant=None)


def test_specialized_geometry(cl_device):
    rng = np.random.default_rng(10)
    for k, s, p, d, o, i in [(3, 1, 1, 1, 10, 7), (5, 2, 2, 2, 4, 4), (1, 1, 0, 1, 9, 33)]:
        w = _weight(rng, o, i, k, 4, 0, False)
        x = rng.standard_normal((2, i, 9, 8)).astype(np.float32)
        eng = _engine(w, None, s, p, d, "relu", cl_device, specialize=True)
        assert any(opt.startswith("-DG_IC") for opt in eng.base_options)
        assert_matches_reference(eng.forward(x), x, w, None, s, p, d, "relu", act_quant=None)

# }}}


# {{{ padding lanes, NaN, layouts

def test_garbage_in_input_padding_lanes_is_ignored(cl_device):
    """NC4HW4 padding lanes of the input are masked in the kernels (even NaN there changes nothing)."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 5, 6, 6)).astype(np.float32)
    for w, pad, groups in [(_weight(rng, 6, 5, 3, 8, 0, False), 1, 1), (_weight(rng, 7, 5, 1, 4, 0, False), 0, 1),
                           (_weight(rng, 5, 5, 3, 4, 0, False, 5), 1, 5)]:
        eng = _engine(w, None, 1, pad, 1, None, cl_device)
        xp = P4.pack_array(x)
        xp[-1, ..., 1:] = np.nan
        y = eng.forward(xp, "nc4hw4")
        assert np.isfinite(y).all()
        assert not y[-1, ..., w.out_channels % 4 or 4:].any()
        assert_matches_reference(P4.unpack_array(y, w.out_channels), x, w, None, 1, pad, act_quant=None)


def test_chained_convs_with_odd_channels_on_device(cl_device):
    """O % 4 != 0 through two convs in NC4HW4 without leaving the device: no NaN creeps in (seed defect 3)."""
    import pyopencl.array as cla

    rng = np.random.default_rng(13)
    w1, w2 = _weight(rng, 5, 3, 3, 4, 0, False), _weight(rng, 6, 5, 1, 8, 0, False)
    e1, e2 = _engine(w1, None, 1, 1, 1, "relu", cl_device), _engine(w2, device=cl_device)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    xd = cla.to_device(e1.queue, P4.pack_array(x))
    yd = e2.forward(e1.forward(xd, "nc4hw4"), "nc4hw4")
    assert isinstance(yd, cla.Array)
    mid = qconv.reference.conv2d(x, w1, None, 1, 1, 1, "relu", act_quant=None)
    assert_matches_reference(P4.unpack_array(yd.get(), 6), mid, w2, act_quant=None)


def test_pyopencl_array_in_and_out(cl_device):
    import pyopencl as cl
    import pyopencl.array as cla

    rng = np.random.default_rng(14)
    w = _weight(rng, 9, 6, 3, 8, 3, True)
    eng = _engine(w, None, 1, 1, 1, None, cl_device)
    x = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    queue = cl.CommandQueue(eng.ctx)  # a queue of the caller's, without profiling
    xd = cla.to_device(queue, x)
    yd = eng.forward(xd, "nchw")
    assert isinstance(yd, cla.Array) and yd.queue is queue and yd.shape == (2, 9, 5, 5)
    assert_matches_reference(yd.get(), x, w, None, 1, 1, act_quant=None)
    # an array with an offset into its buffer (a slice of a batch)
    big = cla.to_device(queue, np.concatenate([x, x]))
    part = big[2:]
    assert part.offset
    assert_matches_reference(eng.forward(part, "nchw").get(), x, w, None, 1, 1, act_quant=None)
    # the public layer passes arrays straight through
    layer = qconv.Conv2d(w, padding=1, device=cl_device, tune="none")
    out = layer(cla.to_device(queue, x))
    assert isinstance(out, cla.Array)
    assert_matches_reference(out.get(), x, w, None, 1, 1, act_quant=None)


def test_array_validation(cl_device):
    import pyopencl as cl
    import pyopencl.array as cla

    rng = np.random.default_rng(15)
    w = _weight(rng, 4, 6, 3)
    eng = _engine(w, None, 1, 1, 1, None, cl_device)
    q = eng.queue
    with pytest.raises(TypeError, match="float32"):
        eng.forward(cla.zeros(q, (1, 6, 4, 4), np.float64))
    with pytest.raises(ValueError, match="NCHW"):
        eng.forward(cla.zeros(q, (1, 5, 4, 4), np.float32))
    with pytest.raises(ValueError, match="NC4HW4"):
        eng.forward(cla.zeros(q, (1, 1, 4, 4, 4), np.float32), "nc4hw4")
    with pytest.raises(ValueError, match="contiguous"):
        eng.forward(cla.zeros(q, (1, 6, 4, 8), np.float32)[:, :, :, ::2])
    other = cl.Context([eng.device])
    with pytest.raises(ValueError, match="context"):
        eng.forward(cla.zeros(cl.CommandQueue(other), (1, 6, 4, 4), np.float32))
    with pytest.raises(TypeError, match="float32"):
        eng.forward(np.zeros((1, 6, 4, 4)))
    with pytest.raises(ValueError, match="layout"):
        eng.forward(np.zeros((1, 6, 4, 4), np.float32), "nhwc")
    plan = next(iter(eng.plans.values()), None) or eng._plan_for("nchw", 1, 4, 4)[0]
    with pytest.raises(ValueError, match="input buffer"):
        eng._check_buffers(plan, 4, 1 << 30)
    with pytest.raises(ValueError, match="output buffer"):
        eng._check_buffers(plan, 1 << 30, 4)


def test_bad_options(cl_device):
    rng = np.random.default_rng(16)
    w = _weight(rng, 4, 6, 3)
    with pytest.raises(ValueError, match="act_quant"):
        gpu.OpenCLEngine(ConvSpec(w, act_quant="tensor"), device=cl_device)
    with pytest.raises(ValueError, match="variant"):
        _engine(w, device=cl_device, variant="c16h1w1")
    with pytest.raises(ValueError, match="local_size"):
        _engine(w, device=cl_device, local_size=(4,))
    with pytest.raises(ValueError, match="tuning level"):
        _engine(w, device=cl_device, tune="maximal")
    w1 = _weight(rng, 4, 6, 1)
    with pytest.raises(ValueError, match="image"):
        _engine(w1, device=cl_device, image=False, variant="img_c1_r1")


def test_driver_errors_carry_the_opencl_name(cl_device):
    rng = np.random.default_rng(17)
    w = _weight(rng, 4, 6, 3)
    _, dev = gpu.resolve(cl_device)
    too_big = (dev.max_work_group_size, 2)
    eng = _engine(w, None, 1, 1, 1, None, cl_device, variant="c4h1w1", local_size=too_big)
    with pytest.raises(gpu.OpenCLError) as err:
        eng.forward(np.zeros((1, 6, 4, 4), np.float32))
    assert err.value.name == "INVALID_WORK_GROUP_SIZE"
    assert "INVALID_WORK_GROUP_SIZE" in str(err.value)


def test_describe_names_the_kernel(cl_device):
    rng = np.random.default_rng(18)
    w = _weight(rng, 4, 6, 3)
    eng = _engine(w, None, 1, 1, 1, None, cl_device, variant="c4h4w1")
    assert "tuned at the first call" in eng.describe()
    eng.forward(np.zeros((1, 6, 8, 8), np.float32))
    assert "c4h4w1" in eng.describe() and "general int8" in eng.describe()

# }}}

# vim: foldmethod=marker
