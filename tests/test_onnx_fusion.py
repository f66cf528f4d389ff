"""Fused elementwise chains of the CPU session (qconv/onnx/fusion.py, qconv/_ext/_fused.pyx): the fused session
gives the unfused one's outputs bit for bit (onnxruntime's ops on the same qconv outputs) over chain shapes,
nearest-Resize factors, broadcasts, batches and threads; what is and is not fused; the numpy path."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("qconv._ext._fused")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.onnx import excite, fusion, pool  # noqa: E402


def _model(c, fh, fw, tail, extra=None):
    """x (N, c, H, W) and z (N, c, H/fh, W/fw) -> a = Conv(x), u = Conv(z), s = Conv(GlobalAveragePool(a));
    y = a + a * HardSigmoid(s) + Resize(u) [-> tail] (+ ``extra``: a Mul by an initializer of that shape first)."""
    rng = np.random.default_rng(c * 100 + fh * 10 + fw)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    inits = [numpy_helper.from_array(w(c, c, 1, 1), "w1"), numpy_helper.from_array(w(c, c, 3, 3), "w2"),
             numpy_helper.from_array(w(c, c, 1, 1), "w3"), numpy_helper.from_array(w(c), "b3"),
             numpy_helper.from_array(np.array([1, 1, fh, fw], np.float32), "scales"),
             numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
             helper.make_node("Conv", ["z", "w2"], ["u"], name="c2", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"], name="gap"),
             helper.make_node("Conv", ["g", "w3", "b3"], ["s"], name="c3"),
             helper.make_node("HardSigmoid", ["s"], ["hs"], name="hs", alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["a", "hs"], ["m"], name="mul"),
             helper.make_node("Add", ["a", "m"], ["r"], name="add1"),
             helper.make_node("Resize", ["u", "roi", "scales"], ["up"], name="resize", mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    last = "r2"
    nodes.append(helper.make_node("Add", ["r", "up"], [last], name="add2"))
    if extra is not None:
        inits.append(numpy_helper.from_array(w(*extra), "t"))
        nodes.append(helper.make_node("Mul", [last, "t"], ["e"], name="mul_t"))
        last = "e"
    if tail == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"], name="tail"))
    elif tail == "clip":
        inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  numpy_helper.from_array(np.array(1.5, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"], name="tail"))
    elif tail == "hardswish":
        nodes.append(helper.make_node("HardSwish", [last], ["y"], name="tail"))
    elif tail == "div":
        inits.append(numpy_helper.from_array(np.array(3.0, np.float32), "d"))
        nodes.append(helper.make_node("Div", [last, "d"], ["y"], name="tail"))
    else:
        nodes.append(helper.make_node("Sub", [last, "a"], ["y"], name="tail"))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"]),
                                           helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", c, "p", "q"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _sessions(model, threads):
    """The model's sessions with and without fused chains; neither fuses its squeeze-excitation block
    (tests/test_onnx_excite.py) or its pool (qconv.onnx.pool), so that the chain here keeps its Mul."""
    q = qo.quantize_model(model, measure=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(excite, "find_blocks", lambda *a, **k: [])
        m.setattr(pool, "pools", lambda *a, **k: ({}, {}))   # the block's pool stays onnxruntime's too
        fused = qo.InferenceSession(q, threads=threads)
        m.setattr(fusion, "find_chains", lambda *a, **k: [])
        plain = qo.InferenceSession(q, threads=threads)
    return fused, plain


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 9), fh=st.integers(1, 3), fw=st.integers(1, 3), n=st.integers(1, 2),
       hw=st.tuples(st.integers(1, 5), st.integers(1, 6)), threads=st.sampled_from([1, 2]),
       tail=st.sampled_from(["relu", "clip", "hardswish", "div", "sub"]))
def test_fused_chain_equals_onnxruntime_ops_bitwise(c, fh, fw, n, hw, threads, tail):
    fused, plain = _sessions(_model(c, fh, fw, tail), threads)
    assert len(fused.fused) == 1 and not plain.fused
    chain = fused.fused[0].chain
    assert {k[0] for k in chain.leaves} - {"d"} == {"a", "s", "u"}   # "a" read twice is one input
    assert ("u", fh, fw) in chain.leaves
    rng = np.random.default_rng(c + n)
    h, w = hw
    feed = {"x": rng.standard_normal((n, c, h * fh, w * fw)).astype(np.float32),
            "z": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    calls = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fusion.FusedKernel, "evaluate", lambda self, xs: calls.append(1))
        y, = fused.run(None, feed)
    want, = plain.run(None, feed)
    assert not calls   # the native path
    assert y.shape == want.shape
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("extra", [(1, 1, 4, 1), (4, 4), (1,)])
def test_other_broadcasts_take_numpy_and_match(monkeypatch, extra):
    """A leaf the native path does not take (a (1, 1, H, 1) or (H, W) plane) runs the chain in numpy: the same
    bits; a one-value leaf stays native."""
    fused, plain = _sessions(_model(3, 2, 2, "relu", extra=extra), 2)
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((2, 3, 4, 4)).astype(np.float32),
            "z": rng.standard_normal((2, 3, 2, 2)).astype(np.float32)}
    calls = []
    real = fusion.FusedKernel.evaluate
    monkeypatch.setattr(fusion.FusedKernel, "evaluate", lambda self, xs: calls.append(1) or real(self, xs))
    y, = fused.run(None, feed)
    want, = plain.run(None, feed)
    assert bool(calls) == (extra != (1,))
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


def test_a_wrong_input_shape_is_a_clear_error():
    fused, _ = _sessions(_model(3, 2, 2, "relu"), 2)
    feed = {"x": np.zeros((1, 3, 4, 4), np.float32), "z": np.zeros((1, 3, 3, 3), np.float32)}
    with pytest.raises(ValueError, match="fused node .* inputs of shapes"):
        fused.run(None, feed)


def _nodes(spec):
    """wire-like nodes from ``(op, inputs, output[, domain])`` tuples."""
    from qconv.onnx import wire

    return [wire.Node(name=f"n{i}", op_type=s[0], domain=s[3] if len(s) > 3 else "", input=list(s[1]),
                      output=[s[2]]) for i, s in enumerate(spec)]


def test_what_is_fused():
    q = ("QConv", ["x"], "a", "ai.qconv")
    chain3 = [q, ("Relu", ["a"], "b"), ("Mul", ["b", "a"], "c"), ("Add", ["c", "x"], "d")]
    assert [c.nodes for c in fusion.find_chains(_nodes(chain3), {}, {"d"})] == [[1, 2, 3]]
    # two nodes: too short
    assert fusion.find_chains(_nodes(chain3[:3]), {}, {"c"}) == []
    # no input from a QConv node
    plain = [("Relu", ["x"], "a")] + chain3[1:]
    assert fusion.find_chains(_nodes(plain), {}, {"d"}) == []
    # an inner value with a second reader, or that is a graph output, ends the chain before it
    # a graph with a subgraph node: its body could read any inner value
    assert fusion.find_chains(_nodes(chain3 + [("If", ["x"], "f")]), {}, {"d", "f"}) == []
    two = chain3 + [("Sigmoid", ["b"], "e")]
    assert fusion.find_chains(_nodes(two), {}, {"d", "e"}) == []
    assert fusion.find_chains(_nodes(chain3), {}, {"d", "b"}) == []
    # a Resize that is not nearest / asymmetric / floor with constant integer scales does not fuse
    from qconv.onnx import wire
    rz = _nodes([q, ("Resize", ["a", "", "sc"], "r"), ("Relu", ["r"], "s"), ("Add", ["s", "x"], "t")])
    assert fusion.find_chains(rz, {}, {"t"}) == []   # default attributes: half_pixel, round_prefer_floor
    attrs = [helper.make_attribute("mode", "nearest"), helper.make_attribute("coordinate_transformation_mode",
                                                                               "asymmetric"),
             helper.make_attribute("nearest_mode", "floor")]
    rz[1].attribute = [a.SerializeToString() for a in attrs]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "sc")
    inits = {"sc": wire.read_tensor(scales.SerializeToString())}
    chains = fusion.find_chains(rz, inits, {"t"})
    assert [c.nodes for c in chains] == [[1, 2, 3]] and ("a", 2, 3) in chains[0].leaves
    inits = {"sc": wire.read_tensor(numpy_helper.from_array(np.array([1, 1, 1.5, 2], np.float32),
                                                            "sc").SerializeToString())}
    assert fusion.find_chains(rz, inits, {"t"}) == []
