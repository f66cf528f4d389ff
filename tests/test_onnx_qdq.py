"""quantize_model(format="qdq"): standard ONNX (DequantizeLinear weights) that plain onnxruntime runs, with the same
codes and scales as the qconv file."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

import qconv.onnx as qo  # noqa: E402
from qconv.onnx.accuracy import measure_model, pooled_sqnr  # noqa: E402
from test_onnx_accuracy import chain, feeds  # noqa: E402


def _plain(model, fs):
    # basic graph optimizations: from the extended level on, onnxruntime fuses DequantizeLinear -> MatMul into a
    # MatMul with dynamically quantized int8 activations (its choice for QDQ models), which is not float
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [sess.run(None, f) for f in fs]


@pytest.mark.parametrize("scheme", ["int8-ch-sym", "int4-b8-sym", "int8-b8-sym", "int4-ch-sym", "int8-ch-zp",
                                    "int4-b8-zp", "int8-ch-zp-bc"])
@pytest.mark.parametrize("bn", [False, True])
def test_qdq_runs_in_plain_onnxruntime_as_accurate_as_the_qconv_file(scheme, bn):
    """No ai.qconv node; plain onnxruntime's output SQNR is the qconv file's (float activations) within 0.1 dB."""
    model, fs = chain(bn=bn), feeds(2, 11)
    qdq = qo.quantize_model(model, scheme, format="qdq", measure=False)
    assert not [n for n in qdq.graph.node if n.domain == qo.DOMAIN]
    assert sum(n.op_type == "DequantizeLinear" for n in qdq.graph.node) == 6
    refs = _plain(model, fs)
    qdq_db = min(db for db, _ in pooled_sqnr(_plain(qdq, fs), refs).values())
    qconv_db = measure_model(model, qo.quantize_model(model, scheme, measure=False), fs, act_quant=None)["sqnr_db"]
    assert qdq_db == pytest.approx(qconv_db, abs=0.1)
    assert qo.model_summary(qdq)["format"] == "qdq"


def test_qdq_refuses_what_integer_zero_points_cannot_hold():
    """Asymmetric offsets (MNN's float minimum) are not integer zero points: refused, naming the scheme and the ways
    out."""
    with pytest.raises(ValueError, match="int8-ch-asym.*symmetric or zero-point scheme.*int8-ch-zp"):
        qo.quantize_model(chain(), "int8-ch-asym", format="qdq", measure=False)


def test_qdq_takes_no_activation_mode_and_only_known_formats():
    """act_quant with format='qdq', and an unknown format, are refused by name."""
    with pytest.raises(ValueError, match="act_quant"):
        qo.quantize_model(chain(), format="qdq", act_quant="tensor", measure=False)
    with pytest.raises(ValueError, match="format"):
        qo.quantize_model(chain(), format="gguf", measure=False)
