"""Latency ratio of a qconv session to onnxruntime float on PP-OCRv4 det (or rec), both sessions in one process and
their runs interleaved (run f, run q, run f, ...), so that the speed changes of a shared VM hit both alike: medians
and the median of the per-pair ratios (with p10 / p90). Public API only (``qconv.onnx``).

    python -m benchmarks.labs.interleaved [--model det|rec] [--runs 20] [--scheme int8-ch-sym] [--size 640]
                                          [--threads 2] [--min-weights N] [--act-quant auto|tensor|none|...]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None):
    import onnx
    import onnxruntime as ort

    import qconv.onnx as qo
    from benchmarks.bench_models import det_input, rec_input
    from qconv.onnx_model import rapidocr_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="det", choices=("det", "rec"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--scheme", default="int8-ch-sym")
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-weights", type=int, default=0, help="quantize_model(min_weights=...)")
    ap.add_argument("--act-quant", default="auto", choices=("auto", "tensor", "row", "block", "none"),
                    help="the session's activation mode (none: float activations)")
    args = ap.parse_args(argv)
    path = rapidocr_model(f"ch_PP-OCRv4_{args.model}_infer.onnx")
    x = det_input(args.size) if args.model == "det" else rec_input()
    q = qo.quantize_model(onnx.load(path), scheme=args.scheme, min_weights=args.min_weights)
    q = qo.InferenceSession(q, threads=args.threads, act_quant=None if args.act_quant == "none" else args.act_quant)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    f = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {f.get_inputs()[0].name: x}
    for _ in range(3):
        q.run(None, feed)
        f.run(None, feed)
    tq, tf = np.empty(args.runs), np.empty(args.runs)
    for i in range(args.runs):
        t = time.perf_counter()
        f.run(None, feed)
        tf[i] = time.perf_counter() - t
        t = time.perf_counter()
        q.run(None, feed)
        tq[i] = time.perf_counter() - t
    r = tq / tf
    what = f"det {args.size}" if args.model == "det" else "rec 48x320"
    print(f"{what}: onnxruntime float {np.median(tf) * 1e3:.1f} ms, qconv {args.scheme} ({q.act_quant}) "
          f"{np.median(tq) * 1e3:.1f} ms; qconv / float per pair: median {np.median(r):.2f} "
          f"(p10 {np.percentile(r, 10):.2f}, p90 {np.percentile(r, 90):.2f})")


if __name__ == "__main__":
    main()
