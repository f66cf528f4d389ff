"""qconv.onnx.InferenceSession as onnxruntime's InferenceSession: arguments in onnxruntime's order, its methods,
clear errors for anything else, and sessions that pickle (to other processes) with the same bits.

The model is built here with onnx.helper (two convs and a Relu) and quantized with qconv.onnx.quantize_model.
"""
import json
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.testing.asserts import sqnr_db  # noqa: E402
from session_workers import run_session  # noqa: E402

RNG = np.random.default_rng(37)
SPIN = "session.intra_op.allow_spinning"


def _float_model():
    """x (n, 4, 10, 10) -> Conv 3x3 (8) + bias -> Relu -> Conv 1x1 (6) -> y (n, 6, 10, 10)."""
    w1 = (RNG.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32)
    b1 = (RNG.standard_normal(8) / 10).astype(np.float32)
    w2 = (RNG.standard_normal((6, 8, 1, 1)) / 3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    g = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             ["n", 4, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("b1", b1), ("w2", w2))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


FLOAT = _float_model()
QUANT = qo.quantize_model(FLOAT, "int8-ch-sym")
X = RNG.standard_normal((2, 4, 10, 10)).astype(np.float32)


@pytest.fixture
def paths(tmp_path):
    onnx.save(FLOAT, tmp_path / "float.onnx")
    onnx.save(QUANT, tmp_path / "q.onnx")
    return str(tmp_path / "float.onnx"), str(tmp_path / "q.onnx")


def onnxruntime_user_script(InferenceSession, path, x):
    """An onnxruntime user's script, word for word: options, providers, the first input's name, run(None, ...)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = InferenceSession(path, so, providers=["CPUExecutionProvider"])
    input_name = sess.get_inputs()[0].name
    outputs = sess.run(None, {input_name: x})
    return sess, outputs


def test_an_onnxruntime_script_runs_unchanged_on_a_qconv_model(paths):
    float_path, q_path = paths
    qnodes = [n for n in onnx.load(q_path).graph.node if n.domain == qo.DOMAIN]
    assert [n.op_type for n in qnodes] == [qo.QCONV, qo.QCONV]   # both convs are qconv nodes in the file
    _, (want,) = onnxruntime_user_script(ort.InferenceSession, float_path, X)
    sess, (y,) = onnxruntime_user_script(qo.InferenceSession, q_path, X)
    assert len(sess.kernels) == 2 and sess.threads == 1   # qconv ran them; intra_op_num_threads is its threads
    assert y.shape == want.shape == (2, 6, 10, 10)
    assert sqnr_db(y, want) > 30.0
    np.testing.assert_array_equal(y, qo.InferenceSession(q_path, threads=1).run(None, {"x": X})[0])


def test_arguments_in_onnxruntime_order_and_by_name(paths):
    _, q_path = paths
    want, = qo.InferenceSession(q_path, threads=1).run(None, {"x": X})
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for sess in (qo.InferenceSession(q_path, so, ["CPUExecutionProvider"], [{}]),
                 qo.InferenceSession(path_or_bytes=q_path, sess_options=so, providers=["CPUExecutionProvider"],
                                     provider_options=[{}])):
        np.testing.assert_array_equal(sess.run(output_names=None, input_feed={"x": X}, run_options=ort.RunOptions()),
                                      [want])
        np.testing.assert_array_equal(sess.run(["y"], {"x": X})[0], want)
    for source in (QUANT, QUANT.SerializeToString()):   # a ModelProto, the model's bytes
        np.testing.assert_array_equal(qo.InferenceSession(source, so).run(None, {"x": X})[0], want)


def test_methods_of_onnxruntime(paths):
    _, q_path = paths
    sess = qo.InferenceSession(q_path, threads=2)
    assert [(i.name, i.shape, i.type) for i in sess.get_inputs()] == [("x", ["n", 4, 10, 10], "tensor(float)")]
    assert [o.name for o in sess.get_outputs()] == ["y"]
    assert sess.get_modelmeta().graph_name == "two_convs"
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert list(sess.get_provider_options()) == ["CPUExecutionProvider"]
    opts = sess.get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 1)
    assert opts.get_session_config_entry(SPIN) == "0" and opts.enable_mem_pattern is False
    with pytest.raises(NotImplementedError, match=r"use run\(output_names, input_feed\)"):
        sess.io_binding()


def test_session_options_rules(paths):
    """intra_op_num_threads sizes both pools unless threads is given; the user's config entry and memory pattern
    win; the options object keeps its thread counts and serves a second session."""
    _, q_path = paths
    so = ort.SessionOptions()
    so.intra_op_num_threads = 3
    so.add_session_config_entry(SPIN, "1")
    sess = qo.InferenceSession(q_path, so)
    assert sess.threads == 3 and all(k.layer.engine.threads == 3 for k in sess.kernels)
    opts = sess.get_session_options()
    assert opts.get_session_config_entry(SPIN) == "1" and opts.enable_mem_pattern is True
    sess2 = qo.InferenceSession(q_path, so, threads=1)   # the same options object again
    assert sess2.threads == 1 and sess2.get_session_options().intra_op_num_threads == 3
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], sess2.run(None, {"x": X})[0])
    plain = ort.SessionOptions()
    sess3 = qo.InferenceSession(q_path, plain, threads=2)
    assert sess3.get_session_options().intra_op_num_threads == 2
    assert (plain.intra_op_num_threads, plain.inter_op_num_threads) == (0, 0)   # left as given


@pytest.mark.parametrize("act_quant", ["none", None])
def test_act_quant_none_is_float_activations(paths, act_quant):
    _, q_path = paths
    sess = qo.InferenceSession(q_path, threads=1, act_quant=act_quant)
    assert sess.act_quant is None and all(k.layer.spec.act_quant is None for k in sess.kernels)
    tensor = qo.InferenceSession(q_path, threads=1, act_quant="tensor")
    assert all(k.layer.spec.act_quant == "tensor" for k in tensor.kernels)


def test_unknown_options_raise_type_error_naming_them(paths):
    float_path, q_path = paths
    for path in (float_path, q_path):   # a model without qconv nodes checks them too
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'colour'.*act_quant"):
            qo.InferenceSession(path, colour="blue")
    with pytest.raises(TypeError, match=r"'enable_mem_pattern' \(an onnxruntime.SessionOptions attribute: set it on "
                                        r"the sess_options"):
        qo.InferenceSession(q_path, enable_mem_pattern=True)
    with pytest.raises(TypeError, match=r"sess_options must be an onnxruntime.SessionOptions or None, got str "
                                        r"'cpu' \(qconv's device is keyword-only"):
        qo.InferenceSession(q_path, "cpu")
    with pytest.raises(ValueError, match="act_quant must be one of"):
        qo.InferenceSession(float_path, act_quant="int3")
    with pytest.raises(ValueError, match="threads must be >= 1"):
        qo.InferenceSession(q_path, threads=0)
    with pytest.raises(ValueError, match="the model bytes are not a readable ONNX model"):
        qo.InferenceSession(b"no model here")


def test_end_profiling_returns_onnxruntime_profile_with_the_qconv_nodes(paths, tmp_path):
    _, q_path = paths
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = qo.InferenceSession(q_path, so, threads=1)
    sess.run(None, {"x": X})
    name = sess.end_profiling()
    with open(name) as f:
        events = json.load(f)
    ops = {e["args"].get("op_name") for e in events if e.get("cat") == "Node"}
    assert qo.QCONV in ops


def _state_of(sess):
    opts = sess.get_session_options()
    return (sess.device, sess.threads, sess.act_quant, [k.layer.spec.act_quant for k in sess.kernels],
            opts.graph_optimization_level, opts.log_severity_level, opts.get_session_config_entry(SPIN))


@pytest.mark.parametrize("source", ["path", "bytes", "proto"])
def test_pickle_round_trip_keeps_options_and_bits(paths, source):
    _, q_path = paths
    model = {"path": q_path, "bytes": QUANT.SerializeToString(), "proto": QUANT}[source]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    so.add_session_config_entry(SPIN, "1")
    sess = qo.InferenceSession(model, so, threads=1, act_quant="tensor")
    copy = pickle.loads(pickle.dumps(sess))
    assert _state_of(copy) == _state_of(sess) == ("cpu", 1, "tensor", ["tensor", "tensor"],
                                                  ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, 3, "1")
    np.testing.assert_array_equal(copy.run(None, {"x": X})[0], sess.run(None, {"x": X})[0])
    copy.close()
    with pytest.raises(RuntimeError, match="closed"):
        pickle.dumps(copy)


def test_pickle_refuses_a_changed_file(paths):
    _, q_path = paths
    sess = qo.InferenceSession(q_path, threads=1)
    onnx.save(qo.quantize_model(FLOAT, "int4-b8-asym"), q_path)
    with pytest.raises(RuntimeError, match="changed since this session read it"):
        pickle.dumps(sess)


def test_session_object_runs_in_spawned_worker_processes(paths):
    _, q_path = paths
    sess = qo.InferenceSession(q_path, threads=1)
    xs = [X, RNG.standard_normal((3, 4, 10, 10)).astype(np.float32)]
    want = [sess.run(None, {"x": x})[0] for x in xs]
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(run_session, [sess] * len(xs), [{"x": x} for x in xs]))
    assert all(pid != multiprocessing.current_process().pid for pid, _ in results)
    for (_, (y,)), w in zip(results, want):
        np.testing.assert_array_equal(y, w)
