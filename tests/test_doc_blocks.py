"""Every ```python, ```sh and ```bash block of README.md, docs/*.md and qconv/onnx/README.md runs and exits 0.

A block runs in a fresh folder that links the repository's top-level entries (so ``examples/data/text_640.png``
and ``scripts/`` resolve and what the block writes stays in the folder), with ``.venv`` linking this
interpreter's environment (``.venv/share/qconv/models/...`` is where ``scripts/setup.sh`` extracts the PP-OCR
models; a block that needs one skips without it, and fails under CI, as the real-model tests do). Python blocks
run with this interpreter, shell blocks with ``bash -e`` and this interpreter first on ``PATH`` (``python``),
``.venv/bin/python`` read as this interpreter.

A block that cannot run here says why on its first line: ``# doc-test: skip (<reason>)``. Output, usage
synopses and pictures use another fence language (```text); every fence names one, so a new code block is
never left out silently. Test ids are ``file:line`` of the opening fence.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
         "qconv/onnx/README.md"]
RUN = ("python", "sh", "bash")
FENCE = re.compile(r"^\s*```(\S*)\s*$")
SKIP = re.compile(r"^#\s*doc-test:\s*skip\s*\((.+)\)\s*$")
MODELS = re.compile(r"ch_PP-OCRv4_\w+\.onnx|rapidocr_model")
TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    """One fenced block: its file (relative to the repository), the line of its opening fence, language, text."""

    file: str
    line: int
    lang: str
    text: str

    def __str__(self):
        return f"{self.file}:{self.line}"


def blocks(name: str) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    out, open_at, lang, body = [], None, "", []
    for i, line in enumerate((ROOT / name).read_text().splitlines(), 1):
        m = FENCE.match(line)
        if open_at is None and m:
            open_at, lang, body = i, m.group(1), []
        elif open_at is not None and line.strip() == "```":
            out.append(Block(name, open_at, lang, textwrap.dedent("\n".join(body)) + "\n"))  # a fence in a list
            open_at = None
        elif open_at is not None:
            body.append(line)
    assert open_at is None, f"{name}:{open_at}: a fence that is never closed"
    return out


ALL = [b for name in FILES for b in blocks(name)]
CODE = [b for b in ALL if b.lang in RUN]


def test_every_fence_names_its_language():
    """An untagged fence would be neither run nor marked as output: it must say ```text (or a language)."""
    assert [str(b) for b in ALL if not b.lang] == []
    assert len(CODE) >= 10, "the blocks to run were not found"


def _workdir(tmp_path: Path) -> Path:
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


@pytest.mark.parametrize("block", CODE, ids=str)
def test_doc_block_runs(block, tmp_path):
    first = (block.text.strip().splitlines() or [""])[0]
    skip = SKIP.match(first)
    if skip:
        pytest.skip(skip.group(1))
    if MODELS.search(block.text):
        from model_support import model_and_picture

        for name in set(re.findall(r"ch_PP-OCRv4_\w+\.onnx", block.text)) or {"ch_PP-OCRv4_det_infer.onnx"}:
            model_and_picture(name)  # a skip (a failure under CI) when the set-up has not extracted it
    cwd = _workdir(tmp_path)
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if block.lang == "python":
        (cwd / "block.py").write_text(block.text)
        cmd = [sys.executable, "block.py"]
    else:
        (cwd / "block.sh").write_text(block.text.replace(".venv/bin/python", sys.executable))
        cmd = ["bash", "-e", "block.sh"]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, f"{block} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


ONNX_EXAMPLE = re.compile(r"qconv\.onnx|python -m qconv (?:inspect|quantize|run)\b")


def _distributions(modules) -> set[str]:
    import importlib.metadata as md

    owners = md.packages_distributions()
    return {owners[m][0].lower() for m in modules if m in owners and m != "qconv"}


def test_onnx_extra_installs_what_the_onnx_examples_use():
    """``pip install qconv[onnx]`` (with the base dependencies) gives every module the ONNX examples import: a
    python block's imports, Pillow where a block reads a picture, matplotlib where one plots (``--plot``)."""
    import ast
    import tomllib

    examples = [b for b in CODE if ONNX_EXAMPLE.search(b.text)]
    modules = set()
    for b in examples:
        if b.lang == "python":
            for node in ast.walk(ast.parse(b.text)):
                if isinstance(node, ast.Import):
                    modules |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    modules.add(node.module.split(".")[0])
        modules |= {"PIL"} if re.search(r"\.(png|jpe?g)\b", b.text) else set()
        modules |= {"matplotlib"} if "--plot" in b.text else set()
    assert {"onnx", "PIL", "matplotlib"} <= modules, "the ONNX examples were not found"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower()
                for r in project["dependencies"] + project["optional-dependencies"]["onnx"]}
    assert _distributions(modules) - declared == set()
