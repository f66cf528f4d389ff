"""Latency ratio of a qconv session to onnxruntime float on PP-OCRv4 det (or rec), both sessions in one process and
their runs interleaved, so that the speed changes of a shared VM hit both alike: medians and the median of the
per-pair ratios (with p10 / p90). Public API only (``qconv.onnx``).

onnxruntime float runs as a user runs it (its intra-op threads spinning between ops, its default), unless
``--ort-spinning off``. ``--peer mnn-int8`` / ``mnn-int4-b32`` times MNN's low-memory run of the model converted with
weight quantization (``mnnconvert``, as ``bench_models.py``) in the peer's place. Spinning threads of one session would slow the other session's next run, so each pair
is: float run, float run (timed), pause, qconv run, qconv run (timed), pause (``--gap-ms``): each session is
timed back to back with itself, as in a process of its own.

    python -m benchmarks.labs.interleaved [--model det|rec] [--runs 20] [--scheme int8-ch-sym]
                                          [--threads 2] [--min-weights N] [--act-quant auto|tensor|none|...]
                                          [--ort-spinning on|off] [--gap-ms 50] [--peer ort-float|mnn-int8|...]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None):
    import onnx
    import onnxruntime as ort

    import qconv.onnx as qo
    from qconv import zoo

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="det", choices=("det", "rec"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--scheme", default="int8-ch-sym")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-weights", type=int, default=0, help="quantize_model(min_weights=...)")
    ap.add_argument("--act-quant", default="auto", choices=("auto", "tensor", "row", "block", "none"),
                    help="the session's activation mode (none: float activations)")
    ap.add_argument("--ort-spinning", default="on", choices=("on", "off"),
                    help="onnxruntime float's intra-op spinning (on: its default)")
    ap.add_argument("--gap-ms", type=float, default=50.0, help="pause after each timed run")
    ap.add_argument("--peer", default="ort-float", choices=("ort-float", "mnn-int8", "mnn-int4-b32"),
                    help="what qconv is timed against (mnn-*: bench_models.py's MNN rows)")
    args = ap.parse_args(argv)
    zname = {"det": "ppocr-det", "rec": "ppocr-rec"}[args.model]
    path, x = zoo.get(zname).path(), zoo.eval_feeds(zname, 1)[0]["x"]   # det 640, rec 48x320: the picture
    q = qo.quantize_model(onnx.load(path), scheme=args.scheme, min_weights=args.min_weights)
    q = qo.InferenceSession(q, threads=args.threads, act_quant=None if args.act_quant == "none" else args.act_quant)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    if args.ort_spinning == "off":
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    f = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {f.get_inputs()[0].name: x}
    if args.peer != "ort-float":   # the peer's run() stands in for the float session's
        import tempfile

        from benchmarks.bench_models import _runner, make_artifact
        work = tempfile.mkdtemp(prefix="qconv-lab-")
        art, why = make_artifact(args.peer, path, x, work)
        if art is None:
            raise SystemExit(f"{args.peer}: {why}")
        peer_run = _runner(args.peer, art, x, args.threads)[0]
        f = type("Peer", (), {"run": staticmethod(lambda names, feeds: peer_run())})()
    for _ in range(3):
        q.run(None, feed)
        f.run(None, feed)
    tq, tf = np.empty(args.runs), np.empty(args.runs)
    for i in range(args.runs):
        for sess, times in ((f, tf), (q, tq)):
            sess.run(None, feed)
            t = time.perf_counter()
            sess.run(None, feed)
            times[i] = time.perf_counter() - t
            time.sleep(args.gap_ms / 1e3)
    r = tq / tf
    what = "det 640" if args.model == "det" else "rec 48x320"
    peer = f"onnxruntime float (spinning {args.ort_spinning})" if args.peer == "ort-float" else args.peer
    print(f"{what}: {peer} {np.median(tf) * 1e3:.1f} ms, qconv {args.scheme} ({q.act_quant}) "
          f"{np.median(tq) * 1e3:.1f} ms; qconv / peer per pair: median {np.median(r):.2f} "
          f"(p10 {np.percentile(r, 10):.2f}, p90 {np.percentile(r, 90):.2f})")


if __name__ == "__main__":
    main()
