"""Fuzzing the public API in a subprocess (``tests/fuzz_driver.py``): mostly valid-but-extreme cases that reach
the kernels and are checked against the oracle, plus malformed arguments that must raise documented exceptions.

The fuzz loop runs in a subprocess so that a segfault, an abort or a sanitizer report fails this test instead
of killing pytest (the sanitizer job of ``scripts/setup.sh`` runs this file with ``--qconv-device=cpu``).
``QCONV_FUZZ_EXAMPLES`` (default 100) sets the examples per target.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = int(os.environ.get("QCONV_FUZZ_EXAMPLES", "100"))


def _fuzz(device):
    out = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_driver.py"), str(EXAMPLES), device],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, f"fuzz process died (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    last = out.stdout.strip().splitlines()[-1]
    print(out.stdout.strip())
    m = re.match(r"fuzz: (\d+) calls, (\d+) documented exceptions, (\d+) valid cases ran \((\d+) checked", last)
    assert m, last
    calls, raised, ran, checked = map(int, m.groups())
    return calls, raised, ran, checked


def test_fuzz_reference_in_subprocess():
    calls, raised, ran, checked = _fuzz("reference")
    assert ran >= 0.55 * calls, f"only {ran} of {calls} fuzz calls reached the kernels"
    assert checked == 2 * EXAMPLES  # every valid conv and linear case ran and matched


def test_fuzz_engine_in_subprocess(qconv_device):
    """On each engine (the ``qconv_device`` fixture: ``--qconv-device=cpu`` in the sanitizer job)."""
    calls, raised, ran, checked = _fuzz(qconv_device)
    if qconv_device == "cpu":
        assert ran >= 0.55 * calls, f"only {ran} of {calls} fuzz calls reached the kernels"
        assert checked == 2 * EXAMPLES
    else:  # OpenCL: fewer geometries (a program to compile each)
        assert checked == 2 * max(5, EXAMPLES // 8)
