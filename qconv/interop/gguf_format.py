"""GGUF / ggml blocks ``Q4_0``, ``Q4_1``, ``Q8_0`` <-> QuantizedWeight (raw block bytes, no file container).

Data is ``uint8 (rows, n_blocks * block_bytes)``: one row per output channel, blocks of 32 elements along
``K = I/groups * kh * kw`` (OIHW flattening; ggml's ``ne = [K, rows]``), K a multiple of 32. Little-endian:

=====  =====  ====================================  =====================  =================================
type   bytes  block                                 value of element j     QuantizedWeight (exact)
=====  =====  ====================================  =====================  =================================
Q4_0   18     fp16 ``d``, u8 ``qs[16]``             ``(nib_j - 8) * d``    ``q = nib - 8``, ``s = d``, offset 0
Q4_1   20     fp16 ``d``, fp16 ``m``, u8 ``qs[16]`` ``nib_j * d + m``      ``q = nib - 8``, ``s = d``,
                                                                                   ``offset = m + 8d``
Q8_0   34     fp16 ``d``, i8 ``qs[32]``             ``qs_j * d``           ``q = qs``, ``s = d``, offset 0
=====  =====  ====================================  =====================  =================================

Nibbles are split halves (:data:`~qconv.layouts.GGUF_Q4`): byte ``j`` holds element ``j`` in bits 0-3 and
``j + 16`` in bits 4-7. Q4_0's quantizer sets ``d = v / -8`` (``v`` the element of largest magnitude, so
``d`` may be negative) and uses the full range [-8, 7]: its weights read as asymmetric-with-zero-offset
(``offsets`` all 0; symmetric only when no code is -8). Reading is exact except Q4_1's ``m + 8d``, which is
rounded to float32 in rare cases of very different magnitudes (reported).

Writing keeps the codes when the format can hold them: blocks of 32 inside QuantizedWeight blocks, codes in
range, and for Q4_0/Q8_0 zero offsets (Q4_1: ``d = s``, ``m = offset - 8s``); fp16 rounding of ``d``/``m``
is then the only loss. Otherwise the dequantized weight is requantized with ggml's reference quantizer
(:func:`quantize_gguf`, bit-exact with gguf-py) and the report says so.
"""
from __future__ import annotations

import numpy as np

from ..layouts import GGUF_Q4
from ..weights import QuantizedWeight, round_half_away
from ._common import (ConversionReport, exact_values, finish, from_integer_domain, reblock, regroup,
                      repeat_blocks, weight_shape)

BLOCK = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
_F16 = np.dtype("<f2")


def _qtype(qtype) -> str:
    name = getattr(qtype, "name", qtype)  # gguf.GGMLQuantizationType members too
    if name not in BLOCK_BYTES:
        raise ValueError(f"GGUF type must be one of {sorted(BLOCK_BYTES)}, got {qtype!r}")
    return name


def _decode(data, qtype: str):
    """-> ``(codes int8 (rows, nb, 32), d fp16 (rows, nb), m fp16 (rows, nb) or None)``."""
    data = np.asarray(data)
    size = BLOCK_BYTES[qtype]
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] % size:
        raise ValueError(f"{qtype} data must be uint8 (rows, n_blocks * {size}), got {data.dtype} {data.shape}")
    blocks = data.reshape(data.shape[0], -1, size)
    half = lambda i: np.ascontiguousarray(blocks[:, :, i:i + 2]).view(_F16)[:, :, 0]  # noqa: E731
    if qtype == "Q8_0":
        return np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8), half(0), None
    start = 4 if qtype == "Q4_1" else 2
    return GGUF_Q4.unpack_array(blocks[:, :, start:], BLOCK), half(0), (half(2) if qtype == "Q4_1" else None)


def _encode(codes, d, m, qtype: str) -> np.ndarray:
    """Inverse of :func:`_decode`: ``codes`` are ``q`` (Q4: ``nib - 8``)."""
    rows, nb = d.shape
    parts = [d.astype(_F16).reshape(rows, nb, 1).view(np.uint8)]
    if m is not None:
        parts.append(m.astype(_F16).reshape(rows, nb, 1).view(np.uint8))
    codes = np.asarray(codes).reshape(rows, nb, BLOCK)
    parts.append(codes.astype(np.int8).view(np.uint8) if qtype == "Q8_0" else GGUF_Q4.pack_array(codes))
    return np.concatenate(parts, axis=2).reshape(rows, -1)


def _values(codes, d, m) -> np.ndarray:
    """Exact float64 ``(rows, K)`` values of decoded blocks."""
    v = codes.astype(np.float64) * d.astype(np.float64)[:, :, None]
    if m is not None:
        v += 8 * d.astype(np.float64)[:, :, None] + m.astype(np.float64)[:, :, None]
    return v.reshape(d.shape[0], -1)


def read_gguf(data, qtype, *, shape=None, groups: int = 1):
    """``uint8 (rows, n_blocks * block_bytes)`` -> ``(QuantizedWeight, ConversionReport)``.

    ``shape``: ``(rows, I/groups, kh, kw)`` of the conv weight (default ``(rows, K, 1, 1)``).
    """
    qtype = _qtype(qtype)
    codes, d, m = _decode(data, qtype)
    rows, nb = d.shape
    k = nb * BLOCK
    shape = weight_shape(shape, rows, k)
    taps = shape[2] * shape[3]
    prefer = BLOCK // taps if BLOCK % taps == 0 else None
    codes = codes.reshape(rows, k)
    if m is None:
        return from_integer_domain(codes, repeat_blocks(d, BLOCK, k), np.zeros((rows, k)),
                                   bits=4 if qtype == "Q4_0" else 8, signed=True, shape=shape,
                                   groups=groups, prefer=prefer)
    block_size, (s, mm) = regroup(shape, [repeat_blocks(d, BLOCK, k), repeat_blocks(m, BLOCK, k)], prefer)
    s64 = s.astype(np.float64)
    return finish(codes.reshape(rows, s.shape[1], -1), s, mm.astype(np.float64) + 8 * s64,
                  _values(codes.reshape(rows, nb, BLOCK), d, m), bits=4, shape=shape, block_size=block_size,
                  groups=groups)


def quantize_gguf(w, qtype) -> np.ndarray:
    """ggml's reference quantizer (as gguf-py's numpy one, bit-exact): float ``(rows, K)`` -> block bytes."""
    qtype = _qtype(qtype)
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"{qtype} needs float (rows, K) with K a multiple of {BLOCK}, got shape {w.shape}")
    x = w.reshape(w.shape[0], -1, BLOCK)
    m = None
    if qtype == "Q4_0":
        d = np.take_along_axis(x, np.abs(x).argmax(axis=2)[:, :, None], axis=2)[:, :, 0] / np.float32(-8)
    elif qtype == "Q4_1":
        m = x.min(axis=2)
        d = (x.max(axis=2) - m) / np.float32(15)
    else:
        d = np.abs(x).max(axis=2) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)[:, :, None]
    if qtype == "Q4_0":
        codes = np.clip(np.trunc(x * inv + np.float32(8.5)), 0, 15) - 8
    elif qtype == "Q4_1":
        codes = np.clip(np.trunc((x - m[:, :, None]) * inv + np.float32(0.5)), 0, 15) - 8
    else:
        codes = round_half_away(x * inv)
    return _encode(codes.astype(np.int8), d, m, qtype)


def _keep_codes(qw: QuantizedWeight, qtype: str):
    """``(block bytes holding qw's own codes, notes)``, or ``(None, [why they cannot])``."""
    q = qw.q.reshape(qw.out_channels, -1)
    lo, hi = (-128, 127) if qtype == "Q8_0" else (-8, 7)
    if q.min() < lo or q.max() > hi:
        return None, [f"int{qw.bits} codes do not fit {qtype}'s [{lo}, {hi}]"]
    offsets = np.zeros_like(qw.scales) if qw.offsets is None else qw.offsets
    if qtype != "Q4_1" and offsets.any():
        return None, [f"{qtype} has no offsets (Q4_1 has)"]
    try:
        s, a = (reblock(p, qw.block_len, q.shape[1], BLOCK).astype(np.float64) for p in (qw.scales, offsets))
    except ValueError:
        return None, [f"blocks of {BLOCK} straddle QuantizedWeight blocks of {qw.block_len} elements"]
    m = a - 8 * s if qtype == "Q4_1" else None
    notes = [f"{name} rounded to float16" for name, p in (("scales", s), ("Q4_1 minimums offset - 8*scale", m))
             if p is not None and (p.astype(_F16).astype(np.float64) != p).any()]
    return _encode(q, s, m, qtype), notes


def write_gguf(qw: QuantizedWeight, qtype):
    """QuantizedWeight -> ``(uint8 (O, n_blocks * block_bytes), ConversionReport)``."""
    qtype = _qtype(qtype)
    k = qw.q[0].size
    if k % BLOCK:
        raise ValueError(f"GGUF blocks are {BLOCK} elements along K = I/groups*kh*kw = {k}; K must be a "
                         f"multiple of {BLOCK}")
    data, notes = _keep_codes(qw, qtype)
    if data is None:
        data = quantize_gguf(qw.dequantize().reshape(qw.out_channels, k), qtype)
        notes = [f"requantized with ggml's {qtype} quantizer: {notes[0]}"]
    return data, ConversionReport.compare(exact_values(qw), _values(*_decode(data, qtype)), notes)
