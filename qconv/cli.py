"""Command line: ``python -m qconv demo`` (and ``qconv demo`` once installed).

``demo`` quantizes a built-in, seeded suite of conv layers in several weight schemes, runs each through
every engine available here (numpy reference, Cython CPU, each OpenCL device) and prints a table:
layer, scheme, weight bytes float -> packed, relative error vs the float conv, and time per engine (the best
of several runs). The OpenCL engine runs untuned by default (``--tune none``: the engine's heuristic kernel
choice): tuning a CPU OpenCL device (PoCL) times several compiled variants per case, minutes for the suite.

A user error (a missing file, a bad scheme or shape, a file that is not a model) prints one line,
``qconv COMMAND: error: MESSAGE``, to stderr and exits with status 2; ``qconv --debug COMMAND ...`` shows
the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np

from ._progress import bar as progress_bar
from ._timing import best_ms, cpu_pressure

BUSY_PERCENT = 10.0
"""The demo notes a busy machine above this CPU pressure (% of the last minute some task waited for a core)."""


@dataclass(frozen=True)
class DemoLayer:
    """One layer of the demo suite: weight ``(o, c, k, k)``, input ``(n, c, h, h)``."""

    name: str
    n: int
    c: int
    o: int
    h: int
    k: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1

    def make(self, rng):
        w = (rng.standard_normal((self.o, self.c, self.k, self.k)) / np.sqrt(self.c * self.k * self.k))
        x = rng.standard_normal((self.n, self.c, self.h, self.h))
        return w.astype(np.float32), x.astype(np.float32), (rng.standard_normal(self.o) * 0.1).astype(np.float32)


SUITE = (
    DemoLayer("3x3 32->48 @28", 1, 32, 48, 28, 3, padding=1),
    DemoLayer("1x1 64->96 @14", 1, 64, 96, 14, 1),
    DemoLayer("3x3 s2 24->40 @28", 1, 24, 40, 28, 3, stride=2, padding=1),
    DemoLayer("3x3 odd 17->23 @15", 2, 17, 23, 15, 3, padding=1),
    DemoLayer("5x5 d2 13->19 @17", 1, 13, 19, 17, 5, padding=2, dilation=2),
    DemoLayer("GEMV 1x1 512->768", 1, 512, 768, 1, 1),
)

SCHEMES = (("int8 sym", 8, True, False), ("int8 asym", 8, False, False),
           ("int4 sym blk", 4, True, True), ("int4 asym blk", 4, False, True))


def _block_for(c: int) -> int:
    return next((b for b in (32, 16, 8) if c % b == 0 and b < c), 0)


def _rel_err(y, ref) -> float:
    return float(np.linalg.norm((y - ref).ravel()) / max(np.linalg.norm(ref.ravel()), 1e-30))


def run_demo(engines=None, repeat: int = 5, quick: bool = False, progress: bool = True, seed: int = 0,
             tune: str = "none"):
    """Run the demo suite; returns a list of result rows (dicts). ``tune``: the OpenCL engines' tuning level."""
    import qconv
    from qconv import reference

    devices = engines or qconv.available_devices()
    suite = SUITE[:3] if quick else SUITE
    schemes = SCHEMES[::3] if quick else SCHEMES
    jobs = [(layer, scheme) for layer in suite for scheme in schemes]
    bar = progress_bar(jobs, desc="demo", unit="case", enabled=progress, leave=True)
    rows = []
    rng = np.random.default_rng(seed)
    data = {layer.name: layer.make(rng) for layer in suite}
    for layer, (sname, bits, sym, blocked) in bar:
        w, x, bias = data[layer.name]
        block = _block_for(layer.c) if blocked else 0
        qw = qconv.quantize_weight(w, bits=bits, block_size=block, symmetric=sym)
        kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
        y_float = reference.float_conv2d(x, w, bias, **kw)
        row = dict(layer=layer.name, scheme=f"{sname}{block}" if block else f"{sname.removesuffix(' blk')} ch",
                   bytes_float=qw.nbytes_float, bytes_packed=qw.nbytes, engines={})
        for dev in devices:
            try:
                opts = dict(tune=tune) if dev.startswith("opencl") else {}
                conv = qconv.Conv2d(qw, bias, device=dev, **kw, **opts)
                y = conv(x)
                ms = best_ms(lambda: conv(x), repeat)
                row["engines"][dev] = dict(ms=ms, rel_err=_rel_err(y, y_float),
                                           act_quant=conv.spec.act_quant)
            except Exception as exc:  # one engine failing must not hide the others' results
                row["engines"][dev] = dict(error=f"{type(exc).__name__}: {exc}")
        rows.append(row)
    return rows


def format_table(rows) -> str:
    devices = list(dict.fromkeys(d for r in rows for d in r["engines"]))
    head = ["layer", "scheme", "bytes float -> packed"] + [f"{d} ms (rel err)" for d in devices]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["layer"], r["scheme"],
                 f"{r['bytes_float']:,} -> {r['bytes_packed']:,} ({r['bytes_float'] / r['bytes_packed']:.1f}x)"]
        for d in devices:
            e = r["engines"].get(d, {})
            cells.append(f"error: {e['error'][:60]}" if "error" in e else f"{e['ms']:.3f} ({e['rel_err']:.2e})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _demo(args) -> int:
    import qconv
    from .layer import engine_class

    engines = args.engines.split(",") if args.engines else None
    for name in engines or ():
        engine_class(name)  # ValueError for a name that is no engine, before the suite runs
    print(f"qconv {qconv.__version__} demo; engines: {', '.join(engines or qconv.available_devices())}")
    rows = run_demo(engines, repeat=args.repeat, quick=args.quick, progress=not args.no_progress, tune=args.tune)
    print(format_table(rows))
    print("ms: the best of at least --repeat runs; rel err = ||y - y_float|| / ||y_float|| against the float conv"
          " of the unquantized weights; CPU engines quantize activations to int8 (act_quant='tensor'), OpenCL"
          f" keeps them float (kernels tune={args.tune}).")
    busy = cpu_pressure()
    if busy is not None and busy > BUSY_PERCENT:
        print(f"note: the CPU was busy: some task waited for a core {busy:.0f}% of the last minute"
              " (/proc/pressure/cpu); the load of other processes inflates the times, of multi-threaded cases most")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    failed = [(r["layer"], r["scheme"], d) for r in rows for d, e in r["engines"].items() if "error" in e]
    if failed:
        print(f"{len(failed)} engine run(s) failed: {failed[:5]}", file=sys.stderr)
        return 1
    return 0


def _act_quant_arg(text):
    return None if text in ("none", "None", "float") else text


def _inspect(args) -> int:
    import csv

    import qconv
    from . import model_report as mr
    from .onnx.cli import _shape

    if args.scheme:
        schemes = [mr.Scheme.parse(s) for s in args.scheme]
    elif args.bits:
        schemes = [mr.Scheme(args.bits, args.block_size, not args.asymmetric, args.method)]
    else:
        schemes = [mr.Scheme.parse("int8-ch-sym"), mr.Scheme.parse("int4-b32-asym")]
    candidates = [mr.Scheme.parse(c) for c in args.candidates.split(",")] if args.target_sqnr is not None else []
    measure = list(dict.fromkeys(schemes + [c for c in candidates if c.bits is not None]))
    if args.engines:
        engines = args.engines.split(",")
    else:
        engines = [d for d in qconv.available_devices() if d != "reference"]
    shape = _shape(args.input_shape)
    rows = mr.inspect(args.model, measure, _act_quant_arg(args.act_quant), args.act_block, engines, args.input,
                      shape, args.repeat, progress=not args.no_progress, calibration_paths=args.calibration)
    shown = [r for r in rows if mr.Scheme.parse(r["scheme"]) in schemes]
    print(mr.format_rows(shown, engines))
    for line in mr.summary_lines(shown):
        print(line)
    gptq = [r for r in rows if r.get("calibration")]
    if gptq:
        print(f"calibrated schemes (-gptq, -bc) calibrated on {gptq[0]['calibration']}")
    elif args.calibration:
        print("--calibration is used by -gptq and -bc schemes only; none was measured", file=sys.stderr)
    note = mr.calibration_note(rows)
    if note:
        print(note)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            flat = [{k: v for k, v in r.items() if k != "engines"} |
                    {f"{d}_ms": e.get("ms") for d, e in r["engines"].items()} for r in rows]
            writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
            writer.writeheader()
            writer.writerows(flat)
    if args.plot:
        mr.plot(shown, args.plot)
    if args.save:
        calib_feeds = None
        if any(mr.Scheme.parse(r["scheme"]).method == "gptq" for r in shown):
            from .onnx_model import load_layers

            calib_feeds = mr.calibration_feeds(load_layers(args.model)[0], args.input, shape, 0, args.calibration)[0]
        mr.save_weights(args.save, args.model, shown, calib_feeds)
    if args.target_sqnr is not None:
        plan = mr.choose_plan(rows, candidates, args.target_sqnr, args.model, _act_quant_arg(args.act_quant))
        print(format_plan(plan, rows))
        if args.save_plan:
            plan.save(args.save_plan)
            print(f"plan saved to {args.save_plan}")
    return 0


def format_plan(plan, rows) -> str:
    int8 = {r["layer"]: r["bytes_packed"] for r in rows if r["scheme"] == "int8-ch-sym"}
    flt = {r["layer"]: r["bytes_float"] for r in rows}
    lines = [f"plan for target SQNR {plan.target_sqnr_db:g} dB:", "| layer | scheme | bytes | SQNR dB |",
             "|---|---|---|---|"]
    for name, entry in plan.layers.items():
        lines.append(f"| {name[:28]} | {entry['scheme']} | {entry['bytes']:,} | {entry['sqnr_db']:.1f} |")
    total = sum(e["bytes"] for e in plan.layers.values())
    worst = min(e["sqnr_db"] for e in plan.layers.values())
    f = sum(flt.values())
    line = f"total {total:,} bytes = {total / f:.1%} of float ({f:,})"
    if len(int8) == len(plan.layers):
        line += f", {total / sum(int8.values()):.1%} of all-int8 per-channel ({sum(int8.values()):,})"
    lines.append(line + f"; worst layer {worst:.1f} dB")
    lines.append("NOTE: this plan is per layer (each layer meets the target on its own); per-layer targets do not "
                 "compose into the model's: for a target at the model's output use `python -m qconv quantize MODEL "
                 "OUT --target-sqnr T --calibration ...`")
    return "\n".join(lines)


def _convert(args) -> int:
    from . import convert

    return convert.main(args)


_USER_ERRORS = (ValueError, TypeError, OSError, ImportError)
"""What a user's input raises in practice: a bad value or scheme (``ValueError``), a missing or unreadable file
(``OSError``), an optional package not installed (``ImportError``, with the ``pip install`` to run)."""
_USER_ERROR_CLASSES = (("qconv.convert", "ConvertError"), ("qconv.gpu.errors", "OpenCLUnavailableError"),
                       ("onnxruntime.capi.onnxruntime_pybind11_state", "InvalidProtobuf"),
                       ("onnxruntime.capi.onnxruntime_pybind11_state", "NoSuchFile"),
                       ("onnxruntime.capi.onnxruntime_pybind11_state", "InvalidArgument"))
"""(module, class) of the user errors of qconv's and onnxruntime's own classes, looked up only where the
module was imported (an exception of a module never imported cannot have been raised)."""


def is_user_error(exc: BaseException) -> bool:
    """True when ``exc`` reports a user's mistake (a file, a value, an option, a missing package): the CLI then
    prints its message in one line instead of a traceback."""
    if isinstance(exc, _USER_ERRORS):
        return True
    if isinstance(exc, SystemExit):  # raise SystemExit("message"): a message, not an exit status
        return isinstance(exc.code, str)
    for module, name in _USER_ERROR_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def main(argv=None) -> int:
    """``python -m qconv``: parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return its exit status.
    A user error (:func:`is_user_error`) prints ``qconv COMMAND: error: MESSAGE`` (the message's first line) to
    stderr and returns 2; with ``--debug`` it propagates with its traceback. Other exceptions propagate."""
    parser = argparse.ArgumentParser(prog="qconv", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the built-in suite through every engine and print a table")
    demo.add_argument("--engines", help="comma-separated engines (default: all available)")
    demo.add_argument("--repeat", type=int, default=5, help="timed runs per case, at least (the best is shown)")
    demo.add_argument("--tune", choices=("none", "fast", "full"), default="none",
                      help="OpenCL auto-tuning (default none: the heuristic kernel choice; fast and full time the "
                           "candidates, minutes on a CPU OpenCL device)")
    demo.add_argument("--quick", action="store_true", help="a smaller suite")
    demo.add_argument("--json", help="also write the rows as JSON to this file")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=_demo)

    ins = sub.add_parser("inspect", help="quantize every layer of an ONNX model and measure it")
    ins.add_argument("model", help="path of an .onnx model")
    ins.add_argument("--scheme", action="append", help="weight scheme, e.g. int4-b32-asym, int8-ch-sym, "
                     "int4-b64-asym-mse (repeatable; default int8-ch-sym and int4-b32-asym)")
    ins.add_argument("--bits", type=int, choices=(4, 8), help="one scheme from parts: bits ...")
    ins.add_argument("--block-size", type=int, default=0, help="... input channels per block (0 = per channel)")
    sym = ins.add_mutually_exclusive_group()
    sym.add_argument("--symmetric", action="store_true", help="symmetric weights (default)")
    sym.add_argument("--asymmetric", action="store_true", help="asymmetric weights")
    ins.add_argument("--method", choices=("minmax", "mse"), default="minmax", help="weight quantizer")
    ins.add_argument("--act-quant", default="tensor", choices=("tensor", "row", "block", "none"),
                     help="activation quantization of the CPU engine and the oracle")
    ins.add_argument("--act-block", type=int, default=0, help="channels per block for --act-quant block")
    ins.add_argument("--input", help="input tensor (.npy) or image (needs Pillow); default: seeded random")
    ins.add_argument("--calibration", nargs="+", metavar="INPUT",
                     help="inputs (.npy or images) that -gptq and -bc schemes are calibrated on; the SQNR is measured "
                          "on --input (default: --input itself, flagged in the output, or a random feed)")
    ins.add_argument("--input-shape", help="N,C,H,W for the random input (dynamic dims default to 1 and 256)")
    ins.add_argument("--engines", help="comma-separated engines to time (default: all fast engines)")
    ins.add_argument("--repeat", type=int, default=3, help="timed runs per layer (median)")
    ins.add_argument("--json", help="write all rows as JSON")
    ins.add_argument("--csv", help="write all rows as CSV")
    ins.add_argument("--plot", help="draw SQNR per layer to this PNG (needs matplotlib)")
    ins.add_argument("--save", help="write the quantized weights to this .npz")
    ins.add_argument("--target-sqnr", type=float, help="a per-layer plan: per layer the cheapest candidate meeting this SQNR on its own (for a "
                          "target at the model's output: `quantize --target-sqnr`)")
    ins.add_argument("--candidates", default="int4-b32-asym,int4-b64-asym,int8-ch-sym,float",
                     help="candidate schemes for --target-sqnr")
    ins.add_argument("--save-plan", help="write the plan of --target-sqnr as JSON")
    ins.add_argument("--no-progress", action="store_true", help="no progress bar")
    ins.set_defaults(func=_inspect)

    conv = sub.add_parser("convert", help="convert one quantized weight between .npz, .onnx, .gguf and .pt files")
    conv.add_argument("input", help="input file (.npz, .onnx, .gguf, .pt)")
    conv.add_argument("output", nargs="?", help="output file (.npz, .onnx, .gguf, .pt)")
    formats = ("npz", "onnx", "gguf", "pt")
    conv.add_argument("--from", dest="src_format", choices=formats, help="input format (default: from the extension)")
    conv.add_argument("--to", dest="dst_format", choices=formats, help="output format (default: from the extension)")
    conv.add_argument("--tensor", help="name of the weight to read (needed when the input holds several)")
    conv.add_argument("--list", action="store_true", help="list the weights of INPUT and exit")
    conv.add_argument("--name", help="tensor name in the output (default: the input's name)")
    conv.add_argument("--groups", type=int, help="set the weight's conv groups (for inputs that do not store them)")
    conv.add_argument("--onnx-op", choices=("dequantizelinear", "matmulnbits"), default="dequantizelinear",
                      help="ONNX output node: blocked DequantizeLinear-21 (default) or com.microsoft.MatMulNBits")
    conv.add_argument("--gguf-type", choices=("Q4_0", "Q4_1", "Q8_0"),
                      help="GGUF output type (default: Q8_0 for int8, Q4_0 for symmetric int4, else Q4_1)")
    conv.set_defaults(func=_convert)
    from .onnx.cli import add_subcommands  # whole models: `quantize` and `run`
    add_subcommands(sub)
    for command in sub.choices.values():  # `--debug` after the subcommand too (without resetting the global one)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BaseException as exc:
        if args.debug or not is_user_error(exc):
            raise
        lines = str(exc.code if isinstance(exc, SystemExit) else exc).strip().splitlines()
        print(f"qconv {args.command}: error: {lines[0] if lines else type(exc).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
