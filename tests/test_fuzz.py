"""Malformed arguments to every public entry point give documented exceptions, never a crash.

The fuzz loop runs in a subprocess so that a segfault or abort fails this test instead of killing pytest.
"""
import os
import subprocess
import sys

import pytest

import qconv

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = int(os.environ.get("QCONV_FUZZ_EXAMPLES", "100"))


@pytest.mark.parametrize("device", qconv.available_devices())
def test_fuzz_public_api_in_subprocess(device):
    out = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_driver.py"), str(EXAMPLES), device],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"fuzz process died (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert "fuzz:" in out.stdout
    print(out.stdout.strip().splitlines()[-1])
