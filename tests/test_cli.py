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
