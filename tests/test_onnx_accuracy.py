"""Model-level accuracy (qconv.onnx.accuracy, quantize_model's eval / target_sqnr / min_sqnr): on small graphs
built here with onnx.helper; the zoo models are in tests/test_zoo_accuracy.py."""
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from hypothesis import given, settings, strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.model_report import Plan, Scheme  # noqa: E402
from qconv.onnx.accuracy import (DEFAULT_SCHEME, Candidates, WeightProxy, measure_model, pooled_sqnr,  # noqa: E402
                                  search_plan)
from qconv.onnx.quantize import GUARD_DB, LowAccuracyWarning  # noqa: E402
from qconv.onnx_model import model_layers  # noqa: E402

def chain(bn: bool = False, linear: bool = True, seed: int = 5):
    """x(1,8,14,10) -> 5 convs (dense, strided, grouped, depthwise, 1x1; Relu / Clip between, a BatchNormalization
    after the first with ``bn``) -> GlobalAveragePool -> Flatten -> MatMul (with ``linear``) -> y; weights drawn
    from ``seed`` (the same graph whatever the order the tests run in)."""
    rng = np.random.default_rng(seed)

    def _w(*shape, scale=1.0):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:])) * scale).astype(np.float32)

    inits = dict(w1=_w(16, 8, 3, 3), b1=_w(16), w2=_w(24, 16, 3, 3), b2=_w(24), w3=_w(24, 6, 3, 3), b3=_w(24),
                 w4=_w(24, 1, 3, 3), b4=_w(24), w5=_w(32, 24, 1, 1), b5=_w(32), W=_w(10, 32).T.copy(),
                 lo=np.array(0, np.float32), hi=np.array(6, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1])]
    last = "c1"
    if bn:
        inits.update(g=(1 + 0.3 * rng.standard_normal(16)).astype(np.float32), be=_w(16), mu=_w(16),
                     var=(0.5 + rng.random(16)).astype(np.float32))
        nodes.append(helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"], name="bn1"))
        last = "n1"
    nodes += [helper.make_node("Relu", [last], ["r1"], name="relu1"),
              helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", strides=[2, 1], pads=[1, 0, 1, 2]),
              helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip2"),
              helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="grouped3", group=4, pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
              helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"], name="dw4", group=24, dilations=[1, 2],
                               pads=[1, 2, 1, 2]),
              helper.make_node("Conv", ["c4", "w5", "b5"], ["c5"], name="conv5"),
              helper.make_node("GlobalAveragePool", ["c5"], ["p"], name="pool"),
              helper.make_node("Flatten", ["p"], ["f"], name="flat")]
    out = "f"
    if linear:
        nodes.append(helper.make_node("MatMul", ["f", "W"], ["y"], name="fc"))
        out = "y"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 10])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def feeds(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 8, 14, 10)) + 0.5).astype(np.float32)} for _ in range(n)]


def test_measure_model_pools_the_signal_and_noise_of_every_feed():
    """measure_model's SQNR is 10 log10(sum of signal / sum of noise) over all feeds, from qconv's session."""
    model, fs = chain(), feeds(3, 1)
    q = qo.quantize_model(model, "int4-b8-asym", measure=False)
    acc = measure_model(model, q, fs, threads=1)
    sess = qo.InferenceSession(q, threads=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ys, rs = [sess.run(None, f)[0] for f in fs], [ref.run(None, f)[0] for f in fs]
    signal = sum(float((r.astype(np.float64) ** 2).sum()) for r in rs)
    noise = sum(float(((y.astype(np.float64) - r) ** 2).sum()) for y, r in zip(ys, rs))
    assert acc["feeds"] == 3 and list(acc["outputs"]) == ["y"]
    assert acc["sqnr_db"] == pytest.approx(10 * np.log10(signal / noise), abs=1e-9)
    assert acc["outputs"]["y"]["max_abs_err"] == pytest.approx(max(np.abs(y - r).max() for y, r in zip(ys, rs)))


def test_pooled_sqnr_of_equal_outputs_is_infinite_and_of_zero_signal_minus_infinite():
    """pooled_sqnr: no noise -> inf, no signal -> -inf; integer outputs are not measured."""
    a = np.ones(3, np.float32)
    assert pooled_sqnr([[a, np.arange(3)]], [[a, np.arange(3)]]) == {0: (np.inf, 0.0)}
    assert pooled_sqnr([[a]], [[0 * a]])[0][0] == -np.inf


@pytest.mark.parametrize("scheme", ["int8-ch-sym", "int4-b8-asym", "int8-b8-sym", "int8-ch-zp", "int4-b8-zp-bc"])
def test_the_proxy_measures_what_the_session_gives(scheme):
    """With float activations (the session's default for convs; act_quant=None also for the MatMul, whose default
    is per-row int8) the weight proxy (dequantized weights in the float model; biases, corrected ones too, as
    inputs, a MatMul's through an Add) gives the qconv session's output SQNR within 0.05 dB (no folded ops: the
    same codes)."""
    from qconv.onnx.quantize import _proxy

    model, fs = chain(), feeds(2, 2)
    q = qo.quantize_model(model, scheme, fuse=False, measure=False)
    real = measure_model(model, q, fs, threads=1, act_quant=None)["sqnr_db"]
    layers = model_layers(model)
    cands = _proxy(model, layers, fs, 1)   # -bc: data-free, on the synthetic input quantize_model used
    proxy = cands.proxy.sqnr(cands.assign({la.name: Scheme.parse(scheme) for la in layers}))
    halves = [measure_model(model, q, f, threads=1, act_quant=None)["sqnr_db"] for f in (fs[:1], fs[1:])]
    assert proxy == pytest.approx(min([real] + halves), abs=0.05)


def _search(target, bn=False):
    model, fs = chain(bn=bn), feeds(2, 3)
    cands = Candidates(WeightProxy(model, model_layers(model), fs, threads=1))
    ladder = [Scheme.parse(s) for s in ("int4-b8-asym", "int8-ch-sym", "int8-b8-asym", "float")]
    return cands, search_plan(cands, target, ladder, ladder[1])


@settings(max_examples=8, deadline=None)
@given(offset=st.floats(-12.0, 12.0))
def test_a_plan_is_never_dominated_by_all_int8(offset):
    """Around all-int8's own SQNR: a plan at >= all-int8's bytes is at least as accurate; when all-int8 meets the
    target the plan's bytes are <= all-int8's and it meets the target too; every figure re-measures."""
    base_db = _search(200.0)[1].base_sqnr_db
    cands, r = _search(base_db + offset)
    if r.nbytes >= r.base_nbytes:
        assert r.sqnr_db >= r.base_sqnr_db
    if r.base_sqnr_db >= base_db + offset:
        assert r.nbytes <= r.base_nbytes and r.sqnr_db >= base_db + offset
    assert cands.nbytes(r.schemes) == r.nbytes
    assert cands.proxy.sqnr(cands.assign(r.schemes)) == pytest.approx(r.sqnr_db, abs=1e-9)


def test_a_reachable_target_above_all_int8_is_reached_by_promoting_layers():
    """A target between all-int8 and float is reached by moving layers up the ladder (int8-b8-asym or float)."""
    base = _search(200.0)[1].base_sqnr_db
    _, r = _search(base + 4)
    assert r.sqnr_db >= base + 4
    assert any(s.bits is None or s.block_size for s in r.schemes.values())


def test_quantize_model_target_sqnr_searches_on_calibration_and_measures_on_eval():
    """target_sqnr: the search runs on the calibration feeds only, and the model's accuracy is measured by a qconv
    session on the eval feeds, both recorded in qconv.summary."""
    model = chain(bn=True)
    q = qo.quantize_model(model, target_sqnr=25.0, calibration=feeds(2, 4), eval=feeds(2, 5))
    s = qo.model_summary(q)
    assert s["search"]["sqnr_db"] >= 25.0 and s["search"]["on"] == "2 calibration inputs"
    assert s["accuracy"]["source"] == "2 evaluation input(s)"
    assert s["accuracy"]["sqnr_db"] == pytest.approx(measure_model(model, q, feeds(2, 5))["sqnr_db"], abs=0.006)
    schemes = {e["scheme"] for e in s["layers"].values()}
    ladder = set(s["search"]["ladder"]) | {s["search"]["int8_scheme"]}
    assert schemes <= ladder
    assert s["search"]["int8_scheme"] == DEFAULT_SCHEME
    gptq_layers = any("gptq" in e["scheme"] for e in s["layers"].values())
    assert s["search"]["gptq"].startswith("kept" if gptq_layers else "not kept")
    # the plan's bytes: all-int8's at most, as all-int8 meets 25 dB on this graph
    assert s["search"]["int8_sqnr_db"] < 25.0 or s["search"]["nbytes"] <= s["search"]["int8_nbytes"]
    # the guard band: the search aims 1 dB above the target, or at all-int8 when that alone meets the target
    band = 25.0 <= s["search"]["int8_sqnr_db"] < 25.0 + GUARD_DB
    assert s["search"]["searched_for_db"] == pytest.approx(s["search"]["int8_sqnr_db"] if band else 25.0 + GUARD_DB,
                                                          abs=0.01)
    assert s["search"]["sqnr_db"] >= s["search"]["searched_for_db"] - 0.01


def test_the_guard_names_three_layers_whose_return_raises_the_sqnr():
    """Below min_sqnr a LowAccuracyWarning names three layers; returning each to int8 alone raises the model's SQNR
    (re-measured through quantize_model with a plan)."""
    model, ev = chain(), feeds(2, 6)
    with pytest.warns(LowAccuracyWarning, match="below the floor") as caught:
        q = qo.quantize_model(model, "int4-b8-asym", eval=ev, min_sqnr=80.0)
    acc = qo.model_summary(q)["accuracy"]
    assert acc["below_floor"] and len(acc["restore"]) == 3
    assert all(r["layer"] in str(caught[0].message) for r in acc["restore"])
    layers = [la.name for la in model_layers(model)]
    for r in acc["restore"]:
        entries = {n: dict(scheme="int8-ch-sym" if n == r["layer"] else "int4-b8-asym", bytes=0, sqnr_db=0.0)
                   for n in layers}
        back = qo.quantize_model(model, plan=Plan("chain", 0.0, None, entries), eval=ev, min_sqnr=None)
        assert qo.model_summary(back)["accuracy"]["sqnr_db"] > acc["sqnr_db"]


def test_the_guard_is_silent_above_the_floor():
    """The default scheme on a well-conditioned graph: no warning, below_floor False."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", LowAccuracyWarning)
        q = qo.quantize_model(chain(), eval=feeds(1, 7))
    acc = qo.model_summary(q)["accuracy"]
    assert not acc["below_floor"] and acc["sqnr_db"] > 30


def test_a_float16_model_is_refused_at_quantize_time():
    """float16 weights: ValueError naming float16, not a session failure later."""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float16), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], [w])
    with pytest.raises(ValueError, match="is float16.*qconv quantizes float32 models"):
        qo.quantize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("label", ["int4-b33-asym", "int8-b2-sym", "int4-b2048-sym"])
def test_block_sizes_the_engines_do_not_run_are_refused(label):
    """Scheme names are validated: power-of-two blocks from 4 to 1024 only."""
    with pytest.raises(ValueError, match="block size"):
        qo.quantize_model(chain(), label)


def test_layers_left_float_are_listed_with_their_reason():
    """A ConvTranspose and a Conv whose weight is computed stay float, each with its reason in qconv.summary."""
    inits = dict(w=np.full((4, 3, 3, 3), 0.1, np.float32), wt=np.full((4, 2, 3, 3), 0.1, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["c", "wt"], ["t"], name="up", strides=[2, 2]),
             helper.make_node("Neg", ["w"], ["wn"], name="neg"),
             helper.make_node("Conv", ["x", "wn"], ["c2"], name="computed", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("t", "c2")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    s = qo.model_summary(qo.quantize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])))
    assert list(s["layers"]) == ["conv"]
    assert s["skipped"]["up"].startswith("ConvTranspose: stays an onnxruntime float op")
    assert "not a constant" in s["skipped"]["computed"]


def test_weight_bytes_and_model_summary_take_paths(tmp_path):
    """weight_bytes(path) and model_summary(path) read the file."""
    path = tmp_path / "q.onnx"
    q = qo.quantize_model(chain(), measure=False)
    onnx.save(q, path)
    assert qo.weight_bytes(str(path)) == qo.weight_bytes(q)
    assert qo.model_summary(str(path)) == qo.model_summary(q) and qo.model_summary(path)["layers"]


def test_a_quantized_file_says_how_to_run_it():
    """The metadata of a quantized model names qconv's session (plain onnxruntime cannot run ai.qconv nodes)."""
    meta = {p.key: p.value for p in qo.quantize_model(chain(), measure=False).metadata_props}
    assert "qconv.onnx.InferenceSession" in meta["qconv.runtime"]


def test_cli_exits_3_below_the_floor_and_names_the_layers(tmp_path):
    """quantize below --min-sqnr: one line on stderr naming the layers, exit status 3; --allow-low-accuracy: 0."""
    model = tmp_path / "m.onnx"
    onnx.save(chain(), model)
    np.save(tmp_path / "e.npy", feeds(1, 8)[0]["x"])
    base = [sys.executable, "-m", "qconv", "quantize", str(model), str(tmp_path / "q.onnx"), "--scheme",
            "int4-b8-asym", "--eval", str(tmp_path / "e.npy"), "--min-sqnr", "80", "--no-progress"]
    low = subprocess.run(base, capture_output=True, text=True)
    assert low.returncode == 3, low.stderr
    line = [ln for ln in low.stderr.splitlines() if "below --min-sqnr" in ln]
    assert len(line) == 1 and "Traceback" not in low.stderr
    summary = qo.model_summary(str(tmp_path / "q.onnx"))
    assert all(r["layer"] in line[0] for r in summary["accuracy"]["restore"])
    ok = subprocess.run(base + ["--allow-low-accuracy", "--layers"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "accuracy at the model's outputs vs float, on 1 evaluation input(s)" in ok.stdout
    assert "weight SQNR dB" in ok.stdout and "grouped3" in ok.stdout
    assert json.loads(json.dumps(summary))["accuracy"]["min_sqnr"] == 80.0


def _uniform(n, seed, shape=(1, 8, 14, 10)):
    rng = np.random.default_rng(seed)
    return [{"x": rng.random(shape, dtype=np.float32)} for _ in range(n)]


def test_the_default_bias_correction_is_data_free_said_and_helps():
    """Without calibration inputs the default's -bc runs on a synthetic uniform [0, 1) input (said in
    qconv.summary): the first conv's corrected bias is its bias minus the mean output shift of its rounding on that
    input (qconv.gptq.output_shift), and on held-out inputs of that kind the corrected model is closer to float."""
    from qconv.gptq import output_shift
    from qconv.onnx.quantize import synthetic_feed
    from qconv.weights import quantize_weight

    model = chain(linear=False)
    q = qo.quantize_model(model, measure=False)
    s = qo.model_summary(q)
    assert DEFAULT_SCHEME.endswith("-bc") and s["bias_correction"] == "a synthetic input (uniform [0, 1), 1x8x14x10)"
    assert {e["scheme"] for e in s["layers"].values()} == {DEFAULT_SCHEME}
    syn = synthetic_feed(model)["x"]   # seeded uniform [0, 1): the same every time
    assert syn.shape == (1, 8, 14, 10) and syn.min() >= 0 and syn.max() < 1 and abs(syn.mean() - 0.5) < 0.05
    assert np.array_equal(syn, synthetic_feed(model)["x"])
    la = model_layers(model)[0]
    kw = dict(stride=la.stride, padding=la.padding, dilation=la.dilation)
    qw = quantize_weight(la.weight, 8, 0, False, zero_point=True)
    want = la.bias - output_shift(la.weight, qw, syn, **kw)
    got = [numpy_helper.to_array(t) for t in q.graph.initializer if t.name.startswith(la.name) and
           numpy_helper.to_array(t).shape == (16,) and numpy_helper.to_array(t).dtype == np.float32]
    assert any(np.allclose(g, want, rtol=0, atol=1e-6) for g in got), (got, want)
    held_out = _uniform(4, 11)
    plain = qo.quantize_model(model, DEFAULT_SCHEME.removesuffix("-bc"), measure=False)
    assert measure_model(model, q, held_out)["sqnr_db"] > measure_model(model, plain, held_out)["sqnr_db"]


def _fixed_size_model():
    """Conv on a dynamic-size input, then a Reshape that only a 1x3x8x8 input fits."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Reshape", ["c", "shape"], ["y"], name="reshape")], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 256], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_bias_correction_says_when_no_synthetic_input_runs_and_takes_the_eval_shape():
    """A model that does not run on the synthetic input's default shape (256 x 256 for dynamic dims) is quantized
    without the correction, said in qconv.summary; evaluation inputs lend their shape (not their values)."""
    model = _fixed_size_model()
    s = qo.model_summary(qo.quantize_model(model, measure=False))
    assert s["bias_correction"].startswith("none: the model does not run on a synthetic input")
    assert s["layers"]["conv"]["scheme"] == DEFAULT_SCHEME.removesuffix("-bc")
    ev = [{"x": np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)}]
    s = qo.model_summary(qo.quantize_model(model, eval=ev))
    assert s["bias_correction"] == "a synthetic input (uniform [0, 1), 1x3x8x8)"
    assert s["layers"]["conv"]["scheme"] == DEFAULT_SCHEME and s["accuracy"]["sqnr_db"] > 30


def test_calibration_inputs_replace_the_synthetic_one_and_gptq_needs_them():
    model = chain(linear=False)
    s = qo.model_summary(qo.quantize_model(model, calibration=_uniform(2, 3), measure=False))
    assert s["bias_correction"] == "2 calibration input(s)"
    with pytest.raises(ValueError, match="gptq.*pass calibration="):
        qo.quantize_model(model, "int8-ch-sym-gptq", measure=False)


def test_accuracy_control_fits_gptq_on_the_even_calibration_inputs_only():
    """The GPTQ rung's weights are fitted on calibration inputs 0, 2, ... (the odd ones hold them out), in the
    search's candidates and in the model quantize_model writes."""
    from qconv.onnx.quantize import GPTQ_FIT, _layer_calibration, _proxy

    model = chain(linear=False)
    cal = _uniform(4, 21)
    cands = _proxy(model, model_layers(model), cal, 1, cal, GPTQ_FIT)
    la = model_layers(model)[1]
    s = Scheme.parse("int4-b8-asym-gptq")
    xs, _ = _layer_calibration(model, [la], cal, {la.name})
    kw = dict(stride=la.stride, padding=la.padding, dilation=la.dilation)
    even = s.quantize(la.weight, la.groups, xs[la.name][::2], **kw).dequantize()
    every = s.quantize(la.weight, la.groups, xs[la.name], **kw).dequantize()
    got = cands.get(la.name, s)[0]
    assert np.array_equal(got, even) and not np.array_equal(got, every)
