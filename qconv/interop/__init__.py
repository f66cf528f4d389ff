"""Converters between :class:`~qconv.QuantizedWeight` and other quantized-weight formats.

One module per format; each reader returns ``(QuantizedWeight, ConversionReport)`` and each writer
``(format data, ConversionReport)``. The report says whether the conversion was lossless (the same real
weights on both sides) and, when not, the largest absolute difference and why. Optional packages (onnx,
gguf, torch) are imported only by the functions that need them.

===========================  ==========================================================================
module                       formats
===========================  ==========================================================================
:mod:`.onnx_format`          DequantizeLinear-21 (blocked, int4/uint4/int8/uint8), com.microsoft
                             MatMulNBits, QLinearConv/ConvInteger weights; arrays and onnx protos
:mod:`.gguf_format`          GGUF Q4_0, Q4_1, Q8_0 block bytes
:mod:`.torch_format`         torch.ao quantized tensors (per tensor/channel), torchao unpacked int form
===========================  ==========================================================================

Mapping rules (blocks, zero-point domains, exactness) are in :mod:`qconv.interop._common`.
"""
from ._common import ConversionReport
from .gguf_format import quantize_gguf, read_gguf, write_gguf
from .onnx_format import (read_dequantize_linear, read_matmul_nbits, read_qlinear_weight, write_dequantize_linear,
                          write_matmul_nbits, write_qlinear_weight)
from .torch_format import read_torch, read_torch_unpacked, write_torch, write_torch_unpacked

__all__ = ["ConversionReport", "read_gguf", "write_gguf", "quantize_gguf", "read_dequantize_linear",
           "write_dequantize_linear", "read_matmul_nbits", "write_matmul_nbits", "read_qlinear_weight",
           "write_qlinear_weight", "read_torch", "read_torch_unpacked", "write_torch", "write_torch_unpacked"]
