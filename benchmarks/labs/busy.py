"""The CPU engine on a shared machine: PP-OCRv4 det (``qconv.onnx.quantize_model(scheme="int8-ch-sym")`` in a qconv
``InferenceSession(path, threads=N)``, and onnxruntime float with ``intra_op_num_threads=N``) on the text picture
``examples/data/text_640.png``, idle and beside K processes that keep a core busy (``python -c "while True: pass"``).

Each configuration (engine, threads, K) runs in its own process: ``--warmup`` runs, then ``--runs`` timed runs;
the table gives the median and p90 in ms, ``vs t1`` (the median over the same engine's ``threads=1`` median under
the same load) and ``busy/idle`` (the median over the same engine and threads idle). The targets of issue #37:
with K=1, qconv ``threads=2`` <= 1.2x its ``threads=1`` and its busy/idle <= 1.2x onnxruntime's; idle, within 3%
of the previous release. A lab, not a test: run it on an otherwise quiet machine (it measures contention).

    python -m benchmarks.labs.busy [--threads 1 2] [--busy 0 1 2] [--runs 20] [--warmup 3] [--engines qconv ort]
                                   [--size 640]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

IMAGE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data", "text_640.png")


def _child(args) -> None:
    """One configuration, in this process: prints a JSON list of the timed runs' seconds."""
    import onnx

    from qconv.onnx_model import load_input

    model = onnx.load(args.model)
    feeds = load_input(model, IMAGE, shape=(1, 3, args.size, args.size), mean=0.5, std=0.5)   # PP-OCR's feed
    if args.engine == "qconv":
        from qconv.onnx import InferenceSession

        sess = InferenceSession(args.model, threads=args.threads)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    for _ in range(args.warmup):
        sess.run(None, feeds)
    ts = []
    for _ in range(args.runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        ts.append(time.perf_counter() - t)
    print(json.dumps(ts))


def _measure(model: str, engine: str, threads: int, busy: int, runs: int, warmup: int, size: int) -> list:
    """Seconds of each timed run of one configuration, in a fresh process, beside ``busy`` spinning processes."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.2 if busy else 0)   # let the spinners take their cores
        out = subprocess.run([sys.executable, "-m", "benchmarks.labs.busy", "--child", "--model", model,
                              "--engine", engine, "--threads", str(threads), "--runs", str(runs),
                              "--warmup", str(warmup), "--size", str(size)], check=True, capture_output=True, text=True,
                             cwd=os.path.join(os.path.dirname(__file__), "..", ".."))
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--engines", nargs="+", choices=("qconv", "ort"), default=["qconv", "ort"])
    ap.add_argument("--size", type=int, default=640, help="input height and width")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.threads = args.threads[0]
        _child(args)
        return 0

    import onnx

    from qconv.onnx import quantize_model
    from qconv.onnx_model import rapidocr_model

    det = rapidocr_model()
    with tempfile.TemporaryDirectory() as tmp:
        qpath = os.path.join(tmp, "det_int8.onnx")
        onnx.save(quantize_model(det, scheme="int8-ch-sym"), qpath)
        paths = {"qconv": qpath, "ort": det}
        med = {}
        rows = []
        for k in args.busy:
            for eng in args.engines:
                for t in args.threads:
                    ts = np.array(_measure(paths[eng], eng, t, k, args.runs, args.warmup, args.size)) * 1e3
                    med[eng, t, k] = float(np.median(ts))
                    rows.append((eng, t, k, med[eng, t, k], float(np.percentile(ts, 90))))
                    print(f"  {eng} threads={t} busy={k}: median {med[eng, t, k]:.1f} ms", file=sys.stderr)
    print(f"PP-OCRv4 det {args.size}x{args.size}, {args.runs} runs after {args.warmup} warm-ups, "
          f"{os.cpu_count()} logical CPUs")
    print(f"{'engine':<7}{'threads':>8}{'busy':>6}{'median ms':>11}{'p90 ms':>9}{'vs t1':>7}{'busy/idle':>11}"
          f"{'/ ort':>7}")
    for eng, t, k, m, p90 in rows:
        vs1 = m / med[eng, 1, k] if (eng, 1, k) in med else float("nan")
        bi = m / med[eng, t, 0] if (eng, t, 0) in med else float("nan")
        ort_bi = (med["ort", t, k] / med["ort", t, 0]) if ("ort", t, k) in med and ("ort", t, 0) in med \
            else float("nan")
        print(f"{eng:<7}{t:>8}{k:>6}{m:>11.1f}{p90:>9.1f}{vs1:>7.2f}{bi:>11.2f}{bi / ort_bi:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
