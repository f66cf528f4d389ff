"""qconv.onnx nodes with unequal geometry: strides, dilations, kernels and pads whose height and width differ (and
asymmetric pads, top != bottom, left != right), for every layer kind quantize_model rewrites -- dense, grouped and
depthwise Conv, Conv + BatchNormalization / Relu / Clip, MatMul with a constant weight, Gemm with alpha / beta.

The oracle is onnxruntime running the float graph with the node's weight replaced by the quantized weight's
``dequantize()`` (and its bias by the node's bias, the affine ops it folded removed): a session's convs run float
activations on the CPU, so the two agree to float32 rounding; any height/width mix-up of the geometry read back from
the qconv node changes the output (or its shape) completely. The float model itself is checked within int8 error.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv  # noqa: E402
import qconv.onnx as qo  # noqa: E402
from qconv.onnx import wire  # noqa: E402
from qconv.onnx.nodes import QCONV, QMATMUL, make_qnode, read_qnode  # noqa: E402
from qconv.testing import sqnr_db  # noqa: E402

SCHEME = "int8-ch-sym"
NEAR = 1e-5      # session vs the dequantized-weight float model: max abs error / max |output|
MIN_DB = 30.0    # session vs the float model (int8 weights; and int8 activations where a test says so)


def _w(rng, *shape, scale=1.0):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) / np.sqrt(fan_in) * scale).astype(np.float32)


def _model(nodes, x_shape, inits):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _ort(model, x):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _qnodes(q) -> dict:
    """``{name: QNode}`` of a quantized model, read back the way a session reads it."""
    nodes, inits = wire.graph_parts(q.SerializeToString())
    return {n.name: read_qnode(n, inits) for n in nodes if n.domain == "ai.qconv"}


def _near(y, ref, scale=None):
    """``y`` equals ``ref`` to float32 rounding: max abs error <= NEAR * ``scale`` (default max |ref|)."""
    scale = float(np.abs(ref).max()) if scale is None else scale
    assert scale > 0
    err = float(np.abs(y.astype(np.float64) - ref).max())
    assert err <= NEAR * scale, f"max abs error {err:.3g} = {err / scale:.3g} of the output scale {scale:.3g}"


def conv_model(x_shape, w, b, *, strides, pads, dilations, group=1, tail="", bn=None):
    """x -> Conv(w, b, geometry) [-> BatchNormalization(bn)] [-> Relu | Clip(0, 6)] -> y."""
    inits = dict(w=w) if b is None else dict(w=w, b=b)
    out = "c" if (tail or bn is not None) else "y"
    nodes = [helper.make_node("Conv", ["x"] + list(inits), [out], name="conv", strides=list(strides),
                              pads=list(pads), dilations=list(dilations), group=group, kernel_shape=list(w.shape[2:]))]
    if bn is not None:
        inits.update(zip(("s", "sh", "mu", "var"), bn))
        nodes.append(helper.make_node("BatchNormalization", [out, "s", "sh", "mu", "var"],
                                      ["n" if tail else "y"], name="bn", epsilon=1e-3))
        out = "n"
    if tail == "relu":
        nodes.append(helper.make_node("Relu", [out], ["y"], name="relu"))
    elif tail == "clip":
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
        nodes.append(helper.make_node("Clip", [out, "lo", "hi"], ["y"], name="clip"))
    return _model(nodes, x_shape, inits)


def _path(sess) -> str:
    """The CPU path the session's one conv took on its last run (from the engine's ``last_call``)."""
    last = sess.kernels[0].layer.engine.last_call
    return {"planes": "depthwise", "strips": "winograd" if last.get("winograd") else "direct"}.get(last["split"],
                                                                                                   "gemm")


def check_conv(x_shape, o, kernel, strides, pads, dilations, group=1, tail="", bn=False, bias=True, seed=0,
               act_quant_tensor=False, path=None, devices=(), min_db=MIN_DB):
    """Quantize a one-conv model, run it in a qconv session; compare with the dequantized-weight float model
    (near exact, same shape) and the float model (within the int8 weight error; and ``min_db`` of SQNR, None for
    none: a tiny output can cancel to nearly 0); ``path``: the CPU path the run must take; ``act_quant_tensor``: also
    run int8 activations (within their error); ``devices``: also run sessions on these (float activations, near
    exact)."""
    rng = np.random.default_rng(seed)
    c = x_shape[1]
    w = _w(rng, o, c // group, *kernel, scale=3.0)
    b = _w(rng, o) if bias else None
    bn_params = None
    if bn:
        bn_params = [(rng.random(o) + 0.5).astype(np.float32), _w(rng, o), _w(rng, o),
                     (rng.random(o) + 0.5).astype(np.float32)]
    geom = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    model = conv_model(x_shape, w, b, tail=tail, bn=bn_params, **geom)
    q = qo.quantize_model(model, SCHEME, measure=False)
    assert [n.op_type for n in q.graph.node] == [QCONV]   # BN, Relu, Clip fused into the node
    qn = _qnodes(q)["conv"]
    assert qn.activation == {"": None, "relu": "relu", "clip": "relu6"}[tail]
    deq = qn.weight.dequantize()
    ref_model = conv_model(x_shape, deq, qn.bias, tail=tail, **geom)
    x = rng.standard_normal(x_shape).astype(np.float32)
    y_float, y_ref = _ort(model, x), _ort(ref_model, x)
    # the output scale: the conv before its activation (a Relu may leave only zeros)
    scale = float(np.abs(_ort(conv_model(x_shape, deq, qn.bias, **geom), x)).max()) or 1.0
    with qo.InferenceSession(q, threads=1) as sess:
        y, = sess.run(None, {"x": x})
        assert path is None or _path(sess) == path, _path(sess)
    assert y.shape == y_ref.shape == y_float.shape
    _near(y, y_ref, scale)
    # the float model within the int8 weight error: |w - deq| <= step / 2 per output channel (Relu, Clip and the BN
    # fold are 1-Lipschitz / folded into the weight), so |y - y_float| <= step * sum of |x| over the receptive field
    step = qn.weight.scales.max(axis=1).reshape(1, -1, 1, 1)
    field = _ort(conv_model(x_shape, np.ones_like(w), None, **geom), np.abs(x))
    err = np.abs(y.astype(np.float64) - y_float)
    assert (err <= step * field + NEAR * scale).all(), float((err / (step * field + NEAR * scale)).max())
    if min_db is not None:
        assert sqnr_db(y, y_float) >= min_db, sqnr_db(y, y_float)
    if act_quant_tensor:   # the integer GEMM path: int8 activations, a step <= max |x| / 127 (per tensor)
        with qo.InferenceSession(q, threads=1, act_quant="tensor") as sess:
            y8, = sess.run(None, {"x": x})
        assert y8.shape == y_ref.shape
        bound = float(np.abs(x).max()) / 127 * np.abs(deq).sum(axis=(1, 2, 3)).reshape(1, -1, 1, 1)
        err = np.abs(y8.astype(np.float64) - y_ref)
        assert (err <= bound + NEAR * scale).all(), float((err / (bound + NEAR * scale)).max())
        if min_db is not None:
            assert sqnr_db(y8, y_ref) >= min_db, sqnr_db(y8, y_ref)
    for device in devices:
        with qo.InferenceSession(q, device=device, act_quant=None) as sess:
            yd, = sess.run(None, {"x": x})
        assert yd.shape == y_ref.shape, device
        _near(yd, y_ref, scale)
    return y


# (x_shape, out channels, kernel, strides, pads [top, left, bottom, right], dilations, group, the CPU path a session's
# float activations take: "direct" (one group, >= 24 output pixels), "winograd" (3x3 stride 1, >= 4096 pixels),
# "gemm" (grouped, or few pixels), "depthwise")
CONVS = {
    "dense": ((1, 4, 11, 14), 6, (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 1, "direct"),
    "dense-transposed": ((1, 4, 14, 11), 6, (2, 3), (1, 2), (0, 1, 1, 2), (2, 1), 1, "direct"),
    "dense-square": ((2, 3, 9, 9), 5, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, "direct"),
    "dense-wide-kernel": ((1, 3, 7, 16), 4, (1, 5), (1, 3), (0, 2, 0, 1), (1, 2), 1, "direct"),
    "dense-few-pixels": ((1, 4, 7, 9), 5, (3, 2), (2, 3), (1, 0, 0, 2), (1, 2), 1, "gemm"),
    "grouped": ((1, 6, 11, 14), 4, (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 2, "gemm"),
    "grouped-3": ((2, 6, 12, 10), 9, (2, 3), (1, 3), (2, 1, 0, 0), (3, 1), 3, "gemm"),
    "depthwise": ((1, 5, 11, 14), 5, (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 5, "depthwise"),
    "depthwise-x2": ((1, 4, 13, 9), 8, (3, 3), (1, 2), (2, 1, 1, 0), (2, 1), 4, "depthwise"),
    "depthwise-square": ((1, 8, 10, 10), 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8, "depthwise"),
    "asym-pads": ((1, 4, 10, 12), 6, (3, 3), (1, 1), (0, 2, 3, 1), (1, 1), 1, "direct"),
    "asym-pads-strided": ((1, 4, 16, 12), 6, (3, 3), (3, 2), (2, 0, 1, 3), (2, 1), 1, "direct"),
    "asym-pads-winograd": ((1, 3, 66, 70), 4, (3, 3), (1, 1), (0, 1, 2, 1), (1, 1), 1, "winograd"),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_geometry_matches_onnxruntime(name):
    """Each CONVS geometry: equal to onnxruntime on the dequantized weight (CPU path named, reference, int8 acts)."""
    x_shape, o, k, s, p, d, g, path = CONVS[name]
    check_conv(x_shape, o, k, s, p, d, g, seed=len(name), act_quant_tensor=True, path=path, devices=["reference"])


@pytest.mark.parametrize("name", ["dense", "depthwise"])
def test_conv_geometry_on_opencl(name):
    """The issue's geometry (dense and depthwise) in an OpenCL session equals onnxruntime on the dequantized weight."""
    if not any(d.startswith("opencl") for d in qconv.available_devices()):
        pytest.skip("no OpenCL device")
    x_shape, o, k, s, p, d, g, _ = CONVS[name]
    check_conv(x_shape, o, k, s, p, d, g, seed=11, devices=["opencl"])


@pytest.mark.parametrize("tail,bn", [("relu", False), ("clip", False), ("", True), ("relu", True),
                                     ("clip", True)])
@pytest.mark.parametrize("name", ["dense", "depthwise", "grouped-3"])
def test_fused_conv_geometry_matches_onnxruntime(name, tail, bn):
    """Conv + BatchNormalization / Relu / Clip(0, 6) fused into one node, unequal geometry: equal to onnxruntime."""
    x_shape, o, k, s, p, d, g, _ = CONVS[name]
    y = check_conv(x_shape, o, k, s, p, d, g, tail=tail, bn=bn, bias=not bn, seed=7)
    if tail:
        assert y.min() >= 0 and (tail != "clip" or y.max() <= 6)


@st.composite
def geometries(draw):
    """A one-conv problem: kind (dense / grouped / depthwise), per-axis kernel, stride, dilation, four pads
    (each side on its own) and an input for an output of 1..9 rows and columns (the GEMM path below 24
    output pixels, the direct one from there)."""
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise", "dense"]))   # dense twice: the direct path
    g = {"dense": 1, "grouped": draw(st.integers(2, 3)), "depthwise": draw(st.integers(2, 6))}[kind]
    c = g * (1 if kind == "depthwise" else draw(st.integers(1, 3)))
    o = g * draw(st.integers(1, 2 if kind == "depthwise" else 3))
    k, s, d, sizes = [], [], [], []
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    for axis in (0, 1):
        k.append(draw(st.integers(1, 4)))
        s.append(draw(st.integers(1, 3)))
        d.append(draw(st.integers(1, 3)) if k[-1] > 1 else 1)
        span = d[-1] * (k[-1] - 1) + 1
        out = draw(st.one_of(st.integers(1, 3), st.integers(5, 9)))
        padded = span + (out - 1) * s[-1] + draw(st.integers(0, s[-1] - 1))
        sizes.append(max(1, padded - pads[axis] - pads[axis + 2]))
    tail = draw(st.sampled_from(["", "relu", "clip", "bn"]))
    return (1, c, *sizes), o, tuple(k), tuple(s), tuple(pads), tuple(d), g, tail


@settings(max_examples=60, deadline=None)
@given(geometries(), st.booleans(), st.integers(0, 2**16))
def test_conv_geometry_property(problem, int8_act, seed):
    """Random per-axis kernel / stride / dilation and four free pads, any conv kind: equal to onnxruntime."""
    x_shape, o, k, s, p, d, g, tail = problem
    check_conv(x_shape, o, k, s, p, d, g, tail="" if tail == "bn" else tail, bn=tail == "bn", seed=seed,
               act_quant_tensor=int8_act, min_db=None)


def linear_model(kind, x_shape, w, c, alpha=1.0, beta=1.0, trans_b=1):
    """x -> MatMul(W [K, N]) -> y, or x -> Gemm(W, C, alpha, beta, transB) -> y."""
    if kind == "MatMul":
        return _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="lin")], x_shape, dict(W=w))
    inits = dict(W=w) if c is None else dict(W=w, C=c)
    node = helper.make_node("Gemm", ["x"] + list(inits), ["y"], name="lin", alpha=alpha, beta=beta, transB=trans_b)
    return _model([node], x_shape, inits)


@pytest.mark.parametrize("case", ["matmul", "gemm-transB", "gemm-transB-scalar-C", "gemm-noC", "gemm"])
def test_matmul_and_gemm_match_onnxruntime(case):
    """MatMul [K, N] and Gemm (transB, alpha, beta; K != N): node weight / bias and outputs equal onnxruntime's."""
    rng = np.random.default_rng(3)
    k, n = 12, 7
    alpha, beta, trans_b = (1.0, 1.0, 1) if case == "matmul" else (0.75, -1.5, 0 if case == "gemm" else 1)
    w = _w(rng, n, k, scale=2.0)                    # (N, K): Gemm with transB=1
    if case == "matmul" or trans_b == 0:
        w = np.ascontiguousarray(w.T)               # (K, N)
    c = {"matmul": None, "gemm-noC": None, "gemm-transB-scalar-C": np.array([0.3], np.float32)}.get(case, _w(rng, n))
    x = rng.standard_normal((2, 3, k) if case == "matmul" else (5, k)).astype(np.float32)
    model = linear_model("MatMul" if case == "matmul" else "Gemm", x.shape, w, c, alpha, beta, trans_b)
    q = qo.quantize_model(model, SCHEME, measure=False)
    assert [nd.op_type for nd in q.graph.node] == [QMATMUL]
    qn = _qnodes(q)["lin"]
    wt = (w if case != "matmul" and trans_b else w.T) * np.float32(alpha)   # (N, K)
    assert qn.weight.q.shape == (n, k, 1, 1)
    deq = qn.weight.dequantize()[:, :, 0, 0]
    np.testing.assert_allclose(deq, wt, atol=float(np.abs(wt).max(axis=1).max()) / 127)
    if c is None:
        assert qn.bias is None
    else:
        np.testing.assert_array_equal(qn.bias, np.broadcast_to(c * np.float32(beta), (n,)))
    # the reference: the same layer with the dequantized weight, alpha and beta folded (as the node holds them)
    ref_model = linear_model("Gemm", (x.size // k, k), deq, qn.bias, 1.0, 1.0, 1)
    y_float = _ort(model, x)
    y_ref = _ort(ref_model, x.reshape(-1, k)).reshape(y_float.shape)
    with qo.InferenceSession(q, threads=1, act_quant=None) as sess:
        y, = sess.run(None, {"x": x})
    assert y.shape == y_float.shape == x.shape[:-1] + (n,)
    _near(y, y_ref)
    with qo.InferenceSession(q, threads=1) as sess:
        y_row, = sess.run(None, {"x": x})
    assert y_row.shape == y_float.shape
    assert sqnr_db(y_row, y_float) >= MIN_DB, sqnr_db(y_row, y_float)


@settings(max_examples=50, deadline=None)
@given(st.tuples(st.integers(1, 4), st.integers(1, 4)), st.tuples(*[st.integers(0, 5)] * 4),
       st.tuples(st.integers(1, 4), st.integers(1, 4)), st.sampled_from([1, 2, 4]))
def test_read_qnode_round_trips_geometry(stride, pads, dilation, group):
    """make_qnode -> wire -> read_qnode gives stride, pads, dilation, group back in order (and padding splits)."""
    rng = np.random.default_rng(0)
    qw = qconv.quantize_weight(_w(rng, 4, 4 // group, 3, 2), 8, groups=group)
    bias = _w(rng, 4)
    node, inits = make_qnode("n", QCONV, qw, bias, "relu", "x", "y", stride=stride, pads=pads, dilation=dilation,
                             scheme=SCHEME)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"]) == \
        (list(stride), list(pads), list(dilation), group)   # ONNX's own attribute names and orders
    qn = read_qnode(wire.read_node(node.SerializeToString()),
                    {t.name: wire.read_tensor(t.SerializeToString()) for t in inits})
    assert (qn.stride, qn.pads, qn.dilation) == (stride, pads, dilation)
    t, l, b, r = pads
    assert qn.padding == (min(t, b), min(l, r))
    assert qn.extra_pad == (t - min(t, b), b - min(t, b), l - min(l, r), r - min(l, r))
    assert qn.weight == qw and qn.weight.groups == group and qn.activation == "relu"
    np.testing.assert_array_equal(qn.bias, bias)
    assert (qn.name, qn.input_name, qn.output_name, qn.scheme) == ("n", "x", "y", SCHEME)


def test_read_qnode_unequal_geometry_example():
    """The issue's strides (2, 1), dilations (1, 2), pads [1, 0, 2, 1] read back; QMatMul has no geometry."""
    qw = qconv.quantize_weight(_w(np.random.default_rng(1), 6, 4, 3, 2), 8)
    node, inits = make_qnode("c", QCONV, qw, None, None, "x", "y", stride=(2, 1), pads=(1, 0, 2, 1), dilation=(1, 2))
    tensors = {t.name: wire.read_tensor(t.SerializeToString()) for t in inits}
    qn = read_qnode(wire.read_node(node.SerializeToString()), tensors)
    assert (qn.stride, qn.dilation, qn.pads, qn.padding, qn.extra_pad) == \
        ((2, 1), (1, 2), (1, 0, 2, 1), (1, 0), (0, 1, 0, 1))
    assert qn.bias is None and qn.activation is None
    lw = qconv.quantize_weight(_w(np.random.default_rng(2), 5, 9)[:, :, None, None], 8)
    node, inits = make_qnode("m", QMATMUL, lw, None, None, "x", "y")
    qn = read_qnode(wire.read_node(node.SerializeToString()),
                    {t.name: wire.read_tensor(t.SerializeToString()) for t in inits})
    assert qn.op == QMATMUL and (qn.stride, qn.pads, qn.dilation) == ((1, 1), (0, 0, 0, 0), (1, 1))
    assert not {"strides", "pads", "dilations"} & {a.name for a in node.attribute}
