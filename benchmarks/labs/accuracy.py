"""Whole-model accuracy: output SQNR of qconv-quantized PP-OCRv4 det and rec against the float model.

The models and evaluation inputs are ``benchmarks/bench_models.py``'s (det: ``examples/data/text_640.png`` at
``--size`` 640, rec: its first text line at 48x320; both fed ``(x/255 - 0.5)/0.5``). Calibrated schemes
(``-gptq``, ``-bc``) are calibrated on **held-out** pictures made here: :func:`text_image` renders other words
(seeded, Pillow's default font at random sizes and dark colours on a light background, the style of the
evaluation picture, none of its words), :func:`text_line` one such line for rec. No evaluation input is used
for calibration, except by the ``plan25`` row (``bench_models``' plan, measured on the evaluation input itself).

Each row: scheme, activation mode (``auto``: the session default, per-tensor for convs / per-row for MatMuls;
``block/N``: ``act_quant="block"`` with ``act_block`` N, resolved per layer by ``quantize_model``), SQNR dB.
Accuracy only: no timing (use ``bench_models.py`` on a quiet machine for that).

    .venv/bin/python benchmarks/labs/accuracy.py [--size 640] [--calibration 1] [--models det,rec] [--quick]

``--quick``: det at 160, rec at 48x160, three rows (a smoke test). ``--sensitivity N``: instead, how much the
int8-ch-sym SQNR moves when every output channel of every weight is scaled by ``1 + u``, ``|u| <= 2^-11`` (the
size of float16 scale rounding), float32 scales, N seeds: a model whose SQNR moves by dB under that is
chaotic at that level, and one stored form's figure against another's says nothing finer.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_models import _plan, _ppocr, models  # noqa: E402

WORDS = ("quantized weights scale offset block channel depthwise kernel tensor pixel row column float integer "
         "engine latency memory session model layer output input image text detector recognizer").split()
ROWS = [  # (scheme, act_quant, act_block)
    ("int8-ch-sym", None, 0), ("int8-ch-sym", "block", 0), ("int8-ch-sym", "block", 8),
    ("int8-ch-sym-bc", "block", 8), ("int8-ch-sym-gptq-bc", "block", 16), ("int8-ch-sym-gptq-bc", "block", 8),
    ("int8-ch-asym-gptq-bc", "block", 8), ("plan25", None, 0), ("int4-b32-asym-mse", None, 0),
    ("int4-b32-asym-mse", "block", 0), ("int4-b32-asym-gptq-bc", "block", 8),
]
QUICK_ROWS = [("int8-ch-sym", None, 0), ("int8-ch-sym-gptq-bc", "block", 8), ("int4-b32-asym-mse-bc", "block", 8)]


def _draw_line(draw, rng, x: int, y: int, font_size: int) -> None:
    from PIL import ImageFont

    words = " ".join(rng.choice(WORDS, int(rng.integers(2, 6))))
    draw.text((x, y), words, fill=tuple(int(v) for v in rng.integers(0, 90, 3)),
              font=ImageFont.load_default(size=font_size))


def text_image(seed: int, size: int = 640):
    """A held-out calibration picture: lines of random words from :data:`WORDS` (PIL RGB, ``size`` square)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(225, 256, 3)))
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(5, 20))
    while y < size - 20:
        font_size = int(rng.integers(14, 40))
        _draw_line(draw, rng, int(rng.integers(5, size // 4)), y, font_size)
        y += int(font_size * rng.uniform(1.3, 2.2))
    return img


def text_line(seed: int, width: int = 320) -> np.ndarray:
    """A held-out rec calibration input: one line of random words, 392x42 like the evaluation crop, resized to
    ``(1, 3, 48, width)``."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (392, 42), tuple(int(v) for v in rng.integers(225, 256, 3)))
    _draw_line(ImageDraw.Draw(img), rng, int(rng.integers(0, 12)), int(rng.integers(0, 8)), int(rng.integers(22, 30)))
    return _ppocr(img.resize((width, 48), Image.BILINEAR))


def calibration(model: str, seeds, size: int, width: int) -> list:
    from PIL import Image

    if model == "det":
        return [_ppocr(text_image(s).resize((size, size), Image.BILINEAR)) for s in seeds]
    return [text_line(s, width) for s in seeds]


def measure(path: str, x: np.ndarray, calib: list, rows) -> list:
    import onnxruntime as ort

    import qconv.onnx as qo
    from qconv.metrics import sqnr_db

    name = qo.InferenceSession(path).get_inputs()[0].name
    ref, = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {name: x})
    out = []
    for scheme, act_quant, act_block in rows:
        if scheme == "plan25":
            q = qo.quantize_model(path, plan=_plan(path, x))
        else:
            q = qo.quantize_model(path, scheme, calibration=calib, act_quant=act_quant, act_block=act_block)
        y, = qo.InferenceSession(q, threads=1).run(None, {name: x})
        act = "auto" if act_quant is None else f"{act_quant}/{act_block or 'w'}"
        out.append((scheme, act, sqnr_db(y, ref)))
        print(f"| {scheme} | {act} | {out[-1][2]:.2f} |", flush=True)
    return out


def sensitivity(path: str, x: np.ndarray, seeds: int) -> None:
    import onnxruntime as ort

    import qconv.model_report as mr
    import qconv.onnx as qo
    from qconv.metrics import sqnr_db

    name = qo.InferenceSession(path).get_inputs()[0].name
    ref, = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {name: x})
    quantize = mr.quantize_weight

    def sqnr(quantizer) -> float:
        mr.quantize_weight = quantizer
        try:
            y, = qo.InferenceSession(qo.quantize_model(path, "int8-ch-sym"), threads=1).run(None, {name: x})
        finally:
            mr.quantize_weight = quantize
        return sqnr_db(y, ref)

    print(f"| int8-ch-sym, default stored form | {sqnr(quantize):.2f} |")
    print(f"| int8-ch-sym, float32 scales | {sqnr(lambda *a: quantize(*a, scale_dtype='float32')):.2f} |")
    for seed in range(seeds):
        rng = np.random.default_rng(seed)

        def perturbed(w, *a):
            w = np.asarray(w, np.float32)
            u = rng.uniform(-2.0 ** -11, 2.0 ** -11, (w.shape[0],) + (1,) * (w.ndim - 1))
            return quantize(w * (1 + u).astype(np.float32), *a, scale_dtype="float32")
        print(f"| int8-ch-sym, float32 scales, channels x (1 + u), seed {seed} | {sqnr(perturbed):.2f} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=640, help="det input size")
    ap.add_argument("--calibration", type=int, default=1, help="held-out calibration pictures (seeds 1..N)")
    ap.add_argument("--models", default="det,rec")
    ap.add_argument("--quick", action="store_true", help="small inputs, three rows")
    ap.add_argument("--sensitivity", type=int, default=0, metavar="N", help="the SQNR's spread under float16-sized "
                    "weight perturbations (N seeds) instead of the table")
    args = ap.parse_args(argv)
    size = 160 if args.quick else args.size
    found = models(size, args.quick)
    for model in args.models.split(","):
        path, x = found[model]
        print(f"\n{model} ({'x'.join(map(str, x.shape[2:]))}), calibrated on {args.calibration} held-out picture(s)")
        if args.sensitivity:
            print("| weights | SQNR dB |\n|---|---:|")
            sensitivity(path, x, args.sensitivity)
            continue
        print("| scheme | activations | SQNR dB |\n|---|---|---:|")
        measure(path, x, calibration(model, range(1, args.calibration + 1), size, x.shape[3]),
                QUICK_ROWS if args.quick else ROWS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
