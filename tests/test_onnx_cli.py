"""``python -m qconv quantize`` / ``run`` on a small graph built here."""
import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qconv.cli import main  # noqa: E402


@pytest.fixture
def float_model(tmp_path):
    rng = np.random.default_rng(3)
    w1, w2 = (rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32), (rng.standard_normal((4, 8, 1, 1)) / 3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="c2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2.astype(np.float32), "w2")])
    path = tmp_path / "float.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_quantize_then_run_with_reference(float_model, tmp_path, capsys):
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(float_model), str(out), "--scheme", "int4-b8-asym"]) == 0
    text = capsys.readouterr().out
    assert "quantized 2 layers" in text and "2 int4-b8-asym" in text and "fused" in text
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    js = tmp_path / "r.json"
    assert main(["run", str(out), "--input", str(tmp_path / "x.npy"), "--reference", str(float_model),
                 "--repeat", "3", "--threads", "1", "--json", str(js), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "median" in text and "p90" in text and "peak RSS" in text and "SQNR" in text
    r = json.loads(js.read_text())
    assert r["qconv_nodes"] == 2 and r["repeat"] == 3 and r["weight_bytes"]["quantized_layers"] == 2
    assert 10 < r["sqnr_db"]["y"] < 60 and r["median_ms"] > 0 and r["peak_rss_mb"] > 10


def test_run_reads_images(float_model, tmp_path, capsys):
    from PIL import Image

    Image.fromarray((np.arange(20 * 20 * 3) % 251).astype(np.uint8).reshape(20, 20, 3)).save(tmp_path / "i.png")
    out = tmp_path / "q.onnx"
    main(["quantize", str(float_model), str(out)])
    assert main(["run", str(out), "--input", str(tmp_path / "i.png"), "--mean", "0.5", "--std", "0.5",
                 "--repeat", "1", "--reference", str(float_model), "--no-progress"]) == 0
    assert "SQNR" in capsys.readouterr().out


def test_plan_and_scheme_are_exclusive(float_model, tmp_path):
    with pytest.raises(SystemExit):
        main(["quantize", str(float_model), str(tmp_path / "q.onnx"), "--scheme", "int8-ch-sym", "--plan", "p.json"])


def test_quantize_with_a_saved_plan(float_model, tmp_path, capsys):
    from qconv.model_report import Plan

    plan = tmp_path / "plan.json"
    Plan(str(float_model), 25.0, "tensor", {"c1": dict(scheme="int4-b8-asym", bytes=0, sqnr_db=30.0),
                                           "c2": dict(scheme="float", bytes=0, sqnr_db=float("inf"))}).save(plan)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(float_model), str(out), "--plan", str(plan)]) == 0
    text = capsys.readouterr().out
    assert "quantized 1 layers" in text and "float: c2: float in the plan" in text
    q = onnx.load(out)
    assert [n.op_type for n in q.graph.node] == ["QConv", "Conv"]


def test_quantize_with_bias_correction_and_block_activations(float_model, tmp_path, capsys):
    """``--scheme ...-bc --calibration`` corrects the biases; ``--act-quant block --act-block N`` is recorded per
    layer and is what ``run`` uses (``--act-quant none``: float activations)."""
    import qconv.onnx as qo

    rng = np.random.default_rng(1)
    np.save(tmp_path / "c.npy", (rng.standard_normal((1, 3, 16, 16)) + 1).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(float_model), str(out), "--scheme", "int4-ch-sym-bc", "--calibration",
                 str(tmp_path / "c.npy"), "--act-quant", "block", "--act-block", "4"]) == 0
    assert "activations: block, blocks of [3, 4] input channels" in capsys.readouterr().out
    q = onnx.load(out)
    s = qo.model_summary(q)
    assert s["act_quant"] == "block" and {n: e["act_block"] for n, e in s["layers"].items()} == {"c1": 3, "c2": 4}
    assert {t.name for t in q.graph.initializer} >= {"c1.bias", "c2.bias"}  # the float model has no bias
    js = tmp_path / "r.json"
    for act in ("none", None):
        assert main(["run", str(out), "--input", str(tmp_path / "c.npy"), "--repeat", "1", "--device", "reference",
                     "--json", str(js), "--no-progress"] + (["--act-quant", act] if act else [])) == 0
        assert json.loads(js.read_text())["act_quant"] == (None if act else "block")
    capsys.readouterr()
    assert main(["quantize", str(float_model), str(out), "--act-block", "4"]) == 2  # a user error: one line
    assert "act_quant='block'" in capsys.readouterr().err


def test_quantize_with_calibration_searches_int8_activations_unless_told(float_model, tmp_path, capsys):
    """``--calibration`` runs the smoothing and the activation search and says what it found; ``--act-budget -1
    --smooth -1`` records neither; a budget of 200 dB lets every conv run int8."""
    import qconv.onnx as qo

    rng = np.random.default_rng(2)
    np.save(tmp_path / "c.npy", (rng.standard_normal((1, 3, 16, 16)) + 1).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(float_model), str(out), "--calibration", str(tmp_path / "c.npy"),
                 "--act-budget", "200", "--no-progress"]) == 0
    assert "int8 activations allowed on 2 of 2 one-group convs" in capsys.readouterr().out
    s = qo.model_summary(onnx.load(out))
    assert s["act_search"]["budget_db"] == 200 and s["smooth"]["smoothed"] == 1
    assert main(["quantize", str(float_model), str(out), "--calibration", str(tmp_path / "c.npy"),
                 "--act-budget", "-1", "--smooth", "-1", "--no-progress"]) == 0
    assert "int8 activations" not in capsys.readouterr().out
    s = qo.model_summary(onnx.load(out))
    assert "act_search" not in s and "smooth" not in s


def test_quantize_says_which_convtransposes_it_rewrote(tmp_path, capsys):
    """A 2x2 stride-2 ConvTranspose becomes a QConv node (the CLI says so); a 3x3 one stays float, with its reason."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 2, 2)).astype(np.float32), "u"),
             numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "v")]
    nodes = [helper.make_node("ConvTranspose", ["x", "u"], ["t"], name="up2", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ConvTranspose", ["t", "v"], ["y"], name="up3", kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path, out = tmp_path / "t.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    assert main(["quantize", str(path), str(out)]) == 0
    text = capsys.readouterr().out
    assert "rewrote 1 ConvTranspose (kernel = stride)" in text
    assert "float: up3: ConvTranspose: stays an onnxruntime float op" in text
