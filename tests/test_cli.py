"""The demo command runs end to end and prints its table."""
import subprocess
import sys

from qconv.cli import format_table, run_demo


def test_demo_rows_have_errors_sizes_and_times():
    rows = run_demo(["reference"], repeat=1, quick=True, progress=False)
    assert rows and all("reference" in r["engines"] for r in rows)
    for r in rows:
        e = r["engines"]["reference"]
        assert "error" not in e and e["ms"] > 0 and 0 < e["rel_err"] < 0.3
        assert r["bytes_packed"] < r["bytes_float"]
    table = format_table(rows)
    assert table.count("\n") == len(rows) + 1 and "reference ms" in table


def test_python_dash_m_qconv_demo():
    out = subprocess.run([sys.executable, "-m", "qconv", "demo", "--quick", "--repeat", "1", "--no-progress",
                          "--engines", "reference"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "| layer | scheme |" in out.stdout


def test_inspect_command_writes_every_output(tmp_path):
    import json

    import pytest

    pytest.importorskip("onnxruntime", reason="needs onnxruntime (test extra)")
    from qconv.onnx_model import rapidocr_model

    try:
        model = rapidocr_model()
    except ImportError as exc:
        pytest.skip(f"PP-OCRv4 model not installed: {exc}")
    from qconv.cli import main

    out = {k: tmp_path / f"o.{k}" for k in ("json", "csv", "npz")}
    args = ["inspect", model, "--input-shape", "1,3,32,32", "--engines", "reference", "--repeat", "1",
            "--no-progress", "--scheme", "int8-ch-sym", "--json", str(out["json"]), "--csv", str(out["csv"]),
            "--save", str(out["npz"]), "--target-sqnr", "20", "--candidates", "int4-b32-asym,int8-ch-sym,float",
            "--save-plan", str(tmp_path / "plan.json")]
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", str(tmp_path / "p.png")]
    except ImportError:
        pass
    assert main(args) == 0
    rows = json.loads(out["json"].read_text())
    assert len({r["layer"] for r in rows}) == 62
    assert out["csv"].read_text().count("\n") == len(rows) + 1
    import numpy as np

    with np.load(out["npz"]) as z:
        assert sum(k.endswith("|q") for k in z.files) == 62
    from qconv.model_report import Plan

    plan = Plan.load(tmp_path / "plan.json")
    weights = plan.apply(model)
    assert len(weights) == 62 and min(e["sqnr_db"] for e in plan.layers.values()) >= 20


def _tiny_model(path):
    """Two 3x3 convs (8 -> 16 -> 16 channels) with a Relu between: an ONNX model written to ``path``."""
    import numpy as np
    import pytest

    onnx = pytest.importorskip("onnx", reason="needs onnx (test extra)")
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (test extra)")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return str(path)


def _inputs(tmp_path, n):
    import numpy as np

    paths = []
    for i in range(n):
        x = np.random.default_rng(100 + i).standard_normal((1, 8, 12, 12)).astype(np.float32)
        x[:, i % 8] *= 4  # inputs that differ in their statistics
        paths.append(str(tmp_path / f"in{i}.npy"))
        np.save(paths[-1], x)
    return paths


def test_inspect_calibration_inputs_are_held_out(tmp_path, capsys):
    """Issue 19 item 9: with --input IMG, -gptq schemes were calibrated on IMG itself and their SQNR measured on
    IMG (optimistic). --calibration takes other inputs; a single input used for both is flagged."""
    from qconv import model_report as mr
    from qconv.cli import main

    model = _tiny_model(tmp_path / "tiny.onnx")
    evaluation, *calibration = _inputs(tmp_path, 3)
    scheme = [mr.Scheme.parse("int4-b4-asym-gptq")]
    kw = dict(engines=(), repeat=1, progress=False, time_ort=False)
    own = mr.inspect(model, scheme, input_path=evaluation, **kw)
    held = mr.inspect(model, scheme, input_path=evaluation, calibration_paths=calibration, **kw)
    assert all(r["calibrated_on_evaluation_input"] for r in own)
    assert not any(r["calibrated_on_evaluation_input"] for r in held)
    assert held[0]["calibration"] == "2 calibration inputs, held out from the evaluation input"
    # calibrating on the measured input flatters it: every layer measures better than held-out calibration
    assert all(o["sqnr_db"] > h["sqnr_db"] for o, h in zip(own, held)), [(o["sqnr_db"], h["sqnr_db"])
                                                                          for o, h in zip(own, held)]
    assert mr.calibration_note(held) is None and "calibration input" in mr.calibration_note(own)

    args = ["inspect", model, "--input", evaluation, "--scheme", "int4-b4-asym-gptq", "--engines", "reference",
            "--repeat", "1", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "int4-b4-asym-gptq*" in out and "measured on the calibration input" in out
    assert main(args + ["--calibration", evaluation]) == 0  # the same file named again: still flagged
    assert "measured on the calibration input" in capsys.readouterr().out
    assert main(args + ["--calibration"] + calibration + ["--save", str(tmp_path / "w.npz")]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 2 calibration inputs, held out" in out and "NOTE" not in out and "gptq*" not in out


def test_gptq_pools_several_calibration_inputs():
    import numpy as np

    from qconv.gptq import quantize_weight_calibrated

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    a, b = (rng.standard_normal((1, 4, 7, 7)).astype(np.float32) for _ in range(2))
    pooled = quantize_weight_calibrated(w, [a, b], 4, 2, False, padding=1)
    assert pooled == quantize_weight_calibrated(w, np.concatenate([a, b]), 4, 2, False, padding=1)
    assert pooled != quantize_weight_calibrated(w, a, 4, 2, False, padding=1)
    c = rng.standard_normal((1, 4, 9, 5)).astype(np.float32)  # another size: columns pooled all the same
    quantize_weight_calibrated(w, [a, c], 4, 2, False, padding=1)


def test_best_ms_is_the_fastest_timed_run_after_a_warm_up(monkeypatch):
    """A fake clock: the warm-up (5 s) and the stalled runs (16 ms) are not what ``best_ms`` reports; runs go on
    until ``min_s`` has passed, past ``repeat``."""
    from qconv import _timing

    durations = iter([5.0, 0.016, 0.016, 0.0001, 0.016, 0.016, 0.016])
    now = [0.0]
    calls = []

    def fn():
        calls.append(1)
        now[0] += next(durations)

    monkeypatch.setattr(_timing.time, "perf_counter", lambda: now[0])
    assert abs(_timing.best_ms(fn, repeat=2, min_s=0.05) - 0.1) < 1e-9
    assert len(calls) == 6  # warm-up + 5 timed runs: the first 4 take 0.0481 s < min_s, the 5th passes it


def test_demo_runs_opencl_untuned_by_default(monkeypatch):
    """The demo's OpenCL layers get ``tune="none"`` (tuning PoCL takes minutes), the others no ``tune``; ``tune=``
    is passed through. The layers are not built: the spy records the options and fails, as an engine may."""
    import qconv

    seen = []

    def spy(*args, **kw):
        seen.append(kw.get("tune", "-"))
        raise RuntimeError("not built in this test")

    monkeypatch.setattr(qconv, "Conv2d", spy)
    rows = run_demo(["cpu", "opencl"], repeat=1, quick=True, progress=False)
    assert seen == ["-", "none"] * len(rows) and all("error" in e for r in rows for e in r["engines"].values())
    seen.clear()
    run_demo(["opencl"], repeat=1, quick=True, progress=False, tune="fast")
    assert set(seen) == {"fast"}


def test_cpu_pressure_reads_psi_some_avg60(tmp_path):
    from qconv._timing import cpu_pressure

    psi = tmp_path / "cpu"
    psi.write_text("some avg10=49.97 avg60=59.77 avg300=70.86 total=1312640457\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cpu_pressure(str(psi)) == 59.77
    assert cpu_pressure(str(tmp_path / "missing")) is None
    psi.write_text("garbage\n")
    assert cpu_pressure(str(psi)) is None


def test_demo_notes_a_busy_machine(monkeypatch, capsys):
    """The note appears above ``BUSY_PERCENT`` only (the timings are then other processes' as much as qconv's)."""
    from qconv import cli

    for pressure, noted in ((50.0, True), (1.0, False), (None, False)):
        monkeypatch.setattr(cli, "cpu_pressure", lambda: pressure)
        assert cli.main(["demo", "--quick", "--repeat", "1", "--no-progress", "--engines", "reference"]) == 0
        assert ("note: the CPU was busy" in capsys.readouterr().out) == noted
