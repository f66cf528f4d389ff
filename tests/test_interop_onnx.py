"""ONNX converters: numpy round trips always; onnx.reference and onnxruntime as oracles when installed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qconv
from qconv.interop import onnx_format as of
from qconv.interop._common import exact_values
from interop_support import assert_same_values, check_report, normalized, raw_weights


def dq_values(dq: of.DQWeight) -> np.ndarray:
    """Exact float64 ``(x - zero_point) * scale`` with DequantizeLinear-21 broadcasting, in x's shape."""
    x = dq.x.astype(np.float64)
    z = 0 if dq.zero_point is None else of._expand(dq.zero_point, x.shape, dq.axis, dq.block_size, "zp")
    return (x - z) * of._expand(dq.scale, x.shape, dq.axis, dq.block_size, "scale").astype(np.float64)


def rows(values, layout):
    """DequantizeLinear output -> (O, K)."""
    return values.reshape(values.shape[0], -1) if layout == "conv" else values.T


def nbits_values(m: of.MatMulNBitsWeight) -> np.ndarray:
    """Exact float64 (N, K) values of MatMulNBits inputs, decoded independently of qconv's reader."""
    kb = -(-m.K // m.block_size)
    if m.bits == 8:
        u = m.B.reshape(m.N, -1)
    else:
        u = np.stack([m.B & 15, m.B >> 4], axis=-1).reshape(m.N, -1)
    zp = m.zero_points
    if zp is None:
        z = np.full((m.N, kb), 1 << (m.bits - 1))
    elif zp.dtype.kind == "f" or m.bits == 8:
        z = zp.astype(np.float64)
    else:
        z = np.stack([zp & 15, zp >> 4], axis=-1).reshape(m.N, -1)[:, :kb]
    rep = lambda p: np.repeat(p.reshape(m.N, kb).astype(np.float64), m.block_size, axis=1)  # noqa: E731
    return ((u - rep(z)) * rep(m.scales))[:, :m.K]


# --- numpy only ----------------------------------------------------------------------------------------
@given(raw_weights(), st.sampled_from(["conv", "matmul"]), st.sampled_from([None, True, False]))
def test_dequantize_linear_round_trip(qw, layout, signed):
    dq, report = of.write_dequantize_linear(qw, layout=layout, signed=signed)
    check_report(report, exact_values(qw), rows(dq_values(dq), layout))
    if signed is None and (qw.offsets is None or not qw.offsets.any()):
        assert report.lossless and dq.zero_point is None and dq.x.dtype == np.int8
    back, report2 = of.read_dequantize_linear(*dq, shape=qw.q.shape, groups=qw.groups)
    check_report(report2, rows(dq_values(dq), layout), exact_values(back))
    if qw.symmetric and signed is not False:
        assert back == normalized(qw)
    elif report.lossless and report2.lossless:
        assert_same_values(back, qw)


@given(raw_weights(kinds=("integer_zero", "zero_offsets"), fp16=True), st.sampled_from(["conv", "matmul"]))
def test_integer_zero_points_are_lossless_both_ways(qw, layout):
    dq, report = of.write_dequantize_linear(qw, layout=layout, signed=False)
    assert report.lossless, report
    back, report2 = of.read_dequantize_linear(*dq, shape=qw.q.shape, groups=qw.groups)
    assert report2.lossless, report2
    assert_same_values(back, qw)


def test_dequantize_linear_ragged_tail_is_exact():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 16, size=(3, 10, 1, 1)).astype(np.uint8)
    scale = rng.uniform(0.1, 1, size=(3, 3, 1, 1)).astype(np.float32)  # blocks of 4 over 10 channels: 4, 4, 2
    zp = rng.integers(0, 16, size=(3, 3, 1, 1)).astype(np.uint8)
    qw, report = of.read_dequantize_linear(x, scale, zp, axis=1, block_size=4, bits=4)
    assert report.lossless and qw.block_size == 2 and qw.n_blocks == 5
    dq = of.DQWeight(x, scale, zp, 1, 4, 4)
    np.testing.assert_array_equal(exact_values(qw), rows(dq_values(dq), "conv"))


def test_dequantize_linear_refusals():
    x = np.zeros((2, 4, 3, 3), np.int8)
    per_tap = np.arange(2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3) + 1
    with pytest.raises(ValueError, match="inside the 3x3 taps"):
        of.read_dequantize_linear(x, per_tap, axis=1, block_size=2)
    with pytest.raises(ValueError, match="block_size=1 with 2 scale blocks does not cover"):
        of.read_dequantize_linear(x, per_tap, axis=1, block_size=1)
    with pytest.raises(ValueError, match="codes must lie in"):
        of.read_dequantize_linear(np.full((2, 4), 9, np.int8), np.float32(1), bits=4)
    with pytest.raises(TypeError):
        of.read_dequantize_linear(np.zeros((2, 4), np.float32), np.float32(1))


def test_dequantize_linear_per_tensor_and_matmul_orientation():
    x = np.array([[1, -2, 3], [4, 5, -6]], np.int8)  # MatMul B: [K=2, N=3]
    qw, report = of.read_dequantize_linear(x, np.float32(0.5))
    assert report.lossless and qw.q[:, :, 0, 0].tolist() == x.T.tolist() and qw.scales.ravel().tolist() == [0.5] * 3
    qw, _ = of.read_dequantize_linear(x, np.float32(0.5), out_axis=0)  # Gemm transB: [N, K]
    assert qw.q[:, :, 0, 0].tolist() == x.tolist()


@given(raw_weights(ipg=(16, 32, 48), kernels=((1, 1),), kinds=("symmetric", "integer_zero", "asymmetric")),
       st.sampled_from([16, 32, 64]), st.sampled_from(["auto", "int", "float"]))
def test_matmul_nbits_round_trip(qw, block_size, zero_points):
    try:
        m, report = of.write_matmul_nbits(qw, block_size=block_size, zero_points=zero_points)
    except ValueError as exc:
        assert "straddle" in str(exc) and qw.block_len % block_size
        return
    assert m.B.shape == (m.N, -(-m.K // block_size), block_size * m.bits // 8) and m.scales.shape == m.B.shape[:2]
    check_report(report, exact_values(qw), nbits_values(m))
    back, report2 = of.read_matmul_nbits(*m, groups=qw.groups)
    check_report(report2, nbits_values(m), exact_values(back))
    if report.lossless and report2.lossless:
        assert_same_values(back, qw)


def test_matmul_nbits_legacy_and_packed_zero_points():
    rng = np.random.default_rng(2)
    n, k, bs = 3, 40, 16  # 3 blocks: odd count of packed zero points, ragged tail of 8
    u = rng.integers(0, 16, size=(n, 48))
    B = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8).reshape(n, 3, 8)
    scales = rng.uniform(0.1, 1, size=n * 3).astype(np.float16)  # legacy flat, fp16
    z = rng.integers(0, 16, size=(n, 3))
    zp = np.stack([z[:, 0] | (z[:, 1] << 4), z[:, 2]], axis=1).astype(np.uint8)
    qw, report = of.read_matmul_nbits(B, scales, zp, k, n, 4, bs)
    assert report.lossless and qw.block_size == 8
    expect = (u[:, :k] - np.repeat(z, bs, axis=1)[:, :k]) * np.repeat(scales.reshape(n, 3), bs, axis=1)[:, :k]
    np.testing.assert_array_equal(exact_values(qw), expect.astype(np.float64))
    with pytest.raises(ValueError, match="bits=2"):
        of.read_matmul_nbits(B, scales, None, k, n, 2, bs)
    with pytest.raises(ValueError, match="power of two"):
        of.write_matmul_nbits(qw, block_size=24)


@given(raw_weights(kinds=("symmetric", "integer_zero", "zero_offsets"), fp16=True))
def test_qlinear_weight_round_trip(qw):
    try:
        w, report = of.write_qlinear_weight(qw)
    except ValueError as exc:
        assert "one scale per output channel" in str(exc)
        return
    assert report.lossless and w.w.dtype == np.int8 and w.scale.shape == (qw.out_channels,)
    back, report2 = of.read_qlinear_weight(*w, groups=qw.groups)
    assert report2.lossless
    assert_same_values(back, qw)


# --- onnx / onnxruntime oracles ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def onnx():
    return pytest.importorskip("onnx", reason="onnx not installed: ONNX proto and reference-evaluator tests skipped")


def _model(onnx, nodes, inits, out_shape, inputs=(), out_type=None):
    h = onnx.helper
    out = h.make_tensor_value_info("Y", out_type or onnx.TensorProto.FLOAT, out_shape)
    graph = h.make_graph(nodes, "g", list(inputs), [out], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def _ort_run(model, feeds=None):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: ORT oracle skipped")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds or {})[0]


def test_int4_tensor_proto_packing_matches_onnx(onnx):
    for dtype, bits in ((np.int8, 4), (np.uint8, 4), (np.int8, 8)):
        lo, hi = (-8, 7) if dtype == np.int8 else (0, 15)
        a = np.random.default_rng(3).integers(lo, hi + 1, size=(3, 5)).astype(dtype)  # odd count: spare nibble
        t = of.to_tensor_proto("t", a, bits)
        back = onnx.numpy_helper.to_array(t).astype(dtype)
        np.testing.assert_array_equal(back, a)
        assert of.from_tensor_proto(t)[1] == bits
        np.testing.assert_array_equal(of.from_tensor_proto(t)[0], a)


@settings(max_examples=15)
@given(raw_weights(), st.sampled_from(["conv", "matmul"]))
def test_dequantize_linear_node_matches_onnx_reference_and_ort(onnx, qw, layout):
    from onnx.reference import ReferenceEvaluator

    node, inits, report = of.dequantize_linear_node(qw, "Y", layout=layout)
    expect = dq_values(of.write_dequantize_linear(qw, layout=layout)[0])
    model = _model(onnx, [node], inits, list(expect.shape))
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {})[0], expect.astype(np.float32))
    np.testing.assert_array_equal(_ort_run(model), expect.astype(np.float32))
    back, report2 = of.read_dequantize_linear_node(node, model, shape=qw.q.shape, groups=qw.groups)
    check_report(report2, rows(expect, layout), exact_values(back))


@settings(max_examples=15)
@given(raw_weights(ipg=(16, 33, 48), kernels=((1, 1),), bits=(4,)), st.sampled_from([16, 32]),
       st.sampled_from(["int", "float"]))
def test_matmul_nbits_node_matches_ort(onnx, qw, block_size, zero_points):
    try:
        node, inits, report = of.matmul_nbits_node(qw, "A", "Y", block_size=block_size, zero_points=zero_points)
    except ValueError:
        return  # blocks straddle: covered by test_matmul_nbits_round_trip
    k, n = qw.q[0].size, qw.out_channels
    a = onnx.helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [k, k])
    model = _model(onnx, [node], inits, [k, n], inputs=[a])
    y = _ort_run(model, {"A": np.eye(k, dtype=np.float32)})  # A = I: Y = dequant(B).T
    expect = nbits_values(of.write_matmul_nbits(qw, block_size=block_size, zero_points=zero_points)[0])
    np.testing.assert_allclose(y.T, expect, rtol=1e-6, atol=1e-6 * np.abs(expect).max())
    back, report2 = of.read_matmul_nbits_node(node, model, groups=qw.groups)
    check_report(report2, expect, exact_values(back))


def test_conv_integer_and_qlinear_conv_nodes(onnx):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(4)
    qw = qconv.quantize_weight(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), symmetric=False, groups=2)
    tensors, report = of.qlinear_weight_tensors(qw, "c")
    w, scale, zp = (onnx.numpy_helper.to_array(t) for t in tensors)
    x = rng.integers(0, 256, size=(1, 6, 5, 5)).astype(np.uint8)
    node = onnx.helper.make_node("ConvInteger", ["x", "c_w", "", "c_w_zero_point"], ["Y"], group=2)
    xin = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, list(x.shape))
    model = _model(onnx, [node], [tensors[0], tensors[2]], [1, 4, 3, 3], [xin], onnx.TensorProto.INT32)
    y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    ints = (w.astype(np.int64) - zp.astype(np.int64)[:, None, None, None]).astype(np.float32)
    np.testing.assert_array_equal(y, qconv.reference.float_conv2d(x.astype(np.float32), ints, groups=2))
    back, report2 = of.read_qlinear_conv_node(node, model, scale=scale)
    check_report(report2, (ints * scale[:, None, None, None].astype(np.float64)).reshape(4, -1), exact_values(back))
    assert report2.max_abs_error < 1e-7 * np.abs(ints).max() * scale.max()  # only float32 offsets move
    qnode = onnx.helper.make_node("QLinearConv", ["x", "xs", "xz", "c_w", "c_w_scale", "c_w_zero_point", "ys", "yz"],
                                  ["Y"], group=2)
    back2, _ = of.read_qlinear_conv_node(qnode, tensors)
    assert back2 == back
    with pytest.raises(ValueError, match="ConvInteger with scale"):
        of.read_qlinear_conv_node(node, model)


@pytest.mark.parametrize("sym", [True, False])
def test_qconv_node_stores_float16_params_of_half_exact_weights(onnx, sym):
    """A qconv ONNX node keeps scales/offsets as FLOAT16 for half-exact weights (half the bytes, read back
    bit-identical as float32) and as FLOAT otherwise; weight_bytes counts what is stored."""
    from qconv.onnx import wire
    from qconv.onnx.nodes import make_qnode, read_qnode, weight_bytes

    w = np.random.default_rng(6).standard_normal((16, 64)).astype(np.float32)
    stored = {}
    for scale_dtype, want in (("auto", onnx.TensorProto.FLOAT16), ("float32", onnx.TensorProto.FLOAT)):
        qw = qconv.quantize_weight(w, 4, 32, sym, scale_dtype=scale_dtype)
        node, inits = make_qnode("l", "QMatMul", qw, None, None, "x", "y")
        params = [t for t in inits if t.name in ("l.scales", "l.offsets")]
        assert len(params) == (1 if sym else 2) and all(t.data_type == want for t in params)
        back = read_qnode(wire.read_node(node.SerializeToString()),
                          {t.name: wire.read_tensor(t.SerializeToString()) for t in inits}).weight
        assert back == qw and back.scales.dtype == np.float32
        assert np.array_equal(back.scales.view(np.uint32), qw.scales.view(np.uint32))
        graph = onnx.helper.make_graph([node], "g", [], [], inits)
        stored[scale_dtype] = weight_bytes(onnx.helper.make_model(graph))["stored"]
        assert stored[scale_dtype] == qw.nbytes
    params = 16 * 2 * (1 if sym else 2)
    assert stored["float32"] - stored["auto"] == 2 * params
