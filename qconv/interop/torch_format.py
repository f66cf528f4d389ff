"""PyTorch weights <-> QuantizedWeight: ``torch.ao`` quantized tensors and torchao's unpacked int form.

* ``torch.ao`` quantized tensor (what ``torch.ao.nn.quantized.Conv2d/Linear(...).weight()`` returns):
  ``qint8`` (signed) or ``quint8`` (unsigned) codes ``int_repr()`` in the weight's shape, ``(O, I/g, kh,
  kw)`` or ``(O, K)``; ``per_tensor_affine`` (``q_scale()`` float, ``q_zero_point()`` int),
  ``per_channel_affine`` (``q_per_channel_scales()`` float64, ``q_per_channel_zero_points()`` int64, along
  ``q_per_channel_axis()``), or ``per_channel_affine_float_qparams`` (float32 scales and zero points).
  ``w = (int_repr - zero_point) * scale``. No blocks: torch.ao has none.
* torchao unpacked (``IntxUnpackedToInt8Tensor``'s fields, also plain arrays): ``qdata`` int8 in the weight's
  shape with values in the ``bits``-bit range, ``scale`` and ``zero_point`` of shape
  ``qdata.shape[d] // block_size[d]`` per dim (any shape with that many values), ``w = (qdata - zero) * scale``.
  Written with ``block_size = (1, b, kh, kw)`` (conv) or ``(1, b*kh*kw)`` (``linear=True``) and scale/zero
  ``(O, n_blocks[, 1, 1])``.

Integer zero points read exactly: ``offset = (c - z) * s`` (see :mod:`qconv.interop._common`); torch's
float64 scales that are not float32 numbers are rounded (reported). Writing rounds float-domain offsets to
integer zero points (``zero="int"``, lossy unless ``offset/scale`` is an integer) or, torchao only, keeps
them as float zero points (``zero="float"``, lossy by float32 rounding only).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..weights import QuantizedWeight
from ._common import from_integer_domain, reblock, to_integer_domain, weight_shape


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ImportError("this converter needs PyTorch (pip install torch)") from exc
    return torch


def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def _expand(p, shape, block) -> np.ndarray:
    """Blocked parameter -> one value per element of ``shape`` (``block``: elements per block per dim)."""
    grid = tuple(d // b for d, b in zip(shape, block))
    p = np.asarray(p)
    if p.size != int(np.prod(grid)):
        raise ValueError(f"expected {int(np.prod(grid))} values ({grid}) for shape {shape} with block_size "
                         f"{tuple(block)}, got shape {p.shape}")
    p = p.reshape(grid)
    for axis, b in enumerate(block):
        p = np.repeat(p, b, axis=axis)
    return p


def _read(codes, scale, zero, block, *, bits, groups):
    shape = codes.shape
    if codes.ndim not in (2, 4) or len(block) != codes.ndim or any(d % b for d, b in zip(shape, block)):
        raise ValueError(f"need a 2-D or 4-D weight with block_size dividing its shape, got {shape}, {block}")
    o = shape[0]
    flat = [_expand(p, shape, block).reshape(o, -1) for p in (scale, zero)]
    prefer = block[1] if codes.ndim == 2 or tuple(block[2:]) == shape[2:] else None
    return from_integer_domain(codes.reshape(o, -1), *flat, bits=bits, signed=codes.dtype.kind == "i",
                               shape=weight_shape(shape if codes.ndim == 4 else None, o, codes[0].size),
                               groups=groups, prefer=prefer)


def read_torch(weight, *, groups=None):
    """A ``torch.ao`` quantized tensor, or a quantized module with ``.weight()`` (``groups`` taken from it)
    -> ``(QuantizedWeight, ConversionReport)`` with 8-bit weights."""
    torch = _torch()
    if not isinstance(weight, torch.Tensor) and callable(getattr(weight, "weight", None)):
        groups = getattr(weight, "groups", 1) if groups is None else groups
        weight = weight.weight()
    if not isinstance(weight, torch.Tensor) or not weight.is_quantized:
        raise TypeError(f"expected a quantized torch tensor or module (plain int tensors: read_torch_unpacked), "
                        f"got {type(weight).__name__}")
    if weight.dtype not in (torch.qint8, torch.quint8):
        raise ValueError(f"only qint8/quint8 weights are supported, got {weight.dtype}")
    codes = _np(weight.int_repr())
    scheme = weight.qscheme()
    if scheme == torch.per_tensor_affine:
        scale, zero, block = np.float64(weight.q_scale()), np.int64(weight.q_zero_point()), codes.shape
    elif scheme in (torch.per_channel_affine, torch.per_channel_affine_float_qparams):
        axis = weight.q_per_channel_axis()
        scale, zero = _np(weight.q_per_channel_scales()), _np(weight.q_per_channel_zero_points())
        block = tuple(1 if d == axis else n for d, n in enumerate(codes.shape))
    else:
        raise ValueError(f"unsupported qscheme {scheme}")
    return _read(codes, scale, zero, block, bits=8, groups=1 if groups is None else groups)


def read_torch_unpacked(qdata, scale, zero_point=None, block_size=None, *, bits: int = 8, groups: int = 1):
    """torchao's unpacked form (torch tensors or numpy arrays) -> ``(QuantizedWeight, ConversionReport)``.

    ``block_size``: elements per block along each dim of ``qdata`` (default: one block per output channel).
    """
    codes = _np(qdata)
    if codes.dtype.kind not in "iu":
        raise TypeError(f"qdata must be an integer tensor, got dtype {codes.dtype}")
    block = (1,) + codes.shape[1:] if block_size is None else tuple(int(b) for b in block_size)
    zero = np.zeros(np.size(_np(scale))) if zero_point is None else _np(zero_point)
    return _read(codes, _np(scale), zero, block, bits=bits, groups=groups)


def _per_channel(p, qw):
    k = qw.q[0].size
    try:
        return reblock(p, qw.block_len, k, k)[:, 0]
    except ValueError:
        raise ValueError("torch.ao quantized tensors have one scale per output channel; this weight has "
                         f"{qw.n_blocks} different blocks per channel (use write_torch_unpacked)") from None


def write_torch(qw: QuantizedWeight, *, linear: bool = False):
    """QuantizedWeight -> ``(per_channel_affine qint8 tensor, ConversionReport)``, shape ``(O, I/g, kh, kw)``
    or ``(O, K)`` with ``linear=True``. Blocked weights must have one scale per channel."""
    torch = _torch()
    codes, s, z, report = to_integer_domain(qw, bits=8, signed=True, scale_dtype=np.float64)
    s, z = _per_channel(s, qw), _per_channel(z, qw)
    shape = (qw.out_channels, -1) if linear else qw.q.shape
    t = torch._make_per_channel_quantized_tensor(torch.from_numpy(codes.astype(np.int8).reshape(shape)),
                                                 torch.from_numpy(s), torch.from_numpy(z), 0)
    return t, report


class TorchUnpacked(NamedTuple):
    """torchao's unpacked form: ``w = (qdata - zero_point) * scale`` over blocks of ``block_size``."""

    qdata: object
    scale: object
    zero_point: object
    block_size: tuple


def write_torch_unpacked(qw: QuantizedWeight, *, zero: str = "int", linear: bool = False):
    """QuantizedWeight -> ``(TorchUnpacked of torch tensors, ConversionReport)``: int8 ``qdata`` (values in
    ``qw.bits`` range), float32 ``scale``, and ``zero_point`` int8 (``zero="int"``) or float32 (``"float"``)."""
    torch = _torch()
    codes, s, z, report = to_integer_domain(qw, bits=qw.bits, signed=True, zero=zero)
    o, nb = s.shape
    if linear:
        qdata, grid, block = codes, (o, nb), (1, qw.block_len)
    else:
        qdata, grid, block = codes.reshape(qw.q.shape), (o, nb, 1, 1), (1, qw.block_channels) + qw.kernel_size
    zero_dtype = np.int8 if zero == "int" else np.float32
    tensors = (torch.from_numpy(np.ascontiguousarray(a.astype(dt).reshape(shape))) for a, dt, shape in
               ((qdata, np.int8, qdata.shape), (s, np.float32, grid), (z, zero_dtype, grid)))
    return TorchUnpacked(*tensors, block), report
