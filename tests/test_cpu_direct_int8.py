"""The direct int8 conv (``qconv_direct_int8.h``, :class:`qconv._ext._direct_int8.DirectInt8Plan`) and its weight
layout :class:`qconv.layouts.amx.AmxConvWeightLayout`.

Everywhere: the layout's exact round trip and explicit byte positions, and the engine option's checks. On each
kernel this CPU runs (``"amx"``: AMX tiles; ``"avx512vnni"``: VNNI vectors; a kernel the CPU lacks is skipped with
the reason): whole engines bitwise equal to the tiled GEMM of the same kernel and to the VNNI GEMM, within the
oracle's rule, over strides, padding, dilation, batch, odd channel counts, int8/int4, symmetric/offset weights,
activations and post-affine tails; ``out=``, NaN refusal, the environment switch and the small-call threshold.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._cpu")

from qconv import quantize_weight  # noqa: E402
from qconv._ext import _cpu  # noqa: E402
from qconv.cpu import CpuEngine, serial_thresholds  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts import all_specs  # noqa: E402
from qconv.layouts.amx import AmxConvWeightLayout  # noqa: E402
from qconv.testing import assert_layout_roundtrip, assert_matches_reference, strategies as qst  # noqa: E402

KERNELS = [pytest.param(k, marks=pytest.mark.skipif(not _cpu.kernel_supported(k), reason=f"this CPU (or OS) cannot "
                                                     f"run the {k!r} kernel"))
           for k in ("amx", "avx512vnni")]


@pytest.fixture(autouse=True, scope="module")
def _threaded_paths():
    with serial_thresholds(macs=0, quant_values=0):
        yield


# --------------------------------------------------------------------------------------------------------------
# the layout and the option (every machine)
# --------------------------------------------------------------------------------------------------------------
def test_layout_is_registered():
    assert AmxConvWeightLayout in all_specs()


@given(AmxConvWeightLayout.hypothesis_case())
def test_layout_round_trips_and_positions(case):
    """Exact round trip; every weight at the byte the docstring formula names, every other byte 0 (padded
    channels, quads and output channels add nothing to the integer sums)."""
    spec, q = case
    assert_layout_roundtrip(spec, q)
    packed = spec.pack_array(q).reshape(-1)
    assert packed.nbytes == spec.nbytes and spec.kg * spec.steps >= spec.quads and spec.kg <= 16
    o, c, t = np.meshgrid(*(np.arange(n) for n in (spec.out_channels, spec.in_channels, spec.taps)), indexing="ij")
    pos = spec.byte_offset(o, c, t)
    np.testing.assert_array_equal(packed[pos], q.reshape(spec.out_channels, spec.in_channels, spec.taps))
    rest = np.ones(packed.size, bool)
    rest[pos.reshape(-1)] = False
    assert (packed[rest] == 0).all()


def test_layout_refuses_groups_and_odd_blocks():
    with pytest.raises(ValueError, match="multiple of 4 channels"):
        AmxConvWeightLayout(8, 12, 9, 2, 8)          # blocks of 6 channels
    with pytest.raises(ValueError, match="one group"):
        AmxConvWeightLayout(8, 8, 9, 1, 8, groups=2)
    assert AmxConvWeightLayout(8, 16, 9, 2, 4).steps == 2 and AmxConvWeightLayout(8, 16, 9, 2, 4).kg == 2


def test_option_is_checked():
    spec = ConvSpec(quantize_weight(np.ones((4, 4, 3, 3), np.float32), block_size=2), None, 2, 1)
    with pytest.raises(TypeError, match="direct_int8 must be"):
        CpuEngine(spec, direct_int8="yes")
    with pytest.raises(ValueError, match="direct_int8=True needs"):     # blocks of 2 channels
        CpuEngine(spec, direct_int8=True)


@st.composite
def cases(draw):
    """Layers the direct int8 conv takes: one group, int8 / int4 weights per channel or in blocks of a multiple of 4
    channels (symmetric, asymmetric, zero-point form), channels across the quad, 16-quad K step and 16-channel tile
    boundaries, any kernel, stride (its phase planes), padding, dilation, batch, activation and (one in three) a
    post-affine tail."""
    geo = draw(qst.conv_geometries(max_channels=70, max_out_channels=40, max_spatial=12, max_kernel=5, max_stride=3))
    weight = draw(qst.quantized_weights(geo, block_filter=lambda b: b % 4 == 0))
    x = draw(qst.activations((geo.n, geo.c, geo.h, geo.w)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bias = rng.standard_normal(geo.o).astype(np.float32) if draw(st.booleans()) else None
    act = draw(st.sampled_from([None, "relu", "relu6", "hardswish", "silu"]))
    pa = None
    if draw(st.integers(0, 2)) == 0:
        pa = (rng.uniform(0.5, 2, geo.o).astype(np.float32), rng.standard_normal(geo.o).astype(np.float32))
    return geo, weight, x, bias, act, pa


# --------------------------------------------------------------------------------------------------------------
# engines, on each kernel this CPU runs
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
@given(case=cases(), threads=st.sampled_from([1, 2]))
def test_engine_bitwise_gemm_and_oracle(kernel, case, threads):
    """The direct int8 conv runs (last_call) and gives bitwise the tiled GEMM's results (same kernel, and the VNNI
    kernel's), within the oracle's rule."""
    geo, weight, x, bias, act, pa = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, "tensor", post_affine=pa)
    direct = CpuEngine(spec, kernel=kernel, threads=threads, direct_int8=True, depthwise=False)
    direct.amx_min_cols = 1
    y = direct.forward(x)
    assert direct.last_call["split"] == "direct-int8"
    for k in dict.fromkeys([kernel, "avx512vnni"]):
        gemm = CpuEngine(spec, kernel=k, threads=threads, direct_int8=False, depthwise=False)
        gemm.amx_min_cols = 1
        np.testing.assert_array_equal(y, gemm.forward(x))
    if pa is None:
        assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, "tensor")


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=cases(), threads=st.sampled_from([1, 2]), zp=st.integers(-128, 127),
       sides=st.sampled_from(["in", "out", "both"]), data=st.data())
def test_static_int8_bitwise_gemm(kernel, case, threads, zp, sides, data):
    """The static int8 path (``input_qparams`` / ``output_qparams``, each side alone or both) on the direct int8 conv:
    an int8 input taken as its own quantization, an int8 output requantized as qc_requant does; bitwise the tiled
    GEMM's static path (same kernel, and the VNNI kernel's)."""
    geo, weight, x, bias, act, pa = case
    kw = {}
    if sides in ("in", "both"):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        x = rng.integers(-128, 128, x.shape).astype(np.int8)
        kw["input_qparams"] = (data.draw(st.sampled_from([0.004, 0.05, 1.5])), zp)
    if sides in ("out", "both"):
        kw["output_qparams"] = (data.draw(st.sampled_from([0.01, 0.1, 3.0])), data.draw(st.integers(-128, 127)))
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, "tensor", post_affine=pa)
    direct = CpuEngine(spec, kernel=kernel, threads=threads, direct_int8=True, depthwise=False, **kw)
    direct.amx_min_cols = 1
    y = direct.forward(x)
    assert direct.last_call["split"] == "direct-int8"
    assert y.dtype == (np.int8 if "output_qparams" in kw else np.float32)
    for k in dict.fromkeys([kernel, "avx512vnni"]):
        gemm = CpuEngine(spec, kernel=k, threads=threads, direct_int8=False, depthwise=False, **kw)
        gemm.amx_min_cols = 1
        np.testing.assert_array_equal(y, gemm.forward(x))


@pytest.mark.parametrize("kernel", KERNELS)
def test_static_int8_saturates_and_keeps_no_native_call(kernel):
    """Outputs beyond the int8 range clamp to -128 / 127 exactly as the GEMM path's (a tiny output scale), and the
    static layer offers the custom operator no native call (its tensors are int8)."""
    rng = np.random.default_rng(11)
    w = quantize_weight(rng.standard_normal((24, 20, 3, 3)).astype(np.float32), symmetric=False)
    spec = ConvSpec(w, rng.standard_normal(24).astype(np.float32), 2, 1, 1, "hardswish", "tensor")
    x = rng.integers(-128, 128, (1, 20, 17, 15)).astype(np.int8)
    kw = dict(input_qparams=(0.03, -5), output_qparams=(0.001, 3))
    direct = CpuEngine(spec, kernel=kernel, direct_int8=True, **kw)
    y = direct.forward(x)
    assert direct.last_call["split"] == "direct-int8" and (y == 127).any() and (y == -128).any()
    np.testing.assert_array_equal(y, CpuEngine(spec, kernel=kernel, direct_int8=False, **kw).forward(x))
    assert direct.native_call(x.shape, y.shape) is None


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("c,hw,stride,n", [(3, 12, 1, 1), (3, 17, 2, 1), (5, 10, 1, 1), (6, 9, 3, 2), (13, 7, 1, 1)])
def test_quantization_bands_cover_every_row(kernel, c, hw, stride, n):
    """Few input channels (a stem's 3) give few quads: their quantization is cut into bands of phase-plane rows,
    about 8 items a thread (qc_di8_quant_bands), whose union must be every row, the last band's slack included;
    bitwise the tiled GEMM's results on 1, 2 and 3 threads."""
    rng = np.random.default_rng(c * hw)
    w = quantize_weight(rng.standard_normal((20, c, 3, 3)).astype(np.float32), symmetric=False)
    spec = ConvSpec(w, None, stride, 1, 1, "hardswish", "tensor")
    x = rng.standard_normal((n, c, hw, hw + 3)).astype(np.float32)
    for threads in (1, 2, 3):
        direct = CpuEngine(spec, kernel=kernel, threads=threads, direct_int8=True, depthwise=False)
        direct.amx_min_cols = 1
        y = direct.forward(x)
        assert direct.last_call["split"] == "direct-int8"
        gemm = CpuEngine(spec, kernel=kernel, threads=threads, direct_int8=False, depthwise=False)
        gemm.amx_min_cols = 1
        np.testing.assert_array_equal(y, gemm.forward(x), err_msg=f"{threads} threads")


@pytest.mark.parametrize("kernel", KERNELS)
def test_engine_out_and_nonfinite(kernel):
    """``out=`` is written in place; NaN input is refused by name, as on the GEMM path."""
    rng = np.random.default_rng(5)
    w = quantize_weight(rng.standard_normal((20, 70, 3, 3)).astype(np.float32))
    eng = CpuEngine(ConvSpec(w, None, 1, 1), kernel=kernel)
    x = rng.standard_normal((2, 70, 9, 11)).astype(np.float32)
    out = np.full((2, 20, 9, 11), np.nan, np.float32)
    assert eng.forward(x, out=out) is out and eng.last_call["split"] == "direct-int8"
    gemm = CpuEngine(ConvSpec(w, None, 1, 1), kernel=kernel, direct_int8=False)
    np.testing.assert_array_equal(out, gemm.forward(x))
    x[1, 3, 4, 5] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        eng.forward(x)


@pytest.mark.parametrize("kernel", KERNELS)
def test_engine_env_and_small_calls(kernel, monkeypatch):
    """$QCONV_CPU_DIRECT_INT8=0 keeps the tiled GEMM; calls under amx_min_cols output pixels take the GEMM too."""
    rng = np.random.default_rng(6)
    spec = ConvSpec(quantize_weight(rng.standard_normal((8, 8, 3, 3)).astype(np.float32)), None, 1, 1)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    monkeypatch.setenv("QCONV_CPU_DIRECT_INT8", "0")
    eng = CpuEngine(spec, kernel=kernel)
    eng.forward(x)
    assert eng.last_call["split"] != "direct-int8"
    monkeypatch.delenv("QCONV_CPU_DIRECT_INT8")
    eng = CpuEngine(spec, kernel=kernel)
    eng.forward(x)
    assert eng.last_call["split"] == "direct-int8" and "direct int8 conv" in eng.describe()
    eng.forward(x[:, :, :1, :1])      # 1 output pixel < amx_min_cols
    assert eng.last_call["split"] != "direct-int8"


@pytest.mark.skipif(not _cpu.kernel_supported("avx512vnni"), reason="this CPU (or OS) cannot run the 'avx512vnni' "
                    "kernel")
@pytest.mark.parametrize("c,k,stride,block,direct", [
    (256, 3, 1, 0, False), (128, 3, 2, 0, False), (96, 3, 1, 0, True), (128, 3, 1, 0, True), (64, 3, 2, 0, True),
    (512, 1, 1, 0, True), (128, 3, 1, 32, False), (64, 3, 2, 32, False), (96, 3, 1, 32, True), (32, 3, 2, 32, True),
    (256, 1, 1, 32, False), (128, 1, 1, 32, True)])
def test_vnni_rule_gives_wide_convs_to_the_gemm(c, k, stride, block, direct):
    """On the VNNI kernel, convs of more than one tap and DI8_VNNI_GEMM_CHANNELS input channels (half at a stride,
    half again with weight blocks; 1x1 convs only with blocks) take the tiled GEMM (the same bits), unless
    direct_int8=True; narrower layers stay direct."""
    from qconv.cpu import engine as E
    assert E.DI8_VNNI_GEMM_CHANNELS == 256
    rng = np.random.default_rng(c + k)
    w = quantize_weight(rng.standard_normal((32, c, k, k)).astype(np.float32), block_size=block, symmetric=not block)
    spec = ConvSpec(w, None, stride, k // 2)
    x = rng.standard_normal((1, c, 9, 10)).astype(np.float32)
    auto = CpuEngine(spec, kernel="avx512vnni")
    y = auto.forward(x)
    assert (auto.last_call["split"] == "direct-int8") == direct
    assert auto.native_call(x.shape, y.shape) is not None   # either path runs natively in a session
    assert ("direct int8 conv" in auto.describe()) == direct
    forced = CpuEngine(spec, kernel="avx512vnni", direct_int8=True)
    np.testing.assert_array_equal(y, forced.forward(x))
    assert forced.last_call["split"] == "direct-int8"


def test_other_kernels_keep_the_gemm():
    """The scalar and AVX2 kernels have no direct int8 conv: automatic is the GEMM, True is refused by name."""
    spec = ConvSpec(quantize_weight(np.ones((8, 8, 3, 3), np.float32)), None, 1, 1)
    for k in ("scalar", "avx2"):
        if not _cpu.kernel_supported(k):
            continue
        eng = CpuEngine(spec, kernel=k)
        eng.forward(np.ones((1, 8, 6, 6), np.float32))
        assert eng.last_call["split"] != "direct-int8"
        with pytest.raises(ValueError, match="direct_int8=True needs kernel"):
            CpuEngine(spec, kernel=k, direct_int8=True)
