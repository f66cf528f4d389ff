"""The canonical quantized weight, :class:`QuantizedWeight`, and :func:`quantize_weight`.

Every engine, layout and converter of qconv starts from this one flat type. Its fields are plain data:

========== ============================== =====================================================
field      dtype / shape                  meaning
========== ============================== =====================================================
q          int8 ``(O, I/groups, kh, kw)``  quantized weights in the logical (OIHW) shape
scales     float32 ``(O, n_blocks)``       per (output channel, block) scale ``s`` (float16 values by default)
offsets    float32 ``(O, n_blocks)``       float-domain offset ``a`` or ``None`` (symmetric)
bits       4 or 8                          integer range: see :attr:`QuantizedWeight.qmin`
block_size int >= 0                        input channels per block, 0 = one block per row
groups     int >= 1                        grouped convolution (``I = groups * q.shape[1]``)
========== ============================== =====================================================

Dequantization is float-domain, as in MNN: ``w = q * s + a``. A block covers ``block_size`` input
channels times all ``kh*kw`` taps, i.e. a contiguous run of ``block_len`` elements of the
OIHW-flattened row of one output channel.

Stored form. In memory ``scales``/``offsets`` are float32 arrays; when every value is a float16 value
(:attr:`QuantizedWeight.half_exact`, the default of :func:`quantize_weight`) they are stored in 2 bytes
each: in ``.npz`` files (:meth:`QuantizedWeight.save`), in qconv's ONNX nodes and in the engines' tables,
and read back bit-identical. Otherwise they are stored as float32. Bytes per weight = code bytes (1 for
int8, 0.5 for int4) + (2 or 4) x (1 symmetric or 2 asymmetric) / ``block_len``: int4 block-32 asymmetric
with float16 parameters is ``0.5 + 4/32 = 0.625`` bytes (0.156x float32), with float32 ``0.75`` (0.1875x).
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

import numpy as np

from . import _validate as V

FORMAT_VERSION = 1

# Integer range of each (bits, symmetric) scheme. Symmetric ranges are restricted (MNN, qnnpack).
_QRANGE = {(8, True): (-127, 127), (8, False): (-128, 127), (4, True): (-7, 7), (4, False): (-8, 7)}
_QRANGE_ANY = {8: (-128, 127), 4: (-8, 7)}


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C ``roundf``), exact for float32 input (computed in float64)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5))


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A weight-quantized conv (or linear) weight. See the module docstring for the fields."""

    q: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None
    bits: int
    block_size: int = 0
    groups: int = 1

    def __post_init__(self):
        bits = V.check_bits(self.bits)
        block_size = V.check_int(self.block_size, "block_size", minimum=0)
        groups = V.check_int(self.groups, "groups", minimum=1)
        q = self.q
        if not isinstance(q, np.ndarray):
            raise TypeError(f"q must be an int8 ndarray, got {type(q).__name__}")
        if q.dtype != np.int8:
            raise TypeError(f"q must have dtype int8, got {q.dtype}")
        if q.ndim != 4:
            raise ValueError(f"q must have shape (O, I/groups, kh, kw), got shape {q.shape}")
        if q.size == 0:
            raise ValueError(f"q must not be empty, got shape {q.shape}")
        o, ipg = q.shape[0], q.shape[1]
        if o % groups:
            raise ValueError(f"out channels {o} are not divisible by groups={groups}")
        if block_size and ipg % block_size:
            raise ValueError(f"block_size={block_size} must divide the input channels per group ({ipg}); "
                             f"valid block sizes: {_divisors(ipg)}")
        n_blocks = ipg // block_size if block_size else 1
        lo, hi = _QRANGE_ANY[bits]
        qmin, qmax = int(q.min()), int(q.max())
        if qmin < lo or qmax > hi:
            raise ValueError(f"q values [{qmin}, {qmax}] are outside the int{bits} range [{lo}, {hi}]")
        scales = _param_array(self.scales, "scales", (o, n_blocks))
        offsets = None if self.offsets is None else _param_array(self.offsets, "offsets", (o, n_blocks))
        if offsets is None and qmin < -(2 ** (bits - 1) - 1):
            raise ValueError(f"symmetric int{bits} weights must lie in [-{2 ** (bits - 1) - 1}, "
                             f"{2 ** (bits - 1) - 1}], got minimum {qmin}")
        q = np.ascontiguousarray(q)
        q.setflags(write=False)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "bits", bits)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "groups", groups)
        with np.errstate(over="ignore"):   # values beyond float16 become inf: not half-exact
            half = all(a is None or np.array_equal(a.astype(np.float16).astype(np.float32), a)
                       for a in (scales, offsets))
        object.__setattr__(self, "_half_exact", half)

    # --- derived properties -------------------------------------------------------------------
    @property
    def out_channels(self) -> int:
        return int(self.q.shape[0])

    @property
    def in_channels(self) -> int:
        """Input channels of the conv (all groups)."""
        return int(self.q.shape[1]) * self.groups

    @property
    def kernel_size(self) -> tuple[int, int]:
        return int(self.q.shape[2]), int(self.q.shape[3])

    @property
    def taps(self) -> int:
        return int(self.q.shape[2] * self.q.shape[3])

    @property
    def n_blocks(self) -> int:
        return int(self.scales.shape[1])

    @property
    def block_channels(self) -> int:
        """Input channels per block (``block_size``, or all channels of a group when 0)."""
        return self.block_size or int(self.q.shape[1])

    @property
    def block_len(self) -> int:
        """Elements of one block: ``block_channels * kh * kw``."""
        return self.block_channels * self.taps

    @property
    def symmetric(self) -> bool:
        return self.offsets is None

    @property
    def qmin(self) -> int:
        return _QRANGE[(self.bits, self.symmetric)][0]

    @property
    def qmax(self) -> int:
        return _QRANGE[(self.bits, self.symmetric)][1]

    @property
    def nbytes_q(self) -> int:
        """Bytes of the packed integers (int4: two per byte)."""
        n = int(self.q.size)
        return n if self.bits == 8 else (n + 1) // 2

    @property
    def nbytes(self) -> int:
        """Bytes as stored: packed integers + scales (+ offsets) in :attr:`param_dtype`."""
        params = self.scales.size * (1 if self.symmetric else 2)
        return self.nbytes_q + self.param_dtype.itemsize * int(params)

    @property
    def nbytes_float(self) -> int:
        """Bytes of the same weight in float32."""
        return 4 * int(self.q.size)

    def blocks(self) -> np.ndarray:
        """``q`` viewed as ``(O, n_blocks, block_len)`` (no copy)."""
        return self.q.reshape(self.out_channels, self.n_blocks, self.block_len)

    @property
    def half_exact(self) -> bool:
        """True when every scale and offset is a float16 value (``quantize_weight``'s default form, GGUF
        imports): files and engines then store them in 2 bytes without changing a single result bit."""
        return self._half_exact

    @property
    def param_dtype(self) -> np.dtype:
        """dtype the scales and offsets are stored in: float16 when :attr:`half_exact`, else float32."""
        return np.dtype(np.float16 if self._half_exact else np.float32)

    def stored_params(self) -> dict[str, np.ndarray]:
        """``{"scales": ..., "offsets": ...}`` (offsets only when asymmetric) in :attr:`param_dtype`: what
        files and qconv's ONNX nodes store; converting back to float32 gives the same bits."""
        out = {"scales": self.scales.astype(self.param_dtype)}
        if self.offsets is not None:
            out["offsets"] = self.offsets.astype(self.param_dtype)
        return out

    def weight_sums(self) -> np.ndarray:
        """int32 ``(O, n_blocks)``: sum of ``q`` over each block."""
        return self.blocks().sum(axis=2, dtype=np.int32)

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """Float weights ``(O, I/groups, kh, kw)``: ``q * scale + offset`` per block, in float32 arithmetic."""
        w = self.blocks().astype(np.float32) * self.scales[:, :, None]
        if self.offsets is not None:
            w = w + self.offsets[:, :, None]
        return w.reshape(self.q.shape).astype(dtype, copy=False)

    def __repr__(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        blk = f"block {self.block_size}" if self.block_size else "per-channel"
        grp = f", groups={self.groups}" if self.groups > 1 else ""
        return (f"QuantizedWeight(int{self.bits} {kind} {blk}, shape={tuple(self.q.shape)}{grp}, "
                f"{self.nbytes_float} -> {self.nbytes} bytes)")

    def __eq__(self, other) -> bool:
        if not isinstance(other, QuantizedWeight):
            return NotImplemented
        same_offsets = (self.offsets is None and other.offsets is None) or (
            self.offsets is not None and other.offsets is not None
            and np.array_equal(self.offsets, other.offsets))
        return (self.bits == other.bits and self.block_size == other.block_size
                and self.groups == other.groups and self.q.shape == other.q.shape
                and np.array_equal(self.q, other.q) and np.array_equal(self.scales, other.scales)
                and same_offsets)

    __hash__ = None

    # --- MNN parameter form -------------------------------------------------------------------
    @classmethod
    def from_mnn(cls, weight_bytes, alpha, out_channels: int, bits: int, asymmetric: bool,
                 weight_shape, groups: int = 1) -> "QuantizedWeight":
        """Build from MNN's loaded form (mnn-semantics 1.1-1.6).

        ``weight_bytes``: uint8, one byte ``q + 128`` per weight (int8) or two nibbles ``q + 8`` per byte,
        even element in the high nibble (int4; an odd count ends in a low nibble that is ignored).
        ``alpha``: float32 ``[oc][block]`` scales (symmetric) or ``(min, scale)`` pairs (asymmetric), which
        load as ``offset = min + 2**(bits-1) * scale``. ``weight_shape``: ``(O, I/groups, kh, kw)``.
        """
        from .layouts.int4 import MNN_INT4

        bits = V.check_bits(bits)
        o = V.check_int(out_channels, "out_channels", minimum=1)
        try:
            shape = tuple(int(s) for s in weight_shape)
        except TypeError:
            raise TypeError(f"weight_shape must be (O, I, kh, kw), got {weight_shape!r}") from None
        if len(shape) != 4 or min(shape) < 1 or shape[0] != o:
            raise ValueError(f"weight_shape must be (O={o}, I, kh, kw) with positive sizes, got {weight_shape!r}")
        wb = np.asarray(weight_bytes)
        if wb.dtype != np.uint8:
            raise TypeError(f"weight_bytes must be uint8, got dtype {wb.dtype}")
        wb = wb.reshape(-1)
        count = int(np.prod(shape))
        need = count if bits == 8 else (count + 1) // 2
        if wb.size != need:
            raise ValueError(f"weight_bytes has {wb.size} bytes, expected {need} for int{bits} weights of shape {shape}")
        q = (wb.astype(np.int16) - 128).astype(np.int8) if bits == 8 else MNN_INT4.unpack_array(wb, count)
        q = q.reshape(shape)
        a = V.float_array(alpha, "alpha", ndim=(1, 2)).reshape(-1)
        per = 2 if asymmetric else 1
        if a.size % (per * o):
            raise ValueError(f"alpha has {a.size} values, not a multiple of {per} x out_channels ({o})")
        n_blocks = a.size // (per * o)
        ipg = shape[1]
        if ipg % n_blocks:
            raise ValueError(f"alpha gives {n_blocks} blocks per channel, which do not divide the "
                             f"{ipg} input channels")
        block_size = 0 if n_blocks == 1 else ipg // n_blocks
        if asymmetric:
            pairs = a.reshape(o, n_blocks, 2)
            scales = pairs[..., 1].copy()
            offsets = (pairs[..., 0] + np.float32(2 ** (bits - 1)) * scales).astype(np.float32)
        else:
            scales, offsets = a.reshape(o, n_blocks).copy(), None
        return cls(q, scales, offsets, bits, block_size, groups)

    def to_mnn(self) -> tuple[np.ndarray, np.ndarray]:
        """``(weight_bytes uint8, alpha float32)`` in the form :meth:`from_mnn` reads."""
        from .layouts.int4 import MNN_INT4

        flat = self.q.reshape(-1)
        wb = (flat.astype(np.int16) + 128).astype(np.uint8) if self.bits == 8 else MNN_INT4.pack_array(flat)
        if self.symmetric:
            alpha = self.scales.reshape(-1).copy()
        else:
            mins = (self.offsets - np.float32(2 ** (self.bits - 1)) * self.scales).astype(np.float32)
            alpha = np.stack([mins, self.scales], axis=-1).reshape(-1)
        return wb, alpha.astype(np.float32)

    # --- files --------------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write an ``.npz`` (format version :data:`FORMAT_VERSION`; no pickled objects). Scales and offsets
        are stored as :meth:`stored_params` gives them (float16 when :attr:`half_exact`; any reader of
        version 1 converts them to float32, exactly)."""
        np.savez(path, format_version=np.int64(FORMAT_VERSION), q=self.q, bits=np.int64(self.bits),
                 block_size=np.int64(self.block_size), groups=np.int64(self.groups), **self.stored_params())

    @classmethod
    def load(cls, path) -> "QuantizedWeight":
        """Read a file written by :meth:`save`. Corrupt or foreign files raise ``ValueError``."""
        try:
            with np.load(path, allow_pickle=False) as z:
                if "format_version" not in z.files:
                    raise ValueError(f"{path}: not a qconv weight file (no format_version)")
                version = int(z["format_version"])
                if version != FORMAT_VERSION:
                    raise ValueError(f"{path}: qconv weight format version {version} is not supported "
                                     f"(this qconv reads version {FORMAT_VERSION})")
                missing = {"q", "scales", "bits", "block_size"} - set(z.files)
                if missing:
                    raise ValueError(f"{path}: missing fields {sorted(missing)}")
                q_info = z.zip.getinfo("q.npy")
                if q_info.file_size > V.memory_limit():
                    V.check_alloc(q_info.file_size, f"{path}: q")
                data = {k: z[k] for k in z.files}
        except (zipfile.BadZipFile, EOFError, OSError, KeyError, io.UnsupportedOperation) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ValueError(f"{path}: corrupt or unreadable qconv weight file ({exc})") from None
        except ValueError as exc:
            if str(exc).startswith(str(path)):
                raise
            raise ValueError(f"{path}: corrupt qconv weight file ({exc})") from None
        return cls(data["q"], data["scales"], data.get("offsets"), int(data["bits"]),
                   int(data["block_size"]), int(data.get("groups", 1)))


def _divisors(n: int) -> list[int]:
    return [0] + [d for d in range(1, n + 1) if n % d == 0]


def _param_array(a, name: str, shape: tuple[int, int]) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a float32 ndarray of shape {shape}, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise TypeError(f"{name} must be float32, got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name} must have shape (O, n_blocks) = {shape}, got {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values")
    a.setflags(write=False)
    return a


METHODS = ("minmax", "mse")
SCALE_DTYPES = ("auto", "float32", "float16")
_F16_MAX = 65504.0

# Clip-ratio search of method="mse": a coarse grid, then a finer one around the best coarse ratio.
_MSE_COARSE = np.linspace(0.30, 1.0, 15)
_MSE_FINE_STEP = 0.05 / 4
_MSE_WINDOW_POSITIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def quantize_weight(w, bits: int = 8, block_size: int = 0, symmetric: bool = True,
                    groups: int = 1, method: str = "minmax", scale_dtype="auto",
                    zero_point: bool = False) -> QuantizedWeight:
    """Quantize float weights per (output channel, block), rounding half away from zero.

    ``w``: float ``(O, I/groups, kh, kw)`` (conv) or ``(O, K)`` (linear, seen as a 1x1 conv).
    ``block_size``: input channels per block (0 = per output channel); must divide ``I/groups``.

    ``method="minmax"`` (MNN's converter, the default): symmetric ``s = absmax / qmax`` with ``q`` in
    [-127, 127] / [-7, 7]; asymmetric ``s = (max-min)/(2^bits-1)``, ``q`` in [-128, 127] / [-8, 7],
    ``offset = min - qmin*s``. Zero blocks give ``s = 0`` and dequantize exactly; asymmetric constant
    blocks give ``s = 0`` and ``offset`` = the value (rounded to float16 in the float16 form).

    ``zero_point=True`` (asymmetric only; the scheme ``int8-ch-zp``): the range is widened to contain 0 and
    ``offset = -z*s`` with an integer zero point ``z`` in [qmin, qmax] (ONNX's and NNCF's asymmetric form), so
    a weight of 0 dequantizes to exactly 0. Same stored form (``q * s + offset``), but ``offset`` is not a
    float16 value: the parameters are stored in float32 (``scale_dtype="float16"`` is refused; ``s`` is rounded
    to a float16 value under ``"auto"``, to 16 significant bits under ``"float32"``, which makes ``-z*s`` exact). Why it matters: in a
    channel whose range is set by a few large weights, most weights round to the grid point nearest 0; with
    MNN's float ``min`` that point is up to ``s/2`` away from 0, the same for all of them, and the error adds
    up coherently over the layer's inputs (PP-OCRv4 rec: 11.8 dB at the output against 21.3 with ``z``).

    ``method="mse"``: per block, search the clipping range that minimises the squared reconstruction
    error ``sum (dequant(q) - w)^2``, ``dequant`` with the scales and offsets in their stored form: clip
    ratios ``r`` of the min/max range on a 15-point grid in [0.3, 1] (asymmetric: the clipped window also
    slides over 5 positions inside [min, max]), then 9 finer ratios around the best. The min/max range is
    candidate 0 and wins ties, so every block's error is never above ``minmax``'s (same stored form). Deterministic; costs about 25 (symmetric) or 100 (asymmetric)
    quantize-dequantize passes over the weights, vectorised over all blocks.

    ``scale_dtype``: the stored form of the scales and offsets.

    * ``"float16"``: they are rounded to float16 values (held as float32 arrays) *before* ``q`` is chosen,
      as GGUF's Q4_0/Q4_1/Q8_0 store them, so ``q`` fits the stored values. :attr:`QuantizedWeight.half_exact`
      is True: files, qconv's ONNX nodes and the engines' tables keep them in 2 bytes, bit-exactly (int4
      block-32 asymmetric: 0.625 bytes per weight instead of 0.75; the parameters are 20% of a GEMV's bytes
      instead of 33%). ``ValueError`` when a value is outside the normal float16 range (|value| > 65504,
      or a nonzero scale, or the nonzero offset of a constant block, < 2**-14 = 6.1e-5).
    * ``"float32"``: float32 scales and offsets (the default of qconv 0.2, bit for bit).
    * ``"auto"`` (default): ``"float16"``, unless some value is outside that range; then the whole weight
      gets ``"float32"`` (no error; ``half_exact`` is False).
    """
    V.check_choice(method, "method", METHODS)
    form = scale_dtype_name(scale_dtype)
    w, bits, block_size, groups = check_quantize_args(w, bits, block_size, symmetric, groups)
    zero_point = check_zero_point(zero_point, symmetric, form)
    o, ipg = w.shape[0], w.shape[1]
    n_blocks = ipg // block_size if block_size else 1
    blocks = w.reshape(o, n_blocks, -1)
    if symmetric:
        lo, hi = None, np.abs(blocks).max(axis=2)
    else:
        lo, hi = blocks.min(axis=2), blocks.max(axis=2)
        with np.errstate(over="ignore"):
            width = hi - lo
        if not np.isfinite(width).all():
            o_bad, b_bad = np.argwhere(~np.isfinite(width))[0]
            raise ValueError(f"asymmetric quantization: the range max - min of output channel {o_bad}, block "
                             f"{b_bad} overflows float32 ({float(lo[o_bad, b_bad]):.3g} .. "
                             f"{float(hi[o_bad, b_bad]):.3g}); use symmetric=True or rescale the weights")
    symmetric = bool(symmetric)

    def quantize(half):
        lo_, hi_ = _mse_range(blocks, lo, hi, bits, symmetric, half, zero_point) if method == "mse" else (lo, hi)
        return _quantize_blocks(blocks, lo_, hi_, bits, symmetric, half, zero_point)
    q, scales, offsets = in_param_form(form, quantize)
    return QuantizedWeight(q.astype(np.int8).reshape(w.shape), scales, offsets, bits, block_size, groups)


def check_quantize_args(w, bits, block_size, symmetric, groups):
    """Validate the arguments shared by the quantizers; returns ``(w float32 (O, I/groups, kh, kw), bits,
    block_size, groups)`` (an ``(O, K)`` weight becomes ``(O, K, 1, 1)``)."""
    bits = V.check_bits(bits)
    block_size = V.check_int(block_size, "block_size", minimum=0)
    groups = V.check_int(groups, "groups", minimum=1)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
    w = V.float_array(w, "w", ndim=(2, 4))
    if w.ndim == 2:
        w = w[:, :, None, None]
    o, ipg = w.shape[0], w.shape[1]
    if o % groups:
        raise ValueError(f"groups={groups} must divide the {o} output channels")
    if block_size and ipg % block_size:
        raise ValueError(f"block_size={block_size} must divide the input channels per group ({ipg}); "
                         f"valid block sizes: {_divisors(ipg)}")
    return w, bits, block_size, groups


def check_zero_point(zero_point, symmetric: bool, form: str) -> bool:
    """Validate ``zero_point`` of the quantizers (asymmetric only; offsets ``-z*s`` are not float16 values)."""
    if not isinstance(zero_point, (bool, np.bool_)):
        raise TypeError(f"zero_point must be a bool, got {zero_point!r}")
    if zero_point and symmetric:
        raise ValueError("zero_point=True is an asymmetric form: pass symmetric=False (symmetric weights have "
                         "their zero point at 0 already)")
    if zero_point and form == "float16":
        raise ValueError("zero_point=True stores offsets -z*s, which are not float16 values: use "
                         "scale_dtype='auto' or 'float32'")
    return bool(zero_point)


def _quantize_blocks(blocks, lo, hi, bits: int, symmetric: bool, half: bool = False, zero_point: bool = False):
    """Quantize ``blocks (O, nb, L)`` to the range ``[lo, hi]`` per block (``lo`` None: symmetric, ``hi`` = absmax).

    Returns ``(q float64 (O, nb, L) integer-valued, scales float32 (O, nb), offsets float32 or None)``;
    ``half``: scales and offsets are float16 values (``q`` is chosen for the rounded ones; with ``zero_point``
    the scales only, offsets being ``-z*s``); :class:`_HalfRangeError` when one is outside the normal float16
    range.
    """
    q, scales, offsets, fits = _quantize_blocks_fit(blocks, lo, hi, bits, symmetric, half, zero_point)
    if not fits.all():
        raise _HalfRangeError("scale_dtype='float16': a weight scale or offset is outside the normal float16 range "
                              "(|value| <= 65504; nonzero scales, and constant blocks' nonzero offsets, >= 2**-14 = "
                              "6.1e-5); rescale the weights or use scale_dtype='float32'")
    return q, scales, offsets


def _quantize_blocks_fit(blocks, lo, hi, bits: int, symmetric: bool, half: bool, zero_point: bool = False):
    """:func:`_quantize_blocks` and a bool ``(O, nb)`` mask of the blocks whose scale and offset fit the normal
    float16 range (all True unless ``half``; the others got values clipped to +-65504, never inf): ``|value| <=
    65504``, a nonzero scale ``>= 2**-14``, and so is the nonzero offset of a constant block (``s = 0``), which
    alone carries the block's value."""
    qmin, qmax = _QRANGE[(bits, symmetric)]
    if symmetric:
        s32 = np.asarray(hi / np.float32(qmax), np.float32)
        scales = _half_values(s32) if half else s32
        safe = np.where(scales > 0, scales, np.float32(1))
        q = round_half_away(blocks / safe[:, :, None])
        a32 = offsets = None
    elif zero_point:
        lo, hi = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
        s32 = np.asarray((hi - lo) / np.float32(2 ** bits - 1), np.float32)
        # 16 significant bits (float16: 11) leave room for z's 8 in float32's 24: -z*s and z*s + offset are exact
        scales = _half_values(s32) if half else _short_mantissa(s32, 16)
        safe = np.where(scales > 0, scales, np.float32(1))
        z = np.clip(round_half_away(np.float32(qmin) - lo / safe), qmin, qmax)
        offsets = np.where(scales > 0, -z * scales, 0).astype(np.float32)
        a32 = None   # the offsets are multiples of the scales: no range of their own to check
        q = round_half_away(blocks / safe[:, :, None]) + z[:, :, None]
    else:
        s32 = np.asarray((hi - lo) / np.float32(2 ** bits - 1), np.float32)
        scales = _half_values(s32) if half else s32
        safe = np.where(scales > 0, scales, np.float32(1))
        a32 = np.asarray(np.where(scales > 0, lo - np.float32(qmin) * scales, lo), np.float32)
        offsets = _half_values(a32) if half else a32
        # q for the stored offset: (w - offset) / s, i.e. (w - lo) / s + qmin for float32 offsets
        base = lo if not half else offsets + np.float32(qmin) * scales
        q = round_half_away((blocks - base[:, :, None]) / safe[:, :, None]) + qmin
    q = np.where((scales > 0)[:, :, None], q, 0)
    fits = np.ones(scales.shape, bool)
    if half:
        tiny = np.float32(2.0 ** -14)
        fits = (np.abs(s32) <= _F16_MAX) & ((s32 == 0) | (np.abs(scales) >= tiny))
        if a32 is not None:   # a constant block (s = 0) is its offset: a normal float16 number, or 0
            fits &= (np.abs(a32) <= _F16_MAX) & ((scales != 0) | (a32 == 0) | (np.abs(offsets) >= tiny))
    return np.clip(q, qmin, qmax), scales, offsets, fits


def scale_dtype_name(scale_dtype) -> str:
    """``"auto"``, ``"float32"`` or ``"float16"`` from a name or numpy dtype (``ValueError`` otherwise)."""
    if isinstance(scale_dtype, str) and scale_dtype == "auto":
        return "auto"
    try:
        name = np.dtype(scale_dtype).name
    except TypeError:
        name = repr(scale_dtype)
    V.check_choice(name, "scale_dtype", SCALE_DTYPES)
    return name


def in_param_form(form: str, quantize):
    """Run ``quantize(half: bool)`` (a quantizer whose scales/offsets are float16 values when ``half``) in the
    stored form ``form`` of :func:`scale_dtype_name`: ``"auto"`` tries float16 and falls back to float32
    when a value is outside the normal float16 range."""
    if form == "float32":
        return quantize(False)
    try:
        return quantize(True)
    except _HalfRangeError:
        if form == "float16":
            raise
    return quantize(False)


class _HalfRangeError(ValueError):
    """A scale or offset is outside the normal float16 range (``scale_dtype="float16"`` refuses it)."""


def _short_mantissa(a: np.ndarray, bits: int) -> np.ndarray:
    """float32 ``a`` rounded to ``bits`` significant bits."""
    m, e = np.frexp(a.astype(np.float64))
    return np.ldexp(np.round(m * 2.0 ** bits) / 2.0 ** bits, e).astype(np.float32)


def _half_values(a: np.ndarray) -> np.ndarray:
    """float32 ``a`` rounded to float16 values (clipped to +-65504 first, so never inf)."""
    return np.clip(a, -_F16_MAX, _F16_MAX).astype(np.float16).astype(np.float32)


def _block_sq_error(blocks, lo, hi, bits, symmetric, half=False, zero_point=False) -> np.ndarray:
    """Squared reconstruction error per block (float64 ``(O, nb)``) of quantizing to ``[lo, hi]``
    (``half``: with float16 scales/offsets; inf for a block whose values leave the normal float16 range)."""
    q, s, off, fits = _quantize_blocks_fit(blocks, lo, hi, bits, symmetric, half, zero_point)
    deq = q.astype(np.float32) * s[:, :, None]
    if off is not None:
        deq = deq + off[:, :, None]
    return np.where(fits, ((deq.astype(np.float64) - blocks) ** 2).sum(axis=2), np.inf)


def _mse_range(blocks, lo, hi, bits: int, symmetric: bool, half: bool = False, zero_point: bool = False):
    """Per-block ``(lo, hi)`` minimising the reconstruction error in the stored form (``half``: float16
    scales/offsets); ``minmax`` is candidate 0."""
    best_err = _block_sq_error(blocks, lo, hi, bits, symmetric, half, zero_point)
    best_lo, best_hi = (None if lo is None else lo.copy()), hi.copy()
    best_r = np.ones_like(hi, dtype=np.float64)
    best_t = np.zeros_like(hi, dtype=np.float64)
    width = None if symmetric else (hi - lo)

    def consider(r, t):
        nonlocal best_err, best_lo, best_hi, best_r, best_t
        if symmetric:
            c_lo, c_hi = None, (hi * np.float32(r)).astype(np.float32)
        else:
            win = (width * np.float32(r)).astype(np.float32)
            c_lo = (lo + np.asarray(t, np.float32) * (width - win)).astype(np.float32)
            c_hi = (c_lo + win).astype(np.float32)
        err = _block_sq_error(blocks, c_lo, c_hi, bits, symmetric, half, zero_point)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_hi = np.where(better, c_hi, best_hi)
        if not symmetric:
            best_lo = np.where(better, c_lo, best_lo)
        best_r = np.where(better, r, best_r)
        best_t = np.where(better, t, best_t)

    positions = (0.0,) if symmetric else _MSE_WINDOW_POSITIONS
    for r in _MSE_COARSE[:-1]:
        for t in positions:
            consider(float(r), t)
    centre_r, centre_t = best_r.copy(), best_t.copy()
    for k in range(-4, 5):
        if k:
            consider(np.clip(centre_r + k * _MSE_FINE_STEP, 0.05, 1.0), centre_t)
    return best_lo, best_hi
