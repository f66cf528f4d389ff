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
