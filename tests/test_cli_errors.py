"""A user error on the command line prints one line, ``qconv COMMAND: error: MESSAGE``, and exits 2, without a
traceback; ``--debug`` shows the traceback. Each case runs ``python -m qconv`` in a subprocess, as a user does."""
import subprocess
import sys

import numpy as np
import pytest

from qconv.cli import is_user_error

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A folder with a small float model (``model.onnx``) and a file that is not a model (``text.onnx``)."""
    from onnx import TensorProto, helper, numpy_helper

    d = tmp_path_factory.mktemp("cli-errors")
    w = (np.random.default_rng(0).standard_normal((4, 3, 3, 3)) / 5).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="c", pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), d / "model.onnx")
    (d / "text.onnx").write_text("not a model\n")
    return d


def _qconv(args, cwd):
    return subprocess.run([sys.executable, "-m", "qconv", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


CASES = {
    "missing model (inspect)": (["inspect", "nope.onnx", "--no-progress"], "nope.onnx"),
    "missing model (quantize)": (["quantize", "nope.onnx", "out.onnx"], "nope.onnx"),
    "missing model (run)": (["run", "nope.onnx"], "nope.onnx"),
    "not an ONNX file": (["inspect", "text.onnx", "--no-progress"], "not a readable ONNX model"),
    "bad scheme": (["quantize", "model.onnx", "out.onnx", "--scheme", "int9-zz"], "scheme 'int9-zz'"),
    "bad --input-shape": (["run", "model.onnx", "--input-shape", "1,3,x"], "--input-shape"),
    "missing input image": (["run", "model.onnx", "--input", "missing.png", "--no-progress"], "missing.png"),
    "bad --repeat": (["run", "model.onnx", "--repeat", "0"], "--repeat must be >= 1"),
    "unknown engine": (["demo", "--engines", "cpu,bogus"], "'bogus'"),
    "missing weight file": (["convert", "nope.npz", "out.onnx"], "nope.npz"),
    "not an ONNX reference": (["run", "model.onnx", "--reference", "text.onnx", "--repeat", "1", "--no-progress"],
                              "text.onnx"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_error_prints_one_line_and_exits_2(case, files):
    args, needle = CASES[case]
    out = _qconv(args, files)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"qconv {args[0]}: error: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(files, where):
    """``--debug`` before or after the subcommand: the exception propagates (Python's exit status 1)."""
    args = ["--debug", "run", "nope.onnx"] if where == "before" else ["run", "nope.onnx", "--debug"]
    out = _qconv(args, files)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "FileNotFoundError" in out.stderr.strip().splitlines()[-1]


def test_internal_errors_are_not_user_errors():
    """An unexpected exception keeps its traceback; an exit status is not a message."""
    assert is_user_error(ValueError("x")) and is_user_error(FileNotFoundError("x"))
    assert is_user_error(SystemExit("--repeat must be >= 1"))
    assert not is_user_error(RuntimeError("x")) and not is_user_error(KeyError("x"))
    assert not is_user_error(SystemExit(3)) and not is_user_error(KeyboardInterrupt())
