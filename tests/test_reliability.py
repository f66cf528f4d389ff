"""Concurrency, determinism and leaks (issue 8), on every fast engine via the qconv_device fixture."""
import os
import subprocess
import sys
import threading

import numpy as np

import qconv


def _problem(seed=0, c=13, o=21, hw=9):
    rng = np.random.default_rng(seed)
    qw = qconv.quantize_weight(rng.standard_normal((o, c, 3, 3)).astype(np.float32), 4, 0, False)
    x = rng.standard_normal((2, c, hw, hw)).astype(np.float32)
    return qw, rng.standard_normal(o).astype(np.float32), x


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_many_python_threads_on_one_layer_match_serial_bitwise(qconv_device):
    qw, bias, _ = _problem()
    layer = qconv.Conv2d(qw, bias, padding=1, device=qconv_device)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1 + i % 3, 13, 7 + i % 4, 9)).astype(np.float32) for i in range(8)]
    serial = [layer(x) for x in inputs]
    results = [[None] * 50 for _ in range(8)]
    errors = []

    def worker(t):
        try:
            for k in range(50):
                results[t][k] = layer(inputs[(t + k) % 8])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in range(8):
        for k in range(50):
            assert np.array_equal(results[t][k], serial[(t + k) % 8]), (t, k)


def test_repeated_calls_and_processes_are_bitwise_identical(qconv_device, tmp_path):
    qw, bias, x = _problem()
    layer = qconv.Conv2d(qw, bias, padding=1, device=qconv_device)
    first = layer(x)
    for _ in range(5):
        assert np.array_equal(layer(x), first)
    path = tmp_path / "w.npz"
    qw.save(path)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "b.npy", bias)
    code = ("import numpy as np, qconv, sys; qw = qconv.QuantizedWeight.load(sys.argv[1]); "
            "y = qconv.Conv2d(qw, np.load(sys.argv[3]), padding=1, device=sys.argv[4])(np.load(sys.argv[2])); "
            "np.save(sys.argv[5], y)")
    out = tmp_path / "y.npy"
    subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "x.npy"), str(tmp_path / "b.npy"),
                    qconv_device, str(out)], check=True, timeout=300)
    assert np.array_equal(np.load(out), first)


def test_no_leak_over_10000_calls(qconv_device):
    qw, bias, _ = _problem(c=8, o=8, hw=6)
    layer = qconv.Conv2d(qw, bias, padding=1, device=qconv_device)
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 6)).astype(np.float32)
    for _ in range(100):
        layer(x)
    base = _rss_bytes()
    for _ in range(10_000):
        layer(x)
    grown = _rss_bytes() - base
    assert grown < 8 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 10,000 calls"
