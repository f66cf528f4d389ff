"""Whole ONNX models with qconv weights: quantize once, run end to end in onnxruntime with qconv's kernels.

::

    import qconv.onnx
    q = qconv.onnx.quantize_model("model.onnx", scheme="int8-ch-sym")   # an onnx.ModelProto
    onnx.save(q, "model.q.onnx")                                         # small: packed weights
    sess = qconv.onnx.InferenceSession("model.q.onnx", threads=2)
    y, = sess.run(None, {"x": x})

Needs ``onnx`` and ``onnxruntime`` (``pip install qconv[onnx]``).
:mod:`qconv.onnx.nodes` describes the custom nodes, :mod:`qconv.onnx.quantize` the rewrite,
:mod:`qconv.onnx.session` the session and its activation default, :mod:`qconv.onnx.accuracy` the
model-level measurement, accuracy control and the activation search, :mod:`qconv.onnx.smooth` the activation
smoothing folded into the weights, :mod:`qconv.onnx.kernels` the prepared kernels behind the native operators (:mod:`qconv._ext._ortops`), :mod:`qconv.onnx.wire` the ONNX bytes a session reads without
importing ``onnx``.
"""
from .accuracy import measure_model
from .nodes import DOMAIN, QCONV, QMATMUL, weight_bytes
from .quantize import LowAccuracyWarning, model_summary, quantize_model
from .session import InferenceSession

__all__ = ["quantize_model", "InferenceSession", "measure_model", "weight_bytes", "model_summary",
           "LowAccuracyWarning", "DOMAIN", "QCONV", "QMATMUL"]
