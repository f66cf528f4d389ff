"""Model-level accuracy on the zoo: the figures behind the default scheme and accuracy control.

Public hooks only (``qconv.zoo``, ``qconv.onnx.quantize_model``, ``qconv.onnx.model_summary``). Every figure is the
SQNR at the model's outputs against onnxruntime float, measured by a qconv session on the zoo's evaluation inputs
(the repository's text picture), never on what a search or a calibrated scheme saw (rendered pictures of other
words, ``qconv.zoo.calibration_feeds``).

    .venv/bin/python -m benchmarks.labs.zoo_accuracy --schemes int8-ch-sym,int8-ch-asym   # one scheme, every model
    .venv/bin/python -m benchmarks.labs.zoo_accuracy --target 25 --calibration 6 --models ppocr-det,ppocr-rec

Prints one markdown row per (model, configuration): eval SQNR, what the search measured on its calibration
inputs, weight bytes against all-int8 per channel, file bytes against the float file, layers per scheme, seconds.
"""
from __future__ import annotations

import argparse
import collections
import os
import time
import warnings


def row(name: str, scheme: str | None, target: float | None, n_calib: int, threads: int) -> str:
    import qconv.onnx as qo
    from qconv import zoo

    path = zoo.get(name).path()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = qo.quantize_model(path, scheme, target_sqnr=target, eval=zoo.eval_feeds(name), threads=threads,
                              calibration=zoo.calibration_feeds(name, n_calib) if n_calib else None)
    seconds = time.perf_counter() - t0
    s = qo.model_summary(q)
    acc, search = s["accuracy"], s.get("search")
    counts = collections.Counter(e["scheme"] for e in s["layers"].values())
    counts.update({"float": len(s["float"])} if s["float"] else {})
    if search:   # the search counts every layer: float ones at 4 bytes a weight
        nbytes, int8 = search["nbytes"], search["int8_nbytes"]
    else:
        int8 = sum(e["bytes"] for e in qo.model_summary(qo.quantize_model(path, measure=False))["layers"].values())
        nbytes = sum(e["bytes"] for e in s["layers"].values())
    what = f"target {target:g} dB, {n_calib} calib." if target is not None else scheme
    found = f"{search['sqnr_db']} dB" if search else ""
    guard = " (guard)" if any("below the floor" in str(w.message) for w in caught) else ""
    return (f"| {name} | {what} | {acc['sqnr_db']}{guard} | {found} | {nbytes / int8:.3f} | "
            f"{len(q.SerializeToString()) / os.path.getsize(path):.3f} | "
            f"{', '.join(f'{v} {k}' for k, v in counts.most_common())} | {seconds:.0f} |")


def main(argv=None) -> int:
    from qconv import zoo

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(zoo.ZOO), help="zoo model names, comma-separated")
    ap.add_argument("--schemes", default="", help="schemes for every layer, comma-separated")
    ap.add_argument("--target", type=float, action="append", default=[], help="accuracy-control target (dB)")
    ap.add_argument("--calibration", type=int, default=6, help="rendered calibration inputs for --target")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    print("| model | configuration | eval SQNR dB | search's SQNR on calib. | weight bytes / all-int8 | file / float "
          "| layers | s |\n|---|---|---:|---:|---:|---:|---|---:|", flush=True)
    for name in args.models.split(","):
        for scheme in filter(None, args.schemes.split(",")):
            print(row(name, scheme, None, 0, args.threads), flush=True)
        for target in args.target:
            print(row(name, None, target, args.calibration, args.threads), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
