"""``python -m qconv inspect MODEL.onnx``: quantize every layer of a real model and measure it.

For each Conv (and MatMul/Gemm with a constant weight) the layer's real input is captured by running the
float model through onnxruntime; then, per weight scheme, the layer is quantized, run through the oracle
and each engine, and compared with the float layer output: relative error, SQNR (dB), time per engine
against onnxruntime's float time for the same layer. ``--target-sqnr`` turns the measurements into a
mixed-precision plan: per layer, the cheapest candidate scheme that meets the target.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

import numpy as np

from . import reference
from ._progress import bar
from ._timing import median_ms
from .metrics import rtol_for, sqnr_db, tolerance
from .weights import QuantizedWeight, quantize_weight

_SCHEME_RE = re.compile(r"^int(4|8)-(ch|b\d+)(?:-(sym|asym|zp))?(?:-(minmax|mse|gptq))?(-bc)?$")


@dataclass(frozen=True)
class Scheme:
    """A weight scheme: ``int4-b32-asym``, ``int8-ch-sym``, ``int8-ch-zp``, ``int4-b64-asym-mse``, ``int8-ch-sym-bc``
    or ``float``.

    The grid: ``sym`` (symmetric, ``q * s``), ``asym`` (MNN's and GGUF Q4_1's float minimum, ``q * s + min``) or
    ``zp`` (asymmetric with an integer zero point, ``(q - z) * s``: 0 is exact; ONNX's and NNCF's form, see
    :func:`~qconv.weights.quantize_weight`'s ``zero_point``).

    The method suffix: ``minmax`` (default), ``mse`` (clip-range search) or ``gptq`` (calibrated on real
    layer inputs, see :mod:`qconv.gptq`; needs ``calib`` in :meth:`quantize`). A final ``-bc`` adds bias
    correction (:meth:`output_shift`, calibrated too): the weights are those of the scheme without it, the
    layer's bias absorbs the mean output shift their rounding causes on the calibration inputs."""

    bits: int | None
    block_size: int = 0
    symmetric: bool = True
    method: str = "minmax"
    bias_correction: bool = False
    zero_point: bool = False

    @classmethod
    def parse(cls, text: str) -> "Scheme":
        text = text.strip().lower()
        if text == "float":
            return cls(None)
        m = _SCHEME_RE.match(text)
        if not m:
            raise ValueError(f"scheme {text!r} not understood; examples: int4-b32-asym, int8-ch-sym, "
                             "int4-b64-asym-mse, int4-b32-asym-gptq, int8-ch-sym-bc, float")
        bits, blk, sym, method, bc = m.groups()
        if sym == "zp" and method == "gptq":
            raise ValueError(f"scheme {text!r}: gptq quantizes to the sym or asym grid (int8-ch-asym-gptq), not zp")
        if blk != "ch" and (int(blk[1:]) < 4 or int(blk[1:]) > 1024 or int(blk[1:]) & (int(blk[1:]) - 1)):
            raise ValueError(f"scheme {text!r}: block size {blk[1:]} is not one the engines run (a power of two from "
                             "4 to 1024 input channels, e.g. int4-b32-asym, int4-b128-sym), or use per-channel "
                             "'ch' (int8-ch-sym)")
        return cls(int(bits), 0 if blk == "ch" else int(blk[1:]), sym not in ("asym", "zp"), method or "minmax", bool(bc),
                   sym == "zp")

    @property
    def label(self) -> str:
        if self.bits is None:
            return "float"
        blk = f"b{self.block_size}" if self.block_size else "ch"
        meth = "" if self.method == "minmax" else f"-{self.method}"
        bc = "-bc" if self.bias_correction else ""
        grid = "sym" if self.symmetric else ("zp" if self.zero_point else "asym")
        return f"int{self.bits}-{blk}-{grid}{meth}{bc}"

    @property
    def calibrated(self) -> bool:
        """Whether the scheme needs the layer's calibration inputs (``gptq`` or ``-bc``)."""
        return self.method == "gptq" or self.bias_correction

    def block_for(self, in_per_group: int) -> int:
        """The block size used for a layer: the requested one when it divides the channels, else per channel."""
        return self.block_size if self.block_size and in_per_group % self.block_size == 0 else 0

    def quantize(self, w: np.ndarray, groups: int, calib=None, **conv) -> QuantizedWeight | None:
        """Quantize ``w``; ``calib`` (the layer's NCHW input) and ``conv`` (stride, padding, dilation) are
        needed by ``gptq`` only."""
        if self.bits is None:
            return None
        block = self.block_for(w.shape[1])
        if self.method == "gptq":
            if calib is None:
                raise ValueError(f"scheme {self.label} needs calibration inputs")
            from .gptq import quantize_weight_calibrated
            return quantize_weight_calibrated(w, calib, self.bits, block, self.symmetric, groups, **conv)
        return quantize_weight(w, self.bits, block, self.symmetric, groups, self.method, zero_point=self.zero_point)

    def corrected_bias(self, w: np.ndarray, qw: QuantizedWeight | None, bias, calib=None, **conv):
        """The layer's bias to use with ``qw``: ``bias`` itself (may be None) without ``-bc``; with it
        ``bias - output_shift(w, qw, calib)`` (float32 ``(O,)``; see :func:`qconv.gptq.output_shift`), where
        ``calib`` is the layer's NCHW input on the calibration feeds (an array or a list)."""
        if not self.bias_correction or qw is None:
            return bias
        if calib is None:
            raise ValueError(f"scheme {self.label} needs calibration inputs")
        from .gptq import output_shift
        shift = output_shift(w, qw, calib, **conv)
        return ((0.0 if bias is None else np.asarray(bias, np.float64)) - shift).astype(np.float32)


def engine_agrees(y, ref, x, qw, bias, act_quant, act_block=0, **conv) -> bool:
    """Whether an engine's output ``y`` is within the per-output tolerance of the oracle's ``ref`` (the rule
    of :mod:`qconv.metrics`: at every element ``|y - ref| <= rtol * (sum |w_deq||x_deq| + |bias|)``)."""
    tol = tolerance(x, qw, bias, act_quant=act_quant, act_block=act_block, rtol=rtol_for(act_quant), **conv)
    return bool(np.isfinite(y).all() and (np.abs(np.asarray(y, np.float64) - ref) <= tol).all())


def measure_layer(layer, x_captured, scheme: Scheme, act_quant="tensor", act_block=0, engines=(),
                  repeat: int = 3, x_calib=None) -> dict:
    """Quantize ``layer`` with ``scheme`` and measure it on its captured input (see the module docstring).

    ``x_calib``: the layer's input on a calibration feed (or a list, one per feed), for calibrated schemes
    (``gptq``, ``-bc``)."""
    import qconv

    x = layer.conv_input(x_captured)
    kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
    y_float = reference.float_conv2d(x, layer.weight, layer.bias, groups=layer.groups, **kw)
    if x_calib is None:
        calib = None
    else:
        calib = [layer.conv_input(t) for t in (x_calib if isinstance(x_calib, (list, tuple)) else [x_calib])]
    qw = scheme.quantize(layer.weight, layer.groups, calib, **kw)
    bias = scheme.corrected_bias(layer.weight, qw, layer.bias, calib, **kw)
    row = dict(layer=layer.name, op=layer.op, shape=layer.describe_shape(), groups=layer.groups,
               scheme=scheme.label, bytes_float=4 * layer.weight.size,
               bytes_packed=4 * layer.weight.size if qw is None else qw.nbytes,
               block=None if qw is None else qw.block_size, engines={})
    if qw is None:
        row.update(rel_err=0.0, sqnr_db=float("inf"))
        return row
    y = reference.conv2d(x, qw, bias, activation=None, act_quant=act_quant, act_block=act_block, **kw)
    row["rel_err"] = float(np.linalg.norm(y - y_float) / max(np.linalg.norm(y_float), 1e-30))
    row["sqnr_db"] = sqnr_db(y, y_float)
    for dev in engines:
        try:
            conv = qconv.Conv2d(qw, bias, device=dev, act_block=act_block,
                                act_quant=act_quant if dev in ("cpu", "reference") else "auto", **kw)
            ye = conv(x)
            aq = conv.spec.act_quant
            ref = y if aq == act_quant else reference.conv2d(x, qw, bias, act_quant=aq, act_block=act_block, **kw)
            row["engines"][dev] = dict(ms=median_ms(lambda: conv(x), repeat),
                                       agrees=engine_agrees(ye, ref, x, qw, bias, aq, act_block, **kw),
                                       sqnr_db=sqnr_db(ye, y_float))
        except Exception as exc:  # report, do not hide the other engines
            row["engines"][dev] = dict(error=f"{type(exc).__name__}: {exc}")
    return row


@dataclass
class Plan:
    """A mixed-precision plan: per layer the chosen scheme label (``float`` keeps the float weight)."""

    model: str
    target_sqnr_db: float
    act_quant: str | None
    layers: dict  # name -> {"scheme": label, "bytes": int, "sqnr_db": float}

    def save(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(asdict(self), fh, indent=1)

    @classmethod
    def load(cls, path) -> "Plan":
        with open(path) as fh:
            data = json.load(fh)
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"{path}: not a qconv plan ({exc})") from None

    def apply(self, model_path=None, calib_feed=None) -> dict:
        """``{layer name: QuantizedWeight or None}`` for the model's layers under this plan.

        ``gptq`` layers are calibrated on ``calib_feed``: a feed dict or a list of them (default: the seeded
        random feed ``inspect`` uses)."""
        from .onnx_model import capture, default_input, load_layers

        model, layers = load_layers(model_path or self.model)
        schemes = {name: Scheme.parse(e["scheme"]) for name, e in self.layers.items()}
        captured = []
        if any(s.method == "gptq" for s in schemes.values()):
            feeds = calib_feed or default_input(model, seed=CALIB_SEED)
            captured = [capture(model, layers, f) for f in (feeds if isinstance(feeds, (list, tuple)) else [feeds])]
        out = {}
        for layer in layers:
            if layer.name in schemes:
                calib = [layer.conv_input(t[layer.input_name]) for t in captured] or None
                out[layer.name] = schemes[layer.name].quantize(layer.weight, layer.groups, calib,
                                                                **_conv_kwargs(layer))
        return out


CALIB_SEED = 1  # the calibration feed differs from the (seed 0) evaluation feed


def _conv_kwargs(layer) -> dict:
    return dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)


def choose_plan(rows, candidates, target_db: float, model: str, act_quant) -> Plan:
    """Per layer, the candidate with the fewest bytes whose measured SQNR is >= ``target_db``."""
    by_layer: dict = {}
    for r in rows:
        by_layer.setdefault(r["layer"], {})[r["scheme"]] = r
    layers = {}
    for name, schemes in by_layer.items():
        ok = [schemes[c.label] for c in candidates if c.label in schemes and schemes[c.label]["sqnr_db"] >= target_db]
        if not ok:
            ok = [dict(scheme="float", bytes_packed=next(iter(schemes.values()))["bytes_float"],
                       sqnr_db=float("inf"))]
        best = min(ok, key=lambda r: r["bytes_packed"])
        layers[name] = dict(scheme=best["scheme"], bytes=int(best["bytes_packed"]), sqnr_db=float(best["sqnr_db"]))
    return Plan(str(model), float(target_db), act_quant, layers)


def format_rows(rows, engines) -> str:
    head = ["layer", "op", "shape", "groups", "scheme", "bytes float -> packed", "rel err", "SQNR dB", "ort float ms"]
    head += [f"{d} ms" for d in engines]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        fell_back = r.get("block") == 0 and Scheme.parse(r["scheme"]).block_size  # the block did not divide
        scheme = r["scheme"] + (" (ch)" if fell_back else "") + ("*" if r.get("calibrated_on_evaluation_input") else "")
        cells = [r["layer"][:28], r["op"], r["shape"], str(r["groups"]), scheme,
                 f"{r['bytes_float']:,} -> {r['bytes_packed']:,}", f"{r['rel_err']:.2e}", f"{r['sqnr_db']:.1f}",
                 f"{r.get('ort_ms', float('nan')):.3f}"]
        for d in engines:
            e = r["engines"].get(d, {})
            if "error" in e:
                cells.append("error")
            else:
                cells.append(f"{e['ms']:.3f}" + ("" if e.get("agrees", True) else " MISMATCH") if e else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(rows) -> list[str]:
    out = []
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == scheme]
        db = np.array([r["sqnr_db"] for r in rs])
        out.append(f"{scheme}: {len(rs)} layers, weights {sum(r['bytes_float'] for r in rs):,} -> "
                   f"{sum(r['bytes_packed'] for r in rs):,} bytes, SQNR median {np.median(db):.1f} dB, "
                   f"worst {db.min():.1f} dB")
    return out


def calibration_feeds(model, input_path=None, input_shape=None, seed: int = 0, calibration_paths=None):
    """The feeds calibrated schemes (``gptq``, ``-bc``) are calibrated on, and where they come from.

    Returns ``(feeds, source, on_evaluation_input)``: ``calibration_paths`` (one or more ``.npy`` / images)
    when given; else, with a user ``input_path``, that input itself (the only real data there is:
    ``on_evaluation_input`` is True and the SQNR measured on it is optimistic); else a seeded random feed
    (seed ``seed + CALIB_SEED``, not the evaluation feed's ``seed``)."""
    import os

    from .onnx_model import default_input, load_input

    if calibration_paths:
        feeds = [load_input(model, p, input_shape) for p in calibration_paths]
        same = input_path is not None and any(os.path.realpath(p) == os.path.realpath(input_path)
                                              for p in calibration_paths)
        n = len(calibration_paths)
        source = f"{n} calibration input{'s' if n > 1 else ''}" + (", including the evaluation input" if same
                                                                   else ", held out from the evaluation input")
        return feeds, source, same
    if input_path is not None:
        return [load_input(model, input_path, input_shape)], "the evaluation input itself", True
    return [default_input(model, input_shape, seed + CALIB_SEED)], f"a random feed (seed {seed + CALIB_SEED})", False


def calibration_note(rows) -> str | None:
    """A warning line when some calibrated row was calibrated on the input its SQNR is measured on."""
    same = [r for r in rows if r.get("calibrated_on_evaluation_input")]
    if not same:
        return None
    return (f"NOTE: {len(same)} calibrated row(s) marked * were calibrated on {same[0]['calibration']}: their SQNR is "
            "measured on the calibration input (optimistic). Pass --calibration with other inputs to measure "
            "them on held-out data.")


def inspect(model_path, schemes, act_quant="tensor", act_block=0, engines=(), input_path=None,
            input_shape=None, repeat: int = 3, progress: bool = True, time_ort: bool = True, seed: int = 0,
            calibration_paths=None):
    """Measure every layer of ``model_path`` under each scheme; returns the list of row dicts.

    Calibrated schemes (``gptq``, ``-bc``) are calibrated on :func:`calibration_feeds` (``calibration_paths``:
    one or more inputs, never the evaluation input unless listed); their rows say where (``calibration``,
    ``calibrated_on_evaluation_input``)."""
    from .onnx_model import capture, default_input, load_input, load_layers, time_float_layer

    model, layers = load_layers(model_path)
    if not layers:
        raise ValueError(f"{model_path}: no Conv or constant-weight MatMul/Gemm layers found")
    feed = load_input(model, input_path, input_shape) if input_path else default_input(model, input_shape, seed)
    tensors = capture(model, layers, feed)
    calib, source, same = {}, None, False
    if any(s.calibrated for s in schemes):
        feeds, source, same = calibration_feeds(model, input_path, input_shape, seed, calibration_paths)
        captured = [tensors if same and not calibration_paths else capture(model, layers, f) for f in feeds]
        calib = {name: [t[name] for t in captured] for name in captured[0]}
    jobs = bar([(layer, s) for layer in layers for s in schemes], desc="inspect", unit="layer", enabled=progress,
               leave=True)
    rows, ort_ms = [], {}
    for layer, scheme in jobs:
        x = tensors[layer.input_name]
        row = measure_layer(layer, x, scheme, act_quant, act_block, engines, repeat,
                            calib.get(layer.input_name) if calib else None)
        if scheme.calibrated:
            row.update(calibration=source, calibrated_on_evaluation_input=same)
        if time_ort and not layer.is_linear and layer.name not in ort_ms:
            ort_ms[layer.name] = time_float_layer(layer, x, repeat)
        row["ort_ms"] = ort_ms.get(layer.name, float("nan"))
        rows.append(row)
    return rows


def save_weights(path, model_path, rows, calib_feeds=None) -> None:
    """``--save``: the quantized weights of every (layer, scheme) row as one ``.npz`` (keys ``layer|scheme|field``);
    ``gptq`` weights calibrated on ``calib_feeds`` (see :func:`calibration_feeds`; default a random feed)."""
    plans = {}
    for r in rows:
        plans.setdefault(r["scheme"], {})[r["layer"]] = dict(scheme=r["scheme"], bytes=0, sqnr_db=0.0)
    arrays = {}
    for scheme, entries in plans.items():
        weights = Plan(str(model_path), 0.0, None, entries).apply(calib_feed=calib_feeds)
        for name, qw in weights.items():
            arrays.update(_weight_arrays(f"{name}|{scheme}|", qw))
    np.savez(path, **arrays)


def _weight_arrays(key: str, qw) -> dict:
    if qw is None:
        return {}
    arrays = {key + "q": qw.q, key + "meta": np.array([qw.bits, qw.block_size, qw.groups], np.int64)}
    arrays.update({key + k: v for k, v in qw.stored_params().items()})
    return arrays


def plot(rows, path) -> None:
    """``--plot``: SQNR per layer for each scheme (matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from None
    names = list(dict.fromkeys(r["layer"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 0.18), 4))
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        vals = {r["layer"]: r["sqnr_db"] for r in rows if r["scheme"] == scheme}
        ax.plot(range(len(names)), [vals.get(n, np.nan) for n in names], marker=".", label=scheme)
    ax.set_xlabel("layer")
    ax.set_ylabel("SQNR vs float (dB)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
