"""CpuEngine against the oracle over the property space, determinism, layouts, the static int8 path and
validation. Every micro-kernel this CPU runs is exercised (forced through the ``kernel`` option and
``$QCONV_CPU_KERNEL``). The serial thresholds are 0 in this module, so every call with ``threads > 1`` runs the
threaded quantization and GEMM (column split, or channel split when there are fewer column tiles than threads)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._cpu")

import qconv  # noqa: E402
from qconv import _validate as V, reference  # noqa: E402
from qconv._ext import _cpu  # noqa: E402
from qconv.cpu import KERNEL_NAMES, CpuEngine, serial_thresholds  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts.nc4hw4 import NC4HW4  # noqa: E402
from qconv.testing import assert_matches_reference, strategies as qst  # noqa: E402
from qconv.weights import round_half_away  # noqa: E402

KERNELS = [k for k in KERNEL_NAMES if _cpu.kernel_supported(k)]
P4 = NC4HW4(4)


pytestmark = pytest.mark.usefixtures("threaded_paths")
conv_cases = qst.conv_problems


def _engine(weight, bias, geo, act, aq, **kw):
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, aq)
    return CpuEngine(spec, **kw)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=conv_cases(), aq=st.sampled_from(["tensor", "row", None]), tile_cols=st.sampled_from([16, 16, 5, 1]))
def test_matches_reference(kernel, case, aq, tile_cols):
    geo, weight, x, bias, act = case
    eng = _engine(weight, bias, geo, act, aq, kernel=kernel, threads=2, tile_cols=tile_cols)
    y = eng.forward(x)
    assert_matches_reference(y, x, weight, bias, **geo.conv_kwargs(), activation=act, act_quant=aq)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=conv_cases(pointwise=True), aq=st.sampled_from(["tensor", "row", None]))
def test_pointwise_matches_reference(kernel, case, aq):
    geo, weight, x, bias, act = case
    eng = _engine(weight, bias, geo, act, aq, kernel=kernel, threads=2)
    # float activations take the direct path with one group, or groups of a multiple of 4 output channels
    direct = aq is None and (geo.groups == 1 or (geo.o // geo.groups) % 4 == 0) and eng.path != "depthwise"
    assert ("direct" if direct else "pointwise" if eng.path != "depthwise" else "depthwise") in eng.describe()
    assert_matches_reference(eng.forward(x), x, weight, bias, **geo.conv_kwargs(), activation=act, act_quant=aq)


@given(case=conv_cases(), aq=st.sampled_from(["tensor", "row", "block"]), garbage=st.sampled_from([np.nan, 1e30, -7.0]))
def test_nc4hw4_layout(case, aq, garbage):
    """NC4HW4 in and out; the input's padding lanes hold garbage, which must change nothing."""
    geo, weight, x, bias, act = case
    eng = _engine(weight, bias, geo, act, aq, threads=2)
    xp = P4.pack_array(x)
    xp[-1, ..., geo.c % 4 or 4:] = garbage
    y4 = eng.forward(xp, "nc4hw4")
    o = weight.out_channels
    assert y4.shape == P4.packed_shape((geo.n, o) + geo.out_hw)
    flat = y4.transpose(0, 4, 1, 2, 3).reshape(-1, *y4.shape[1:4])
    assert (flat[o:] == 0).all(), "padding lanes must be zero"
    np.testing.assert_array_equal(P4.unpack_array(y4, o), eng.forward(x))


@pytest.mark.parametrize("aq", ["tensor", "row", "block"])
@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30, -50.0, 3.0])
def test_garbage_in_input_padding_lanes_is_ignored(aq, garbage):
    """NC4HW4 padding lanes of the input change nothing (not the quantization range, not a NaN check): the
    result equals the zero-padded and the NCHW call bit for bit, and the oracle (tensor, row; block mode is
    checked against the oracle in test_cpu_block.py)."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 6, 6, 6)).astype(np.float32)
    for c, (o, k, pad, groups, bs) in [(5, (6, 3, 1, 1, 0)), (5, (7, 1, 0, 1, 0)), (5, (5, 3, 1, 5, 0)),
                                       (6, (9, 3, 1, 1, 3)), (1, (4, 3, 1, 1, 0))]:
        w = qconv.quantize_weight(rng.standard_normal((o, c // groups, k, k)).astype(np.float32), bits=4,
                                  block_size=bs, symmetric=False, groups=groups)
        xc = np.ascontiguousarray(x[:, :c])
        eng = CpuEngine(ConvSpec(w, None, 1, pad, 1, None, aq), threads=2)
        clean = eng.forward(P4.pack_array(xc), "nc4hw4")
        xp = P4.pack_array(xc)
        xp[-1, ..., c % 4:] = garbage
        y = eng.forward(xp, "nc4hw4")
        assert np.array_equal(y.view(np.uint32), clean.view(np.uint32))
        np.testing.assert_array_equal(P4.unpack_array(y, o), eng.forward(xc))
        if aq != "block":
            assert_matches_reference(P4.unpack_array(y, o), xc, w, None, 1, pad, act_quant=aq)


def test_garbage_in_int8_input_padding_lanes_is_ignored():
    rng = np.random.default_rng(13)
    w = qconv.quantize_weight(rng.standard_normal((6, 5, 3, 3)).astype(np.float32))
    eng = CpuEngine(ConvSpec(w, None, 1, 1), threads=2, input_qparams=(0.05, 3))
    xi = P4.pack_array(rng.integers(-128, 128, (2, 5, 6, 6)).astype(np.int8))
    clean = eng.forward(xi, "nc4hw4")
    xi[-1, ..., 1:] = rng.integers(-128, 128, xi[-1, ..., 1:].shape)
    np.testing.assert_array_equal(eng.forward(xi, "nc4hw4"), clean)


@given(case=conv_cases(), aq=st.sampled_from(["tensor", "row"]))
def test_deterministic_across_threads_and_calls(case, aq):
    """1, 2 and 3 threads give the same bits (and the oracle's result); the 2-thread engine really runs the
    threaded quantization and GEMM."""
    geo, weight, x, bias, act = case
    e1 = _engine(weight, bias, geo, act, aq, threads=1)
    e2 = _engine(weight, bias, geo, act, aq, threads=2)
    e3 = _engine(weight, bias, geo, act, aq, threads=3)
    y = e1.forward(x)
    dw = e1.path == "depthwise"   # no separate quantization pass there (quant_threads 0)
    assert e1.last_call["gemm_threads"] == 1 and e1.last_call["quant_threads"] == (0 if dw else 1)
    assert_matches_reference(y, x, weight, bias, **geo.conv_kwargs(), activation=act, act_quant=aq)
    for eng in (e1, e2, e3, e2):
        assert np.array_equal(eng.forward(x).view(np.uint32), y.view(np.uint32))
    assert e2.last_call["gemm_threads"] == 2
    assert e2.last_call["quant_threads"] == (0 if dw else min(2, geo.n * geo.h))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits, bs, aq", [(8, 0, "row"), (4, 32, "row"), (8, 64, "tensor"), (4, 0, "block")])
def test_gemv_channel_split_matches_one_thread(kernel, bits, bs, aq):
    """Fewer column tiles than threads: the threads split the output-channel tiles (7 tiles of 32 here, and
    groups); bitwise the 1-thread result, and the oracle's (tensor, row; block: see test_cpu_block.py). The tiled
    GEMM's split: direct_int8=False (AMX / VNNI machines would take the direct int8 conv for 4 columns or more)."""
    rng = np.random.default_rng(21)
    for o, c, groups, n in [(200, 128, 1, 1), (200, 128, 1, 3), (97, 192, 1, 15), (192, 128, 2, 2)]:
        w = qconv.quantize_weight(rng.standard_normal((o, c // groups, 1, 1)).astype(np.float32), bits=bits,
                                  block_size=bs, symmetric=bits == 8, groups=groups)
        b = rng.standard_normal(o).astype(np.float32)
        x = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
        one = CpuEngine(ConvSpec(w, b, act_quant=aq), threads=1, kernel=kernel, direct_int8=False).forward(x)
        for threads in (2, 3):
            eng = CpuEngine(ConvSpec(w, b, act_quant=aq), threads=threads, kernel=kernel, direct_int8=False)
            y = eng.forward(x)
            assert eng.last_call == dict(quant_threads=0 if aq == "block" else min(threads, n), gemm_threads=threads,
                                         split="channels")
            assert np.array_equal(y.view(np.uint32), one.view(np.uint32))
        if aq != "block":
            assert_matches_reference(one, x, w, b, act_quant=aq)
    # enough columns: the threads split the column tiles instead
    eng = CpuEngine(ConvSpec(w, b, act_quant=aq), threads=2, kernel=kernel, direct_int8=False)
    eng.forward(rng.standard_normal((40, c, 1, 1)).astype(np.float32))
    assert eng.last_call["split"] == "columns"


def test_serial_thresholds_pick_one_thread_and_restore():
    w = qconv.quantize_weight(np.ones((40, 16, 1, 1), np.float32))
    # 18 columns: two column tiles (amx's default is 32); direct_int8=False: the tiled GEMM on AMX machines too
    eng = CpuEngine(ConvSpec(w), threads=2, tile_cols=16, direct_int8=False)
    assert eng.last_call is None
    x = np.ones((2, 16, 3, 3), np.float32)
    with serial_thresholds(macs=1 << 40, quant_values=1 << 40):
        eng.forward(x)
        assert eng.last_call == dict(quant_threads=1, gemm_threads=1, split="columns")
    eng.forward(x)   # the module's thresholds (0) are back
    assert eng.last_call == dict(quant_threads=2, gemm_threads=2, split="columns")
    with pytest.raises(ValueError, match="macs"):
        with serial_thresholds(macs=-1):
            pass


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=conv_cases())
def test_row_mode_batch_equals_rows(kernel, case):
    geo, weight, x, bias, act = case
    eng = _engine(weight, bias, geo, act, "row", threads=2, kernel=kernel)
    y = eng.forward(x)
    for i in range(geo.n):
        assert np.array_equal(eng.forward(np.ascontiguousarray(x[i:i + 1])).view(np.uint32), y[i:i + 1].view(np.uint32))


def test_linear_gemv_shapes():
    """The 1x1-on-1x1 GEMV/LLM case through qconv.Linear, several batches, blockwise int4 and int8."""
    rng = np.random.default_rng(3)
    for bits, bs, sym in [(8, 0, True), (4, 32, False), (4, 0, True), (8, 64, False)]:
        w = qconv.quantize_weight(rng.standard_normal((97, 192)).astype(np.float32), bits=bits, block_size=bs,
                                  symmetric=sym)
        b = rng.standard_normal(97).astype(np.float32)
        lin = qconv.Linear(w, b, device="cpu", threads=2)
        for n in (1, 3, 8, 17, 40):
            x = rng.standard_normal((n, 192)).astype(np.float32)
            y = lin(x)
            assert y.shape == (n, 97)
            assert_matches_reference(y.reshape(n, 97, 1, 1), x.reshape(n, 192, 1, 1), w, b, act_quant="row")


def test_conv2d_layer_dispatch_and_repr():
    rng = np.random.default_rng(0)
    w = qconv.quantize_weight(rng.standard_normal((8, 5, 3, 3)).astype(np.float32), bits=4, block_size=0)
    layer = qconv.Conv2d(w, padding=1, device="cpu", threads=2)
    assert "cpu (" in repr(layer) and "UNIT=32" in repr(layer)
    x = rng.standard_normal((2, 5, 7, 6)).astype(np.float32)
    assert_matches_reference(layer(x), x, w, padding=1)
    y4 = layer(P4.pack_array(x), layout="nc4hw4")
    np.testing.assert_array_equal(P4.unpack_array(y4, 8), layer(x))


def test_env_var_forces_kernel(monkeypatch):
    w = qconv.quantize_weight(np.ones((4, 4, 1, 1), np.float32))
    for k in KERNELS:
        monkeypatch.setenv("QCONV_CPU_KERNEL", k)
        eng = CpuEngine(ConvSpec(w))
        assert eng.kernel == k and k in eng.describe()
    monkeypatch.setenv("QCONV_CPU_KERNEL", "nope")
    with pytest.raises(ValueError, match="QCONV_CPU_KERNEL"):
        CpuEngine(ConvSpec(w))
    for k in KERNEL_NAMES:
        if k not in KERNELS:
            with pytest.raises(ValueError, match="does not support"):
                CpuEngine(ConvSpec(w), kernel=k)


def test_threads_setting():
    w = qconv.quantize_weight(np.ones((4, 4, 1, 1), np.float32))
    eng = CpuEngine(ConvSpec(w), threads=None)
    assert eng.threads >= 1
    eng.threads = 3
    assert eng.threads == 3
    with pytest.raises(ValueError):
        eng.threads = 0
    with pytest.raises(ValueError):
        eng.threads = 10**6


@pytest.mark.parametrize("aq", ["tensor", "row"])
def test_special_inputs(aq):
    """Constant, all-negative with padding (zero must stay exact), zeros, outliers."""
    rng = np.random.default_rng(5)
    w = qconv.quantize_weight(rng.standard_normal((7, 6, 3, 3)).astype(np.float32), bits=4, block_size=3,
                              symmetric=False)
    eng = CpuEngine(ConvSpec(w, None, 1, 2, 1, None, aq), threads=2)
    cases = [np.full((2, 6, 5, 5), 3.7, np.float32), -np.abs(rng.standard_normal((2, 6, 5, 5))).astype(np.float32) - 1,
             np.zeros((1, 6, 4, 4), np.float32), np.abs(rng.standard_normal((1, 6, 5, 5))).astype(np.float32) + 2]
    x = rng.standard_normal((1, 6, 5, 5)).astype(np.float32)
    x[0, 2] *= 1000
    cases.append(x)
    for x in cases:
        assert_matches_reference(eng.forward(x), x, w, padding=2, act_quant=aq)


def test_tiny_inputs_do_not_crash():
    w = qconv.quantize_weight(np.ones((3, 2, 1, 1), np.float32))
    for aq in ("tensor", "row"):
        y = CpuEngine(ConvSpec(w, act_quant=aq), threads=2).forward(np.full((2, 2, 3, 3), 1e-39, np.float32))
        assert np.isfinite(y).all() and (y == 0).all()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(16, 3, 3, 3, 1), (12, 1, 3, 3, 12), (20, 40, 1, 1, 1)])
def test_hardswish_is_the_activation_applied_to_the_plain_output(kernel, shape):
    """activation="hardswish" (GEMM path, depthwise path, pointwise) is bitwise the oracle's float32 hardswish of
    the same layer's output without activation, over values on both sides of -3 and 3."""
    o, i, kh, kw, groups = shape
    rng = np.random.default_rng(o)
    w = qconv.quantize_weight(rng.standard_normal((o, i, kh, kw)).astype(np.float32), groups=groups)
    x = (rng.standard_normal((2, i * groups, 9, 9)) * 3).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    plain = CpuEngine(ConvSpec(w, bias, 1, kh // 2), kernel=kernel, threads=2).forward(x)
    hsw = CpuEngine(ConvSpec(w, bias, 1, kh // 2, activation="hardswish"), kernel=kernel, threads=2).forward(x)
    assert (plain < -3).any() and (plain > 3).any() and ((plain > -3) & (plain < 3)).any()
    np.testing.assert_array_equal(hsw, reference.apply_activation(plain, "hardswish"))


@pytest.mark.parametrize("shape", [(16, 3, 3, 3, 1), (12, 1, 3, 3, 12), (20, 40, 1, 1, 1)])
@pytest.mark.parametrize("act_quant", ["tensor", None])
def test_silu_is_the_same_bits_on_every_kernel_and_within_2_ulp_of_exact(shape, act_quant):
    """activation="silu" (GEMM, direct, direct int8 and depthwise paths): v / (1 + exp(-v)) of the same layer's
    output without activation, within 2 float32 ulp of the float64 value (plus the division's rounding), over
    outputs from -90 to 90 (exp's clamp at both ends included), and, with int8 activations (whose plain outputs are
    the same bits on every kernel), the same bits on every kernel this CPU runs: the exp polynomial's float32
    operations are the same in the scalar, AVX2 and AVX-512 code. Below -87 exp's
    argument is clamped: silu is then below 1e-30 in magnitude instead of smaller still."""
    o, i, kh, kw, groups = shape
    rng = np.random.default_rng(o)
    w = qconv.quantize_weight(rng.standard_normal((o, i, kh, kw)).astype(np.float32), groups=groups)
    x = (rng.standard_normal((2, i * groups, 9, 9)) * 30).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    outs = {}
    for kernel in KERNELS:
        plain = CpuEngine(ConvSpec(w, bias, 1, kh // 2, act_quant=act_quant), kernel=kernel, threads=2).forward(x)
        y = CpuEngine(ConvSpec(w, bias, 1, kh // 2, activation="silu", act_quant=act_quant), kernel=kernel,
                      threads=2).forward(x)
        assert (plain < -88).any() and (plain > 88).any() and (np.abs(plain) < 1).any()
        p64 = plain.astype(np.float64)
        exact = p64 / (1 + np.exp(-p64))
        bad = np.abs(y - exact) > 3 * np.spacing(np.abs(exact).astype(np.float32)) + 1e-30
        assert not bad.any(), (kernel, p64[bad][:5], exact[bad][:5], y[bad][:5])
        for k2, (plain2, y2) in outs.items():   # the same plain output: the same silu
            if np.array_equal(plain, plain2):
                np.testing.assert_array_equal(y, y2, err_msg=f"{kernel} vs {k2}")
        outs[kernel] = plain, y


def test_the_tail_activations_are_the_same_bits_in_scalar_and_avx2_code():
    """qc_tail's scalar and AVX2 code (the AVX-512 epilogue's is checked through the direct int8 conv above):
    silu and hardswish give the same bits over values from -120 to 120, both sides of exp's clamp, signed zeros."""
    from qconv._ext import _cpu_testing

    rng = np.random.default_rng(7)
    v = np.concatenate([rng.uniform(-120, 120, 4000), rng.standard_normal(4000),
                        [0.0, -0.0, 87.0, -87.0, 88.0, -88.0, 1e-30, -1e-30, 3.0, -3.0]]).astype(np.float32)
    for code in (V.ACTIVATION_CODES["silu"], V.ACTIVATION_CODES["hardswish"]):
        scalar = _cpu_testing._test_tail(v, code, 0)
        if "avx2" in KERNELS:
            np.testing.assert_array_equal(_cpu_testing._test_tail(v, code, 1), scalar)
    silu = _cpu_testing._test_tail(v, V.ACTIVATION_CODES["silu"], 0)
    v64 = v.astype(np.float64)
    exact = v64 / (1 + np.exp(-v64))
    assert (np.abs(silu - exact) <= 3 * np.spacing(np.abs(exact).astype(np.float32)) + 1e-30).all()
    np.testing.assert_array_equal(_cpu_testing._test_tail(v, 0, 0), v)   # code 0: untouched


@pytest.mark.parametrize("variant, kernel", [(1, "avx2"), (2, "avx512vnni")])
def test_hardswish_product_form_is_the_division_on_every_float32(variant, kernel):
    """hardswish's two vector forms (qconv_kernels.h: the division by 6, and the product by float32(1/6) with one
    remainder correction, which Intel CPUs run) give the same bits on all 2^32 float32 bit patterns, NaN for NaN.
    Each epilogue runs one of them (``$QCONV_HSWISH``, else by CPU vendor), so each kernel's results do not depend on
    which."""
    from qconv._ext import _cpu_testing

    if kernel not in KERNELS:
        pytest.skip(f"this CPU cannot run the {kernel!r} kernel")
    assert _cpu_testing._test_hswish_mismatches(variant) == 0


_HSWISH_CHILD = """
import sys, numpy as np, qconv
from qconv._ext import _cpu
from qconv.cpu import CpuEngine
from qconv.geometry import ConvSpec
rng = np.random.default_rng(3)
x = rng.standard_normal((1, 24, 20, 20)).astype(np.float32) * 4
x.reshape(-1)[:64] = [0.0, -0.0, 1e-39, -1e-39, 1e-37, -3.0, -2.9999998, 3.0] * 8
outs = []
for kernel in sys.argv[2:]:
    for groups, k, aq in ((24, 3, None), (24, 5, None), (1, 3, None), (1, 3, "tensor"), (1, 1, "tensor")):
        w = qconv.quantize_weight(rng.standard_normal((24, 24 // groups, k, k)).astype(np.float32), groups=groups)
        spec = ConvSpec(w, rng.standard_normal(24).astype(np.float32), (1, 1), (k // 2, k // 2), (1, 1),
                        "hardswish", aq)
        outs.append(CpuEngine(spec, threads=2, kernel=kernel).forward(x))
np.save(sys.argv[1], np.concatenate([o.ravel() for o in outs]))
print(_cpu.hswish_form())
"""


def test_hardswish_forms_give_the_same_layers(tmp_path):
    """Layers with hardswish (depthwise, direct float, direct int8 and GEMM paths, each kernel this CPU runs) give
    the same bits with ``$QCONV_HSWISH=mul`` and ``=div``, each in a fresh process (the form is decided at import)."""
    import os
    import subprocess
    import sys

    got = {}
    for form in ("mul", "div"):
        out = tmp_path / f"{form}.npy"
        r = subprocess.run([sys.executable, "-c", _HSWISH_CHILD, str(out), *KERNELS], capture_output=True, text=True,
                           env={**os.environ, "QCONV_HSWISH": form}, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split()[-1] == form
        got[form] = np.load(out)
    assert np.array_equal(got["mul"].view(np.uint32), got["div"].view(np.uint32))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("direct", [False, True])
def test_float_activations_take_nonfinite_through_the_layer(kernel, direct):
    """act_quant=None (float activations) has no quantization pass: the GEMM path's pixel-major copy of the input,
    and the direct path's phase planes or in-place strips, refuse NaN / inf (NCHW and NC4HW4 lane by lane), and
    NC4HW4 padding lanes stay ignored."""
    rng = np.random.default_rng(3)
    w = qconv.quantize_weight(rng.standard_normal((8, 6, 3, 3)).astype(np.float32), bits=4, block_size=2,
                              symmetric=False)
    layer = qconv.Conv2d(w, padding=1, act_quant=None, kernel=kernel, threads=2, direct=direct)
    assert layer.engine.rejects_nonfinite and layer.engine.path == ("direct" if direct else "gemm")
    x = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    xp = P4.pack_array(x)
    xp[-1, ..., 2:] = np.nan
    np.testing.assert_array_equal(P4.unpack_array(layer(xp, layout="nc4hw4"), 8), layer(x))
    for i, bad in enumerate((np.inf, -np.inf, np.nan)):
        xb = x.copy()
        xb[1, 2 + i, 3, 4 - i] = bad
        for layout, xin in (("nchw", xb), ("nc4hw4", P4.pack_array(xb))):
            with pytest.raises(ValueError, match="NaN or inf"):
                layer(xin, layout=layout)
    wide = qconv.Conv2d(qconv.quantize_weight(rng.standard_normal((4, 16, 1, 1)).astype(np.float32)), act_quant=None,
                        kernel=kernel, threads=2, direct=direct)   # 16 channels: the 8x8 transpose blocks
    xw = rng.standard_normal((1, 16, 3, 9)).astype(np.float32)
    xw[0, 11, 1, 6] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        wide(xw)
    # direct path in place (1x1, stride 1): full strips and the gathered last one; strided: the values no
    # output reads are checked too
    for shape, at, stride in [((2, 16, 7, 9), (1, 3, 0, 2), 1), ((2, 16, 7, 9), (1, 15, 6, 8), 1),
                              ((1, 16, 12, 12), (0, 5, 1, 1), 2)]:
        xs = rng.standard_normal(shape).astype(np.float32)
        xs[at] = np.inf
        strided = qconv.Conv2d(wide.weight, stride=stride, act_quant=None, kernel=kernel, threads=2, direct=direct)
        with pytest.raises(ValueError, match="NaN or inf"):
            strided(xs)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(16, 3, 3, 3, 1), (16, 8, 1, 1, 1), (12, 1, 3, 3, 12), (40, 20, 1, 1, 2)])
@pytest.mark.parametrize("aq", ["tensor", None])
def test_post_affine_is_y_times_scale_plus_shift(kernel, shape, aq):
    """post_affine=(s, t) (GEMM, direct, depthwise and grouped pointwise paths) is bitwise the layer's output without it,
    times s plus t in float32 (two roundings), after a hardswish; the oracle applies the same rule."""
    o, i, kh, kw, groups = shape
    rng = np.random.default_rng(o + 1)
    w = qconv.quantize_weight(rng.standard_normal((o, i, kh, kw)).astype(np.float32), groups=groups)
    x = (rng.standard_normal((2, i * groups, 7, 7)) * 3).astype(np.float32)
    ps = (rng.standard_normal(o) * 1.7).astype(np.float32)
    pt = rng.standard_normal(o).astype(np.float32)
    kw_ = dict(kernel=kernel, threads=2)
    plain = CpuEngine(ConvSpec(w, None, 1, kh // 2, activation="hardswish", act_quant=aq), **kw_).forward(x)
    post = CpuEngine(ConvSpec(w, None, 1, kh // 2, activation="hardswish", act_quant=aq, post_affine=(ps, pt)),
                     **kw_).forward(x)
    want = plain * ps.reshape(1, o, 1, 1) + pt.reshape(1, o, 1, 1)
    np.testing.assert_array_equal(post, want)
    ref = reference.conv2d(x, w, None, 1, kh // 2, activation="hardswish", act_quant=aq, post_affine=(ps, pt))
    ref_plain = reference.conv2d(x, w, None, 1, kh // 2, activation="hardswish", act_quant=aq)
    np.testing.assert_array_equal(ref, ref_plain * ps.reshape(1, o, 1, 1) + pt.reshape(1, o, 1, 1))
    with pytest.raises(ValueError, match="post_affine"):
        ConvSpec(w, post_affine=(ps[:-1], pt[:-1]))


def test_depthwise_many_groups():
    rng = np.random.default_rng(2)
    w = qconv.quantize_weight(rng.standard_normal((48, 1, 3, 3)).astype(np.float32), groups=48)
    x = rng.standard_normal((2, 48, 9, 9)).astype(np.float32)
    eng = CpuEngine(ConvSpec(w, None, 2, 1, 1, "relu", "tensor"), threads=2)
    assert_matches_reference(eng.forward(x), x, w, None, 2, 1, 1, "relu")


def test_scratch_is_one_arena_per_thread():
    """Engines keep no scratch between calls: each call binds views of the calling thread's arena and releases
    them; the arena holds about the largest layer's scratch, not the sum over layers and shapes."""
    from qconv.cpu import scratch
    rng = np.random.default_rng(0)
    scratch.release()
    big = CpuEngine(ConvSpec(qconv.quantize_weight(rng.standard_normal((64, 32, 3, 3)).astype(np.float32)),
                             None, 1, 1), threads=2)
    small = CpuEngine(ConvSpec(qconv.quantize_weight(rng.standard_normal((8, 4, 3, 3)).astype(np.float32)),
                               None, 1, 1), threads=2)
    xb = rng.standard_normal((1, 32, 24, 24)).astype(np.float32)
    yb = big.forward(xb)
    assert not big._plan.bound     # released after the call
    held = scratch.arena().nbytes
    assert held > 24 * 24 * 32     # at least the quantized input
    for s in range(5, 11):         # other layers and shapes reuse it
        small.forward(rng.standard_normal((1, 4, s, s)).astype(np.float32))
        assert not small._plan.bound
    assert scratch.arena().nbytes == held
    np.testing.assert_array_equal(big.forward(xb), yb)
    # another thread has its own arena; releasing this one frees it and the next call allocates again
    import threading
    t = threading.Thread(target=lambda: small.forward(xb[:, :4, :8, :8]))
    t.start()
    t.join()
    assert scratch.arena().nbytes == held
    scratch.release()
    assert scratch.arena().nbytes == 0
    np.testing.assert_array_equal(big.forward(xb), yb)


def test_arena_views_are_reused_until_a_buffer_grows():
    """``Arena.take_all`` returns the same views for the same sizes (a small layer's per-call set-up) and new ones
    once one of the arena's buffers was replaced: never a view of a freed buffer. Layers alternating with a growing
    one on the same thread keep their exact results."""
    from qconv.cpu import scratch
    ar = scratch.Arena()
    sizes = (("a", 10, np.dtype(np.float32)), ("b", 3, np.dtype(np.int32)))
    v1 = ar.take_all(sizes)
    v2 = ar.take_all(sizes)
    assert all(v1[k] is v2[k] for k in v1) and v1 is not v2
    ar.take("a", 1000, np.float32)                 # "a" grows: its old buffer is dropped
    v3 = ar.take_all(sizes)
    assert np.shares_memory(v3["a"], ar._bufs["a"]) and not np.shares_memory(v1["a"], ar._bufs["a"])
    ar.clear()
    assert not np.shares_memory(ar.take_all(sizes)["b"], v3["b"])
    rng = np.random.default_rng(4)
    small = CpuEngine(ConvSpec(qconv.quantize_weight(rng.standard_normal((8, 4, 3, 3)).astype(np.float32)),
                               None, 1, 1), threads=2)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    y = small.forward(x)
    for c in (8, 16, 32, 64):   # each bigger layer replaces arena buffers the small layer's cached views held
        w = qconv.quantize_weight(rng.standard_normal((16, c, 3, 3)).astype(np.float32))
        xb = rng.standard_normal((1, c, 16, 16)).astype(np.float32)
        big = CpuEngine(ConvSpec(w, None, 1, 1), threads=2)
        assert_matches_reference(big.forward(xb), xb, w, None, 1, 1)
        np.testing.assert_array_equal(small.forward(x), y)


def test_depthwise_layer_prepares_no_gemm_plan():
    """A layer the depthwise path runs builds no GEMM tiles, tables or native plan (memory of whole models)."""
    rng = np.random.default_rng(1)
    w = qconv.quantize_weight(rng.standard_normal((96, 1, 5, 5)).astype(np.float32), groups=96)
    eng = CpuEngine(ConvSpec(w, None, 1, 2), threads=2)
    assert eng.path == "depthwise" and eng._plan is None and eng.layout is None
    assert eng.nbytes == eng._dw.nbytes < 96 * 25 * 4 + 4 * 96 * 4
    gen = CpuEngine(ConvSpec(w, None, 1, 2), threads=2, depthwise=False)
    assert gen.path == "gemm" and gen.nbytes > 10 * eng.nbytes
    x = rng.standard_normal((1, 96, 12, 12)).astype(np.float32)
    np.testing.assert_array_equal(eng.forward(x), gen.forward(x))


# --- static int8 path -------------------------------------------------------------------------------------------
def _static_ref(xi, in_scale, in_zp, w, bias, geo_kw, act):
    xd = ((xi.astype(np.float64) - in_zp) * np.float64(in_scale)).astype(np.float32)
    y = reference.float_conv2d(xd, w.dequantize(), bias, groups=w.groups, **geo_kw)
    return reference.apply_activation(y, act)


@pytest.mark.parametrize("kernel", KERNELS)
@given(case=conv_cases(), zp=st.integers(-128, 127), out_int8=st.booleans(), nc4hw4=st.booleans())
def test_static_int8(kernel, case, zp, out_int8, nc4hw4):
    geo, weight, x, bias, act = case
    rng = np.random.default_rng(abs(hash(zp)) % 2**31)
    xi = rng.integers(-128, 128, (geo.n, geo.c, geo.h, geo.w)).astype(np.int8)
    in_scale = np.float32(0.05)
    out = (0.1, -7) if out_int8 else None
    eng = _engine(weight, bias, geo, act, "tensor", kernel=kernel, threads=2, input_qparams=(in_scale, zp),
                  output_qparams=out)
    assert eng.int8_input
    y = eng.forward(P4.pack_array(xi), "nc4hw4") if nc4hw4 else eng.forward(xi)
    if nc4hw4:
        y = P4.unpack_array(y, weight.out_channels)
    ref = _static_ref(xi, in_scale, zp, weight, bias, geo.conv_kwargs(), act)
    mag = reference.float_conv2d(np.abs(((xi.astype(np.float64) - zp) * in_scale)).astype(np.float32),
                                 np.abs(weight.dequantize()), None if bias is None else np.abs(bias),
                                 groups=weight.groups, **geo.conv_kwargs()).max()
    if out is None:
        assert y.dtype == np.float32
        assert np.abs(y - ref).max() <= 1e-5 * max(mag, 1e-30)
    else:
        assert y.dtype == np.int8
        want = np.clip(round_half_away((ref / np.float32(0.1)).astype(np.float32)) + out[1], -128, 127)
        diff = np.abs(y.astype(np.int64) - want)
        assert diff.max() <= 1   # float rounding order may move a value across a .5 boundary
        if act in ("relu", "relu6"):
            assert y.min() >= out[1]


def test_static_int8_through_layer():
    rng = np.random.default_rng(4)
    w = qconv.quantize_weight(rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
    layer = qconv.Conv2d(w, padding=1, activation="relu", device="cpu", input_qparams=(0.02, 5),
                         output_qparams=(0.05, -128))
    xi = rng.integers(-128, 128, (1, 3, 6, 6)).astype(np.int8)
    y = layer(xi)
    assert y.dtype == np.int8 and y.min() >= -128
    with pytest.raises(TypeError):
        layer(xi.astype(np.float32))


@pytest.mark.parametrize("bad, err", [
    (dict(input_qparams=(0.0, 0)), ValueError),
    (dict(input_qparams=(1.0, 200)), ValueError),
    (dict(input_qparams=(float("nan"), 0)), ValueError),
    (dict(input_qparams=5), TypeError),
    (dict(output_qparams=("a", 0)), TypeError),
    (dict(output_qparams=(1.0, 1.5)), ValueError),
    (dict(tile_cols=0), ValueError),
    (dict(kernel="sse"), ValueError),
])
def test_bad_options(bad, err):
    w = qconv.quantize_weight(np.ones((4, 4, 1, 1), np.float32))
    with pytest.raises(err):
        CpuEngine(ConvSpec(w), **bad)


def test_bad_inputs_never_crash():
    w = qconv.quantize_weight(np.ones((4, 6, 3, 3), np.float32))
    eng = CpuEngine(ConvSpec(w, padding=1), threads=2)
    for x, layout in [(np.zeros((1, 5, 4, 4), np.float32), "nchw"), (np.zeros((1, 6, 4), np.float32), "nchw"),
                      (np.zeros((1, 6, 4, 4), np.float64), "nchw"), (np.zeros((3, 1, 4, 4, 4), np.float32), "nc4hw4"),
                      (np.zeros((1, 6, 0, 4), np.float32), "nchw"), (np.zeros((1, 6, 4, 4), np.float32), "nhwc")]:
        with pytest.raises((ValueError, TypeError)):
            eng.forward(x, layout)
    with pytest.raises(ValueError, match="output height"):
        CpuEngine(ConvSpec(w), threads=2).forward(np.zeros((1, 6, 1, 1), np.float32))
    with pytest.raises(ValueError, match="act_quant"):
        CpuEngine(ConvSpec(w, act_quant="channel"))
    for aq in ("tensor", "row"):
        e = CpuEngine(ConvSpec(w, padding=1, act_quant=aq), threads=2)
        for bad in (np.nan, np.inf, -np.inf):
            x = np.zeros((2, 6, 4, 4), np.float32)
            x[1, 3, 2, 1] = bad
            with pytest.raises(ValueError, match="NaN or infinite"):
                e.forward(x)


def test_too_long_block_rejected():
    w = qconv.QuantizedWeight(np.zeros((1, 8192, 3, 3), np.int8), np.ones((1, 1), np.float32), None, 8)
    with pytest.raises(ValueError, match="too long"):
        CpuEngine(ConvSpec(w))


@pytest.mark.parametrize("case", ["depthwise", "direct float", "direct int8", "gemm int8", "gemm 1x1 pixel"])
def test_forward_nchw_unchecked_is_forward(case):
    """The session kernels' entry (no Python checks) runs the same path as forward: the same bits on every path,
    and a non-finite input is still refused (natively)."""
    rng = np.random.default_rng(11)
    o, i, k, groups, act, hw = {"depthwise": (24, 24, 3, 24, None, 9), "direct float": (20, 12, 3, 1, None, 9),
                                "direct int8": (20, 12, 3, 1, "tensor", 9), "gemm int8": (20, 12, 1, 1, "row", 3),
                                "gemm 1x1 pixel": (20, 12, 1, 1, "tensor", 1)}[case]
    w = rng.standard_normal((o, i // groups, k, k)).astype(np.float32)
    spec = ConvSpec(qconv.quantize_weight(w, bits=8, symmetric=False, groups=groups), None, 1, k // 2, 1, "relu", act)
    eng = CpuEngine(spec, threads=2)
    x = rng.standard_normal((2, i, hw, hw)).astype(np.float32)
    want = eng.forward(x, "nchw")
    y = np.full_like(want, np.nan)
    assert eng.forward_nchw_unchecked(x, y) is y
    np.testing.assert_array_equal(y, want)
    x[1, 0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        eng.forward_nchw_unchecked(x, y)


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 70), o=st.integers(1, 80), k=st.sampled_from([1, 3]), bits=st.sampled_from([8, 4]),
       block=st.sampled_from([0, 16, 32]), sym=st.booleans(), half=st.booleans(), n=st.integers(1, 2),
       act=st.sampled_from([None, "relu6", "hardswish"]), threads=st.sampled_from([1, 2]),
       kernel=st.sampled_from(sorted(k_ for k_ in ("avx2", "avx512vnni", "scalar") if _cpu.kernel_supported(k_))),
       seed=st.integers(0, 2**31))
def test_float_activations_on_one_output_pixel(c, o, k, bits, block, sym, half, n, act, threads, kernel, seed):
    """act_quant=None on the GEMM path with one output column per sample (a linear layer on one row, a conv on one
    pixel: qconv_float.h's one-column kernel for int8 codes) against the oracle: taps with padding, blocks,
    offsets, float16 and float32 tables, and enough multiply-adds that two threads split the channels."""
    rng = np.random.default_rng(seed)
    if block and c % block:
        block = 0
    w = qconv.quantize_weight((rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32), bits=bits,
                              block_size=block, symmetric=sym, scale_dtype="float16" if half else "float32")
    bias = rng.standard_normal(o).astype(np.float32)
    x = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
    layer = qconv.Conv2d(w, bias, padding=k // 2, activation=act, act_quant=None, kernel=kernel, threads=threads,
                         direct=False)
    with serial_thresholds(macs=0 if threads > 1 else None):
        y = layer(x)
    assert_matches_reference(y, x, w, bias, padding=k // 2, activation=act, act_quant=None)


def test_last_call_is_none_before_the_first_call():
    w = qconv.quantize_weight(np.ones((8, 8, 3, 3), np.float32))
    for act in (None, "tensor", "row"):
        layer = qconv.Conv2d(w, act_quant=act, threads=1)
        assert layer.engine.last_call is None
        layer(np.ones((1, 8, 3, 3), np.float32))   # one output pixel: the GEMM path
        assert layer.engine.last_call["gemm_threads"] == 1
