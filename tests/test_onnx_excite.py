"""Squeeze-excitation blocks of the CPU session as one node (qconv/onnx/excite.py, the row loops of
qconv/_ext/_fused.pyx): the native channel means and scaling against numpy, what is and is not a block, and the
fused session against the unfused one (the same qconv nodes; the means and the gate's products summed in another
order, Sigmoid by qconv's exp: float32 rounding apart) over gates, channel counts, plane sizes, batches and threads;
the native gate against float64 numpy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
_fused = pytest.importorskip("qconv._ext._fused")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.onnx import excite, pool, wire  # noqa: E402


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 40), h=st.integers(1, 19), w=st.integers(1, 19),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_channel_means_and_scaling(n, c, h, w, threads, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, h, w)) * 10 + 3).astype(np.float32)
    m = np.empty((n, c), np.float32)
    _fused.channel_means(x, m, threads)
    want = x.astype(np.float64).mean(axis=(2, 3))
    np.testing.assert_allclose(m, want, rtol=1e-5, atol=1e-5 * np.abs(x).max())
    one = np.empty_like(m)
    _fused.channel_means(x, one, 1)
    assert np.array_equal(one.view(np.uint32), m.view(np.uint32)), "1 vs 2 threads differ"
    g = rng.standard_normal((n, c)).astype(np.float32)
    y = np.empty_like(x)
    _fused.scale_channels(x, g, y, threads)
    assert np.array_equal(y.view(np.uint32), (x * g[:, :, None, None]).view(np.uint32))
    with pytest.raises(ValueError):
        _fused.channel_means(x, np.empty((n, c + 1), np.float32), threads)
    with pytest.raises(ValueError):
        _fused.scale_channels(x, g, np.empty((n, c, h, w + 1), np.float32), threads)


def _gate_reference(v, steps):
    """The gate of ``_fused.excite_gate`` in float64 numpy."""
    v = v.astype(np.float64)
    for st_ in steps:
        if st_[0] == "Conv":
            _, wt, b, act, ps, pt = st_
            v = v @ wt.astype(np.float64) + b
            if act in (1, 2):
                v = np.maximum(v, 0)
            if act == 2:
                v = np.minimum(v, 6)
            if act == 3:
                v = v * np.clip(v + 3, 0, 6) / 6
            if act == 4:
                v = v / (1 + np.exp(-v))
            if ps is not None:
                v = v * ps + pt
            continue
        op, p0, p1 = st_
        v = {10: lambda v: np.maximum(v, 0), 11: lambda v: np.clip(v * p0 + p1, 0, 1),
             13: lambda v: np.clip(v, p0, p1), 14: lambda v: v * np.clip(v * p0 + p1, 0, 1),
             20: lambda v: 1 / (1 + np.exp(-v))}[op](v)
    return v


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 70), r=st.integers(1, 40), act=st.sampled_from(sorted(
    _fused.GATE_ACTS.values())), op=st.sampled_from(sorted(_fused.GATE_OPS.values())), affine=st.booleans(),
       seed=st.integers(0, 2**31))
def test_native_gate_against_numpy(n, c, r, act, op, affine, seed):
    """conv (every activation, with and without post_affine) -> op -> conv -> Sigmoid on (N, C) means: float32 within
    rounding of float64 numpy, the AVX2 lanes and the tails of odd channel counts included."""
    rng = np.random.default_rng(seed)

    def conv(cin, cout, a):
        pa = (rng.standard_normal(cout).astype(np.float32), rng.standard_normal(cout).astype(np.float32))
        return ("Conv", np.ascontiguousarray((rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype(np.float32)),
                rng.standard_normal(cout).astype(np.float32), a, *(pa if affine else (None, None)))

    steps = [conv(c, r, act), (op, 0.2, 0.5) if op != 13 else (op, -0.5, 1.5), conv(r, c, 0), (20, 0.0, 0.0)]
    v = rng.standard_normal((n, c)).astype(np.float32)
    got = _fused.excite_gate(v, steps)
    assert got.shape == (n, c) and got.dtype == np.float32
    np.testing.assert_allclose(got, _gate_reference(v, steps), rtol=2e-5, atol=2e-6)
    with pytest.raises(ValueError, match="transposed weight"):
        _fused.excite_gate(np.ones((n, c + 1), np.float32), steps)


def _model(c, r, gate, identity, relu_node):
    """x -> a = Conv3x3(x); s = a * gate(Conv(act(Conv(GlobalAveragePool(a))))); y = Conv1x1(s) + a: a block
    whose value ``a`` has a third reader (the residual Add)."""
    rng = np.random.default_rng(c * 10 + r)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = [numpy_helper.from_array(w(c, c, 3, 3), "w0"), numpy_helper.from_array(w(r, c, 1, 1), "w1"),
             numpy_helper.from_array(w(r), "b1"), numpy_helper.from_array(w(c, r, 1, 1), "w2"),
             numpy_helper.from_array(w(c), "b2"), numpy_helper.from_array(w(c, c, 1, 1), "w3")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="c0", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"], name="gap"),
             helper.make_node("Conv", ["p", "w1", "b1"], ["h"], name="c1")]
    last = "h"
    if relu_node:
        nodes.append(helper.make_node("Relu", [last], ["hr"], name="relu"))
        last = "hr"
    nodes.append(helper.make_node("Conv", [last, "w2", "b2"], ["e"], name="c2"))
    last = "e"
    if identity:
        nodes.append(helper.make_node("Identity", [last], ["ei"], name="ident"))
        last = "ei"
    if gate == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", [last], ["g"], name="gate"))
    else:
        nodes.append(helper.make_node("HardSigmoid", [last], ["g"], name="gate", alpha=1 / 6, beta=0.5))
    nodes += [helper.make_node("Mul", ["a", "g"], ["s"], name="mul"),
              helper.make_node("Conv", ["s", "w3"], ["t"], name="c3"),
              helper.make_node("Add", ["t", "a"], ["y"], name="add")]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@settings(max_examples=20, deadline=None)
@given(c=st.integers(2, 24), r=st.integers(1, 8), gate=st.sampled_from(["sigmoid", "hard"]), identity=st.booleans(),
       relu_node=st.booleans(), n=st.integers(1, 2), hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       threads=st.sampled_from([1, 2]))
def test_block_session_matches_unfused(c, r, gate, identity, relu_node, n, hw, threads):
    q = qo.quantize_model(_model(c, r, gate, identity, relu_node), measure=False)
    fused = qo.InferenceSession(q, threads=threads)
    with pytest.MonkeyPatch.context() as m:   # onnxruntime's own ops for the block, its pool included
        m.setattr(excite, "find_blocks", lambda *a, **k: [])
        m.setattr(pool, "pools", lambda *a, **k: ({}, {}))
        plain = qo.InferenceSession(q, threads=threads)
    assert [type(k).__name__ for k in fused.fused] == ["ExciteKernel"] and not plain.fused
    x = np.random.default_rng(c + n).standard_normal((n, c) + hw).astype(np.float32)
    y, = fused.run(None, {"x": x})
    want, = plain.run(None, {"x": x})
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def _nodes(spec):
    return [wire.Node(name=f"n{i}", op_type=s[0], domain=s[3] if len(s) > 3 else "", input=list(s[1]),
                      output=[s[2]]) for i, s in enumerate(spec)]


def test_what_is_a_block():
    q = lambda i, o: ("QConv", [i], o, "ai.qconv")   # noqa: E731
    block = [("GlobalAveragePool", ["x"], "p"), q("p", "h"), ("Relu", ["h"], "hr"), q("hr", "e"),
             ("Sigmoid", ["e"], "g"), ("Mul", ["x", "g"], "y")]
    qn = {1, 3}
    found = excite.find_blocks(_nodes(block), {}, {"y"}, qn)
    assert [(b.pool, b.middle, b.mul, b.x) for b in found] == [(0, [1, 2, 3, 4], 5, "x")]
    # the Mul's operands swapped: the same block
    swapped = block[:5] + [("Mul", ["g", "x"], "y")]
    assert len(excite.find_blocks(_nodes(swapped), {}, {"y"}, qn)) == 1
    # no qconv node between: not a block
    assert excite.find_blocks(_nodes(block), {}, {"y"}, set()) == []
    # an inner value with a second reader, or that is a graph output
    assert excite.find_blocks(_nodes(block + [("Relu", ["h"], "z")]), {}, {"y", "z"}, qn) == []
    assert excite.find_blocks(_nodes(block), {}, {"y", "e"}, qn) == []
    # the Mul scales another tensor than the pooled one, or an op that is not elementwise sits between
    other = block[:5] + [("Mul", ["z", "g"], "y")]
    assert excite.find_blocks(_nodes(other), {}, {"y"}, qn) == []
    softmax = block[:4] + [("Softmax", ["e"], "g"), block[5]]
    assert excite.find_blocks(_nodes(softmax), {}, {"y"}, qn) == []


def test_kernel_refuses_nonfinite_input_and_takes_other_ranks():
    """A NaN / inf in x is a ValueError naming the node (as the qconv nodes it replaces would raise); a 3-D input
    takes the numpy path: the same gate, x times it."""
    k = excite.ExciteKernel([("HardSigmoid", 0.5, 0.5)], threads=2, name="se")
    x = np.ones((1, 3, 4, 5), np.float32)
    x[0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="'se'.*NaN or infinite"):
        k(x, np.empty_like(x))
    x3 = np.random.default_rng(0).standard_normal((2, 3, 7)).astype(np.float32)
    y3 = k(x3, np.empty_like(x3))
    g = np.clip(x3.mean(axis=2, keepdims=True) * np.float32(0.5) + np.float32(0.5), 0, 1)
    np.testing.assert_allclose(y3, x3 * g, rtol=1e-6)
