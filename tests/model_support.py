"""The real model and picture of the whole-model tests (tests/test_real_model.py, tests/test_onnx_quality.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

TEXT_IMAGE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "text_640.png"


def model_and_picture(name: str = "ch_PP-OCRv4_det_infer.onnx") -> tuple[str, Path]:
    """(path of the rapidocr model ``name`` as the set-up installs it, the text picture
    ``../shared/data/text_640.png``), or a skip that names what is missing."""
    from qconv.onnx_model import rapidocr_model

    if not TEXT_IMAGE.exists():
        pytest.skip(f"{TEXT_IMAGE} not here (shared/data beside the repository)")
    try:
        return rapidocr_model(name), TEXT_IMAGE
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"{name} not installed: {exc}")
