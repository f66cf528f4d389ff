"""Integer activations measured per node: smoothing (qconv.onnx.smooth), the activation search
(qconv.onnx.accuracy.search_act_modes), what quantize_model records and what a session's act_quant="auto" runs.
Small graphs built here with onnx.helper; the zoo's figures are in docs/benchmarks_cpu.md."""
import pickle

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.onnx import smooth  # noqa: E402
from qconv.onnx.accuracy import measure_model, search_act_modes  # noqa: E402
from qconv.onnx.kernels import INT8_FAST_KERNELS, auto_act_quant, cpu_kernel  # noqa: E402
from qconv.onnx.quantize import model_summary  # noqa: E402
from qconv.onnx_model import capture, model_layers  # noqa: E402

SHAPE = (1, 6, 12, 10)


@pytest.fixture
def int8_auto(monkeypatch):
    """act_quant="auto" runs allowed nodes int8 on this machine's kernel too (on CPUs without VNNI or AMX it keeps
    them float, kernels.INT8_FAST_KERNELS): the tests of what a session runs then hold on every CI machine."""
    from qconv.onnx import kernels

    monkeypatch.setattr(kernels, "INT8_FAST_KERNELS", tuple(INT8_FAST_KERNELS) + (cpu_kernel(),))


def outlier_model(seed: int = 3, outlier: float = 40.0):
    """x (1,6,12,10) -> conv1 3x3 6->16 (channel 0 of its output ``outlier`` times the others) -> HardSwish ->
    conv2 1x1 16->16 -> Relu -> dw3 3x3 depthwise -> conv4 3x3 16->8 -> Add(conv4, conv5(x)) -> y. conv2's and
    conv4's inputs are smoothable (a fused tail of one layer, one consumer); conv5 reads the graph input, not."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    w1 = w(16, 6, 3, 3)
    w1[0] *= outlier
    inits = dict(w1=w1, b1=w(16), w2=w(16, 16, 1, 1), b2=w(16), w3=w(16, 1, 3, 3), b3=w(16), w4=w(8, 16, 3, 3),
                 b4=w(8), w5=w(8, 6, 1, 1))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"], name="hsw1"),
             helper.make_node("Conv", ["h1", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="dw3", group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c3", "w4", "b4"], ["c4"], name="conv4", pads=[1, 0, 1, 2], strides=[1, 2]),
             helper.make_node("Conv", ["x", "w5"], ["c5"], name="conv5", strides=[1, 2]),
             helper.make_node("Add", ["c4", "c5"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def feeds(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(n)]


def run(model, feed):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_channel_ranges_are_the_max_abs_of_each_input_channel_over_every_feed():
    m = outlier_model()
    layers = model_layers(m, {})
    fs = feeds(3, 1)
    got = smooth.channel_ranges(m, layers, fs)
    conv2 = next(la for la in layers if la.name == "conv2")
    want = np.max([np.abs(capture(m, layers, f)[conv2.input_name]).max(axis=(0, 2, 3)) for f in fs], axis=0)
    np.testing.assert_array_equal(got["conv2"], want)


def test_smoothing_keeps_the_float_model_and_evens_the_smoothed_inputs():
    """y is the same function after smoothing (float32 rounding); the inputs of the smoothed convs have channel
    ranges closer to each other (their max / min ratio falls), the unsmoothable conv5 (graph input) is left."""
    m = outlier_model()
    layers = model_layers(m, {})
    fs = feeds(2, 1)
    ranges = smooth.channel_ranges(m, layers, fs)
    ms, done = smooth.smooth_model(m, layers, ranges, 0.5)
    assert set(done) == {"conv2", "dw3", "conv4"}
    for f in feeds(2, 9):
        y, ys = run(m, f), run(ms, f)
        np.testing.assert_allclose(ys, y, rtol=1e-4, atol=1e-4 * np.abs(y).max())
    after = smooth.channel_ranges(ms, model_layers(ms, {}), fs)
    for name in done:
        before_ratio = ranges[name].max() / ranges[name].min()
        assert after[name].max() / after[name].min() < before_ratio, name
    assert not any(n.name == smooth.PREFIX + "conv5" for n in ms.graph.node)


def test_the_smoothing_mul_folds_into_the_producer_and_int8_activations_gain():
    """quantize_model with calibration smooths, folds every inserted Mul (no extra node in the quantized graph),
    and per-tensor int8 activations of the smoothed model are more accurate than without smoothing."""
    m, cal, ev = outlier_model(), feeds(3, 1), feeds(3, 2)
    q = qo.quantize_model(m, calibration=cal, measure=False, act_budget=0.0)
    q0 = qo.quantize_model(m, calibration=cal, measure=False, act_budget=0.0, smooth=None)
    assert not any(n.name.startswith(smooth.PREFIX) for n in q.graph.node)
    assert len(q.graph.node) == len(q0.graph.node)
    assert model_summary(q)["smooth"]["smoothed"] == 3 and "smooth" not in model_summary(q0)
    db = measure_model(m, q, ev, act_quant="tensor")["sqnr_db"]
    db0 = measure_model(m, q0, ev, act_quant="tensor")["sqnr_db"]
    assert db > db0 + 3.0, (db, db0)


def test_an_unfoldable_smoothing_is_dropped():
    """conv2's input fed by a Sigmoid (no fusable tail of a qconv layer): quantize_model keeps no Mul there."""
    m = outlier_model()
    for n in m.graph.node:
        if n.op_type == "HardSwish":
            n.op_type = "Sigmoid"
    q = qo.quantize_model(m, calibration=feeds(2, 1), measure=False, act_budget=0.0)
    assert not any(n.name.startswith(smooth.PREFIX) for n in q.graph.node)
    assert model_summary(q)["smooth"]["not_folded"] >= 1


def test_the_search_keeps_the_goal_and_the_session_runs_what_it_recorded(int8_auto):
    """The recorded SQNR is what a default session gives on the calibration feeds and is >= the goal; the
    session's act_modes are the recorded ones; depthwise convs are never int8 under "auto"."""
    m, cal = outlier_model(), feeds(3, 1)
    q = qo.quantize_model(m, calibration=cal, measure=False, act_budget=1.0)
    s = model_summary(q)
    rec = s["act_search"]
    assert rec["sqnr_db"] >= rec["goal_db"] and rec["goal_db"] == pytest.approx(min(rec["float_sqnr_db"] - 1.0, 35),
                                                                             abs=0.011)
    again = measure_model(m, q, cal)["sqnr_db"]
    assert again == pytest.approx(rec["sqnr_db"], abs=0.011)
    sess = qo.InferenceSession(q)
    for name, e in s["layers"].items():
        assert sess.act_modes[name] == ("tensor" if "tensor" in e["act_allowed"] else "float"), name
    assert s["layers"]["dw3"]["act_allowed"] == ["float"] and sess.act_modes["dw3"] == "float"
    assert rec["int8_nodes"] == sum("tensor" in e["act_allowed"] for e in s["layers"].values())
    assert qo.InferenceSession(q, device="reference").act_modes == sess.act_modes


def test_auto_runs_int8_only_where_allowed_on_one_group_convs_of_a_fast_kernel():
    """A session on a kernel outside INT8_FAST_KERNELS (here: "scalar") keeps every conv float."""
    q = qo.quantize_model(outlier_model(), calibration=feeds(2, 1), measure=False, act_budget=200.0)
    assert set(qo.InferenceSession(q, kernel="scalar").act_modes.values()) == {"float"}
    allowed = ["float", "tensor"]
    assert auto_act_quant(allowed, 1, "amx") == auto_act_quant(allowed, 1, "avx512vnni") == "tensor"
    for args in ((allowed, 1, "avx2"), (allowed, 1, "scalar"), (allowed, 4, "amx"), (["float"], 1, "amx"),
                 (None, 1, "amx")):
        assert auto_act_quant(*args) is None, args


def test_the_budget_decides_how_many_nodes_run_int8():
    """A budget nothing breaks makes every one-group conv int8; no budget (and no cap: ``enough_db`` inf) keeps
    them all float, said in ``refused``; the default cap of 35 dB lets int8 in where float is far above it."""
    m, cal = outlier_model(), feeds(2, 1)
    convs = {"conv1", "conv2", "conv4", "conv5"}
    q = qo.quantize_model(m, calibration=cal, measure=False, act_budget=200.0)
    assert {n for n, e in model_summary(q)["layers"].items() if "tensor" in e["act_allowed"]} == convs
    plain = qo.quantize_model(m, calibration=cal, measure=False, act_budget=None)
    found = search_act_modes(m, plain, cal, budget_db=0.0, enough_db=float("inf"))
    assert set(found.refused) == convs and all(a == ["float"] for a in found.allowed.values())
    capped = search_act_modes(m, plain, cal, budget_db=0.0)
    assert found.float_sqnr_db > 35 and capped.goal_db == 35 and capped.sqnr_db >= 35
    assert len(capped.refused) < len(convs)


def test_without_calibration_or_search_every_conv_stays_float():
    m = outlier_model()
    for q in (qo.quantize_model(m, measure=False), qo.quantize_model(m, calibration=feeds(2, 1), measure=False,
                                                                       act_budget=None)):
        s = model_summary(q)
        assert "act_search" not in s and "smooth" not in s
        assert set(qo.InferenceSession(q).act_modes.values()) == {"float"}


def test_act_allowed_without_a_search_record_is_not_used():
    """Files of earlier releases recorded a model-wide act_allowed: without ``act_search`` the session runs float."""
    import json

    q = qo.quantize_model(outlier_model(), calibration=feeds(2, 1), measure=False, act_budget=200.0)
    s = model_summary(q)
    del s["act_search"]
    for p in q.metadata_props:
        if p.key == "qconv.summary":
            p.value = json.dumps(s)
    assert set(qo.InferenceSession(q).act_modes.values()) == {"float"}


def test_the_session_options_override_the_recorded_modes():
    q = qo.quantize_model(outlier_model(), calibration=feeds(2, 1), measure=False, act_budget=200.0)
    assert set(qo.InferenceSession(q, act_quant="none").act_modes.values()) == {"float"}
    assert set(qo.InferenceSession(q, act_quant="tensor").act_modes.values()) == {"tensor"}


def test_the_measured_accuracy_is_the_default_sessions_and_float_activations_beside():
    m, cal, ev = outlier_model(), feeds(2, 1), feeds(2, 2)
    q = qo.quantize_model(m, calibration=cal, eval=ev, act_budget=200.0)
    acc = model_summary(q)["accuracy"]
    assert acc["cpu_kernel"] == cpu_kernel()
    assert acc["sqnr_db"] == pytest.approx(measure_model(m, q, ev)["sqnr_db"], abs=0.011)
    assert acc["float_act_sqnr_db"] == pytest.approx(measure_model(m, q, ev, act_quant="none")["sqnr_db"], abs=0.011)


def test_bad_budgets_and_alphas_are_refused_and_a_searched_model_is_not_searched_again():
    m, cal = outlier_model(), feeds(1, 1)
    with pytest.raises(ValueError, match="act_budget"):
        qo.quantize_model(m, calibration=cal, act_budget=-1.0)
    with pytest.raises(ValueError, match="smooth"):
        qo.quantize_model(m, calibration=cal, smooth=1.5)
    with pytest.raises(TypeError, match="act_budget"):
        qo.quantize_model(m, calibration=cal, act_budget="3")
    q = qo.quantize_model(m, calibration=cal, measure=False, act_budget=200.0)
    with pytest.raises(ValueError, match="already records"):
        search_act_modes(m, q, cal)


def test_the_search_is_reproducible_across_thread_counts():
    """The search decides on measured SQNR only (the engine gives the same bits on any thread count): the same
    file from 1 and 2 threads."""
    m, cal = outlier_model(), feeds(2, 1)
    a = qo.quantize_model(m, calibration=cal, measure=False, act_budget=1.0, threads=1)
    b = qo.quantize_model(m, calibration=cal, measure=False, act_budget=1.0, threads=2)
    sa, sb = model_summary(a), model_summary(b)
    for s in (sa, sb):
        s["act_search"].pop("seconds")
    assert a.graph.SerializeToString() == b.graph.SerializeToString() and sa == sb


def test_auto_times_narrow_int8_nodes_and_keeps_the_faster_mode(int8_auto, monkeypatch):
    """act_quant="auto" on the CPU: a node that auto_act_quant gives int8 and whose outputs each sum at most
    ACT_TIMED_PRODUCTS products (conv1 54, conv2 16, conv5 6) is timed in both modes at its first call; float
    displaces int8 only when ACT_TIMING_MARGIN faster (forced both ways here), the choice is remembered per process,
    act_modes says what runs, and the outputs are those of a session given the same modes. conv4 (144 products),
    sessions with QCONV_ACT_TIMING=0, measure_model's sessions and the reference engine never time."""
    from qconv.onnx import kernels

    m = outlier_model()
    q = qo.quantize_model(m, calibration=feeds(2, 1), measure=False, act_budget=200.0)
    x = feeds(1, 5)[0]
    recorded = {"conv1": "tensor", "conv2": "tensor", "dw3": "float", "conv4": "tensor", "conv5": "tensor"}
    narrow = ("conv1", "conv2", "conv5")
    for margin, mode in ((1e9, "float"), (0.0, "tensor")):
        monkeypatch.setattr(kernels, "ACT_TIMING_MARGIN", margin)
        kernels._act_choices.clear()
        sess = qo.InferenceSession(q)
        assert sess.act_modes == recorded   # before its first call a node runs what the model records
        y = sess.run(None, x)[0]
        assert sess.act_modes == {**recorded, **dict.fromkeys(narrow, mode)}
        monkeypatch.setenv("QCONV_ACT_TIMING", "0")
        given = qo.InferenceSession(q)
        for k in given.kernels:
            k.set_act_quant(None if sess.act_modes[k.name] == "float" else sess.act_modes[k.name])
        assert np.array_equal(given.run(None, x)[0], y)
        assert qo.InferenceSession(q).act_modes == recorded
        monkeypatch.delenv("QCONV_ACT_TIMING")
    monkeypatch.setattr(kernels, "ACT_TIMING_MARGIN", 1e9)   # remembered: the last choice (int8) stays
    again = qo.InferenceSession(q)
    again.run(None, x)
    assert again.act_modes == recorded
    kernels._act_choices.clear()   # a float choice travels with a pickled session, whatever the copy would time
    chose = qo.InferenceSession(q)
    y = chose.run(None, x)[0]
    monkeypatch.setattr(kernels, "ACT_TIMING_MARGIN", 0.0)
    kernels._act_choices.clear()
    copy = pickle.loads(pickle.dumps(chose))
    assert copy.act_modes == chose.act_modes != recorded
    assert np.array_equal(copy.run(None, x)[0], y) and copy.act_modes == chose.act_modes
    kernels._act_choices.clear()
    ref = qo.InferenceSession(q, device="reference")
    ref.run(None, x)
    assert ref.act_modes == recorded
    db = measure_model(m, q, feeds(2, 7))["sqnr_db"]
    monkeypatch.setenv("QCONV_ACT_TIMING", "0")
    assert measure_model(m, q, feeds(2, 7))["sqnr_db"] == db
