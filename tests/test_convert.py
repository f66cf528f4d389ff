"""``python -m qconv convert``: round trips through each format via the CLI entry point, and user errors."""
import re
import subprocess
import sys

import numpy as np
import pytest

from qconv import QuantizedWeight, quantize_weight
from qconv.cli import main
from qconv.interop._common import exact_values


def _fp16_scales(qw):
    """The same weight with float16-representable scales (so GGUF can hold it exactly)."""
    s = qw.scales.astype(np.float16).astype(np.float32)
    return QuantizedWeight(qw.q, s, qw.offsets, qw.bits, qw.block_size, qw.groups)


def _weight(bits=8, shape=(8, 32, 3, 3), block=0, symmetric=True, groups=1, seed=0):
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return quantize_weight(w, bits=bits, block_size=block, symmetric=symmetric, groups=groups)


W8 = _fp16_scales(_weight(groups=2))                                           # 3x3, K = 144, per channel
W4 = _fp16_scales(_weight(bits=4, shape=(6, 64, 1, 1), block=32))             # 1x1, blocks of 32
W4A = _weight(bits=4, shape=(6, 64, 1, 1), block=32, symmetric=False)         # asymmetric, real offsets


def convert(capsys, *args):
    """Run ``qconv convert`` in-process: ``(exit code, stdout, stderr)``."""
    rc = main(["convert", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def round_trip(tmp_path, capsys, qw, ext, *opts, back_opts=()):
    """npz -> ext -> npz; returns (weight read back, stdout of the first step, both steps lossless)."""
    src, mid, back = tmp_path / "w.npz", tmp_path / f"mid{ext}", tmp_path / "back.npz"
    qw.save(src)
    rc, out, err = convert(capsys, src, mid, *opts)
    assert rc == 0, err
    rc, out2, err = convert(capsys, mid, back, *back_opts)
    assert rc == 0, err
    result = QuantizedWeight.load(back)
    assert result.q.shape == qw.q.shape and re.search(r"^\S+: shape ", out, re.M)
    lossless = "ConversionReport: lossless" in out and "ConversionReport: lossless" in out2
    if lossless:
        np.testing.assert_array_equal(exact_values(result), exact_values(qw))
        assert result.groups == qw.groups
    return result, out, lossless


@pytest.mark.parametrize("qw, opts", [(W8, ()), (W4, ()), (W4, ("--onnx-op", "matmulnbits"))],
                         ids=["dq-int8-groups", "dq-int4-block", "matmulnbits"])
def test_npz_onnx_npz(tmp_path, capsys, qw, opts):
    pytest.importorskip("onnx", reason="onnx not installed: .onnx conversion skipped")
    assert round_trip(tmp_path, capsys, qw, ".onnx", *opts)[2]


def test_written_onnx_runs_in_onnxruntime(tmp_path, capsys):
    pytest.importorskip("onnx", reason="onnx not installed: .onnx conversion skipped")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: ORT load check skipped")
    W4.save(tmp_path / "w.npz")
    for op, feeds in (("dequantizelinear", {}), ("matmulnbits", {"weight_input": np.eye(64, dtype=np.float32)})):
        assert convert(capsys, tmp_path / "w.npz", tmp_path / f"{op}.onnx", "--onnx-op", op)[0] == 0
        sess = ort.InferenceSession(str(tmp_path / f"{op}.onnx"), providers=["CPUExecutionProvider"])
        y = sess.run(None, feeds)[0]
        np.testing.assert_allclose(y.reshape(-1) if op == "dequantizelinear" else y.T.reshape(-1),
                                   W4.dequantize().reshape(-1), rtol=1e-6, atol=1e-7)
    rc, out, _ = convert(capsys, "--list", tmp_path / "matmulnbits.onnx")
    assert rc == 0 and out.startswith("weight\tMatMulNBits")


@pytest.mark.parametrize("qw, gtype", [(W8, "Q8_0"), (W4, "Q4_0")])
def test_npz_gguf_npz(tmp_path, capsys, qw, gtype):
    pytest.importorskip("gguf", reason="gguf not installed: .gguf conversion skipped")
    _, out, lossless = round_trip(tmp_path, capsys, qw, ".gguf")
    assert lossless and f"(GGUF {gtype}): lossless" in out


def test_lossy_gguf_report_tells_the_error(tmp_path, capsys):
    pytest.importorskip("gguf", reason="gguf not installed: .gguf conversion skipped")
    back, out, _ = round_trip(tmp_path, capsys, W4A, ".gguf", "--gguf-type", "Q4_0")
    err = float(re.search(r"ConversionReport: lossy, max abs error (\S+)", out).group(1))
    assert "requantized" in out
    assert np.isclose(np.abs(exact_values(back) - exact_values(W4A)).max(), err, rtol=1e-5)


def test_npz_pt_npz(tmp_path, capsys):
    pytest.importorskip("torch", reason="torch not installed: .pt conversion skipped")
    _, out, lossless = round_trip(tmp_path, capsys, W8, ".pt", back_opts=("--groups", "2"))
    assert lossless and "--groups 2" in out
    rc, _, err = convert(capsys, tmp_path / "w.npz", tmp_path / "x.pt", "--groups", "3")
    assert rc == 2 and err.count("\n") == 1  # 8 output channels in 3 groups: refused in one line


def test_inspect_save_file_entries(tmp_path, capsys):
    path = tmp_path / "multi.npz"
    arrays = {}
    for layer, qw in (("conv1", W8), ("fc", W4A)):
        key = f"{layer}|int-x|"
        arrays.update({key + "q": qw.q, key + "scales": qw.scales,
                       key + "meta": np.array([qw.bits, qw.block_size, qw.groups], np.int64)})
        if qw.offsets is not None:
            arrays[key + "offsets"] = qw.offsets
    np.savez(path, **arrays)
    rc, out, _ = convert(capsys, path, "--list")
    assert rc == 0 and out.splitlines()[0].startswith("conv1|int-x\t")
    rc, _, err = convert(capsys, path, tmp_path / "o.npz")
    assert rc == 2 and "--tensor" in err and "conv1|int-x, fc|int-x" in err
    rc, _, err = convert(capsys, path, tmp_path / "o.npz", "--tensor", "nope")
    assert rc == 2 and "no tensor named 'nope'; available: conv1|int-x, fc|int-x" in err
    assert convert(capsys, path, tmp_path / "o.npz", "--tensor", "fc|int-x")[0] == 0
    assert QuantizedWeight.load(tmp_path / "o.npz") == W4A


def test_user_errors_are_one_line(tmp_path, capsys, monkeypatch):
    W8.save(tmp_path / "w.npz")
    for name in ("bad.npz", "bad.onnx", "bad.gguf", "bad.pt"):
        (tmp_path / name).write_bytes(b"garbage, not a weight file")
    np.savez(tmp_path / "pickled.npz", a=np.array([{"x": 1}], dtype=object))
    cases = [((tmp_path / "w.npz", tmp_path / "out.bin"), "cannot tell the format"),
             ((tmp_path / "missing.npz", tmp_path / "o.npz"), "no such file"),
             ((tmp_path / "w.npz",), "missing OUTPUT"),
             ((tmp_path / "pickled.npz", tmp_path / "o.npz"), "pickled objects are never loaded"),
             ((tmp_path / "bad.npz", tmp_path / "o.npz"), "not a readable npz file")]
    for mod, ext, kind in (("onnx", "onnx", "ONNX"), ("gguf", "gguf", "GGUF"), ("torch", "pt", "PyTorch")):
        try:
            __import__(mod)
            cases.append(((tmp_path / f"bad.{ext}", tmp_path / "o.npz"), f"not a readable {kind} file"))
        except ImportError:
            pass
    for args, message in cases:
        rc, out, err = convert(capsys, *args)
        assert rc == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, (args, err)
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if gguf were not installed
    rc, _, err = convert(capsys, tmp_path / "w.npz", tmp_path / "o.gguf")
    assert rc == 2 and "pip install gguf" in err


def test_pickled_pt_is_refused(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="torch not installed: .pt conversion skipped")
    torch.save({"w": QuantizedWeight}, tmp_path / "code.pt")  # a class reference: weights_only refuses it
    rc, _, err = convert(capsys, tmp_path / "code.pt", tmp_path / "o.npz")
    assert rc == 2 and "weights_only=True" in err


def test_python_dash_m_qconv_convert(tmp_path):
    W4A.save(tmp_path / "w.npz")
    run = lambda *a: subprocess.run([sys.executable, "-m", "qconv", "convert", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    ok = run(tmp_path / "w.npz", tmp_path / "o.npz")
    assert ok.returncode == 0 and "ConversionReport: lossless" in ok.stdout, ok.stderr
    bad = run(tmp_path / "w.npz", tmp_path / "o.txt")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--from/--to" in bad.stderr
