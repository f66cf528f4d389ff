"""The CPU engine's direct float-activation path (qconv._ext._direct: act_quant=None, one group or groups of a
multiple of 4 output channels) against the
oracle over the property space (kernel sizes, strides, padding, dilation, odd channel counts, int8 / int4, blocks,
both layouts, batches), bitwise across thread counts, its Winograd F(2x2, 3x3) for 3x3 stride-1 layers, and its
hand-over to the GEMM for small outputs."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._direct")

import qconv  # noqa: E402
from qconv._ext import _cpu, _direct  # noqa: E402
from qconv.cpu import KERNEL_NAMES, CpuEngine  # noqa: E402
from qconv.cpu.engine import DIRECT_MIN_PIXELS  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts.nc4hw4 import NC4HW4  # noqa: E402
from qconv.testing import assert_matches_reference, strategies as qst  # noqa: E402

KERNELS = [k for k in KERNEL_NAMES if _cpu.kernel_supported(k)]
P4 = NC4HW4(4)
pytestmark = pytest.mark.usefixtures("threaded_paths")


@st.composite
def direct_cases(draw):
    """A one-group conv whose output has at least one full strip of pixels per sample."""
    geo = draw(qst.conv_geometries(max_channels=20, max_out_channels=21, max_spatial=20, max_stride=3))
    oh = (geo.h + 2 * geo.padding[0] - geo.dilation[0] * (geo.kernel[0] - 1) - 1) // geo.stride[0] + 1
    ow = (geo.w + 2 * geo.padding[1] - geo.dilation[1] * (geo.kernel[1] - 1) - 1) // geo.stride[1] + 1
    if oh * ow < DIRECT_MIN_PIXELS:   # hypothesis would reject too many draws: widen instead
        geo = dataclasses.replace(geo, h=geo.h + 8 * geo.stride[0], w=geo.w + 8 * geo.stride[1])
    weight = draw(qst.quantized_weights(geo))
    x = draw(qst.activations((geo.n, geo.c, geo.h, geo.w)))
    bias = np.random.default_rng(draw(st.integers(0, 99))).standard_normal(geo.o).astype(np.float32)
    return geo, weight, x, bias if draw(st.booleans()) else None, draw(st.sampled_from([None, "relu", "relu6",
                                                                                         "hardswish", "silu"]))


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=40)
@given(case=direct_cases(), nc4hw4=st.booleans())
def test_direct_matches_reference_bitwise_over_threads(kernel, case, nc4hw4):
    geo, weight, x, bias, act = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    one = CpuEngine(spec, kernel=kernel, threads=1)
    assert one.path == "direct"
    xin = P4.pack_array(x) if nc4hw4 else x
    if nc4hw4 and geo.c % 4:
        xin[-1, ..., geo.c % 4:] = np.nan   # padding lanes are ignored
    layout = "nc4hw4" if nc4hw4 else "nchw"
    y1 = one.forward(xin, layout)
    assert one.last_call["split"] == "strips"
    y = P4.unpack_array(y1, geo.o) if nc4hw4 else y1
    assert_matches_reference(y, x, weight, bias, **geo.conv_kwargs(), activation=act, act_quant=None)
    for threads in (2, 3):
        yt = CpuEngine(spec, kernel=kernel, threads=threads).forward(xin, layout)
        assert np.array_equal(yt.view(np.uint32), y1.view(np.uint32))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("c,h,w,bits", [(5, 32, 32, 8), (100, 33, 41, 4), (200, 40, 26, 8), (1100, 7, 9, 8)])
def test_direct_in_place_on_large_planes(kernel, c, h, w, bits):
    """1x1 stride-1 convs read in place (each item's rows gathered to one block first: a bug there shows on
    large planes), one chunk of all input channels (c <= QC_DIRECT_KC_IN_PLACE) or chunks of 96 (1100) and a last
    partial strip: the oracle, bitwise over thread counts."""
    rng = np.random.default_rng(c)
    weight = qconv.quantize_weight(rng.standard_normal((13, c, 1, 1)).astype(np.float32), bits=bits)
    bias = rng.standard_normal(13).astype(np.float32)
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    spec = ConvSpec(weight, bias, 1, 0, activation="relu", act_quant=None)
    y1 = CpuEngine(spec, kernel=kernel, threads=1).forward(x)
    assert_matches_reference(y1, x, weight, bias, 1, 0, activation="relu", act_quant=None)
    y2 = CpuEngine(spec, kernel=kernel, threads=2).forward(x)
    assert np.array_equal(y2.view(np.uint32), y1.view(np.uint32))


AVX512 = [k for k in KERNELS if k in _direct.AVX512_KERNELS]


@pytest.mark.skipif(not AVX512, reason="this CPU has no AVX-512 micro-kernel (its avx2 results are checked above)")
@settings(max_examples=40)
@given(case=direct_cases(), nc4hw4=st.booleans(), in_place=st.sampled_from([0, 5, 1100]))
def test_avx512_micro_kernel_equals_avx2_bitwise(case, nc4hw4, in_place):
    """The AVX-512 micro-kernel (8 channels x 32 pixels, two weight blocks a call, one for an odd last block) runs
    every output's FMA chain over k in the AVX2 kernel's order: the same bits, in both layouts, on strided and padded
    layers and on in-place 1x1 layers (one chunk of k, and chunks of 96 for 1100 input channels)."""
    geo, weight, x, bias, act = case
    if in_place:
        rng = np.random.default_rng(in_place)
        o = geo.o
        weight = qconv.quantize_weight(rng.standard_normal((o, in_place, 1, 1)).astype(np.float32), bits=weight.bits)
        x = rng.standard_normal((geo.n, in_place, 9, 11)).astype(np.float32)
        spec = ConvSpec(weight, bias, 1, 0, 1, act, None)
    else:
        spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    xin = P4.pack_array(x) if nc4hw4 else x
    layout = "nc4hw4" if nc4hw4 else "nchw"
    want = CpuEngine(spec, kernel="avx2", threads=2).forward(xin, layout)
    for kernel in AVX512:
        eng = CpuEngine(spec, kernel=kernel, threads=2)
        assert eng.path == "direct" and f"{_direct.STRIP_PIXELS_AVX512}-pixel strips" in eng.describe()
        assert np.array_equal(eng.forward(xin, layout).view(np.uint32), want.view(np.uint32))


@st.composite
def grouped_cases(draw):
    """A grouped conv whose groups have a multiple of 4 output channels (RegNet's 8 a group, ResNeXt's 4), 2-9
    input channels a group (one is depthwise), any kernel / stride / padding / dilation, at least one strip of
    output pixels."""
    g, cpg, opg = draw(st.integers(2, 6)), draw(st.integers(2, 9)), 4 * draw(st.integers(1, 3))
    k, s = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    p, d = draw(st.integers(0, k - 1)), draw(st.integers(1, 2)) if k > 1 else 1
    h, w = draw(st.integers(d * (k - 1) + 1, 18)) + 6 * s, draw(st.integers(d * (k - 1) + 1, 18)) + 6 * s
    geo = qst.ConvGeometry(draw(st.integers(1, 2)), g * cpg, g * opg, h, w, (k, k), (s, s), (p, p), (d, d), g)
    weight = draw(qst.quantized_weights(geo))
    x = draw(qst.activations((geo.n, geo.c, h, w)))
    bias = np.random.default_rng(draw(st.integers(0, 99))).standard_normal(geo.o).astype(np.float32)
    return geo, weight, x, bias, draw(st.sampled_from([None, "relu", "relu6", "silu"]))


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=30)
@given(case=grouped_cases(), nc4hw4=st.booleans())
def test_grouped_direct_matches_reference_bitwise_over_threads(kernel, case, nc4hw4):
    """Grouped convs on the direct path: each block of 4 output channels reads its own group's planes (a wrong
    group offset mixes groups: the oracle fails), two blocks a micro-tile only within a group; bitwise over thread
    counts, and the AVX-512 micro-kernel equals AVX2 bit for bit."""
    geo, weight, x, bias, act = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    eng = CpuEngine(spec, kernel=kernel, threads=1)
    assert eng.path == "direct"
    xin, layout = (P4.pack_array(x), "nc4hw4") if nc4hw4 else (x, "nchw")
    y1 = eng.forward(xin, layout)
    assert eng.last_call["split"] == "strips"
    y = P4.unpack_array(y1, geo.o) if nc4hw4 else y1
    assert_matches_reference(y, x, weight, bias, **geo.conv_kwargs(), activation=act, act_quant=None)
    yt = CpuEngine(spec, kernel=kernel, threads=3).forward(xin, layout)
    assert np.array_equal(yt.view(np.uint32), y1.view(np.uint32))
    if kernel in _direct.AVX512_KERNELS:
        want = CpuEngine(spec, kernel="avx2", threads=2).forward(xin, layout)
        assert np.array_equal(y1.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kernel", KERNELS)
def test_grouped_direct_where_it_applies(kernel):
    """Groups of 6 output channels (not a multiple of 4) take the GEMM; 3x3 grouped layers above Winograd's size
    and 1x1 grouped layers (no in-place read: the planes of every group) run the strips; all match the oracle."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 24, 70, 70)).astype(np.float32)
    for o, k, pad in ((18, 3, 1), (24, 3, 1), (24, 1, 0)):
        w = qconv.quantize_weight(rng.standard_normal((o, 8, k, k)).astype(np.float32), groups=3)
        eng = CpuEngine(ConvSpec(w, None, 1, pad, act_quant=None), kernel=kernel, threads=2)
        assert eng.path == ("gemm" if o == 18 else "direct")
        assert_matches_reference(eng.forward(x), x, w, None, 1, pad, act_quant=None)
        if eng.path == "direct":
            assert eng.last_call["split"] == "strips" and not eng.last_call["winograd"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_direct_hands_small_outputs_to_the_gemm(kernel):
    """Fewer than DIRECT_MIN_PIXELS output pixels a sample: the GEMM path, prepared on that first call; both paths
    match the oracle, and a Linear (one pixel a sample) never prepares the direct path."""
    rng = np.random.default_rng(5)
    w = qconv.quantize_weight(rng.standard_normal((10, 7, 3, 3)).astype(np.float32), bits=4, block_size=0)
    eng = CpuEngine(ConvSpec(w, None, 1, 1, act_quant=None), kernel=kernel, threads=2)
    assert eng.path == "direct" and eng.layout is None
    small = rng.standard_normal((3, 7, 4, 5)).astype(np.float32)
    assert_matches_reference(eng.forward(small), small, w, None, 1, 1, act_quant=None)
    assert eng.last_call["split"] != "strips" and eng.layout is not None
    big = rng.standard_normal((1, 7, 6, 5)).astype(np.float32)
    assert_matches_reference(eng.forward(big), big, w, None, 1, 1, act_quant=None)
    assert eng.last_call["split"] == "strips"
    lw = qconv.quantize_weight(rng.standard_normal((9, 40)).astype(np.float32))
    lin = qconv.Linear(lw, act_quant=None, kernel=kernel, threads=2)
    assert lin.engine.path == "gemm"


VEC_KERNELS = [k for k in KERNELS if k != "scalar"]


@st.composite
def winograd_cases(draw):
    """A 3x3 stride-1 conv with at least WINOGRAD_MIN_PIXELS output pixels a sample (odd sizes: half tiles)."""
    c, o, n = draw(st.integers(1, 13)), draw(st.integers(1, 11)), draw(st.integers(1, 2))
    p = draw(st.integers(0, 2))
    side = int(np.ceil(np.sqrt(_direct.WINOGRAD_MIN_PIXELS))) + 2 - 2 * p
    h, w = side + draw(st.integers(0, 9)), side + draw(st.integers(0, 9))
    geo = qst.ConvGeometry(n, c, o, h, w, (3, 3), (1, 1), (p, p), (1, 1))
    weight = draw(qst.quantized_weights(geo))
    x = draw(qst.activations((n, c, h, w)))
    rng = np.random.default_rng(draw(st.integers(0, 99)))
    bias = rng.standard_normal(o).astype(np.float32) if draw(st.booleans()) else None
    pa = (rng.standard_normal(o).astype(np.float32), rng.standard_normal(o).astype(np.float32))
    return geo, weight, x, bias, draw(st.sampled_from([None, "relu", "relu6", "hardswish", "silu"])), \
        pa if draw(st.booleans()) else None


@pytest.mark.skipif(not VEC_KERNELS, reason="Winograd runs in the AVX2 code; this CPU has no AVX2")
@pytest.mark.parametrize("kernel", VEC_KERNELS)
@settings(max_examples=25, deadline=None)
@given(case=winograd_cases())
def test_winograd_matches_reference_bitwise_over_threads(kernel, case):
    """3x3 stride-1 layers of >= WINOGRAD_MIN_PIXELS output pixels run Winograd: the oracle within the float
    tolerance of their 2x2 output tile's magnitude (odd sizes leave half tiles; padding 0-2; int8 / int4, blocks,
    post_affine), bitwise over 1, 2 and 3 threads."""
    geo, weight, x, bias, act, pa = case
    spec = ConvSpec(weight, bias, 1, geo.padding, 1, act, None)
    one = CpuEngine(spec, kernel=kernel, threads=1)
    y1 = one.forward(x)
    assert one.last_call["winograd"]
    assert_matches_reference(y1, x, weight, bias, 1, geo.padding, 1, activation=act, act_quant=None,
                             tile=_direct.WINOGRAD_TILE)
    for threads in (2, 3):
        yt = CpuEngine(spec, kernel=kernel, threads=threads).forward(x)
        assert np.array_equal(yt.view(np.uint32), y1.view(np.uint32))
    if pa is not None:   # post_affine: the same outputs times s plus t (two float32 roundings), bitwise
        post = CpuEngine(ConvSpec(weight, bias, 1, geo.padding, 1, act, None, post_affine=pa), kernel=kernel,
                         threads=2).forward(x)
        np.testing.assert_array_equal(post, y1 * pa[0].reshape(1, -1, 1, 1) + pa[1].reshape(1, -1, 1, 1))


@pytest.mark.skipif(not VEC_KERNELS, reason="Winograd runs in the AVX2 code; this CPU has no AVX2")
def test_winograd_only_where_it_applies(monkeypatch):
    """Strides, dilations, other kernel sizes, NC4HW4, small outputs, the portable code and
    QCONV_CPU_WINOGRAD=0 run the strips; NaN input is refused."""
    rng = np.random.default_rng(8)
    side = int(np.ceil(np.sqrt(_direct.WINOGRAD_MIN_PIXELS))) + 2
    w3 = qconv.quantize_weight(rng.standard_normal((6, 5, 3, 3)).astype(np.float32))
    x = rng.standard_normal((1, 5, side, side)).astype(np.float32)

    def ran(spec, x, layout="nchw", **kw):
        eng = CpuEngine(spec, threads=2, **kw)
        eng.forward(x, layout)
        return eng.last_call["winograd"]

    assert ran(ConvSpec(w3, None, 1, 1, act_quant=None), x)
    assert not ran(ConvSpec(w3, None, 2, 1, act_quant=None), x)
    assert not ran(ConvSpec(w3, None, 1, 2, 2, act_quant=None), x)
    assert not ran(ConvSpec(w3, None, 1, 1, act_quant=None), x[:, :, :40, :40])
    assert not ran(ConvSpec(w3, None, 1, 1, act_quant=None), P4.pack_array(x), "nc4hw4")
    assert not ran(ConvSpec(w3, None, 1, 1, act_quant=None), x, kernel="scalar")
    w5 = qconv.quantize_weight(rng.standard_normal((6, 5, 5, 5)).astype(np.float32))
    assert not ran(ConvSpec(w5, None, 1, 2, act_quant=None), x)
    monkeypatch.setenv("QCONV_CPU_WINOGRAD", "0")
    assert not ran(ConvSpec(w3, None, 1, 1, act_quant=None), x)
    monkeypatch.delenv("QCONV_CPU_WINOGRAD")
    bad = x.copy()
    bad[0, 3, side - 1, 7] = np.nan
    eng = CpuEngine(ConvSpec(w3, None, 1, 1, act_quant=None), threads=2)
    with pytest.raises(ValueError, match="NaN"):
        eng.forward(bad)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("stride, pad", [(2, 1), (1, 1), (2, 0), (3, 2)])
def test_phase_plane_bands_refuse_nonfinite_in_every_row(kernel, stride, pad):
    """A few-channel layer (a stem: 3 channels) cuts its phase planes into row bands, more with more threads: an inf
    in any row and any column of the input, padding rows around it included, is refused with every split, in both
    layouts, and finite inputs give the bits of one thread."""
    rng = np.random.default_rng(11)
    w = qconv.quantize_weight(rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    spec = ConvSpec(w, None, stride, pad, act_quant=None)
    x = rng.standard_normal((1, 3, 23, 21)).astype(np.float32)
    engines = [CpuEngine(spec, kernel=kernel, threads=t) for t in (1, 2, 3)]
    assert {e.path for e in engines} == {"direct"}
    y1 = engines[0].forward(x)
    for eng in engines[1:]:
        assert np.array_equal(eng.forward(x).view(np.uint32), y1.view(np.uint32))
    for row in range(x.shape[2]):
        xb = x.copy()
        xb[0, row % 3, row, (5 * row) % x.shape[3]] = np.inf if row % 2 else np.nan
        for eng in engines:
            for layout, xin in (("nchw", xb), ("nc4hw4", P4.pack_array(xb))):
                with pytest.raises(ValueError, match="NaN or inf"):
                    eng.forward(xin, layout)


def test_direct_option():
    rng = np.random.default_rng(6)
    w = qconv.quantize_weight(rng.standard_normal((4, 4, 1, 1)).astype(np.float32))
    assert CpuEngine(ConvSpec(w, act_quant=None), direct=False).path == "gemm"
    with pytest.raises(ValueError, match="direct=True"):
        CpuEngine(ConvSpec(w, act_quant="tensor"), direct=True)
    wg = qconv.quantize_weight(rng.standard_normal((4, 2, 1, 1)).astype(np.float32), groups=2)
    with pytest.raises(ValueError, match="direct=True"):
        CpuEngine(ConvSpec(wg, act_quant=None), direct=True)
    with pytest.raises(TypeError, match="direct"):
        CpuEngine(ConvSpec(w, act_quant=None), direct="yes")
    plan = _direct.DirectPlan(ConvSpec(w, act_quant=None), "avx2")
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    with pytest.raises(ValueError, match="buf"):
        plan.forward(x, 1, np.empty((1, 4, 6, 6), np.float32), 0, 1, np.empty(3, np.float32))
