"""Speed of one weight scheme against another on the CPU engine, interleaved: the layer cases of
``benchmarks/bench_cpu.py`` (``qconv.Conv2d`` / ``qconv.Linear``, their default activations) and the zoo models
(``qconv.onnx.InferenceSession`` of ``quantize_model(path, scheme)``).

Each pair of runs times A then B back to back, so the speed changes of a shared VM hit both alike; the figure per
case is the median of the per-pair ratios B / A (> 1: B is slower) with p10 / p90, beside both medians. Public API
only. Used for the default scheme's "within 3% of int8-ch-sym" check (``qconv/onnx/README.md``):

    .venv/bin/python -m benchmarks.labs.scheme_speed --a int8-ch-sym --b int8-ch-zp-bc [--threads 2]
                                                     [--layers-only | --models-only] [--pairs 30]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _pairs(fa, fb, pairs: int, min_s: float = 0.02):
    """Per-pair times of ``fa`` and ``fb`` (each call repeated to at least ``min_s``), after one warm-up each."""
    fa(), fb()

    def once(f):
        n, t0 = 0, time.perf_counter()
        while True:
            f()
            n += 1
            t = time.perf_counter() - t0
            if t >= min_s:
                return t / n
    ta, tb = [], []
    for _ in range(pairs):
        ta.append(once(fa))
        tb.append(once(fb))
    return np.array(ta), np.array(tb)


def _row(name, ta, tb) -> str:
    r = tb / ta
    return (f"| {name} | {np.median(ta) * 1e3:.3f} | {np.median(tb) * 1e3:.3f} | **{np.median(r):.3f}** | "
            f"{np.percentile(r, 10):.3f} - {np.percentile(r, 90):.3f} |")


def layers(a: str, b: str, threads: int, pairs: int):
    import qconv
    from qconv.model_report import Scheme

    from ..bench_cpu import CONVS, LINEARS

    rng = np.random.default_rng(0)
    for name, o, i, k, hw, stride, pad in CONVS:
        w = (rng.standard_normal((o, i, k, k)) * 0.05).astype(np.float32)
        x = rng.standard_normal((1, i, hw, hw)).astype(np.float32)
        fa, fb = (qconv.Conv2d(Scheme.parse(s).quantize(w, 1), None, stride, pad, threads=threads) for s in (a, b))
        yield _row(name, *_pairs(lambda: fa(x), lambda: fb(x), pairs))
    for name, o, kk, n in LINEARS:
        w = (rng.standard_normal((o, kk)) * 0.02).astype(np.float32)
        x = rng.standard_normal((n, kk)).astype(np.float32)
        fa, fb = (qconv.Linear(Scheme.parse(s).quantize(w, 1), None, threads=threads) for s in (a, b))
        yield _row(name, *_pairs(lambda: fa(x), lambda: fb(x), pairs))


def models(a: str, b: str, threads: int, pairs: int):
    import qconv.onnx as qo
    from qconv import zoo

    for name in zoo.ZOO:
        path, feed = zoo.get(name).path(), zoo.eval_feeds(name, 1)[0]
        sa, sb = (qo.InferenceSession(qo.quantize_model(path, s, eval=[feed], measure=False), threads=threads)
                  for s in (a, b))
        yield _row(name, *_pairs(lambda: sa.run(None, feed), lambda: sb.run(None, feed), pairs, min_s=0.0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="int8-ch-sym", help="the baseline scheme")
    ap.add_argument("--b", default="int8-ch-zp-bc", help="the scheme compared with it")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=30)
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--layers-only", action="store_true")
    only.add_argument("--models-only", action="store_true")
    args = ap.parse_args(argv)
    print(f"| case | {args.a} ms | {args.b} ms | ratio B/A (median) | p10 - p90 |\n|---|---:|---:|---:|---:|", flush=True)
    if not args.models_only:
        for line in layers(args.a, args.b, args.threads, args.pairs):
            print(line, flush=True)
    if not args.layers_only:
        for line in models(args.a, args.b, args.threads, args.pairs):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
