"""Native calls of the CPU session (``qconv_native.h``, :meth:`qconv.cpu.CpuEngine.native_call`): after a node's
first call through Python, onnxruntime's custom operator runs its depthwise, direct float and direct int8 convs
without Python. They must give the Python path's bits, and leave to it what they do not run: another input shape,
a NaN input (its error), a node whose layer changed, concurrent runs."""
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv._ext import _ortops  # noqa: E402
from qconv.onnx import kernels as qk  # noqa: E402
from test_onnx_excite import _model as se_model  # noqa: E402


def _model(c, m, k, stride, seed=0):
    """x (n, c, h, w) -> Conv 1x1 c->m + Relu -> depthwise Conv k x k (stride, "same" padding) + Clip(0, 6)
    -> Conv 3x3 m->c: an inverted-residual-like chain."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = [numpy_helper.from_array(w(m, c, 1, 1), "w0"), numpy_helper.from_array(w(m), "b0"),
             numpy_helper.from_array(w(m, 1, k, k), "w1"), numpy_helper.from_array(w(m), "b1"),
             numpy_helper.from_array(w(c, m, 3, 3), "w2"), numpy_helper.from_array(w(c), "b2"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], name="expand"),
             helper.make_node("Relu", ["a"], ["ar"], name="relu"),
             helper.make_node("Conv", ["ar", "w1", "b1"], ["d"], name="dw", group=m, strides=[stride, stride],
                              pads=[k // 2] * 4),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dc"], name="clip"),
             helper.make_node("Conv", ["dc", "w2", "b2"], ["y"], name="project", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8   # older onnxruntime wheels (the AMX host's 1.30) refuse the newest IR versions
    return m


@pytest.fixture
def python_calls(monkeypatch):
    """Names of the qconv nodes whose call went through Python (ConvKernel.__call__), in order."""
    seen = []
    call = qk.ConvKernel.__call__

    def counted(self, x, y):
        seen.append(self.name)
        return call(self, x, y)

    monkeypatch.setattr(qk.ConvKernel, "__call__", counted)
    yield seen
    _ortops.set_native(True)


def _run(sess, x):
    return sess.run(None, {"x": x})[0]


def _check_native_matches_python(sess, x, seen):
    _ortops.set_native(False)
    want = _run(sess, x)
    _ortops.set_native(True)
    _run(sess, x)   # the first call of each node went through Python above: native calls exist from here
    native = {k.name for k in sess.kernels if k._native is not None}
    seen.clear()
    for _ in range(2):
        got = _run(sess, x)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "native calls changed the bits"
    assert not native & set(seen), f"{native & set(seen)} went through Python although native"
    assert len(seen) == 2 * (len(sess.kernels) - len(native))
    return native


# (python_calls is cleared before each use: one fixture for every example is fine)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(1, 12), m=st.integers(2, 40), k=st.sampled_from([1, 3, 5]), stride=st.sampled_from([1, 2]),
       hw=st.tuples(st.integers(3, 30), st.integers(3, 30)), n=st.integers(1, 2),
       act=st.sampled_from([None, "tensor"]), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_native_calls_give_the_python_bits(python_calls, c, m, k, stride, hw, n, act, threads, seed):
    q = qo.quantize_model(_model(c, m, k, stride, seed % 1000), measure=False)
    sess = qo.InferenceSession(q, threads=threads, **({} if act is None else {"act_quant": act}))
    x = np.random.default_rng(seed).standard_normal((n, c) + hw).astype(np.float32)
    native = _check_native_matches_python(sess, x, python_calls)
    dw = next(kn for kn in sess.kernels if kn.name == "dw")
    if k >= stride and dw.layer.engine._dw is not None and act is None:   # float depthwise rows read every input
        assert "dw" in native


def test_native_calls_leave_other_shapes_nan_and_changed_layers_to_python(python_calls):
    q = qo.quantize_model(_model(4, 24, 3, 1), measure=False)
    sess = qo.InferenceSession(q, threads=2)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 20, 20)).astype(np.float32)
    native = _check_native_matches_python(sess, x, python_calls)
    assert "dw" in native and "project" in native   # the depthwise conv and the direct 3x3 float conv
    # another shape: Python runs it, with the bits of a session that never ran native calls
    other = rng.standard_normal((2, 4, 9, 13)).astype(np.float32)
    fresh = qo.InferenceSession(q, threads=2)
    _ortops.set_native(False)
    want = _run(fresh, other)
    _ortops.set_native(True)
    python_calls.clear()
    assert np.array_equal(_run(sess, other), want)
    assert set(python_calls) == {kn.name for kn in sess.kernels}
    # a NaN: the native call refuses it, the Python path raises its error
    bad = x.copy()
    bad[0, 1, 5, 7] = np.nan
    with pytest.raises(Exception, match="NaN"):
        _run(sess, bad)
    assert np.array_equal(_run(sess, x), _run(fresh, x))
    # a changed layer (the activation search switches modes): its old native call is disabled
    dw = next(kn for kn in sess.kernels if kn.name == "project")
    dw.set_act_quant("tensor")
    python_calls.clear()
    got = _run(sess, x)
    assert "project" in python_calls
    fresh_t = qo.InferenceSession(q, threads=2)
    next(kn for kn in fresh_t.kernels if kn.name == "project").set_act_quant("tensor")
    assert np.array_equal(got, _run(fresh_t, x))


def test_native_calls_from_concurrent_threads():
    q = qo.quantize_model(_model(3, 32, 5, 2), measure=False)
    sess = qo.InferenceSession(q, threads=2)
    xs = [np.random.default_rng(i).standard_normal((1, 3, 24, 24)).astype(np.float32) for i in range(4)]
    _ortops.set_native(False)
    want = [_run(sess, x) for x in xs]
    _ortops.set_native(True)
    _run(sess, xs[0])
    assert any(kn._native is not None for kn in sess.kernels)
    errors = []

    def worker(i):
        try:
            for _ in range(20):
                if not np.array_equal(_run(sess, xs[i]), want[i]):
                    errors.append(i)
        except Exception as exc:   # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@settings(max_examples=10, deadline=None)
@given(c=st.integers(2, 24), r=st.integers(1, 8), gate=st.sampled_from(["sigmoid", "hard"]), relu_node=st.booleans(),
       n=st.integers(1, 2), hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), threads=st.sampled_from([1, 2]))
def test_native_squeeze_excitation_gives_the_python_bits(c, r, gate, relu_node, n, hw, threads):
    m = se_model(c, r, gate, False, relu_node)
    m.ir_version = 8
    q = qo.quantize_model(m, measure=False)
    sess = qo.InferenceSession(q, threads=threads)
    x = np.random.default_rng(c + n).standard_normal((n, c) + hw).astype(np.float32)
    _ortops.set_native(False)
    want = _run(sess, x)
    _ortops.set_native(True)
    try:
        _run(sess, x)
        assert [k._native is not None for k in sess.fused] == [True]
        assert np.array_equal(_run(sess, x).view(np.uint32), want.view(np.uint32))
        bad = x.copy()
        bad[-1, -1, 0, 0] = np.inf
        with pytest.raises(Exception, match="NaN or infinite"):
            _run(sess, bad)
    finally:
        _ortops.set_native(True)


def _head_model(c, m, classes, hw_pool: bool, seed=0):
    """x (n, c, h, w) -> Conv 3x3 c->c + Relu -> GlobalAveragePool -> Conv 1x1 c->m (one pixel: the tiled GEMM)
    + HardSwish -> Flatten -> MatMul m->classes + Add: a classifier's head."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1] if len(shape) == 2 else shape[1:])))\
            .astype(np.float32)

    inits = [numpy_helper.from_array(w(c, c, 3, 3), "w0"), numpy_helper.from_array(w(c), "b0"),
             numpy_helper.from_array(w(m, c, 1, 1), "w1"), numpy_helper.from_array(w(m), "b1"),
             numpy_helper.from_array(w(m, classes), "w2"), numpy_helper.from_array(w(classes), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], name="body", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"], name="relu"),
             helper.make_node("GlobalAveragePool", ["ar"], ["p"], name="pool"),
             helper.make_node("Conv", ["p", "w1", "b1"], ["h"], name="head"),
             helper.make_node("HardSwish", ["h"], ["hs"], name="hswish"),
             helper.make_node("Flatten", ["hs"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w2"], ["mm"], name="fc"),
             helper.make_node("Add", ["mm", "b2"], ["y"], name="fc_bias")]
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mp.ir_version = 8
    return mp


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(1, 40), m=st.integers(1, 300), classes=st.integers(1, 20), n=st.integers(1, 3),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), act=st.sampled_from([None, "none", "tensor", "row"]),
       scheme=st.sampled_from([None, "int4-b32-asym"]), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_native_gemm_calls_give_the_python_bits(python_calls, c, m, classes, n, hw, act, scheme, threads, seed):
    """The tiled GEMM's calls (a conv on one pixel, a QMatMul) run natively with float, per-tensor or per-row
    activations and give the Python path's bits; a NaN goes to the Python path's error."""
    q = qo.quantize_model(_head_model(c, m, classes, True, seed % 1000), measure=False,
                          **({} if scheme is None else {"scheme": scheme}))
    sess = qo.InferenceSession(q, threads=threads, **({} if act is None else {"act_quant": act}))
    x = np.random.default_rng(seed).standard_normal((n, c) + hw).astype(np.float32)
    fc = qk.KERNELS[f"{sess._id}/fc"]
    native = _check_native_matches_python(sess, x, python_calls)
    assert "head" in native and fc._native is not None
    got = _run(sess, x)
    bad = x.copy()
    bad[-1, -1, 0, 0] = np.nan
    with pytest.raises(Exception, match="NaN"):
        _run(sess, bad)
    assert np.array_equal(_run(sess, x), got)


@settings(max_examples=15, deadline=None)
@given(c=st.integers(1, 40), n=st.integers(1, 3), hw=st.tuples(st.integers(1, 17), st.integers(1, 17)),
       threads=st.sampled_from([1, 2]))
def test_global_average_pool_runs_natively_with_the_means(c, n, hw, threads):
    """A GlobalAveragePool between qconv nodes is the session's own node (qconv.onnx.pool): the channel means of
    its input (float32, within 1e-6 of numpy's float64 means), the same bits natively as through Python."""
    rng = np.random.default_rng(c * 7 + n)
    w = numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
             helper.make_node("GlobalAveragePool", ["a"], ["y"], name="gap")]
    g = helper.make_graph(nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("a", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = qo.InferenceSession(qo.quantize_model(m, measure=False), threads=threads)
    assert [type(k).__name__ for k in sess.fused] == ["PoolKernel"]
    x = rng.standard_normal((n, c) + hw).astype(np.float32)
    _ortops.set_native(False)
    try:
        y, a = sess.run(None, {"x": x})
    finally:
        _ortops.set_native(True)
    assert y.shape == (n, c, 1, 1)
    np.testing.assert_allclose(y, a.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-6, atol=1e-7)
    sess.run(None, {"x": x})   # the first call made the native one
    assert sess.fused[0]._native is not None
    assert np.array_equal(sess.run(None, {"x": x})[0].view(np.uint32), y.view(np.uint32))
