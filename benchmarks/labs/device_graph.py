"""Whole models on an OpenCL device (``InferenceSession(model, device=...)``: the device graph): set-up and first
run, then the wall time per run from a numpy input to numpy outputs, and the output SQNR against qconv's CPU
session with float activations (the same weights) on the same input.

    python -m benchmarks.labs.device_graph model.q.onnx [...] [--device opencl] [--runs 50] [--tune fast]

Inputs: each model's first input, random in [0, 1), its dynamic dimensions 1 (batch) or ``--hw`` (or ``--shape``). Run it twice
with the same ``QCONV_CACHE_DIR`` to see set-up with a cold and then a warm tuning cache.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--hw", type=int, default=640, help="the input's dynamic dimensions but the first (batch: 1)")
    ap.add_argument("--shape", default="", help="the input's shape instead, e.g. 1,3,48,320")
    ap.add_argument("--tune", default="fast")
    ap.add_argument("--no-check", action="store_true", help="skip the CPU session's comparison")
    ap.add_argument("--profile", action="store_true", help="per operator type: host time and time to finish")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    for path in args.models:
        try:
            run_model(path, args, rng)
        except Exception as exc:  # one model's failure does not stop the others
            print(f"{path}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


def run_model(path, args, rng):
    import qconv.onnx as qo
    from qconv.gpu import tuning

    before = dict(tuning.stats)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = qo.InferenceSession(path, device=args.device, tune=args.tune)
    made = time.perf_counter() - t0
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else (1 if i == 0 else args.hw) for i, d in enumerate(inp.shape)]
    if args.shape:
        shape = [int(v) for v in args.shape.split(",")]
    x = rng.random(shape).astype(np.float32)
    feeds = {inp.name: x}
    sess.run(None, feeds)
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        ys = sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    times.sort()
    graph = sess.device_graph
    line = (f"{path.split('/')[-1]:28s} {tuple(shape)}  setup {made:6.2f} s  setup+first run {first:6.2f} s  "
            f"run median {statistics.median(times) * 1e3:7.3f} ms  p10 {times[len(times) // 10] * 1e3:7.3f} ms  "
            f"nodes {len(graph.nodes) if graph else '-'}  host nodes {len(graph.host_nodes) if graph else '-'}")
    if not args.no_check:
        from qconv.metrics import sqnr_db

        ref = qo.InferenceSession(path, device="cpu", act_quant="none").run(None, feeds)
        line += f"  SQNR vs CPU {min(sqnr_db(a, b) for a, b in zip(ys, ref)):.1f} dB"
    print(line, flush=True)
    print("    tuning:", ", ".join(f"{k} {v - before.get(k, 0)}" for k, v in tuning.stats.items()), flush=True)
    for w in caught:
        print("   ", w.message)
    if graph and graph.host_nodes:
        print("    host:", sorted({op for _, op, _ in graph.host_nodes}))
    if graph and args.profile:
        prof = {}
        for _ in range(5):
            graph.run(None, feeds, profile=prof)
        total = sum(r[2] for r in prof.values())
        print(f"    profiled run (finish after each node): {total / 5 * 1e3:.2f} ms; per op type: calls, host ms, "
              f"to finish ms (a run)")
        for op, (n, host, fin) in sorted(prof.items(), key=lambda kv: -kv[1][2]):
            print(f"      {op:20s} {n // 5:4d} {host / 5 * 1e3:8.3f} {fin / 5 * 1e3:8.3f}")


if __name__ == "__main__":
    main()
