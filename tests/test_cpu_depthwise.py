"""The CPU engine's depthwise path (``qconv._ext._depthwise``: groups == in_channels, channel multiplier M).

Against the oracle (integer parts exact, the per-output 1e-5 rule) and bitwise against the general GEMM path
(``depthwise=False``: the depthwise epilogue is the GEMM kernels' own formula and order), over kernel sizes 1-7,
strides, padding, dilation, odd channel counts, M in {1, 2}, int4 / int8 (symmetric or not, float16 scales),
act_quant tensor / row / block, the static int8 path, NCHW and NC4HW4, bias, relu / relu6, and 1 vs 2 threads.
The serial thresholds are 0 here, so 2-thread calls really run two threads.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._depthwise")

import qconv  # noqa: E402
from qconv._ext import _cpu, _depthwise  # noqa: E402
from qconv.cpu import KERNEL_NAMES, CpuEngine, serial_thresholds  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts.nc4hw4 import NC4HW4  # noqa: E402
from qconv.testing import assert_matches_reference, strategies as qst  # noqa: E402

# the AMX kernel's depthwise path is the AVX2 one; its GEMM path differs only in speed
KERNELS = [k for k in KERNEL_NAMES if _cpu.kernel_supported(k) and k != "amx"]
P4 = NC4HW4(4)


pytestmark = pytest.mark.usefixtures("threaded_paths")


@st.composite
def dw_cases(draw, max_kernel=7):
    c = draw(st.sampled_from([2, 3, 5, 7, 13, 16, 17, 33]) | st.integers(2, 24))
    m = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(1, 2))
    dims = []
    for _ in range(2):
        k = draw(st.integers(1, max_kernel))
        s = draw(st.integers(1, 3))
        p = draw(st.integers(0, k - 1))
        d = draw(st.integers(1, 3)) if k > 1 else 1
        lo = max(1, d * (k - 1) + 1 - 2 * p)
        dims.append((k, s, p, d, draw(st.integers(lo, lo + 12))))
    (kh, sh, ph, dh, h), (kw, sw, pw, dw, w) = dims
    geo = qst.ConvGeometry(n, c, c * m, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw), c)
    weight = draw(qst.quantized_weights(geo))
    x = draw(qst.activations((n, c, h, w)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    bias = rng.standard_normal(c * m).astype(np.float32) if draw(st.booleans()) else None
    act = draw(st.sampled_from([None, "relu", "relu6"]))
    return geo, weight, x, bias, act


def _spec(geo, weight, bias, act, aq):
    return ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, aq)


def _run(eng, x, layout, o):
    if layout == "nchw":
        return eng.forward(x)
    y4 = eng.forward(P4.pack_array(x), "nc4hw4")
    if o % 4:
        assert not y4[-1, ..., o % 4:].any(), "NC4HW4 output padding lanes must be zero"
    return P4.unpack_array(y4, o)


def _same(a, b):
    """Bitwise equal (a zero's sign aside: the symmetric epilogue adds +0 where the GEMM adds offset 0 * S)."""
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=dw_cases(), aq=st.sampled_from(["tensor", "row", "block"]), layout=st.sampled_from(["nchw", "nc4hw4"]))
@settings(deadline=None)
def test_depthwise_matches_oracle_and_general_path(kernel, case, aq, layout):
    geo, weight, x, bias, act = case
    spec = _spec(geo, weight, bias, act, aq)
    dw = CpuEngine(spec, threads=2, kernel=kernel)
    assert "depthwise" in dw.describe()
    y = _run(dw, x, layout, geo.o)
    assert dw.last_call["split"] == "planes" and dw.last_call["gemm_threads"] == 2
    assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, aq)
    gen = CpuEngine(spec, threads=1, kernel=kernel, depthwise=False)
    assert "depthwise" not in gen.describe()
    assert _same(gen.forward(x), y)
    one = CpuEngine(spec, threads=1, kernel=kernel)
    assert np.array_equal(one.forward(x).view(np.uint32), y.view(np.uint32)), "1 vs 2 threads differ"


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=dw_cases(), layout=st.sampled_from(["nchw", "nc4hw4"]), tail=st.sampled_from([None, "hardswish", "silu"]),
       affine=st.booleans())
@settings(deadline=None)
def test_depthwise_float_activations(kernel, case, layout, tail, affine):
    """act_quant=None on the depthwise path: float32 sums of the input as it is (kind 3), within the oracle's
    tolerance like the general path's float kernel, and the same bits on 1 and 2 threads. Symmetric weights run in
    blocks of 8 channels (qc_dw_item_c8: NCHW outputs transposed back, NC4HW4 ones stored pixel by pixel when the
    channel multiplier is 1), other NC4HW4 outputs one channel's planes at a time: the same bits."""
    geo, weight, x, bias, act = case
    act = tail or act
    rng = np.random.default_rng(geo.c)
    pa = (rng.standard_normal(geo.o).astype(np.float32), rng.standard_normal(geo.o).astype(np.float32))
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None,
                    post_affine=pa if affine else None)
    dw = CpuEngine(spec, threads=2, kernel=kernel)
    assert "depthwise" in dw.describe()
    y = _run(dw, x, layout, geo.o)
    other = _run(dw, x, "nc4hw4" if layout == "nchw" else "nchw", geo.o)
    assert np.array_equal(other.view(np.uint32), y.view(np.uint32)), "NCHW and NC4HW4 outputs differ"
    if affine:   # the oracle has no post_affine: y * scale, then + shift, in float32 after the plain layer
        plain = _run(CpuEngine(_spec(geo, weight, bias, act, None), threads=2, kernel=kernel), x, layout, geo.o)
        want = (plain * pa[0][:, None, None]).astype(np.float32) + pa[1][:, None, None]
        assert np.array_equal(want.view(np.uint32), y.view(np.uint32))
    else:
        assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
        gen = CpuEngine(spec, threads=1, kernel=kernel, depthwise=False)
        assert_matches_reference(gen.forward(x), x, weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    one = CpuEngine(spec, threads=1, kernel=kernel)
    assert np.array_equal(one.forward(x).view(np.uint32), y.view(np.uint32)), "1 vs 2 threads differ"


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "scalar"])
@pytest.mark.parametrize("kw, stride_h, dil_h, w", [(5, 1, 1, 80), (5, 2, 1, 37), (3, 1, 2, 19), (3, 1, 1, 8),
                                                    (5, 1, 3, 5)])
def test_depthwise_rows_of_taps_keep_the_bits(kernel, kw, stride_h, dil_h, w):
    """Stride-1, width-dilation-1 rows of 3 or 5 taps (qc_dw_c8_mac_row: each input pixel loaded once per kernel
    row): the same bits as the planes (NC4HW4 output) and within the oracle's tolerance, widths below, at and past
    one 8-pixel step."""
    rng = np.random.default_rng(kw * 100 + w)
    c = 19
    weight = qconv.quantize_weight(rng.standard_normal((c, 1, 5, kw)).astype(np.float32), groups=c)
    x = rng.standard_normal((2, c, 11, w)).astype(np.float32)
    spec = ConvSpec(weight, None, (stride_h, 1), (2, kw // 2), (dil_h, 1), "hardswish", None)
    dw = CpuEngine(spec, threads=2, kernel=kernel)
    y = _run(dw, x, "nchw", c)
    assert np.array_equal(_run(dw, x, "nc4hw4", c).view(np.uint32), y.view(np.uint32))
    assert_matches_reference(y, x, weight, None, (stride_h, 1), (2, kw // 2), (dil_h, 1), "hardswish", None)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=dw_cases())
@settings(deadline=None)
def test_depthwise_float_nc4hw4_input_to_nchw(kernel, case):
    """Float activations read from NC4HW4 (its padding lanes NaN: ignored) into NCHW outputs: the same bits as from
    NCHW (the channel blocks gather either layout)."""
    geo, weight, x, bias, act = case
    plan = _depthwise.DepthwisePlan(_spec(geo, weight, bias, act, None), kernel)
    shape = (geo.n, geo.o) + _spec(geo, weight, bias, act, None).out_hw(geo.h, geo.w)
    y1, y2 = np.empty(shape, np.float32), np.empty(shape, np.float32)
    plan.forward(x, 1, y1, 0, 2)
    x4 = P4.pack_array(x)
    if geo.c % 4:
        x4[-1, ..., geo.c % 4:] = np.nan
    plan.forward(x4, 0, y2, 0, 2)
    assert np.array_equal(y1.view(np.uint32), y2.view(np.uint32))
    assert_matches_reference(y1, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, None)


@st.composite
def flat_cases(draw):
    """Layers the flat planes take (qc_dw_item_flat): "same" padding (odd kernels or even dilation), stride 1 or 2
    in both dimensions, up to 7x7 taps, planes from 1 pixel to several vectors a row (stride 2 rows of 32 outputs
    and more run row by row, narrower ones through phase planes), odd channel counts (the last group of 4 partial),
    few planes (bands of rows) and many."""
    c = draw(st.sampled_from([2, 3, 5, 7, 13, 16, 17, 33]))
    m, n, s = draw(st.sampled_from([1, 2])), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    dims = []
    for _ in range(2):
        k, d = draw(st.sampled_from([1, 3, 5, 7])), draw(st.integers(1, 3))
        dims.append((k, d * (k - 1) // 2, d, draw(st.sampled_from([1, 2, 7, 14, 15, 16, 17, 33, 40, 64, 97]))))
    (kh, ph, dh, h), (kw, pw, dw, w) = dims
    geo = qst.ConvGeometry(n, c, c * m, h, w, (kh, kw), (s, s), (ph, pw), (dh, dw), c)
    weight = draw(qst.quantized_weights(geo))
    x = draw(qst.activations((n, c, h, w)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    bias = rng.standard_normal(c * m).astype(np.float32) if draw(st.booleans()) else None
    act = draw(st.sampled_from([None, "relu", "relu6", "hardswish", "silu"]))
    return geo, weight, x, bias, act


@pytest.mark.skipif("avx512vnni" not in KERNELS, reason="the flat planes need AVX-512")
@given(case=flat_cases(), affine=st.booleans())
@settings(deadline=None)
def test_depthwise_flat_planes_keep_the_bits(case, affine):
    """Float activations on AVX-512 with NCHW in and out (qc_dw_item_flat: a channel's output plane as a flat run
    of 16-pixel vectors, taps as masked loads; stride 2 by rows or through the input's phase planes; every layer they can take,
    the speed policy lifted): the same bits as the 8-channel blocks of the AVX2 kernel and on 1 and 2 threads,
    within the oracle's tolerance."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_depthwise, "FLAT_MAX_TAPS_WIDTH_S1", 1 << 30)
        _check_flat_planes(case, affine)


def _check_flat_planes(case, affine):
    geo, weight, x, bias, act = case
    rng = np.random.default_rng(geo.c)
    pa = (rng.standard_normal(geo.o).astype(np.float32), rng.standard_normal(geo.o).astype(np.float32))
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, None,
                    post_affine=pa if affine else None)
    flat = CpuEngine(spec, threads=2, kernel="avx512vnni")
    y = flat.forward(x)
    assert flat.last_call["depthwise"] == "flat"
    blocks = CpuEngine(spec, threads=2, kernel="avx2")
    assert np.array_equal(blocks.forward(x).view(np.uint32), y.view(np.uint32)), "flat planes and blocks differ"
    assert blocks.last_call["depthwise"] == "blocks"
    one = CpuEngine(spec, threads=1, kernel="avx512vnni")
    assert np.array_equal(one.forward(x).view(np.uint32), y.view(np.uint32)), "1 vs 2 threads differ"
    if not affine:
        assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, None)
    # a non-finite value anywhere in the input, here in the last (partial) group's last channel
    bad = x.copy()
    bad.reshape(-1)[-1 - int(rng.integers(0, geo.h * geo.w))] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        flat.forward(bad)


@pytest.mark.skipif("avx512vnni" not in KERNELS, reason="the flat planes need AVX-512")
@pytest.mark.parametrize("k, s, w", [(3, 1, 21), (5, 1, 21), (3, 2, 70), (5, 2, 67)])
def test_depthwise_flat_sums_tell_an_overflow_from_a_bad_input(k, s, w):
    """Stride 1's flat planes, and stride 2's rows, find a NaN / inf input through their sums: finite values whose
    sums overflow to inf are a result (the blocks' bits, no error), a NaN read only by zero weights is still an
    error."""
    rng = np.random.default_rng(k)
    wf = rng.standard_normal((8, 1, k, k)).astype(np.float32)
    wf[3] = 0   # channel 3: every weight zero
    w8 = qconv.quantize_weight(wf, groups=8)
    spec = ConvSpec(w8, None, s, k // 2, act_quant=None)
    flat, blocks = CpuEngine(spec, threads=2, kernel="avx512vnni"), CpuEngine(spec, threads=2, kernel="avx2")
    x = rng.standard_normal((1, 8, 20, w)).astype(np.float32)
    x[0, 1, 4:9, 5:12] = 3.0e38   # finite; the sums overflow
    y = flat.forward(x)
    assert flat.last_call["depthwise"] == "flat" and not np.isfinite(y).all()
    assert np.array_equal(y.view(np.uint32), blocks.forward(x).view(np.uint32))
    for bad in (np.nan, np.inf, -np.inf):
        xb = x.copy()
        xb[0, 3, 7, 20] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            flat.forward(xb)


@pytest.mark.skipif("avx512vnni" not in KERNELS, reason="the flat planes need AVX-512")
@pytest.mark.parametrize("k, s, hw, path", [(3, 1, 56, "flat"), (3, 1, 112, "flat"), (3, 1, 320, "flat"),
                                            (5, 1, 28, "flat"), (5, 1, 40, "blocks"), (7, 1, 14, "flat"),
                                            (7, 1, 28, "blocks"), (3, 2, 112, "flat"), (5, 2, 80, "flat")])
def test_depthwise_flat_planes_policy(k, s, hw, path):
    """Stride 1 takes the flat planes for kernels of up to FLAT_ANY_WIDTH_TAPS taps, and for larger ones up to
    FLAT_MAX_TAPS_WIDTH_S1 taps x output width (wider rows: the blocks' rows of taps); stride 2 always."""
    w = qconv.quantize_weight(np.ones((8, 1, k, k), np.float32), groups=8)
    eng = CpuEngine(ConvSpec(w, None, s, k // 2, act_quant=None), threads=2, kernel="avx512vnni")
    eng.forward(np.ones((1, 8, hw, hw), np.float32))
    assert eng.last_call["depthwise"] == path


@given(case=dw_cases(max_kernel=5), layout=st.sampled_from(["nchw", "nc4hw4"]),
       out_int8=st.booleans(), zp=st.integers(-128, 127))
@settings(deadline=None)
def test_static_int8_path_bitwise_general(case, layout, out_int8, zp):
    geo, weight, x, bias, act = case
    rng = np.random.default_rng(geo.h * 31 + geo.w)
    xi = rng.integers(-128, 128, x.shape).astype(np.int8)
    kw = dict(input_qparams=(0.037, zp), output_qparams=(0.05, -3) if out_int8 else None)
    spec = _spec(geo, weight, bias, act, "tensor")
    dw = CpuEngine(spec, threads=2, **kw)
    gen = CpuEngine(spec, threads=2, depthwise=False, **kw)
    if layout == "nchw":
        y, ref = dw.forward(xi), gen.forward(xi)
    else:
        xp = P4.pack_array(xi)
        if geo.c % 4:
            xp[-1, ..., geo.c % 4:] = rng.integers(-128, 128, xp[-1, ..., geo.c % 4:].shape)  # ignored lanes
        y, ref = dw.forward(xp, "nc4hw4"), gen.forward(xp, "nc4hw4")
    assert y.dtype == (np.int8 if out_int8 else np.float32)
    assert _same(y, ref)


def test_large_kernel_chunks_stay_exact():
    """Over QC_DW_EXACT_TAPS taps the float chunk sums are added in int32: still the oracle's integers."""
    rng = np.random.default_rng(5)
    k = 25   # 625 taps > 512
    assert k * k > _depthwise.EXACT_TAPS
    w = qconv.quantize_weight(rng.standard_normal((6, 1, k, k)).astype(np.float32) + 3, bits=8, symmetric=False,
                              groups=3)
    x = np.abs(rng.standard_normal((1, 3, 30, 28)).astype(np.float32)) + 1   # large same-sign sums
    for aq in ("tensor", "row", "block"):
        spec = ConvSpec(w, None, 1, 3, 1, None, aq)
        y = CpuEngine(spec, threads=2).forward(x)
        assert_matches_reference(y, x, w, None, 1, 3, 1, None, aq)
        assert _same(CpuEngine(spec, threads=1, depthwise=False).forward(x), y)


@pytest.mark.parametrize("aq", ["tensor", "row", "block", None])
def test_nonfinite_input_rejected(aq):
    w = qconv.quantize_weight(np.ones((4, 1, 3, 3), np.float32), groups=4)
    eng = CpuEngine(ConvSpec(w, None, 1, 1, act_quant=aq), threads=2)
    assert "depthwise" in eng.describe()
    for bad in (np.nan, np.inf):
        x = np.ones((1, 4, 5, 5), np.float32)
        x[0, 2, 3, 1] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            eng.forward(x)
    # float activations check the rows their bands read (every row here; stride 2, both layouts, every
    # position class: first / last row and column, interior), and a range pass where rows go unread (1x1 stride 2)
    for k, s, p in [(3, 1, 1), (3, 2, 1), (5, 2, 2), (1, 2, 0)] if aq is None else []:
        wk = qconv.quantize_weight(np.ones((4, 1, k, k), np.float32), groups=4)
        ek = CpuEngine(ConvSpec(wk, None, s, p, act_quant=aq), threads=2)
        for at in [(0, 0, 0, 0), (0, 3, 6, 8), (0, 1, 6, 0), (0, 2, 3, 7), (0, 3, 5, 4), (0, 1, 2, 20),
                   (0, 2, 4, 33), (0, 3, 1, 40), (0, 1, 6, 70), (0, 2, 0, 45)]:
            # 41: the rows' vector loops too; 71: stride 2 by rows (36 outputs a row)
            x = np.ones((1, 4, 7, 9 if at[3] < 9 else 41 if at[3] < 41 else 71), np.float32)
            x[at] = np.inf
            for layout, xin in (("nchw", x), ("nc4hw4", P4.pack_array(x))):
                with pytest.raises(ValueError, match="NaN or infinite"):
                    ek.forward(xin, layout)
    # NC4HW4 padding lanes are not values: NaN there is ignored
    w3 = qconv.quantize_weight(np.ones((3, 1, 3, 3), np.float32), groups=3)
    e3 = CpuEngine(ConvSpec(w3, None, 1, 1, act_quant=aq), threads=2)
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 5)).astype(np.float32)
    xp = P4.pack_array(x)
    clean = e3.forward(xp, "nc4hw4")
    xp[-1, ..., 3] = np.nan
    np.testing.assert_array_equal(e3.forward(xp, "nc4hw4"), clean)


def test_dispatch_option_and_env(monkeypatch):
    rng = np.random.default_rng(2)
    w = qconv.quantize_weight(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), groups=8)
    spec = ConvSpec(w, None, 1, 1)
    assert "depthwise" in CpuEngine(spec).describe()
    assert "depthwise" not in CpuEngine(spec, depthwise=False).describe()
    monkeypatch.setenv("QCONV_CPU_DEPTHWISE", "0")
    assert "depthwise" not in CpuEngine(spec).describe()
    assert "depthwise" in CpuEngine(spec, depthwise=True).describe()
    monkeypatch.delenv("QCONV_CPU_DEPTHWISE")
    # not depthwise: the general path; forcing the depthwise path there is an error
    g2 = qconv.quantize_weight(rng.standard_normal((8, 2, 3, 3)).astype(np.float32), groups=4)
    assert "depthwise" not in CpuEngine(ConvSpec(g2, None, 1, 1)).describe()
    with pytest.raises(ValueError, match="depthwise"):
        CpuEngine(ConvSpec(g2, None, 1, 1), depthwise=True)
    with pytest.raises(TypeError, match="depthwise"):
        CpuEngine(spec, depthwise="yes")
    # the public layer picks it too
    layer = qconv.Conv2d(w, None, padding=1, device="cpu", threads=2)
    assert "depthwise" in repr(layer)
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    np.testing.assert_array_equal(layer(x), CpuEngine(spec, threads=1, depthwise=False).forward(x))


def test_many_planes_run_threaded():
    """A depthwise call of planes (here int8 activations) under SERIAL_MACS runs on one thread only with fewer than
    DW_SERIAL_PLANES (sample, channel) planes: each plane's set-up is work too. Both give the same bits."""
    from qconv.cpu.engine import DW_SERIAL_PLANES

    rng = np.random.default_rng(3)
    for c, threads in ((DW_SERIAL_PLANES - 1, 1), (DW_SERIAL_PLANES, 2)):
        w = qconv.quantize_weight(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), groups=c)
        eng = CpuEngine(ConvSpec(w, None, 2, 1, act_quant="tensor"), threads=2)
        assert not eng._dw.channel_blocks(0)
        x = rng.standard_normal((1, c, 12, 12)).astype(np.float32)
        with serial_thresholds(macs=1 << 21):
            y = eng.forward(x)
        assert eng.last_call["gemm_threads"] == threads
        np.testing.assert_array_equal(y, CpuEngine(ConvSpec(w, None, 2, 1, act_quant="tensor"), threads=1).forward(x))


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "scalar"])
def test_channel_blocks_run_threaded_from_few_channels(kernel):
    """Channel blocks (float activations into NCHW, or NC4HW4 with channel multiplier 1) have no per-plane set-up:
    a call runs on one thread only under SERIAL_MACS // DW_BLOCK_SERIAL_DIV multiply-adds, however few its channels
    (16 at 112x112 ran serially before); planes (here NC4HW4 outputs of multiplier 2) keep the plane rule. The same
    bits either way."""
    from qconv.cpu.engine import DW_BLOCK_SERIAL_DIV, DW_SERIAL_PLANES

    rng = np.random.default_rng(4)
    c, macs = 16, 1 << 21
    w = qconv.quantize_weight(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), groups=c)
    spec = ConvSpec(w, None, 1, 1, act_quant=None)
    eng = CpuEngine(spec, threads=2, kernel=kernel)
    assert eng._dw.channel_blocks(0) and eng._dw.channel_blocks(1) and c < DW_SERIAL_PLANES
    one = CpuEngine(spec, threads=1, kernel=kernel)
    w2 = qconv.quantize_weight(rng.standard_normal((2 * c, 1, 3, 3)).astype(np.float32), groups=c)
    eng2 = CpuEngine(ConvSpec(w2, None, 1, 1, act_quant=None), threads=2, kernel=kernel)
    assert eng2._dw.channel_blocks(0) and not eng2._dw.channel_blocks(1)
    for hw, threads in ((40, 2), (8, 1)):   # 16*40*40*9 = 230K multiply-adds; 16*8*8*9 = 9K
        assert (c * hw * hw * 9 >= macs // DW_BLOCK_SERIAL_DIV) == (threads == 2)
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        with serial_thresholds(macs=macs):
            y = eng.forward(x)
            assert eng.last_call["gemm_threads"] == threads
            y4 = eng.forward(P4.pack_array(x), "nc4hw4")
            assert eng.last_call["gemm_threads"] == threads
            eng2.forward(P4.pack_array(x), "nc4hw4")
            assert eng2.last_call["gemm_threads"] == 1   # planes: under SERIAL_MACS with 16 planes
        np.testing.assert_array_equal(y, one.forward(x))
        np.testing.assert_array_equal(P4.unpack_array(y4, c), y)


def test_last_call_reports_threads():
    w = qconv.quantize_weight(np.ones((6, 1, 3, 3), np.float32), groups=6)
    eng = CpuEngine(ConvSpec(w, None, 1, 1), threads=2)
    assert eng.last_call is None
    x = np.ones((1, 6, 8, 8), np.float32)
    eng.forward(x)
    # no separate quantization pass: each conv thread quantizes the input rows it reads
    assert eng.last_call == dict(quant_threads=0, gemm_threads=2, split="planes", depthwise="planes")
    with serial_thresholds(macs=1 << 40, quant_values=1 << 40):
        eng.forward(x)
        assert eng.last_call == dict(quant_threads=0, gemm_threads=1, split="planes", depthwise="planes")
