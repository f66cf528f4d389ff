"""What every converter shares: the report, block regrouping, and the integer <-> float zero-point maps.

Blocks. A format stores a weight as ``O`` rows of ``K = I/groups * kh * kw`` elements (OIHW flattening)
with parameters constant over runs of elements along K. A :class:`~qconv.QuantizedWeight` block is a run
of ``block_len = b * kh * kw`` elements (``b`` whole input channels, all taps). Readers expand the format's
parameters to one value per element and :func:`regroup` finds the QuantizedWeight block size on which
they are constant: the format's own block first, then the coarsest divisor of ``I/groups`` that works,
which absorbs ragged tail blocks exactly (K = 48 with blocks of 32 becomes blocks of 16). Only
parameters that change inside the ``kh*kw`` taps of one input channel are refused. Writers do the
reverse with :func:`reblock`, which refuses a format block that straddles QuantizedWeight blocks with
different parameters.

Zero points. Integer domain (ONNX, MatMulNBits, torch): ``w = (u - z) * s``. Float domain (QuantizedWeight,
GGUF Q4_1): ``w = q * s + a``.

* Reading, per block: ``q = u - c`` and ``a = (c - z) * s``. Of the shifts ``c`` that keep every ``q`` in
  QuantizedWeight's int range, ``c = z`` is taken when possible (``a = 0``), else the one for which
  ``c - z`` has the most trailing zero bits (always a power of two when the block's codes span at most
  half the code range), so that ``a`` is exact in float32. A block whose codes leave no power-of-two
  shift, or a float zero point, can get an ``a`` rounded to float32 (by <= half an ulp); the report says.
  The result is symmetric (``offsets=None``) when every offset is 0 and ``q >= -qmax``; a code
  ``-2**(bits-1)`` with zero offset stays asymmetric-with-zero-offset (QuantizedWeight's symmetric range
  is the restricted ``[-127, 127]`` / ``[-7, 7]``).
* Writing: ``u = q + c`` and ``z = c - a / s``. An integer zero point is rounded half to even and clipped
  to the code type's range: lossy unless ``a`` is an integer multiple of ``s``, which weights made by
  :func:`qconv.quantize_weight` asymmetrically are not (their zero ``-min/s`` is real). A float zero
  point (MatMulNBits, torchao) is rounded to the scale dtype. A constant block (``s = 0``, ``a != 0``)
  is written exactly as scale ``|a|`` and codes ``c + sign(a)``.

Exactness. A report compares the real numbers both sides denote, evaluated in float64 (exact for integer
zero points: ``|u - z| < 2**9`` times a 24-bit significand). ``lossless`` means they are equal; float32
evaluation of ``q*s + a`` versus ``(u - z)*s`` may still differ by rounding (about 1 ulp).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..weights import QuantizedWeight


@dataclass(frozen=True)
class ConversionReport:
    """Outcome of a conversion: ``lossless`` iff ``max_abs_error == 0`` (see the module docstring)."""

    lossless: bool
    max_abs_error: float
    notes: tuple[str, ...] = ()

    @classmethod
    def compare(cls, source: np.ndarray, result: np.ndarray, notes=()) -> "ConversionReport":
        err = float(np.max(np.abs(source - result))) if source.size else 0.0
        return cls(err == 0.0, err, tuple(notes))


def storage_range(bits: int, signed: bool) -> tuple[int, int]:
    """Value range of a ``bits``-bit integer code type."""
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def exact_values(qw: QuantizedWeight) -> np.ndarray:
    """float64 ``(O, K)``: ``q * s + a`` of every element, evaluated exactly."""
    v = qw.blocks().astype(np.float64) * qw.scales[:, :, None].astype(np.float64)
    if qw.offsets is not None:
        v += qw.offsets[:, :, None]
    return v.reshape(qw.out_channels, -1)


def weight_shape(shape, o: int, k: int) -> tuple[int, int, int, int]:
    """``(O, I/groups, kh, kw)`` of a format's ``(O, K)`` rows: ``shape`` checked, or ``(O, K, 1, 1)``."""
    if shape is None:
        return (o, k, 1, 1)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4 or shape[0] != o or int(np.prod(shape[1:])) != k:
        raise ValueError(f"shape must be (O={o}, I/groups, kh, kw) with I/groups*kh*kw = K = {k}, got {shape}")
    return shape


def repeat_blocks(p, block: int, k: int) -> np.ndarray:
    """``(O, n_blocks)`` per-block parameters -> ``(O, K)`` per element (a ragged last block is cut)."""
    return np.repeat(np.asarray(p), block, axis=1)[:, :k]


def regroup(shape, params, prefer: int | None = None) -> tuple[int, list[np.ndarray]]:
    """QuantizedWeight ``block_size`` on which every ``(O, K)`` array of ``params`` is constant per block.

    Tries ``prefer`` (input channels per block) first, then the divisors of ``I/groups`` from the largest
    (per channel, returned as 0). Returns the block size and each parameter as ``(O, n_blocks)``.
    """
    o, ipg, kh, kw = shape
    divisors = [d for d in range(ipg, 0, -1) if ipg % d == 0]
    for b in ([prefer] if prefer in divisors else []) + divisors:
        runs = [np.asarray(p).reshape(o, ipg // b, b * kh * kw) for p in params]
        if all((r == r[:, :, :1]).all() for r in runs):
            return (0 if b == ipg else b), [r[:, :, 0] for r in runs]
    raise ValueError(f"the scales/zero points change inside the {kh}x{kw} taps of an input channel; a "
                     f"QuantizedWeight block covers whole input channels with all their taps, so this weight "
                     f"of shape {tuple(shape)} has no exact QuantizedWeight form (requantize it instead)")


def reblock(p: np.ndarray, block_len: int, k: int, length: int) -> np.ndarray:
    """Per-QuantizedWeight-block parameters ``(O, n_blocks)`` -> per format block of ``length`` elements.

    The last format block may be ragged. Raises ``ValueError`` when a format block would cover
    QuantizedWeight blocks with different parameters.
    """
    el = repeat_blocks(p, block_len, k)
    n = -(-k // length)
    runs = np.pad(el, ((0, 0), (0, n * length - k)), mode="edge").reshape(el.shape[0], n, length)
    if not (runs == runs[:, :, :1]).all():
        raise ValueError(f"format blocks of {length} elements straddle QuantizedWeight blocks of {block_len} "
                         f"elements with different scales/zero points; use a block size dividing {block_len}")
    return runs[:, :, 0]


def finish(q, scales, offsets, source, *, bits, shape, block_size, groups):
    """Build the QuantizedWeight from per-block ``q (O, n_blocks, block_len)``, scales and float64 offsets
    (any float dtype), and its report against ``source`` (float64 ``(O, K)`` values of the format)."""
    notes = []
    s32 = np.asarray(scales).astype(np.float32)
    moved = int(np.count_nonzero(s32.astype(np.float64) != np.asarray(scales, dtype=np.float64)))
    if moved:
        notes.append(f"{moved} scale(s) rounded to float32")
    a32 = offsets.astype(np.float32)
    moved = int(np.count_nonzero(a32 != offsets))
    if moved:
        notes.append(f"{moved} offset(s) (c - zero) * scale rounded to float32")
    symmetric = not a32.any() and int(q.min()) >= -((1 << (bits - 1)) - 1)
    qw = QuantizedWeight(np.asarray(q).reshape(shape).astype(np.int8), s32, None if symmetric else a32,
                         bits, block_size, groups)
    return qw, ConversionReport.compare(source, exact_values(qw), notes)


def from_integer_domain(codes, scale, zero, *, bits, signed, shape, groups=1, prefer=None):
    """``w = (u - z) * s`` -> QuantizedWeight. ``codes`` ``(O, K)`` of a ``bits``-bit signed or unsigned
    type; ``scale`` and ``zero`` ``(O, K)`` per element (``zero`` may be fractional: float zero points)."""
    codes = np.asarray(codes).astype(np.int64)
    lo, hi = storage_range(bits, signed)
    if codes.size and (codes.min() < lo or codes.max() > hi):
        raise ValueError(f"codes must lie in [{lo}, {hi}] ({'' if signed else 'u'}int{bits}), "
                         f"got [{codes.min()}, {codes.max()}]")
    block_size, (s, z) = regroup(shape, [scale, np.asarray(zero, dtype=np.float64)], prefer)
    u = codes.reshape(shape[0], s.shape[1], -1)
    qlo, qhi = storage_range(bits, True)
    # Shifts c with u - c in range form [max(u) - qhi, min(u) - qlo]; take the one whose distance to z
    # has the most trailing zero bits: 0 (c = z) when possible, else a power of two when there is one.
    zi = np.round(z)
    d_lo, d_hi = u.max(axis=2) - qhi - zi, u.min(axis=2) - qlo - zi
    d = d_lo
    for k in range(12):
        m = -(-d_lo // (1 << k)) * (1 << k)
        d = np.where(m <= d_hi, m, d)
    c = zi + d
    s64 = s.astype(np.float64)
    source = ((u - z[:, :, None]) * s64[:, :, None]).reshape(codes.shape)
    return finish(u - c.astype(np.int64)[:, :, None], s, (c - z) * s64, source, bits=bits, shape=shape,
                  block_size=block_size, groups=groups)


def to_integer_domain(qw: QuantizedWeight, *, bits: int, signed: bool, zero: str = "int",
                      scale_dtype=np.float32):
    """QuantizedWeight -> ``(codes (O, K) int64, scales (O, n_blocks), zeros (O, n_blocks), report)``.

    ``zero``: ``"int"`` (int64, rounded half to even, clipped to the code range) or ``"float"`` (in
    ``scale_dtype``). ``scales`` are cast to ``scale_dtype``.
    """
    lo, hi = storage_range(bits, signed)
    c = 0 if signed else 1 << (bits - 1)
    q = qw.blocks().astype(np.int64)
    if int(q.min()) + c < lo or int(q.max()) + c > hi:
        raise ValueError(f"int{qw.bits} weights in [{q.min()}, {q.max()}] do not fit "
                         f"{'' if signed else 'u'}int{bits} codes")
    s = qw.scales.astype(np.float64)
    a = np.zeros_like(s) if qw.offsets is None else qw.offsets.astype(np.float64)
    const = (s == 0) & (a != 0)
    q = np.where(const[:, :, None], np.sign(a).astype(np.int64)[:, :, None], q)
    s, a = np.where(const, np.abs(a), s), np.where(const, 0.0, a)
    s_out = s.astype(scale_dtype)
    s_exact = s_out.astype(np.float64)
    notes = []
    moved = int(np.count_nonzero(s_exact != s))
    if moved:
        notes.append(f"{moved} scale(s) rounded to {np.dtype(scale_dtype).name}")
    with np.errstate(divide="ignore", invalid="ignore"):
        z_real = np.where(s_exact != 0, c - a / s_exact, c)
    if zero == "int":
        z = np.rint(z_real)
        moved = int(np.count_nonzero(z != z_real))
        if moved:
            notes.append(f"{moved} of {z.size} zero point(s) rounded to integers")
        out = int(np.count_nonzero((z < lo) | (z > hi)))
        if out:
            notes.append(f"{out} zero point(s) clipped to [{lo}, {hi}]")
        z = np.clip(z, lo, hi).astype(np.int64)
    elif zero == "float":
        z = z_real.astype(scale_dtype)
        moved = int(np.count_nonzero(z.astype(np.float64) != z_real))
        if moved:
            notes.append(f"{moved} float zero point(s) rounded to {np.dtype(scale_dtype).name}")
    else:
        raise ValueError(f"zero must be 'int' or 'float', got {zero!r}")
    codes = q + c
    result = (codes - z.astype(np.float64)[:, :, None]) * s_exact[:, :, None]
    report = ConversionReport.compare(exact_values(qw), result.reshape(qw.out_channels, -1), notes)
    return codes.reshape(qw.out_channels, -1), s_out, z, report
