"""``python -m qconv quantize`` and ``python -m qconv run``: whole ONNX models from the command line.

``quantize MODEL.onnx OUT.onnx (--scheme S | --plan PLAN.json) [--calibration INPUT ... [--act-budget DB]] [--act-quant MODE
[--act-block N]]`` writes the quantized model and prints what became of each layer and the weight bytes.
``run MODEL.onnx --input INPUT [--reference FLOAT.onnx] [--repeat N] [--json OUT]`` runs it through
:class:`qconv.onnx.InferenceSession` and prints the latency per run (median, p90), the peak RSS, the weight
bytes as stored and, with ``--reference``, the SQNR of every output against the float model on the same input.
Inputs: ``.npy`` tensors or images (as ``inspect`` reads them: RGB in [0, 1], resized; ``--mean``/``--std``
normalise), ``NAME=PATH`` for a model input other than the first.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from .._progress import bar
from .._timing import peak_rss_mb
from .accuracy import ACT_BUDGET_DB, DEFAULT_SCHEME, MIN_SQNR_DB
from .smooth import DEFAULT_ALPHA as SMOOTH_ALPHA


def _floats(text):
    return None if text is None else [float(v) for v in text.split(",")]


def _shape(text):
    """``--input-shape N,C,H,W`` -> a tuple of ints (``None`` for no value); ``ValueError`` naming the option."""
    if not text:
        return None
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--input-shape must be comma-separated integers such as 1,3,640,640, got {text!r}") from None


def _feeds(model, specs, shape=None, mean=None, std=None, seed=0) -> dict:
    """``--input`` values (``PATH`` or ``NAME=PATH``) -> feed dict; no value -> the seeded random feed.
    ``model``: an ``onnx.ModelProto`` or a session (:func:`qconv.onnx_model.first_input`)."""
    from ..onnx_model import default_input, first_input, load_input

    if not specs:
        return default_input(model, shape, seed)
    feeds = {}
    first, _ = first_input(model)
    for spec in specs:
        name, path = spec.split("=", 1) if "=" in spec and not os.path.exists(spec) else (first, spec)
        feed = load_input(model, path, shape, mean, std)
        feeds[name] = feed.pop(first)
    return feeds


def _input_list(model, paths, args):
    """``--calibration`` / ``--eval`` paths -> feed dicts (None when no path)."""
    if not paths:
        return None
    shape = _shape(args.input_shape)
    return [_feeds(model, [c], shape, _floats(args.mean), _floats(args.std)) for c in paths]


def _db(v) -> str:
    return "inf" if v is None else f"{v:.1f}"


def layer_table(summary: dict) -> list[str]:
    """The per-layer lines ``quantize`` prints: layer, op, scheme, stored bytes, weight SQNR (dB)."""
    rows = [(name, e["op"], e["scheme"] + ("" if e.get("block_size", 1) or "-ch" in e["scheme"] else " (per channel)"),
             f"{e.get('bytes', 0):,}", _db(e.get("weight_sqnr_db"))) for name, e in summary["layers"].items()]
    rows += [(name, "", "float", "", why) for name, why in list(summary["float"].items()) +
             list(summary["skipped"].items())]
    head = ("layer", "op", "scheme", "bytes", "weight SQNR dB")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(head[:4], widths)) + "  " + head[4]]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r[:4], widths)) + "  " + str(r[4]) for r in rows]
    return lines


def quantize_main(args) -> int:
    import warnings

    import onnx

    from ..onnx_model import load_model
    from . import model_summary, quantize_model, weight_bytes
    from .quantize import LowAccuracyWarning

    model = load_model(args.model)
    calib = _input_list(model, args.calibration, args)
    evals = _input_list(model, args.eval, args)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LowAccuracyWarning)
        q = quantize_model(model, None if args.plan else (args.scheme or DEFAULT_SCHEME), plan=args.plan,
                           calibration=calib, eval=evals, target_sqnr=args.target_sqnr,
                           min_sqnr=None if args.min_sqnr < 0 else args.min_sqnr, progress=not args.no_progress,
                           threads=args.threads, fuse=not args.no_fuse, act_quant=args.act_quant,
                           act_block=args.act_block, min_weights=args.min_weights, format=args.format,
                           act_budget=None if args.act_budget < 0 else args.act_budget,
                           smooth=None if args.smooth < 0 else args.smooth)
    for w in caught:
        if not issubclass(w.category, LowAccuracyWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    seconds = time.perf_counter() - t0
    onnx.save(q, args.output)
    s = model_summary(q)
    if args.layers:
        print("\n".join(layer_table(s)))
    by_scheme: dict = {}
    for entry in s["layers"].values():
        by_scheme[entry["scheme"]] = by_scheme.get(entry["scheme"], 0) + 1
    nb = weight_bytes(q)
    print(f"quantized {len(s['layers'])} layers in {seconds:.1f} s: "
          + ", ".join(f"{n} {k}" for k, n in by_scheme.items()))
    fused = sum(1 for e in s["layers"].values() if e["activation"] or e["folded"])
    if fused:
        print(f"fused the activation or affine ops (bias Add, Mul, BatchNormalization) that follow {fused} of them")
    if s.get("convtranspose_as_conv"):
        print(f"rewrote {s['convtranspose_as_conv']} ConvTranspose (kernel = stride) as 1x1 convs whose nodes shuffle "
              f"their output (depth_to_space)")
    if not args.layers:
        for name, why in list(s["float"].items()) + list(s["skipped"].items()):
            print(f"float: {name}: {why}")
    if s.get("act_quant"):
        blocks = sorted({e["act_block"] for e in s["layers"].values() if "act_block" in e})
        print(f"activations: {s['act_quant']}" + (f", blocks of {blocks} input channels" if blocks else ""))
    if "act_search" in s:
        r, sm = s["act_search"], s.get("smooth", {})
        print(f"int8 activations allowed on {r['int8_nodes']} of {r['candidates']} one-group convs "
              f"(output within {r['budget_db']:g} dB of float activations on {r['on']}: {_db(r['sqnr_db'])} against "
              f"{_db(r['float_sqnr_db'])} dB; {sm.get('smoothed', 0)} inputs smoothed); {r['evaluations']} model runs "
              f"in {r['seconds']:g} s")
    if "search" in s:
        r = s["search"]
        print(f"accuracy control: target {r['target_sqnr_db']:g} dB on {r['on']}: {_db(r['sqnr_db'])} dB at "
              f"{r['nbytes'] / r['int8_nbytes']:.3f}x the bytes of all-{r['int8_scheme']} ({_db(r['int8_sqnr_db'])} "
              f"dB); {r['evaluations']} model runs in {r['seconds']:g} s")
    print(f"weights {nb['float']:,} bytes float -> {nb['stored']:,} stored ({nb['ratio']:.3f}x); "
          f"file {os.path.getsize(args.model):,} -> {os.path.getsize(args.output):,} bytes; wrote {args.output}")
    acc = s.get("accuracy")
    if acc and "outputs" not in acc:
        print(f"accuracy: {acc['source']}")
    elif acc:
        outs = ", ".join(f"{n} {_db(o['sqnr_db'])} dB (max abs err {o['max_abs_err']:.3g})"
                         for n, o in acc["outputs"].items())
        print(f"accuracy at the model's outputs vs float, on {acc['source']}: {outs}")
        if acc["below_floor"]:
            names = ", ".join(f"{r['layer']} (to {r['to']}: {_db(r['sqnr_db'])} dB)" for r in acc["restore"])
            print(f"qconv quantize: output SQNR {_db(acc['sqnr_db'])} dB is below --min-sqnr {acc['min_sqnr']:g} "
                  f"dB; the layers whose return helps most: {names}", file=sys.stderr)
            if not args.allow_low_accuracy:
                return 3
    return 0


def run_main(args) -> int:
    from ..onnx_model import load_model
    from ..testing.asserts import sqnr_db
    from . import InferenceSession, weight_bytes

    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    opts = {} if args.act_quant is None else {"act_quant": None if args.act_quant == "none" else args.act_quant}
    t0 = time.perf_counter()
    sess = InferenceSession(args.model, device=args.device, threads=args.threads, **opts)
    load_s = time.perf_counter() - t0
    feeds = _feeds(sess, args.input, _shape(args.input_shape), _floats(args.mean), _floats(args.std))
    outputs = sess.run(None, feeds)  # warm-up (scratch buffers, OpenCL programs)
    times = []
    for _ in bar(range(args.repeat), desc="run", unit="run", enabled=not args.no_progress, leave=True):
        t = time.perf_counter()
        outputs = sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    rss = peak_rss_mb()   # the session's process so far: the weight count below loads the model with onnx
    nb = weight_bytes(load_model(args.model))
    ms = np.array(times) * 1e3
    names = [o.name for o in sess.get_outputs()]
    result = dict(model=args.model, device=args.device, threads=sess.threads, act_quant=sess.act_quant,
                  qconv_nodes=len(sess.kernels), load_s=load_s, repeat=args.repeat,
                  median_ms=float(np.median(ms)), p90_ms=float(np.percentile(ms, 90)), peak_rss_mb=rss,
                  weight_bytes=nb, outputs={n: list(o.shape) for n, o in zip(names, outputs)})
    print(f"{args.model}: {len(sess.kernels)} qconv nodes, device {args.device}, {sess.threads} threads, "
          f"act_quant {sess.act_quant}")
    print(f"latency per run: median {result['median_ms']:.2f} ms, p90 {result['p90_ms']:.2f} ms "
          f"({args.repeat} runs); session load {load_s:.2f} s")
    print(f"peak RSS {rss:.1f} MiB; weights as stored {nb['stored']:,} bytes ({nb['ratio']:.3f}x of "
          f"{nb['float']:,} float)")
    if args.reference:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = sess.threads
        ref = ort.InferenceSession(args.reference, so, providers=["CPUExecutionProvider"])
        ref_out = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
        result["sqnr_db"] = {}
        for n, y in zip(names, outputs):
            if n in ref_out:
                db = sqnr_db(y, ref_out[n])
                result["sqnr_db"][n] = db
                print(f"output {n} {list(y.shape)}: SQNR {db:.2f} dB vs {args.reference}")
            else:
                print(f"output {n}: not an output of {args.reference}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


def add_subcommands(sub) -> None:
    """Add ``quantize`` and ``run`` to the ``python -m qconv`` sub-parsers."""
    q = sub.add_parser("quantize", help="quantize the Conv/MatMul/Gemm layers of an ONNX model into qconv nodes")
    q.add_argument("model", help="float .onnx model")
    q.add_argument("output", help="quantized .onnx to write")
    how = q.add_mutually_exclusive_group()
    how.add_argument("--scheme",
                     help=f"scheme for every layer, e.g. {DEFAULT_SCHEME} (default, chosen by measurement: "
                          "qconv/onnx/README.md; zp: integer zero point), int8-ch-sym, int4-b32-asym-mse, "
                          "int8-ch-sym-gptq-bc; -gptq and -bc (bias correction) schemes are calibrated on "
                          "--calibration, -bc without it on a synthetic input")
    how.add_argument("--plan", help="per-layer plan JSON from `inspect --target-sqnr T --save-plan PLAN.json`")
    how.add_argument("--target-sqnr", type=float, metavar="DB",
                     help="accuracy control: per-layer schemes (int4, int8, int8 in blocks, float; "
                          "bias-corrected on --calibration) with the fewest bytes whose model output reaches DB "
                          "on --calibration")
    q.add_argument("--calibration", nargs="+", metavar="INPUT",
                   help="inputs (.npy or images) for --target-sqnr and -gptq / -bc schemes (default: a random feed, "
                        "useless for images)")
    q.add_argument("--eval", nargs="+", metavar="INPUT",
                   help="inputs the quantized model is measured on (default: the calibration inputs, else a random "
                        "feed); keep them apart from --calibration")
    q.add_argument("--min-sqnr", type=float, default=MIN_SQNR_DB, metavar="DB",
                   help=f"accuracy floor (default {MIN_SQNR_DB:g} dB; -1: none): below it quantize names the layers "
                        "to return and exits with status 3")
    q.add_argument("--allow-low-accuracy", action="store_true", help="write the model and exit 0 below --min-sqnr")
    q.add_argument("--format", choices=("qconv", "qdq"), default="qconv",
                   help="qconv: ai.qconv nodes for qconv's session (default); qdq: standard DequantizeLinear + "
                        "Conv/MatMul that plain onnxruntime runs (symmetric schemes)")
    q.add_argument("--layers", action="store_true", help="print the per-layer table (scheme, bytes, weight SQNR)")
    q.add_argument("--threads", type=int, help="threads of the measuring sessions (default: all cores)")
    q.add_argument("--no-progress", action="store_true", help="no progress bars")
    q.add_argument("--act-quant", choices=("tensor", "row", "block"),
                   help="activation mode recorded in the model for `run` (default: the plan's, else the session's)")
    q.add_argument("--act-budget", type=float, default=ACT_BUDGET_DB, metavar="DB",
                   help=f"with --calibration: the convs whose int8 activations keep the output within DB of float "
                        f"activations on those inputs run int8 (default {ACT_BUDGET_DB:g}; -1: none, all float)")
    q.add_argument("--smooth", type=float, default=SMOOTH_ALPHA, metavar="ALPHA",
                   help=f"with --calibration: move activation ranges into the weights, SmoothQuant's alpha (default "
                        f"{SMOOTH_ALPHA:g}; -1: off)")
    q.add_argument("--act-block", type=int, default=0,
                   help="with --act-quant block: input channels per activation block (per layer the largest divisor "
                        "of its weight block <= N; default: the weight's block)")
    q.add_argument("--input-shape", help="N,C,H,W images are resized to (default: the model's, dynamic 256)")
    q.add_argument("--mean", help="image normalisation (x - mean) / std, e.g. 0.5 or 0.485,0.456,0.406")
    q.add_argument("--std", help="see --mean")
    q.add_argument("--no-fuse", action="store_true",
                   help="do not fuse the activation and affine ops that follow a layer into its qconv node")
    q.add_argument("--min-weights", type=int, default=0, metavar="N",
                   help="layers with fewer than N weights stay float (default 0: quantize every layer)")
    q.set_defaults(func=quantize_main)

    r = sub.add_parser("run", help="run an ONNX model (quantized by `quantize`) with qconv's kernels and time it")
    r.add_argument("model", help=".onnx model (quantized or float)")
    r.add_argument("--input", action="append", metavar="INPUT",
                   help="input .npy or image; NAME=PATH for another model input (repeatable; default: seeded random)")
    r.add_argument("--input-shape", help="N,C,H,W images are resized to / random input shape")
    r.add_argument("--mean", help="image normalisation (x - mean) / std, e.g. 0.5 (PP-OCR)")
    r.add_argument("--std", help="see --mean")
    r.add_argument("--reference", help="float .onnx model: print the SQNR of every output against it")
    r.add_argument("--repeat", type=int, default=10, help="timed runs (after one warm-up run)")
    r.add_argument("--threads", type=int, help="qconv and onnxruntime threads (default: all cores)")
    r.add_argument("--device", default="cpu", help="qconv engine: cpu (default), opencl, reference")
    r.add_argument("--act-quant", choices=("auto", "tensor", "row", "block", "none"),
                   help="activation quantization of the qconv nodes (default: auto, or the plan's)")
    r.add_argument("--json", help="write the measurements as JSON")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=run_main)
