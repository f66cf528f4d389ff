"""1x1 + depthwise pairs in CPU sessions (qconv/onnx/pair.py): what the graph pairs, and the paired session against
the unpaired one, bit for bit, over channel counts, batches, plane sizes, threads and a second reader of the 1x1
output. The pair's native call itself: tests/test_cpu_pair.py."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.onnx import kernels as kernels_mod  # noqa: E402
from qconv.onnx import pair as pair_mod  # noqa: E402


def _model(c, o, extra_reader, stride=1):
    """x -> Conv1x1 (C -> O) + Relu -> depthwise Conv3x3 (``stride``) + Clip(0, 6) -> Conv1x1 (O -> 8) -> y; with
    ``extra_reader`` the 1x1 conv's output is also a second output (no pair then)."""
    rng = np.random.default_rng(c * 100 + o)
    inits = [numpy_helper.from_array((rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "b0"),
             numpy_helper.from_array((rng.standard_normal((o, 1, 3, 3)) / 3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, o, 1, 1)) / np.sqrt(o)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], name="pw"),
             helper.make_node("Relu", ["a"], ["ar"], name="r0"),
             helper.make_node("Conv", ["ar", "w1"], ["d"], name="dw", group=o, pads=[1, 1, 1, 1],
                              strides=[stride, stride]),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dr"], name="r1"),
             helper.make_node("Conv", ["dr", "w2"], ["y"], name="proj")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("ar", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _quantized(c, o, extra_reader, rng, stride=1):
    calib = [{"x": rng.standard_normal((1, c, 12, 12)).astype(np.float32)} for _ in range(2)]
    return qo.quantize_model(_model(c, o, extra_reader, stride), calibration=calib)


@settings(max_examples=12, deadline=None)
@given(c=st.integers(3, 24), o=st.sampled_from([32, 64, 96]), n=st.integers(1, 2),
       hw=st.tuples(st.integers(4, 26), st.integers(4, 26)), threads=st.sampled_from([1, 2]),
       extra_reader=st.booleans(), stride=st.sampled_from([1, 2]))
def test_paired_session_matches_unpaired(c, o, n, hw, threads, extra_reader, stride):
    rng = np.random.default_rng(c + o + n)
    q = _quantized(c, o, extra_reader, rng, stride)
    with pytest.MonkeyPatch.context() as m:
        m.setenv(kernels_mod.ENV_ACT_TIMING, "0")   # the recorded modes, untimed
        paired = qo.InferenceSession(q, threads=threads)
        m.setattr(pair_mod, "ENABLED", False)
        plain = qo.InferenceSession(q, threads=threads)
    kinds = [type(k).__name__ for k in paired.fused]
    int8 = paired.act_modes.get("pw") == "tensor"
    dw_kernel = next(k for k in paired.kernels if k.name == "dw").layer.engine.kernel
    expect = int8 and not extra_reader and ((o % 32 == 0 and (o // 32) % threads == 0)   # groups of 32
                                            or (stride == 2 and dw_kernel in ("amx", "avx512vnni")))   # bands
    assert kinds.count("PairKernel") == int(expect), (kinds, paired.act_modes)
    assert "PairKernel" not in [type(k).__name__ for k in plain.fused]
    x = rng.standard_normal((n, c) + hw).astype(np.float32)
    for _ in range(3):   # the Python path, then the native calls
        got = paired.run(None, {"x": x})
        want = plain.run(None, {"x": x})
        assert all(_same(g_, w_) for g_, w_ in zip(got, want))
    x[0, 0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        paired.run(None, {"x": x})


def test_banded_pair_in_a_session():
    """A 1x1 conv's output of megabytes (32 channels at 112x112: one group of 32 on 2 threads) before a stride-2
    depthwise conv pairs banded on AVX-512: the paired session gives the unpaired one's bits, and a NaN raises."""
    rng = np.random.default_rng(7)
    q = _quantized(16, 32, False, rng, stride=2)
    with pytest.MonkeyPatch.context() as m:
        m.setenv(kernels_mod.ENV_ACT_TIMING, "0")
        paired = qo.InferenceSession(q, threads=2)
        m.setattr(pair_mod, "ENABLED", False)
        plain = qo.InferenceSession(q, threads=2)
    pairs = [k for k in paired.fused if isinstance(k, pair_mod.PairKernel)]
    if paired.act_modes.get("pw") != "tensor" or next(
            k for k in paired.kernels if k.name == "dw").layer.engine.kernel not in ("amx", "avx512vnni"):
        assert not pairs
        return
    assert len(pairs) == 1
    x = rng.standard_normal((1, 16, 112, 112)).astype(np.float32)
    for _ in range(3):
        assert all(_same(g_, w_) for g_, w_ in zip(paired.run(None, {"x": x}), plain.run(None, {"x": x})))
    from qconv._ext import _pair
    assert _pair.call_mode(pairs[0]._native) == "banded" and _pair.band_rows(pairs[0]._native) > 0
    x[0, 3, 100, 7] = np.inf
    with pytest.raises(ValueError, match="NaN"):
        paired.run(None, {"x": x})


def test_what_pairs():
    """Only a 1x1 conv whose output one depthwise conv of its channels reads; the graph's pair node replaces both."""
    q = _quantized(8, 64, False, np.random.default_rng(5))
    s = qo.InferenceSession(q, threads=2)
    pairs = [k for k in s.fused if isinstance(k, pair_mod.PairKernel)]
    if s.act_modes.get("pw") != "tensor":
        assert not pairs
        return
    assert [p.name for p in pairs] == ["qconv.pair/pw+dw"]
    assert pairs[0].pw.name == "pw" and pairs[0].dw.name == "dw"
    assert {k.name for k in s.kernels} >= {"pw", "dw", "proj"}   # the nodes' kernels (act_modes) stay listed
