"""The real model and picture of the whole-model tests (tests/test_real_model.py, tests/test_onnx_quality.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

TEXT_IMAGE = Path(__file__).resolve().parents[1] / "examples" / "data" / "text_640.png"


def model_and_picture(name: str = "ch_PP-OCRv4_det_infer.onnx") -> tuple[str, Path]:
    """(path of the rapidocr model ``name`` as the set-up installs it, the text picture
    ``examples/data/text_640.png``, in the repository), or a skip that names what is missing (a failure under CI)."""
    from qconv.onnx_model import rapidocr_model

    assert TEXT_IMAGE.exists(), f"{TEXT_IMAGE} is part of the repository"
    try:
        return rapidocr_model(name), TEXT_IMAGE
    except (ImportError, FileNotFoundError) as exc:
        missing(f"{name} not installed (bash scripts/setup.sh extracts it): {exc}")


def missing(reason: str):
    """A model the set-up installs is not there: a failure under CI (CI=true), a skip elsewhere."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no", "off"):
        pytest.fail(f"under CI: {reason}")
    pytest.skip(reason)
