"""qconv.onnx: whole models quantized once and run in onnxruntime with qconv's kernels as custom operators.

Every graph is built here with onnx.helper. The quantized session must equal running the same qconv layers one
by one (same weights, same fused activation, same engine) exactly, and the float model within the scheme's error.
"""
import gc

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv  # noqa: E402
import qconv.onnx as qo  # noqa: E402
from qconv.model_report import Plan, Scheme  # noqa: E402
from qconv.onnx import kernels as qk  # noqa: E402
from qconv.testing.asserts import sqnr_db  # noqa: E402

RNG = np.random.default_rng(21)
AQ = qk.SESSION_CONV_ACT_QUANT   # a session's conv activations on the CPU with act_quant="auto"
# SQNR (dB) of the whole small graph vs float, with margin below what was measured (2026-12-01)
MIN_DB = {"int8-ch-sym": 30.0, "int4-b8-asym": 12.0, "int4-b8-asym-mse": 12.0}


def _w(*shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (RNG.standard_normal(shape) / np.sqrt(fan_in) * (scale or 1.0)).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=13):
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    g = helper.make_graph(nodes, "t", inputs, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _float_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def conv_chain():
    """x(1,8,12,12) -> conv3x3+Relu -> grouped s2 conv + Clip(0,6) -> depthwise d2 conv (+ residual Add)
    -> 1x1 conv with asymmetric pads -> y."""
    w = dict(w1=_w(16, 8, 3, 3), b1=_w(16), w2=_w(16, 4, 3, 3, scale=6.0), b2=_w(16), w3=_w(16, 1, 3, 3), b3=_w(16),
             w4=_w(8, 16, 1, 1), b4=_w(8))
    consts = dict(w, lo=np.array(0, np.float32), hi=np.array(6, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", group=4, strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip2"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="dw3", group=16, dilations=[2, 2],
                              pads=[2, 2, 2, 2]),
             helper.make_node("Add", ["c3", "r2"], ["s3"], name="residual"),
             helper.make_node("Conv", ["s3", "w4", "b4"], ["y"], name="conv4", pads=[0, 0, 1, 1])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])], ["y"], consts)

    def one_by_one(x, scheme, device="cpu", **kw):
        kw.setdefault("act_quant", AQ)
        s = Scheme.parse(scheme)
        q = {k: s.quantize(w[k], g) for k, g in (("w1", 1), ("w2", 4), ("w3", 16), ("w4", 1))}
        r1 = qconv.Conv2d(q["w1"], w["b1"], padding=1, activation="relu", device=device, **kw)(x)
        r2 = qconv.Conv2d(q["w2"], w["b2"], stride=2, padding=1, activation="relu6", device=device, **kw)(r1)
        c3 = qconv.Conv2d(q["w3"], w["b3"], padding=2, dilation=2, device=device, **kw)(r2)
        s3 = c3 + r2
        return qconv.Conv2d(q["w4"], w["b4"], device=device, **kw)(np.pad(s3, ((0, 0), (0, 0), (0, 1), (0, 1))))

    return model, one_by_one


def linear_graph():
    """x(2,5,32) -> MatMul(W[32,24]) -> Add(bias) -> Relu -> Reshape(10,24) -> Gemm(alpha, beta, transB) -> y."""
    w = dict(W=_w(24, 32).T.copy(), bias=_w(24), G=_w(12, 24), C=_w(12), shape=np.array([10, 24], np.int64))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["bias", "m"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["r2"], name="reshape"),
             helper.make_node("Gemm", ["r2", "G", "C"], ["y"], name="gemm", alpha=0.5, beta=2.0, transB=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 32])], ["y"], w)

    def one_by_one(x, scheme, device="cpu", **kw):
        s = Scheme.parse(scheme)
        q1 = s.quantize(w["W"].T[:, :, None, None], 1)
        q2 = s.quantize((w["G"] * np.float32(0.5))[:, :, None, None], 1)
        r = qconv.Linear(q1, w["bias"], activation="relu", device=device, **kw)(x.reshape(10, 32))
        return qconv.Linear(q2, w["C"] * np.float32(2.0), device=device, **kw)(r)

    return model, one_by_one


@pytest.mark.parametrize("scheme", sorted(MIN_DB))
@pytest.mark.parametrize("graph", [conv_chain, linear_graph])
def test_session_equals_layers_one_by_one_and_float_within_scheme_error(graph, scheme):
    model, one_by_one = graph()
    x = RNG.standard_normal(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim))
    x = x.astype(np.float32)
    q = qo.quantize_model(model, scheme)
    assert not [n.op_type for n in q.graph.node if n.op_type in ("Conv", "MatMul", "Gemm", "Relu", "Clip")]
    with qo.InferenceSession(q, threads=2) as sess:
        y, = sess.run(None, {"x": x})
    expect = one_by_one(x, scheme, threads=2)
    np.testing.assert_array_equal(y, expect)
    y_float, = _float_run(model, {"x": x})
    assert sqnr_db(y, y_float) >= MIN_DB[scheme], sqnr_db(y, y_float)


def test_fused_activation_and_bias_really_apply():
    """Fusion must not drop the Relu/Clip or the bias Add: the results differ from the unfused layers."""
    model, one_by_one = conv_chain()
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    y, = qo.InferenceSession(qo.quantize_model(model, "int8-ch-sym"), threads=1).run(None, {"x": x})
    q_unfused = qo.quantize_model(model, "int8-ch-sym", fuse=False)
    assert [n.op_type for n in q_unfused.graph.node].count("Relu") == 1
    y2, = qo.InferenceSession(q_unfused, threads=1).run(None, {"x": x})
    np.testing.assert_allclose(y, y2, rtol=0.05, atol=0.05 * np.abs(y).max())  # same math, other rounding
    summary = qo.model_summary(qo.quantize_model(linear_graph()[0], "int8-ch-sym"))
    entry = {k: v for k, v in summary["layers"]["mm"].items()
             if k not in ("bytes", "block_size", "weight_sqnr_db", "act_allowed")}
    assert entry == dict(scheme="int8-ch-sym", op="MatMul", activation="relu", folded=["Add"], post=[])
    assert summary["layers"]["mm"]["bytes"] == 24 * 32 + 2 * 24 and summary["layers"]["mm"]["block_size"] == 0


def test_affine_ops_after_a_layer_fold_into_its_weight_and_bias():
    """Conv -> Mul (per channel) -> Add (scalar) -> BatchNormalization -> Div (scalar) -> Relu becomes one node
    (weights scaled per channel before quantization); a Mul by a spatial map, and one whose operand is computed,
    do not fold. The session matches the float model, and equals the same qconv layer on the folded float
    weight."""
    w1, b1, w2 = _w(8, 4, 3, 3), _w(8), _w(6, 8, 1, 1)
    a = (RNG.standard_normal((1, 8, 1, 1)) + 2).astype(np.float32)
    bn = [(RNG.random(8) + 0.5).astype(np.float32), _w(8), _w(8), (RNG.random(8) + 0.5).astype(np.float32)]
    consts = dict(w1=w1, b1=b1, w2=w2, a=a, c=np.array(0.3, np.float32), s=bn[0], sh=bn[1], mu=bn[2], var=bn[3],
                  d=np.array([4.0], np.float32), spatial=(RNG.random((1, 1, 6, 6)) + 0.5).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["a", "c1"], ["m1"], name="m1"),
             helper.make_node("Add", ["m1", "c"], ["a1"], name="a1"),
             helper.make_node("BatchNormalization", ["a1", "s", "sh", "mu", "var"], ["n1"], name="bn",
                              epsilon=1e-3),
             helper.make_node("Div", ["n1", "d"], ["v1"], name="div"),
             helper.make_node("Relu", ["v1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="c2"),
             helper.make_node("Mul", ["c2", "spatial"], ["m2"], name="spatial_mul"),
             helper.make_node("Mul", ["m2", "m2"], ["y"], name="square")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])], ["y"], consts)
    q = qo.quantize_model(model, "int8-ch-sym")
    layers = qo.model_summary(q)["layers"]
    assert layers["c1"]["folded"] == ["Mul", "Add", "BatchNormalization", "Div"] and layers["c1"]["activation"] == "relu"
    assert layers["c2"]["folded"] == []
    assert [n.op_type for n in q.graph.node if n.domain != "ai.qconv"] == ["Mul", "Mul"]
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    with qo.InferenceSession(q, threads=2) as sess:
        y, = sess.run(None, {"x": x})
    y_float, = _float_run(model, {"x": x})
    assert sqnr_db(y, y_float) >= 25, sqnr_db(y, y_float)
    # the node is the qconv layer of the folded float weight: a*(W x + b1) + b, a and b from the chain
    f64 = [v.astype(np.float64) for v in bn]
    s_bn = f64[0] / np.sqrt(f64[3] + 1e-3)
    scale, shift = a.reshape(-1).astype(np.float64), b1 * a.reshape(-1).astype(np.float64)   # Mul
    shift = shift + np.float64(np.float32(0.3))                                               # Add
    scale, shift = scale * s_bn, shift * s_bn + (f64[1] - f64[2] * s_bn)                      # BatchNormalization
    scale, shift = scale * 0.25, shift * 0.25                                                 # Div
    wf = (w1.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
    layer = qconv.Conv2d(qconv.quantize_weight(wf), shift.astype(np.float32), padding=1, activation="relu", threads=2,
                         act_quant=AQ)
    r1 = layer(x)
    layer2 = qconv.Conv2d(qconv.quantize_weight(w2), threads=2, act_quant=AQ)
    m2 = layer2(r1) * consts["spatial"]
    np.testing.assert_array_equal(y, m2 * m2)


def test_hardswish_patterns_fuse():
    """Conv -> Mul (folded) -> x * Clip(x + 3, 0, 6) / 6 in either order of the product and the division, and
    Conv -> HardSwish, each become one node with activation="hardswish", equal to the qconv layers one by one; a
    pattern whose Add is not +3 stays apart."""
    w1, b1, w2, w3, w4 = _w(8, 4, 3, 3, scale=4.0), _w(8), _w(6, 8, 1, 1, scale=4.0), _w(6, 6, 1, 1, scale=4.0), \
        _w(5, 6, 1, 1)
    f = np.float32
    consts = dict(w1=w1, b1=b1, w2=w2, w3=w3, w4=w4, k=np.array([1.5], f), three=np.array(3, f),
                  zero=np.array(0, f), six=np.array(6, f), two=np.array(2, f))
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
             node("Mul", ["c1", "k"], ["m1"], name="m1"),
             node("Add", ["m1", "three"], ["t1"]), node("Clip", ["t1", "zero", "six"], ["t2"]),
             node("Mul", ["m1", "t2"], ["t3"]), node("Div", ["t3", "six"], ["h1"]),          # (x * t) / 6
             node("Conv", ["h1", "w2"], ["c2"], name="c2"),
             node("Add", ["three", "c2"], ["s1"]), node("Clip", ["s1", "zero", "six"], ["s2"]),
             node("Div", ["s2", "six"], ["s3"]), node("Mul", ["s3", "c2"], ["h2"]),          # x * (t / 6)
             node("Conv", ["h2", "w3"], ["c3"], name="c3"),
             node("HardSwish", ["c3"], ["h3"]),
             node("Conv", ["h3", "w4"], ["c4"], name="c4"),
             node("Add", ["c4", "two"], ["u1"]), node("Clip", ["u1", "zero", "six"], ["u2"]),
             node("Mul", ["u2", "c4"], ["u3"]), node("Div", ["u3", "six"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])], ["y"], consts,
                   opset=14)
    q = qo.quantize_model(model, "int8-ch-sym")
    layers = qo.model_summary(q)["layers"]
    assert [layers[n]["activation"] for n in ("c1", "c2", "c3", "c4")] == ["hardswish"] * 3 + [""]
    assert [n.op_type for n in q.graph.node if n.domain != "ai.qconv"] == ["Add", "Clip", "Mul", "Div"]
    x = (RNG.standard_normal((1, 4, 7, 7)) * 2).astype(np.float32)
    with qo.InferenceSession(q, threads=2) as sess:
        y, = sess.run(None, {"x": x})
    y_float, = _float_run(model, {"x": x})
    assert sqnr_db(y, y_float) >= 25, sqnr_db(y, y_float)
    l1 = qconv.Conv2d(qconv.quantize_weight((w1 * f(1.5))), (b1.astype(np.float64) * 1.5).astype(f), padding=1,
                      activation="hardswish", threads=2, act_quant=AQ)
    l2, l3 = (qconv.Conv2d(qconv.quantize_weight(w), activation="hardswish", threads=2, act_quant=AQ) for w in (w2, w3))
    c4 = qconv.Conv2d(qconv.quantize_weight(w4), threads=2, act_quant=AQ)(l3(l2(l1(x))))
    np.testing.assert_array_equal(y, (c4 * np.clip(c4 + f(2), f(0), f(6))) / f(6))


def test_silu_patterns_fuse():
    """Conv -> Mul(x, Sigmoid(x)) in either operand order becomes one node with activation="silu" (a Mul after it
    the node's post_affine), equal to the qconv layers one by one; a SiLU whose Sigmoid output is also a graph
    output stays apart; format="qdq" writes Sigmoid -> Mul back."""
    w1, b1, w2, w3 = _w(8, 4, 3, 3, scale=4.0), _w(8), _w(6, 8, 1, 1, scale=4.0), _w(5, 6, 1, 1)
    f = np.float32
    consts = dict(w1=w1, b1=b1, w2=w2, w3=w3, k=np.array([1.5], f))
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
             node("Sigmoid", ["c1"], ["g1"]), node("Mul", ["c1", "g1"], ["s1"]),
             node("Mul", ["s1", "k"], ["m1"]),
             node("Conv", ["m1", "w2"], ["c2"], name="c2"),
             node("Sigmoid", ["c2"], ["g2"]), node("Mul", ["g2", "c2"], ["s2"]),
             node("Conv", ["s2", "w3"], ["c3"], name="c3"),
             node("Sigmoid", ["c3"], ["g3"]), node("Mul", ["c3", "g3"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])], ["y", "g3"], consts,
                   opset=14)
    q = qo.quantize_model(model, "int8-ch-sym")
    layers = qo.model_summary(q)["layers"]
    assert [layers[n]["activation"] for n in ("c1", "c2", "c3")] == ["silu", "silu", ""]
    assert layers["c1"]["post"] == ["Mul"]
    assert [n.op_type for n in q.graph.node if n.domain != "ai.qconv"] == ["Sigmoid", "Mul"]
    x = (RNG.standard_normal((1, 4, 7, 7)) * 2).astype(np.float32)
    with qo.InferenceSession(q, threads=2) as sess:
        y, _ = sess.run(None, {"x": x})
    y_float = _float_run(model, {"x": x})[0]
    assert sqnr_db(y, y_float) >= 25, sqnr_db(y, y_float)
    l1 = qconv.Conv2d(qconv.quantize_weight(w1), b1, padding=1, activation="silu", threads=2, act_quant=AQ,
                      post_affine=(np.full(8, 1.5, f), np.zeros(8, f)))
    l2 = qconv.Conv2d(qconv.quantize_weight(w2), activation="silu", threads=2, act_quant=AQ)
    c3 = qconv.Conv2d(qconv.quantize_weight(w3), threads=2, act_quant=AQ)(l2(l1(x)))
    np.testing.assert_allclose(y, c3 * (1 / (1 + np.exp(-c3))), rtol=1e-5, atol=1e-5 * np.abs(y).max())  # ORT sigmoid
    qdq = qo.quantize_model(model, "int8-ch-sym", format="qdq")
    assert sum(n.op_type == "Sigmoid" for n in qdq.graph.node) == 3
    assert sqnr_db(_float_run(qdq, {"x": x})[0], y_float) >= 25


def test_min_weights_keeps_small_layers_float():
    """quantize_model(min_weights=N): layers with fewer than N weights stay float Convs (named in qconv.summary
    with the reason), the others become qconv nodes; the model still runs and matches the float model."""
    model, _ = conv_chain()
    q = qo.quantize_model(model, min_weights=145)   # dw3 has 16*1*3*3 = 144 weights, conv4 8*16 = 128
    s = qo.model_summary(q)
    assert set(s["layers"]) == {"conv1", "conv2"} and set(s["float"]) == {"dw3", "conv4"}
    assert "144 weights < min_weights=145" in s["float"]["dw3"]
    assert [n.name for n in q.graph.node if n.op_type == "Conv"] == ["dw3", "conv4"]
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    with qo.InferenceSession(q, threads=2) as sess:
        y, = sess.run(None, {"x": x})
    assert sqnr_db(y, _float_run(model, {"x": x})[0]) >= MIN_DB["int8-ch-sym"]
    with pytest.raises(ValueError, match="min_weights"):
        qo.quantize_model(model, min_weights=-1)


def test_affine_ops_after_an_activation_become_the_post_affine():
    """Conv -> Relu -> Mul (per channel) -> Add (scalar) and MatMul -> HardSwish -> Mul -> Add: the ops after the
    activation become the node's post_affine (y * s + t, float32), equal to the qconv layers one by one with it,
    on the CPU and (applied on the host) on OpenCL."""
    w1, w2 = _w(8, 4, 3, 3), _w(8, 6)
    f = np.float32
    s1 = (RNG.standard_normal((1, 8, 1, 1)) + 1).astype(f)
    consts = dict(w1=w1, w2=w2, s1=s1, t1=np.array([0.25], f), s2=np.array(0.5, f), t2=(RNG.standard_normal(6)).astype(f))
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"]),
             node("Mul", ["r1", "s1"], ["m1"]), node("Add", ["t1", "m1"], ["a1"]),
             node("Flatten", ["a1"], ["fl"], axis=1),
             node("Slice", ["fl", "st", "en"], ["sl"]),
             node("MatMul", ["sl", "w2"], ["mm"], name="mm"), node("HardSwish", ["mm"], ["h2"]),
             node("Mul", ["s2", "h2"], ["m2"]), node("Add", ["m2", "t2"], ["y"])]
    consts.update(st=np.array([0], np.int64), en=np.array([8], np.int64))
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])], ["y"], consts,
                   opset=14)
    q = qo.quantize_model(model, "int8-ch-sym")
    layers = qo.model_summary(q)["layers"]
    assert layers["c1"]["post"] == ["Mul", "Add"] and layers["mm"]["post"] == ["Mul", "Add"]
    assert [n.op_type for n in q.graph.node if n.domain != "ai.qconv"] == ["Flatten", "Slice"]
    x = RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)
    l1 = qconv.Conv2d(qconv.quantize_weight(w1), padding=1, activation="relu",
                      post_affine=(s1.reshape(-1), np.full(8, 0.25, f)), threads=2, act_quant=AQ)
    l2 = qconv.Linear(qconv.quantize_weight(w2.T.copy()), activation="hardswish",
                      post_affine=(np.full(6, 0.5, f), consts["t2"]), threads=2)
    want = l2(l1(x).reshape(1, -1)[:, :8])
    with qo.InferenceSession(q, threads=2) as sess:
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    assert sqnr_db(want, _float_run(model, {"x": x})[0]) >= 25
    if any(d.startswith("opencl") for d in qconv.available_devices()):
        # the OpenCL engine takes no post_affine: the session's kernel applies it on the host, the same float32 rule
        o1 = qconv.Conv2d(qconv.quantize_weight(w1), padding=1, activation="relu", device="opencl")
        o2 = qconv.Linear(qconv.quantize_weight(w2.T.copy()), activation="hardswish", device="opencl")
        y1 = o1(x) * s1 + f(0.25)
        want = o2(y1.reshape(1, -1)[:, :8]) * f(0.5) + consts["t2"]
        with qo.InferenceSession(q, device="opencl") as sess:
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def test_conv_with_a_computed_weight_stays_float():
    w1, wd = _w(8, 4, 3, 3), _w(6, 8, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="qconv_me", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["wd", "two"], ["wdyn"], name="make_weight"),
             helper.make_node("Conv", ["c1", "wdyn"], ["y"], name="computed_weight")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6]),
                           helper.make_tensor_value_info("wd", TensorProto.FLOAT, [6, 8, 1, 1])], ["y"],
                   dict(w1=w1, two=np.array(2, np.float32)))
    q = qo.quantize_model(model, "int8-ch-sym")
    assert [n.op_type for n in q.graph.node] == ["QConv", "Mul", "Conv"]
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    y, = qo.InferenceSession(q, threads=1).run(None, {"x": x, "wd": wd})
    c1 = qconv.Conv2d(qconv.quantize_weight(w1, 8), padding=1, threads=1, act_quant=AQ)(x)
    np.testing.assert_allclose(y, np.einsum("oi,nihw->nohw", (wd * 2)[:, :, 0, 0], c1), rtol=1e-5, atol=1e-5)


def test_saved_model_is_small_and_round_trips(tmp_path):
    model, _ = conv_chain()
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    for scheme, ratio in (("int8-ch-sym", 0.30), ("int4-b8-asym", 0.25)):
        q = qo.quantize_model(model, scheme)
        path = tmp_path / f"{scheme}.onnx"
        onnx.save(q, path)
        nb = qo.weight_bytes(q)
        assert nb["quantized_layers"] == 4 and nb["float_layers"] == 0 and nb["ratio"] <= ratio, nb
        assert not {"w1", "w2", "w3", "w4"} & {t.name for t in onnx.load(path).graph.initializer}
        y_mem, = qo.InferenceSession(q, threads=1).run(None, {"x": x})
        y_file, = qo.InferenceSession(str(path), threads=1).run(None, {"x": x})
        np.testing.assert_array_equal(y_mem, y_file)
        if scheme.startswith("int4"):
            t = {t.name: t for t in onnx.load(path).graph.initializer}["conv1.q"]
            assert t.data_type == TensorProto.INT4 and len(t.raw_data) == 16 * 8 * 9 // 2
        from qconv.onnx import wire
        from qconv.onnx.nodes import read_qnode
        nodes, inits = wire.graph_parts(path.read_bytes())
        qn = read_qnode(nodes[0], inits)
        w1 = numpy_helper.to_array({t.name: t for t in model.graph.initializer}["w1"])
        assert qn.name == "conv1" and qn.weight == Scheme.parse(scheme).quantize(w1, 1)


def test_plan_applies_per_layer_and_unnamed_layers_stay_float():
    model, _ = conv_chain()
    plan = Plan("chain", 25.0, None, {"conv1": dict(scheme="int4-b8-asym", bytes=0, sqnr_db=0.0),
                                      "dw3": dict(scheme="int8-ch-sym", bytes=0, sqnr_db=0.0),
                                      "conv4": dict(scheme="float", bytes=0, sqnr_db=0.0)})
    q = qo.quantize_model(model, plan=plan)
    ops = {n.name: (n.op_type, {a.name: helper.get_attribute_value(a) for a in n.attribute}.get("bits"))
           for n in q.graph.node}
    assert ops["conv1"] == ("QConv", 4) and ops["dw3"] == ("QConv", 8)
    assert ops["conv2"][0] == "Conv" and ops["conv4"][0] == "Conv"
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    y, = qo.InferenceSession(q, threads=1).run(None, {"x": x})
    assert sqnr_db(y, _float_run(model, {"x": x})[0]) > 12
    bad = Plan("other", 25.0, None, {"nope": dict(scheme="int8-ch-sym", bytes=0, sqnr_db=0.0)})
    with pytest.raises(ValueError, match="plan names layers"):
        qo.quantize_model(model, plan=bad)


def test_clear_errors():
    relu_only = _model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], ["y"], {})
    with pytest.raises(ValueError, match="no Conv or constant-weight MatMul/Gemm"):
        qo.quantize_model(relu_only)
    model, _ = conv_chain()
    sess = qo.InferenceSession(qo.quantize_model(model), threads=1)
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    with pytest.raises(ValueError, match=r"missing input\(s\) \['x'\]"):
        sess.run(None, {})
    with pytest.raises(ValueError, match="unknown input"):
        sess.run(None, {"x": x, "z": x})
    with pytest.raises(TypeError, match="must be float32"):
        sess.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(ValueError, match="dimension 1 must be 8"):
        sess.run(None, {"x": x[:, :7]})
    with pytest.raises(ValueError, match="must have 4 dimensions"):
        sess.run(None, {"x": x[0]})
    with pytest.raises(ValueError, match="scheme 'int3' not understood"):
        qo.quantize_model(model, "int3")


def test_kernel_error_is_raised_not_fatal():
    """An exception inside a qconv operator comes back from run() (it would abort the process if it escaped)."""
    w = _w(6, 16)
    model = _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "k"])], ["y"], dict(W=w.T.copy()))
    sess = qo.InferenceSession(qo.quantize_model(model), threads=1)
    with pytest.raises(ValueError, match="takes 16"):
        sess.run(None, {"x": np.ones((2, 5), np.float32)})
    y, = sess.run(None, {"x": np.ones((2, 16), np.float32)})   # the session still works afterwards
    assert y.shape == (2, 6)


def test_kernels_are_per_session_and_released():
    model, one_by_one = conv_chain()
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    gc.collect()  # sessions of earlier tests
    before = len(qk.KERNELS)
    s8 = qo.InferenceSession(qo.quantize_model(model, "int8-ch-sym"), threads=1)
    s4 = qo.InferenceSession(qo.quantize_model(model, "int4-b8-asym"), threads=1)
    assert len(qk.KERNELS) == before + 8   # 4 nodes each
    assert [k.name for k in s8.kernels] == ["conv1", "conv2", "dw3", "conv4"]
    y8, = s8.run(None, {"x": x})
    y4, = s4.run(None, {"x": x})
    np.testing.assert_array_equal(y8, one_by_one(x, "int8-ch-sym", threads=1))
    np.testing.assert_array_equal(y4, one_by_one(x, "int4-b8-asym", threads=1))
    s8.close()
    del s4
    gc.collect()
    assert len(qk.KERNELS) == before
    with pytest.raises(RuntimeError, match="closed"):
        s8.run(None, {"x": x})


def test_threads_and_activation_mode_reach_the_layers():
    model, one_by_one = conv_chain()
    sess = qo.InferenceSession(qo.quantize_model(model, "int8-ch-sym"), threads=1, act_quant="block")
    assert {k.layer.engine.threads for k in sess.kernels} == {1}
    so = sess._sess.get_session_options()
    assert so.intra_op_num_threads == 1 and so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert {k.layer.spec.act_quant for k in sess.kernels} == {"block"}
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], one_by_one(x, "int8-ch-sym", threads=1,
                                                                            act_quant="block"))


def test_session_memory_settings_and_no_float_weights():
    """Memory of whole models: onnxruntime's memory pattern is off unless asked for, the depthwise node prepares
    no GEMM plan, no engine keeps scratch after a run, and no float array as large as a weight is kept."""
    model, _ = conv_chain()
    sess = qo.InferenceSession(qo.quantize_model(model), threads=1)
    assert sess._sess.get_session_options().enable_mem_pattern is False
    so = ort.SessionOptions()
    so.enable_mem_pattern = True   # a given sess_options keeps its own memory pattern setting
    assert qo.InferenceSession(qo.quantize_model(model), so,
                               threads=1).get_session_options().enable_mem_pattern is True
    sess.run(None, {"x": RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)})
    engines = {k.name: k.layer.engine for k in sess.kernels}
    assert [n for n, e in engines.items() if e.path == "depthwise"] == ["dw3"]
    for name, eng in engines.items():
        w = eng.spec.weight
        assert w.q.dtype.kind in "iu"
        if eng.path == "gemm":
            assert not eng._plan.bound
        held = [a for a in vars(eng).values() if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                and a.size >= w.q.size]
        assert not held, name


def test_opencl_session_equals_opencl_layers():
    if not any(d.startswith("opencl") for d in qconv.available_devices()):
        pytest.skip("no OpenCL device")
    for graph in (conv_chain, linear_graph):
        model, one_by_one = graph()
        shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
        x = RNG.standard_normal(shape).astype(np.float32)
        y, = qo.InferenceSession(qo.quantize_model(model, "int4-b8-asym"), device="opencl").run(None, {"x": x})
        np.testing.assert_array_equal(y, one_by_one(x, "int4-b8-asym", device="opencl"))


def test_gptq_scheme_is_calibrated_on_the_given_inputs():
    """gptq layers are quantized on each layer's captured input for the calibration feeds given."""
    from qconv.onnx_model import capture, model_layers

    model, _ = conv_chain()
    calib = [RNG.standard_normal((1, 8, 12, 12)).astype(np.float32) for _ in range(2)]
    q = qo.quantize_model(model, "int4-b8-asym-gptq", calibration=calib)
    layers = model_layers(model)
    x1 = np.concatenate([layers[0].conv_input(capture(model, layers, {"x": c})[layers[0].input_name])
                         for c in calib])
    want = Scheme.parse("int4-b8-asym-gptq").quantize(layers[0].weight, 1, x1, stride=(1, 1), padding=(1, 1),
                                                      dilation=(1, 1))
    from qconv.onnx import wire
    from qconv.onnx.nodes import read_qnode
    nodes, inits = wire.graph_parts(q.SerializeToString())
    got = read_qnode(nodes[0], inits).weight
    assert got == want and got != Scheme.parse("int4-b8-asym").quantize(layers[0].weight, 1)
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    y, = qo.InferenceSession(q, threads=1).run(None, {"x": x})
    assert sqnr_db(y, _float_run(model, {"x": x})[0]) > 12


def test_float_model_runs_unchanged():
    """A model without qconv nodes runs as plain onnxruntime (no custom-op library needed)."""
    model, _ = conv_chain()
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    sess = qo.InferenceSession(model, threads=1)
    assert sess.kernels == []
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _float_run(model, {"x": x})[0])


@pytest.mark.parametrize("residual", [False, True])
def test_squeeze_excite_block(residual):
    """conv -> SE (GlobalAveragePool -> conv+Relu -> conv -> HardSigmoid -> Mul [-> Add x]) -> conv: one fused
    squeeze-excitation node (qconv/onnx/excite.py), the float model within the scheme's error; with an SE
    intermediate as a graph output the block stays unfused (its 1x1 convs between onnxruntime's own ops), as close."""
    # ws2 large: the HardSigmoid saturates at both ends for some channels
    w = dict(w1=_w(16, 8, 3, 3), ws1=_w(4, 16, 1, 1, scale=4.0), bs1=_w(4), ws2=_w(16, 4, 1, 1, scale=12.0),
             bs2=_w(16, scale=3.0), w3=_w(8, 16, 1, 1))
    tail = ([helper.make_node("Add", ["x1", "m"], ["s"], name="res")] if residual else [])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["x1"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["x1"], ["g"], name="gap"),
             helper.make_node("Conv", ["g", "ws1", "bs1"], ["s1"], name="se1"),
             helper.make_node("Relu", ["s1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "ws2", "bs2"], ["s2"], name="se2"),
             helper.make_node("HardSigmoid", ["s2"], ["h"], name="hs", alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["x1", "h"], ["m"], name="scale")] + tail + [
             helper.make_node("Conv", ["s" if residual else "m", "w3"], ["y"], name="c3")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 9, 11])], ["y"], w)
    x = RNG.standard_normal((2, 8, 9, 11)).astype(np.float32)
    with qo.InferenceSession(qo.quantize_model(model, "int8-ch-sym"), threads=2) as sess:
        assert [k.name for k in sess.kernels] == ["c1", "se1", "se2", "c3"]
        assert [type(k).__name__ for k in sess.fused] == ["ExciteKernel"]
        y, = sess.run(None, {"x": x})
    assert sqnr_db(y, _float_run(model, {"x": x})[0]) >= 30
    model.graph.output.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, None))
    with qo.InferenceSession(qo.quantize_model(model, "int8-ch-sym"), threads=2) as sess:
        assert [type(k).__name__ for k in sess.fused] == ["PoolKernel"]   # the block's pool alone (qconv.onnx.pool)
        ys = sess.run(None, {"x": x})
    assert sqnr_db(ys[0], y) >= 40
    assert sqnr_db(ys[1], _float_run(model, {"x": x})[1]) >= 30
