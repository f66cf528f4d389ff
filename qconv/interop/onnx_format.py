"""ONNX weights <-> QuantizedWeight: blocked ``DequantizeLinear`` (opset 21), ``com.microsoft.MatMulNBits``,
and the weights of ``QLinearConv`` / ``ConvInteger``.

Array functions need only numpy; the ``*_node`` / ``*_tensors`` helpers build and read ``onnx`` protos
(imported lazily). Every function returns its result and a :class:`ConversionReport`; zero-point
conventions and exactness are in :mod:`qconv.interop._common`.

DequantizeLinear-21: ``y = (x - zero_point) * scale``
  ``x`` int8/uint8/int4/uint4; ``scale`` a scalar (per tensor), 1-D along ``axis`` (per axis), or the rank
  of ``x`` with ``ceil(D/block_size)`` entries along ``axis`` (blocked; the last block may be ragged).
  ``zero_point`` (same shape and type as x) defaults to 0. int4/uint4 storage: two values a byte, the
  first of each pair in bits 0-3, packed along the row-major order of the whole tensor
  (:data:`~qconv.layouts.ONNX_INT4` / :data:`~qconv.layouts.ONNX_UINT4`). Symmetric weights are written
  as signed codes without a zero point, asymmetric ones as unsigned codes with one (ORT's convention).
  Layouts: ``"conv"`` ``x = (O, I/g, kh, kw)``, per channel ``axis=0``, blocked ``axis=1`` with the scale
  ``(O, n_blocks, kh, kw)`` (repeated over the taps: DequantizeLinear has no coarser blocked form);
  ``"matmul"`` ``x = [K, N]`` (MatMul's B, ``K = I/g*kh*kw``), per channel ``axis=1``, blocked ``axis=0``
  with the scale ``[n_blocks, N]``.

MatMulNBits (``com.microsoft``): ``Y = A @ dequant(B).T``, attributes ``K, N, bits, block_size``
  ``B`` uint8 ``[N, k_blocks, block_size*bits/8]``, ``k_blocks = ceil(K/block_size)``, unsigned codes,
  4 bits packed along K first-in-low-nibble (ONNX_UINT4); the tail block is padded. ``scales``
  ``[N, k_blocks]`` (legacy: flat ``[N*k_blocks]``). ``zero_points``: absent (= ``2**(bits-1)``),
  packed ``uint8 [N, ceil(k_blocks*bits/8)]`` (4 bits: ONNX_UINT4 along the blocks), or unpacked in the
  scale dtype ``[N, k_blocks]`` (float zero points). bits 2 is refused (QuantizedWeight holds 4 or 8).

QLinearConv / ConvInteger weights: ``w`` int8/uint8 ``(O, I/g, kh, kw)``, ``w_scale`` and
  ``w_zero_point`` scalars or ``(O,)``: DequantizeLinear with ``axis=0``. ConvInteger has no weight scale
  (it is applied after the op): pass it. Written per channel; onnxruntime's CPU ConvInteger accepts only a
  per-tensor weight zero point, i.e. symmetric weights (all zero points 0).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..layouts import ONNX_INT4, ONNX_UINT4
from ..weights import QuantizedWeight
from ._common import from_integer_domain, reblock, repeat_blocks, to_integer_domain, weight_shape


class DQWeight(NamedTuple):
    """Inputs and attributes of a DequantizeLinear node (``x`` as int8/uint8 when ``bits == 4``)."""

    x: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    axis: int
    block_size: int
    bits: int


class MatMulNBitsWeight(NamedTuple):
    """Inputs and attributes of a MatMulNBits node."""

    B: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    K: int
    N: int
    bits: int
    block_size: int


class QLinearWeight(NamedTuple):
    """Weight inputs of QLinearConv (``w, w_scale, w_zero_point``); ConvInteger takes ``w`` and the zero point."""

    w: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray


# --- DequantizeLinear ---------------------------------------------------------------------------------
def _codes(x, bits):
    """Integer array (numpy or ml_dtypes int4/uint4) -> (int64 codes, bits, signed)."""
    x = np.asarray(x)
    if x.dtype.name in ("int4", "uint4"):
        return x.astype(np.int64), 4, x.dtype.name == "int4"
    if x.dtype.kind not in "iu":
        raise TypeError(f"quantized data must be an integer array, got dtype {x.dtype}")
    return x.astype(np.int64), (8 if bits is None else bits), x.dtype.kind == "i"


def _expand(p, shape, axis: int, block_size: int, name: str) -> np.ndarray:
    """DequantizeLinear broadcasting of a scale/zero point to one value per element of ``x``."""
    p = np.asarray(p)
    if p.ndim == 0:
        return np.broadcast_to(p, shape)
    if p.ndim == 1:
        if p.shape[0] != shape[axis]:
            raise ValueError(f"per-axis {name} has {p.shape[0]} values, x has {shape[axis]} along axis {axis}")
        return np.broadcast_to(p.reshape([-1 if d == axis else 1 for d in range(len(shape))]), shape)
    if p.ndim != len(shape) or any(p.shape[d] != shape[d] for d in range(len(shape)) if d != axis):
        raise ValueError(f"blocked {name} of shape {p.shape} does not match x of shape {shape} off axis {axis}")
    n, size = p.shape[axis], shape[axis]
    if block_size <= 0 or n * block_size < size or (n - 1) * block_size >= size:
        raise ValueError(f"block_size={block_size} with {n} {name} blocks does not cover axis {axis} of size "
                         f"{size} (need ceil({size}/block_size) == {n})")
    return np.take(np.repeat(p, block_size, axis=axis), np.arange(size), axis=axis)


def read_dequantize_linear(x, scale, zero_point=None, axis: int = 1, block_size: int = 0, bits=None, *,
                           out_axis=None, shape=None, groups: int = 1):
    """DequantizeLinear inputs -> ``(QuantizedWeight, ConversionReport)``.

    ``x``: 4-D conv weight ``(O, I/g, kh, kw)`` or 2-D matrix; ``out_axis`` is the output-channel axis
    (default 0 for 4-D, 1 for 2-D: MatMul's B is ``[K, N]``). ``bits``: 4 for int4 values held in an
    int8/uint8 array (ml_dtypes int4/uint4 arrays are recognised), else 8. ``shape``: for a 2-D ``x``, the
    conv weight shape ``(N, I/g, kh, kw)`` its ``K`` axis flattens (default ``(N, K, 1, 1)``).
    """
    codes, bits, signed = _codes(x, bits)
    if codes.ndim not in (2, 4):
        raise ValueError(f"x must be a 2-D or 4-D weight, got shape {codes.shape}")
    axis = axis + codes.ndim if axis < 0 else axis
    out_axis = (0 if codes.ndim == 4 else 1) if out_axis is None else out_axis
    if out_axis not in ((0,) if codes.ndim == 4 else (0, 1)):
        raise ValueError(f"out_axis={out_axis} is invalid for a {codes.ndim}-D weight (conv weights are OIHW)")
    scale = np.asarray(scale)
    if scale.dtype.kind != "f":
        scale = scale.astype(np.float32)  # bfloat16 and the like: exact
    s = _expand(scale, codes.shape, axis, block_size, "scale")
    z = 0 if zero_point is None else _expand(_codes(zero_point, bits)[0], codes.shape, axis, block_size,
                                             "zero_point")
    z = np.broadcast_to(z, codes.shape)
    o = codes.shape[out_axis]
    codes, s, z = (np.moveaxis(a, out_axis, 0).reshape(o, -1) for a in (codes, s, z))
    shape = weight_shape(np.shape(x) if np.ndim(x) == 4 else shape, o, codes.shape[1])
    taps = 1 if np.ndim(x) == 4 else shape[2] * shape[3]  # 2-D blocks count K elements, 4-D ones channels
    blocked_k = scale.ndim == np.ndim(x) and axis != out_axis and block_size % taps == 0
    return from_integer_domain(codes, s, z, bits=bits, signed=signed, shape=shape, groups=groups,
                               prefer=block_size // taps if blocked_k else None)


def write_dequantize_linear(qw: QuantizedWeight, *, layout: str = "conv", signed=None, scale_dtype=np.float32):
    """QuantizedWeight -> ``(DQWeight, ConversionReport)``. ``signed`` defaults to signed codes without a
    zero point for weights with no (or all-zero) offsets, unsigned codes with a zero point otherwise.
    ``scale_dtype`` is also the node's output dtype (float32, or float16)."""
    if layout not in ("conv", "matmul"):
        raise ValueError(f"layout must be 'conv' or 'matmul', got {layout!r}")
    if signed is None:
        signed = qw.offsets is None or not qw.offsets.any()
    codes, s, z, report = to_integer_domain(qw, bits=qw.bits, signed=signed, scale_dtype=scale_dtype)
    dtype = np.int8 if signed else np.uint8
    z = None if signed and not z.any() else z.astype(dtype)
    o, nb = s.shape
    if layout == "conv":
        x = codes.reshape(qw.q.shape).astype(dtype)
        if nb == 1:
            return DQWeight(x, s[:, 0], None if z is None else z[:, 0], 0, 0, qw.bits), report
        taps = (o, nb) + qw.kernel_size
        tile = lambda p: np.ascontiguousarray(np.broadcast_to(p[:, :, None, None], taps))  # noqa: E731
        return DQWeight(x, tile(s), None if z is None else tile(z), 1, qw.block_size, qw.bits), report
    x = np.ascontiguousarray(codes.T.astype(dtype))
    if nb == 1:
        return DQWeight(x, s[:, 0], None if z is None else z[:, 0], 1, 0, qw.bits), report
    z = None if z is None else np.ascontiguousarray(z.T)
    return DQWeight(x, np.ascontiguousarray(s.T), z, 0, qw.block_len, qw.bits), report


# --- MatMulNBits --------------------------------------------------------------------------------------
def _check_nbits(bits, block_size):
    if bits not in (4, 8):
        raise ValueError(f"MatMulNBits bits={bits}: QuantizedWeight holds 4- or 8-bit weights only")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"MatMulNBits block_size must be a power of two >= 16, got {block_size}")


def read_matmul_nbits(B, scales, zero_points, K: int, N: int, bits: int, block_size: int, *, shape=None,
                      groups: int = 1):
    """MatMulNBits inputs and attributes -> ``(QuantizedWeight, ConversionReport)``.

    ``shape``: the conv weight shape ``(N, I/g, kh, kw)`` the ``[N, K]`` rows came from (default
    ``(N, K, 1, 1)``). A ragged tail block is absorbed exactly (see :func:`~qconv.interop._common.regroup`).
    """
    _check_nbits(bits, block_size)
    kb = -(-K // block_size)
    B = np.asarray(B)
    if B.dtype != np.uint8 or B.size != N * kb * block_size * bits // 8:
        raise ValueError(f"B must be uint8 [N={N}, {kb}, {block_size * bits // 8}], got {B.dtype} {B.shape}")
    B = B.reshape(N, kb, -1)
    codes = (ONNX_UINT4.unpack_array(B, block_size) if bits == 4 else B).reshape(N, -1)[:, :K]
    s = np.asarray(scales).reshape(N, kb)
    if zero_points is None:
        z = np.full((N, kb), 1 << (bits - 1))
    else:
        zp = np.asarray(zero_points).reshape(N, -1)
        if zp.dtype.kind == "f":
            z = zp.astype(np.float64)
        elif bits == 4:
            z = ONNX_UINT4.unpack_array(zp.astype(np.uint8), kb)
        else:
            z = zp
        if z.shape != (N, kb):
            raise ValueError(f"zero_points do not give [N={N}, k_blocks={kb}] values, got shape {zp.shape}")
    shape = weight_shape(shape, N, K)
    taps = shape[2] * shape[3]
    return from_integer_domain(codes, repeat_blocks(s, block_size, K), repeat_blocks(z, block_size, K), bits=bits,
                               signed=False, shape=shape, groups=groups,
                               prefer=block_size // taps if block_size % taps == 0 else None)


def write_matmul_nbits(qw: QuantizedWeight, *, block_size: int = 32, zero_points: str = "auto",
                       scale_dtype=np.float32):
    """QuantizedWeight -> ``(MatMulNBitsWeight, ConversionReport)`` with ``bits = qw.bits``.

    ``zero_points``: ``"int"`` (packed uint4/uint8, omitted when all are ``2**(bits-1)``), ``"float"``
    (unpacked, in ``scale_dtype``), or ``"auto"``: int when lossless, else the form with the smaller error;
    always int for 8 bits (onnxruntime's CPU kernel refuses float zero points with 8-bit weights).
    ``block_size`` must be a power of two >= 16 whose blocks each lie inside one QuantizedWeight block
    (any size for per-channel weights).
    """
    bits = qw.bits
    _check_nbits(bits, block_size)
    if zero_points == "auto":
        forms = [to_integer_domain(qw, bits=bits, signed=False, zero=k, scale_dtype=scale_dtype)
                 for k in (("int", "float") if bits == 4 else ("int",))]
        form = forms[0] if forms[0][3].lossless else min(forms, key=lambda f: f[3].max_abs_error)
    else:
        form = to_integer_domain(qw, bits=bits, signed=False, zero=zero_points, scale_dtype=scale_dtype)
    codes, s, z, report = form
    n, k = codes.shape
    kb = -(-k // block_size)
    s, z = (reblock(p, qw.block_len, k, block_size) for p in (s, z))
    codes = np.pad(codes, ((0, 0), (0, kb * block_size - k))).reshape(n, kb, block_size)
    B = ONNX_UINT4.pack_array(codes) if bits == 4 else codes.astype(np.uint8)
    if z.dtype.kind == "f":
        zp = z
    elif (z == 1 << (bits - 1)).all():
        zp = None
    else:
        zp = ONNX_UINT4.pack_array(z) if bits == 4 else z.astype(np.uint8)
    return MatMulNBitsWeight(B, s, zp, k, n, bits, block_size), report


# --- QLinearConv / ConvInteger ------------------------------------------------------------------------
def read_qlinear_weight(w, scale, zero_point=None, *, groups: int = 1):
    """QLinearConv ``(w, w_scale, w_zero_point)`` (or ConvInteger's ``w``, ``w_zero_point`` and the scale
    applied after it) -> ``(QuantizedWeight, ConversionReport)``."""
    if np.ndim(w) != 4:
        raise ValueError(f"w must be a conv weight (O, I/g, kh, kw), got shape {np.shape(w)}")
    return read_dequantize_linear(w, scale, zero_point, axis=0, groups=groups)


def write_qlinear_weight(qw: QuantizedWeight, *, signed: bool = True):
    """QuantizedWeight -> ``(QLinearWeight, ConversionReport)``: 8-bit codes (4-bit weights fit exactly),
    per-channel float32 scale and zero point. Blocked weights must have one scale per channel."""
    codes, s, z, report = to_integer_domain(qw, bits=8, signed=signed)
    k = codes.shape[1]
    try:
        s, z = (reblock(p, qw.block_len, k, k)[:, 0] for p in (s, z))
    except ValueError:
        raise ValueError("QLinearConv/ConvInteger weights have one scale per output channel; this weight has "
                         f"{qw.n_blocks} different blocks per channel (requantize it per channel)") from None
    dtype = np.int8 if signed else np.uint8
    return QLinearWeight(codes.reshape(qw.q.shape).astype(dtype), s, z.astype(dtype)), report


# --- onnx protos --------------------------------------------------------------------------------------
def _onnx():
    try:
        import onnx
    except ImportError as exc:
        raise ImportError("this helper needs the 'onnx' package (pip install onnx)") from exc
    return onnx


def to_tensor_proto(name: str, array, bits: int = 8):
    """numpy array -> TensorProto; integer arrays with ``bits=4`` become INT4/UINT4, packed by ONNX_INT4/UINT4."""
    onnx = _onnx()
    a = np.asarray(array)
    if bits == 4 and a.dtype.kind in "iu":
        signed = a.dtype.kind == "i"
        raw = (ONNX_INT4 if signed else ONNX_UINT4).pack_array(a.reshape(-1)).tobytes()
        kind = onnx.TensorProto.INT4 if signed else onnx.TensorProto.UINT4
        return onnx.helper.make_tensor(name, kind, a.shape, raw, raw=True)
    return onnx.numpy_helper.from_array(a, name)


def from_tensor_proto(tensor) -> tuple[np.ndarray, int]:
    """TensorProto -> ``(array, bits)``; INT4/UINT4 come back as int8/uint8 with ``bits = 4``."""
    onnx = _onnx()
    a = onnx.numpy_helper.to_array(tensor)
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return a.astype(np.int8 if tensor.data_type == onnx.TensorProto.INT4 else np.uint8), 4
    return a, 8


def _inits(initializers) -> dict:
    """A ModelProto, GraphProto, mapping name -> TensorProto, or list of TensorProtos -> dict."""
    src = getattr(initializers, "graph", initializers)
    src = getattr(src, "initializer", src)
    return dict(src) if isinstance(src, dict) else {t.name: t for t in src}


def _inputs(node, initializers, indices) -> list:
    """``(array, bits)`` of the node inputs at ``indices`` (``(None, 8)`` for absent optional inputs)."""
    inits = _inits(initializers)
    names = [node.input[i] if i < len(node.input) else "" for i in indices]
    missing = [n for n in names if n and n not in inits]
    if missing:
        raise ValueError(f"{node.op_type} node {node.name!r}: inputs {missing} are not initializers")
    return [from_tensor_proto(inits[n]) if n else (None, 8) for n in names]


def _attrs(node) -> dict:
    onnx = _onnx()
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _tensors(names, arrays, bits):
    return [to_tensor_proto(n, a, bits if a.dtype.kind in "iu" else 8) for n, a in zip(names, arrays)
            if a is not None]


def dequantize_linear_node(qw: QuantizedWeight, name: str, **kwargs):
    """``(NodeProto, [TensorProto], ConversionReport)``: a DequantizeLinear (opset 21) with output ``name``
    and initializers ``name + "_quantized" / "_scale" / "_zero_point"``. ``kwargs``: see
    :func:`write_dequantize_linear`."""
    onnx = _onnx()
    dq, report = write_dequantize_linear(qw, **kwargs)
    names = [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"]
    inits = _tensors(names, dq[:3], dq.bits)
    attrs = dict(axis=dq.axis, **({"block_size": dq.block_size} if dq.block_size else {}))
    node = onnx.helper.make_node("DequantizeLinear", [t.name for t in inits], [name], name=name, **attrs)
    return node, inits, report


def read_dequantize_linear_node(node, initializers, *, out_axis=None, shape=None, groups: int = 1):
    """A DequantizeLinear node whose inputs are initializers -> ``(QuantizedWeight, ConversionReport)``."""
    (x, bits), (scale, _), (zp, _) = _inputs(node, initializers, (0, 1, 2))
    a = _attrs(node)
    return read_dequantize_linear(x, scale, zp, a.get("axis", 1), a.get("block_size", 0),
                                  bits, out_axis=out_axis, shape=shape, groups=groups)


def matmul_nbits_node(qw: QuantizedWeight, a: str, y: str, **kwargs):
    """``(NodeProto, [TensorProto], ConversionReport)``: ``y = MatMulNBits(a, ...)`` with initializers
    ``y + "_B" / "_scales" / "_zero_points"``. ``kwargs``: see :func:`write_matmul_nbits`."""
    onnx = _onnx()
    m, report = write_matmul_nbits(qw, **kwargs)
    inits = _tensors([f"{y}_B", f"{y}_scales", f"{y}_zero_points"], m[:3], 8)
    node = onnx.helper.make_node("MatMulNBits", [a] + [t.name for t in inits], [y], name=y,
                                 domain="com.microsoft", K=m.K, N=m.N, bits=m.bits, block_size=m.block_size)
    return node, inits, report


def read_matmul_nbits_node(node, initializers, *, shape=None, groups: int = 1):
    """A MatMulNBits node (B, scales, zero_points initializers) -> ``(QuantizedWeight, ConversionReport)``."""
    (B, _), (scales, _), (zp, _) = _inputs(node, initializers, (1, 2, 3))
    a = _attrs(node)
    return read_matmul_nbits(B, scales, zp, a["K"], a["N"], a["bits"], a["block_size"],
                             shape=shape, groups=groups)


def qlinear_weight_tensors(qw: QuantizedWeight, prefix: str, *, signed: bool = True):
    """``([w, w_scale, w_zero_point] TensorProtos, ConversionReport)`` for a QLinearConv/ConvInteger."""
    w, report = write_qlinear_weight(qw, signed=signed)
    return _tensors([f"{prefix}_w", f"{prefix}_w_scale", f"{prefix}_w_zero_point"], w, 8), report


def read_qlinear_conv_node(node, initializers, *, scale=None):
    """A QLinearConv (``scale`` from its ``w_scale``) or ConvInteger (``scale`` given: the factor applied to
    its int32 output) node -> ``(QuantizedWeight, ConversionReport)``."""
    groups = _attrs(node).get("group", 1)
    if node.op_type == "QLinearConv":
        (w, _), (s, _), (zp, _) = _inputs(node, initializers, (3, 4, 5))
        return read_qlinear_weight(w, s, zp, groups=groups)
    if node.op_type != "ConvInteger" or scale is None:
        raise ValueError(f"expected QLinearConv, or ConvInteger with scale=..., got {node.op_type}")
    (w, _), (zp, _) = _inputs(node, initializers, (1, 3))
    return read_qlinear_weight(w, scale, zp, groups=groups)
