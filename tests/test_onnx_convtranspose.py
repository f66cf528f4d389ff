"""ConvTranspose whose kernel equals its stride, and DepthToSpace, in quantized models.

``quantize_model`` rewrites such a ConvTranspose as a 1x1 conv and ``DepthToSpace(mode="CRD")`` (the affine ops
after it folded, a Relu / Clip moved before the shuffle), and a QConv node absorbs a CRD DepthToSpace after it
(``depth_to_space``: the session's kernel shuffles the conv's output with ``_cpu.depth_to_space``). Checked
against onnxruntime running the float model (the native shuffle alone: ``tests/test_cpu_kernels.py``).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.onnx import wire  # noqa: E402
from qconv.onnx.nodes import read_qnode  # noqa: E402
from qconv.testing.asserts import sqnr_db  # noqa: E402

def _model(nodes, x_shape, inits, outputs=("y",), opset=13):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, x):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _head(s, c, o, bias, bn, act):
    """x -> ConvTranspose(k=s, stride s) [+ bias] [-> Add(per channel) -> BatchNormalization] [-> act] -> y."""
    rng = np.random.default_rng(s * 100 + c * 10 + o)
    inits = dict(w=(rng.standard_normal((c, o, s, s)) / np.sqrt(c)).astype(np.float32))
    ins = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(o).astype(np.float32)
        ins.append("b")
    nodes = [helper.make_node("ConvTranspose", ins, ["t"], name="up", kernel_shape=[s, s], strides=[s, s])]
    last = "t"
    if bn:
        inits.update(k=rng.standard_normal((1, o, 1, 1)).astype(np.float32), g=rng.random(o).astype(np.float32) + .5,
                     be=rng.standard_normal(o).astype(np.float32), mu=rng.standard_normal(o).astype(np.float32),
                     var=rng.random(o).astype(np.float32) + .5)
        nodes += [helper.make_node("Add", [last, "k"], ["t2"]),
                  helper.make_node("BatchNormalization", ["t2", "g", "be", "mu", "var"], ["t3"])]
        last = "t3"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["t4"]))
        last = "t4"
    elif act == "relu6":
        inits.update(lo=np.array(0, np.float32), hi=np.array(6, np.float32))
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["t4"]))
        last = "t4"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    return nodes, inits


@given(s=st.integers(2, 3), c=st.integers(1, 9), o=st.integers(1, 6), bias=st.booleans(), bn=st.booleans(),
       act=st.sampled_from([None, "relu", "relu6"]), n=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 19))
@settings(deadline=None, max_examples=25)
def test_convtranspose_runs_as_one_qconv_node(s, c, o, bias, bn, act, n, h, w):
    """The ConvTranspose, its affine ops and its activation become one QConv node with ``depth_to_space=s`` and
    the output keeps int8's accuracy against the float model (a wrong channel order would not: the sub-pixel
    positions would swap)."""
    nodes, inits = _head(s, c, o, bias, bn, act)
    model = _model(nodes, [None, c, None, None], inits)
    q = qo.quantize_model(model, "int8-ch-sym", measure=False)
    ops = [nd.op_type for nd in q.graph.node]
    assert ops == ["QConv", "Identity"], ops
    assert qo.model_summary(q)["convtranspose_as_conv"] == 1
    parts = wire.graph_parts(q.SerializeToString())
    qn = read_qnode(parts[0][0], parts[1])
    assert qn.depth_to_space == s and qn.weight.out_channels == o * s * s and qn.activation == act
    x = (np.random.default_rng(h * 31 + w).standard_normal((n, c, h, w)) * 2).astype(np.float32)
    want = _run(model, x)[0]
    with qo.InferenceSession(q, threads=2) as sess:
        y = sess.run(None, {"x": x})[0]
    assert y.shape == want.shape == (n, o, h * s, w * s)
    if np.abs(want).max() > 0:   # int8 weights: 28.7 dB at worst seen (c=9, o=1, relu leaving a few small values);
        assert sqnr_db(y, want) >= 20, sqnr_db(y, want)   # swapped sub-pixel positions: about 0 dB


def test_other_convtransposes_stay_float_and_right():
    """Overlapping windows (kernel 3, stride 2, padding 1), groups or a kernel unlike the stride: onnxruntime's
    float op, named in the summary; the model still computes the same."""
    rng = np.random.default_rng(5)
    for attrs, wshape in ((dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (4, 3, 3, 3)),
                          (dict(kernel_shape=[2, 2], strides=[2, 2], group=2), (4, 2, 2, 2)),
                          (dict(kernel_shape=[2, 2], strides=[1, 1]), (4, 3, 2, 2))):
        inits = dict(w=rng.standard_normal(wshape).astype(np.float32), w2=rng.standard_normal((5, 4, 1, 1)).astype(np.float32))
        nodes = [helper.make_node("Conv", ["x", "w2"], ["a"], name="pre"),
                 helper.make_node("ConvTranspose", ["a", "w"], ["y"], name="up", **attrs)]
        model = _model(nodes, [1, 4, 5, 6], dict(inits, w2=rng.standard_normal((4, 4, 1, 1)).astype(np.float32)))
        q = qo.quantize_model(model, "int8-ch-sym", measure=False)
        assert [nd.op_type for nd in q.graph.node] == ["QConv", "ConvTranspose"]
        assert qo.model_summary(q)["skipped"]["up"].startswith("ConvTranspose: stays an onnxruntime float op")
        x = rng.standard_normal((1, 4, 5, 6)).astype(np.float32)
        with qo.InferenceSession(q) as sess:
            assert sqnr_db(sess.run(None, {"x": x})[0], _run(model, x)[0]) >= 30


def test_the_layer_reader_tells_rewritten_convtransposes_apart():
    """``model_layers`` (what ``inspect`` lists) reports the ConvTransposes ``quantize_model`` rewrites, by the same
    rule (:func:`qconv.onnx_model.transposed_block`)."""
    from qconv.onnx_model import model_layers

    nodes, inits = _head(2, 3, 2, True, False, None)
    skipped = {}
    model_layers(_model(nodes, [1, 3, 4, 4], inits), skipped)
    assert skipped["up"] == "ConvTranspose: quantize_model rewrites it as a 1x1 conv and a DepthToSpace (opset >= 11)"


def test_depth_to_space_after_a_conv_fuses_in_crd_mode_only():
    """Conv -> DepthToSpace (a pixel shuffle, ESPCN-style): CRD fuses into the QConv node; DCR stays an
    onnxruntime op (right either way); format="qdq" keeps the DepthToSpace as it is."""
    rng = np.random.default_rng(6)
    inits = dict(w=(rng.standard_normal((12, 3, 3, 3)) / 5).astype(np.float32))
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    for mode, fused in (("CRD", True), ("DCR", False)):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                 helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=2, mode=mode)]
        model = _model(nodes, [None, 3, None, None], inits)
        q = qo.quantize_model(model, "int8-ch-sym", measure=False)
        assert [nd.op_type for nd in q.graph.node] == (["QConv"] if fused else ["QConv", "DepthToSpace"])
        want = _run(model, x)[0]
        with qo.InferenceSession(q, threads=2) as sess:
            y = sess.run(None, {"x": x})[0]
        assert y.shape == (2, 3, 12, 14) and sqnr_db(y, want) >= 30
        qdq = qo.quantize_model(model, "int8-ch-sym", format="qdq", measure=False)
        assert sum(nd.op_type == "DepthToSpace" for nd in qdq.graph.node) == 1
        assert sqnr_db(_run(qdq, x)[0], want) >= 30


def test_qdq_writes_the_rewritten_convtranspose():
    nodes, inits = _head(2, 6, 3, True, True, "relu")
    model = _model(nodes, [1, 6, 4, 5], inits)
    qdq = qo.quantize_model(model, "int8-ch-sym", format="qdq", measure=False)
    ops = [nd.op_type for nd in qdq.graph.node]
    assert "ConvTranspose" not in ops and "DepthToSpace" in ops and "Conv" in ops
    x = np.random.default_rng(7).standard_normal((1, 6, 4, 5)).astype(np.float32)
    assert sqnr_db(_run(qdq, x)[0], _run(model, x)[0]) >= 30


def test_bad_depth_to_space_attribute_is_refused():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=2, mode="CRD")]
    model = _model(nodes, [1, 3, 4, 4], dict(w=np.ones((8, 3, 1, 1), np.float32)))
    q = qo.quantize_model(model, "int8-ch-sym", measure=False)
    attr = next(a for a in q.graph.node[0].attribute if a.name == "depth_to_space")
    attr.i = 3   # 8 output channels do not split into 3x3 blocks
    parts = wire.graph_parts(q.SerializeToString())
    with pytest.raises(ValueError, match="depth_to_space=3"):
        read_qnode(parts[0][0], parts[1])
    with pytest.raises(Exception, match="depth_to_space=3"):
        qo.InferenceSession(q)
