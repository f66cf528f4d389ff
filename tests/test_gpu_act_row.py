"""OpenCL engine with ``act_quant="row"`` (int8 activations per sample): ``gemv_a8`` for linear layers on one
row matches the oracle to 1e-5 (integer sums exact), the other shapes (float kernels on ``quant_rows``'s
dequantized input) to 1e-4; the quantization itself is bit-exact (ties, zero and tiny inputs).

Runs on every visible OpenCL device (PoCL in CI: the portable dp4a; the H200 run covers the PTX one).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qconv
from qconv import gpu, reference
from qconv.geometry import ConvSpec
from qconv.gpu.families import Problem, gemv_a8
from qconv.testing import assert_matches_reference
from qconv.testing.asserts import RTOL_FLOAT
from qconv.testing.strategies import activations, conv_geometries

from test_gpu_engine import _PROP, P4, _draw_layer, _forward, _weight, cl_device  # noqa: F401


def _row_engine(weight, bias=None, stride=1, padding=0, activation=None, device=None, **opts):
    spec = ConvSpec(weight, bias, stride, padding, 1, activation, "row")
    opts.setdefault("tune", "none")
    return gpu.OpenCLEngine(spec, device=device, **opts)


def _program(eng, layout, n, h, w):
    return eng.plans[(layout, n, h, w)].cand.program


@settings(_PROP, max_examples=16)
@given(data=st.data())
def test_gemv_a8_matches_reference(cl_device, data):
    """gemv_a8: both variants, split-K local sizes, both layouts, odd channel counts, every scheme; blocks
    that do not fit its chunks run the float kernels on quantized rows (and a forced variant says why)."""
    geo = data.draw(conv_geometries(pointwise=True, max_channels=80, max_out_channels=13, max_spatial=1,
                                    max_batch=1))
    weight, bias, act = _draw_layer(data, geo)
    layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
    variant = data.draw(st.sampled_from([None] + sorted(gpu.A8_VARIANTS)))
    lws = data.draw(st.sampled_from([None, (1, 1, 1), (2, 2, 1), (4, 4, 1), (8, 1, 1), (2, 8, 1), (3, 5, 1)]))
    x = data.draw(activations((1, geo.c, 1, 1)))
    try:
        eng = _row_engine(weight, bias, activation=act, device=cl_device, image=False, variant=variant,
                          local_size=lws)
        y = _forward(eng, x, layout)
    except ValueError as exc:
        pow2 = lws is None or lws[0] * lws[1] & (lws[0] * lws[1] - 1) == 0
        assert variant is not None and ("multiple or a divisor" in str(exc)
                                        or (gpu.A8_VARIANTS[variant][1] and not pow2 and "power of two" in str(exc)))
        return
    if _program(eng, layout, 1, 1, 1) == "gemv_a8":
        assert variant is None or eng.plans[(layout, 1, 1, 1)].variant == variant
        assert_matches_reference(y, x, weight, bias, activation=act, act_quant="row")
    else:
        assert variant is None and weight.n_blocks > 1
        assert_matches_reference(y, x, weight, bias, activation=act, act_quant="row", rtol=RTOL_FLOAT)


@pytest.mark.parametrize("bits,block,sym", [(8, 0, True), (4, 32, False), (4, 0, True), (8, 64, False),
                                            (4, 8, True), (8, 4, False)])
def test_gemv_a8_long_k(cl_device, bits, block, sym):
    """1024 input channels over split-K lanes, every variant, fp16 scales."""
    rng = np.random.default_rng(7)
    w = _weight(rng, 37, 1024, 1, bits, block, sym)
    half = lambda a: None if a is None else a.astype(np.float16).astype(np.float32)  # noqa: E731
    w16 = qconv.QuantizedWeight(w.q, half(w.scales), half(w.offsets), bits, block)
    x = rng.standard_normal((1, 1024, 1, 1)).astype(np.float32)
    for variant, lws in (("gemv_a8_c1", (4, 16, 1)), ("gemv_a8_c2", (8, 4, 1)), ("gemv_a8_c2", (2, 32, 1)),
                         ("gemv_a8f_c1", (16, 4, 1)), ("gemv_a8f_c2", (4, 8, 1)), ("gemv_a8f_c1", (1, 2, 1))):
        eng = _row_engine(w16, device=cl_device, image=False, variant=variant, local_size=lws)
        assert eng.scale_layout.dtype == "float16"
        assert_matches_reference(eng.forward(x), x, w16, act_quant="row")


@pytest.mark.parametrize("bits,block,sym", [(4, 0, True), (8, 0, False), (4, 32, False)])
def test_gemv_a8_many_tiles_per_work_group(cl_device, bits, block, sym):
    """More tiles of output channels than the grid has work-groups (1100 channels in tiles of 4 or 8 on any
    device's compute units): every group loops over several tiles, loading each next tile's first weights
    during the previous tile's reduction; every variant matches the oracle."""
    rng = np.random.default_rng(3)
    w = _weight(rng, 1100, 96, 1, bits, block, sym)
    x = rng.standard_normal((1, 96, 1, 1)).astype(np.float32)
    for variant in sorted(gpu.A8_VARIANTS):
        eng = _row_engine(w, device=cl_device, image=False, variant=variant, local_size=(4, 2, 1))
        assert eng.device.max_compute_units < 1100 // (4 * gpu.A8_VARIANTS[variant][0])  # tiles > groups
        y = eng.forward(x)
        assert eng.plans[("nchw", 1, 1, 1)].cand.program == "gemv_a8"
        assert_matches_reference(y, x, w, act_quant="row")


@pytest.mark.parametrize("bits,block,sym", [(8, 0, True), (4, 0, True), (4, 32, False)])
def test_gemv_a8_every_tuner_size(cl_device, bits, block, sym):
    """Every (l0, SPLIT, g) the tuner may time for the fused variants matches the oracle. On NVIDIA these
    start with the balanced tiles (l0 about OCp / (g * compute units), whole warps): for 1100 channels on
    the H200's 132 units, l0 = 6 and 10 (int8, c1), not powers of two."""
    import pyopencl.array as cla
    rng = np.random.default_rng(5)
    w = _weight(rng, 1100, 256, 1, bits, block, sym)
    x = rng.standard_normal((1, 256, 1, 1)).astype(np.float32)
    for variant in ("gemv_a8f_c1", "gemv_a8f_c2"):
        eng = _row_engine(w, device=cl_device, image=False, variant=variant)
        sizes = gemv_a8.local_sizes(eng, *gpu.A8_VARIANTS[variant])
        assert sizes
        if eng.nv_ptx:
            assert sizes[:2] == gemv_a8.balanced_sizes(eng, gpu.A8_VARIANTS[variant][0], 8 if bits == 4 else 16)
        [cand] = gemv_a8.candidates(eng, Problem("nchw", 1, 1, 1, 1, 1))
        xd = cla.to_device(eng.queue, x)
        for lws in sizes:
            yd = cla.zeros(eng.queue, (1, 1100, 1, 1), np.float32) + np.float32(np.nan)
            cand.launch(eng.queue, lws, (xd.base_data, yd.base_data))
            assert_matches_reference(yd.get(), x, w, act_quant="row")


def test_row_quantization_is_bit_exact(cl_device):
    """The device quantizes like the oracle: half away from zero at ties, clipped, zero and tiny inputs."""
    rng = np.random.default_rng(11)
    k = 16
    eye = qconv.quantize_weight(np.eye(k, dtype=np.float32).reshape(k, k, 1, 1), bits=8)
    ties = np.array([127, 0.5, -0.5, 1.5, -2.5, 126.5, -126.5, 3.4999998, 2.5000002, 0, -127, 63.5, 7, -0.49999997,
                     100.5, -1], np.float32)
    for variant in sorted(gpu.A8_VARIANTS):  # quant_x_a8, and the fused variants' own quantization
        eng = _row_engine(eye, device=cl_device, image=False, variant=variant)
        for x in (ties, ties * np.float32(0.75), np.zeros(k, np.float32), np.full(k, 1e-39, np.float32),
                  rng.standard_normal(k).astype(np.float32)):
            x4 = x.reshape(1, k, 1, 1)
            y = eng.forward(x4)
            assert _program(eng, "nchw", 1, 1, 1) == "gemv_a8"
            aq = reference.quantize_activation(x4, "row")
            assert_matches_reference(y, x4, eye, act_quant="row")
            # the identity gives y = dx * xq (s * q = 1 up to rounding): xq comes back exactly
            np.testing.assert_array_equal(np.round(y.ravel() / aq.scale[0]).astype(np.int64), aq.xq.ravel())
    eng = _row_engine(eye, device=cl_device, image=False)
    ties2 = np.stack([ties, -ties * np.float32(0.5)]).reshape(2, k, 1, 1)  # two rows: quant_rows + float kernels
    y2 = eng.forward(ties2)
    assert _program(eng, "nchw", 2, 1, 1) != "gemv_a8"
    assert_matches_reference(y2, ties2, eye, act_quant="row", rtol=RTOL_FLOAT)


@pytest.mark.parametrize("one_group", [True, False])
@pytest.mark.parametrize("layout", ["nchw", "nc4hw4"])
def test_other_shapes_run_on_quantized_rows(cl_device, layout, one_group, monkeypatch):
    """Convs and batched 1x1 layers: per-sample quantization (NC4HW4 padding lanes left out, even NaN), in one
    launch per sample's work-group (small samples) or after row_amax's partial maxima (large ones)."""
    from qconv.gpu.families import act_quant

    monkeypatch.setattr(act_quant, "ONE_GROUP_MAX", act_quant.ONE_GROUP_MAX if one_group else 0)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 5, 7, 6)).astype(np.float32)
    x[1] *= 40  # samples with different ranges: one scale each
    for w, pad in ((_weight(rng, 6, 5, 3, 8, 0, False), 1), (_weight(rng, 7, 5, 1, 4, 0, True), 0)):
        eng = _row_engine(w, None, 1, pad, "relu", cl_device)
        if layout == "nchw":
            y = eng.forward(x)
        else:
            xp = P4.pack_array(x)
            xp[-1, ..., 1:] = np.nan
            y = P4.unpack_array(eng.forward(xp, "nc4hw4"), w.out_channels)
        assert "quant_rows" in eng.describe() and ("row_amax" in eng.describe()) != one_group, eng.describe()
        assert_matches_reference(y, x, w, None, 1, pad, 1, "relu", act_quant="row", rtol=RTOL_FLOAT)
        x2 = -x[:, :, ::-1].copy()  # a second call reuses the plan's scratch buffer
        y2 = eng.forward(x2) if layout == "nchw" else P4.unpack_array(eng.forward(P4.pack_array(x2), "nc4hw4"),
                                                                      w.out_channels)
        assert_matches_reference(y2, x2, w, None, 1, pad, 1, "relu", act_quant="row", rtol=RTOL_FLOAT)


def test_a8_candidates_and_errors(cl_device):
    rng = np.random.default_rng(13)
    w = _weight(rng, 12, 64, 1, 4, 32, False)
    eng = _row_engine(w, device=cl_device, image=False)
    assert {c.variant for c in eng._plan_for("nchw", 1, 1, 1)[0].cand} == set(gpu.A8_VARIANTS)
    assert not any(c.program == "gemv_a8" for c in eng._plan_for("nchw", 2, 1, 1)[0].cand)
    forced = _row_engine(w, device=cl_device, image=False, variant="gemv_a8_c2")
    with pytest.raises(ValueError, match="one row"):
        forced.forward(np.zeros((2, 64, 1, 1), np.float32))
    with pytest.raises(ValueError, match="multiple or a divisor"):
        _row_engine(_weight(rng, 4, 48, 1, 4, 4, True), device=cl_device, variant="gemv_a8_c1")
    with pytest.raises(ValueError, match="power of two"):  # the fused variants' amax tree (6: not whole warps)
        _row_engine(w, device=cl_device, image=False, variant="gemv_a8f_c1", local_size=(3, 2, 1)).forward(
            np.zeros((1, 64, 1, 1), np.float32))
    with pytest.raises(ValueError, match="variant"):
        gpu.OpenCLEngine(ConvSpec(w, act_quant=None), device=cl_device, variant="gemv_a8_c1")
    with pytest.raises(ValueError, match="act_quant"):
        gpu.OpenCLEngine(ConvSpec(w, act_quant="block"), device=cl_device)
    assert "int8 activations per row" in eng.describe()
    import pyopencl.array as cla  # device arrays in and out, on a queue of the caller's
    import pyopencl as cl
    queue = cl.CommandQueue(eng.ctx)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((1, 64, 1, 1)).astype(np.float32)
        y = eng.forward(cla.to_device(queue, x))
        assert y.queue is queue
        assert_matches_reference(y.get(), x, w, act_quant="row")


def test_linear_layer_gpu_equals_cpu(cl_device):
    """``qconv.Linear(act_quant="row")``: the GPU and CPU engines agree to the integer-path tolerance."""
    rng = np.random.default_rng(14)
    w = _weight(rng, 24, 96, 1, 4, 32, False)
    b = rng.standard_normal(24).astype(np.float32)
    x = rng.standard_normal((1, 96)).astype(np.float32)
    gpu_lin = qconv.Linear(w, b, device=cl_device, act_quant="row", tune="none")
    cpu_lin = qconv.Linear(w, b, device="cpu", act_quant="row")
    y_gpu, y_cpu = gpu_lin(x), cpu_lin(x)
    assert "gemv_a8" in gpu_lin.engine.describe()
    scale = float(np.abs(y_cpu).max())
    np.testing.assert_allclose(y_gpu, y_cpu, rtol=0, atol=1e-5 * scale * 8)
