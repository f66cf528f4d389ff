"""Packed int4: two 4-bit values a byte, with the nibble order as data.

One implementation, several specs:

=============  ===============  ==========================================================  =========
spec           order            byte ``b`` of a row holds                                    nibble
=============  ===============  ==========================================================  =========
``MNN_INT4``   ``high_first``   ``v[2b]`` in bits 4-7, ``v[2b+1]`` in bits 0-3               ``q + 8``
``ONNX_INT4``  ``low_first``    ``v[2b]`` in bits 0-3, ``v[2b+1]`` in bits 4-7               ``q & 15``
``ONNX_UINT4`` ``low_first``    same, for unsigned codes ``u`` in [0, 15]                    ``u``
``GGUF_Q4``    ``split_halves`` in each 32-group: ``v[j]`` in bits 0-3, ``v[j+16]`` in 4-7   ``q + 8``
=============  ===============  ==========================================================  =========

``pack_array`` works along the last axis; an odd length leaves the unused nibble of the last byte at the
code of value 0 (``high_first``/``low_first``). ``split_halves`` needs the last axis to be a multiple of
the group (32 for GGUF).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ORDERS = ("high_first", "low_first", "split_halves")
ENCODINGS = ("offset8", "twos_complement", "unsigned")


@dataclass(frozen=True)
class Int4Packing:
    """Two int4 values a byte, the nibble order and code as fields: MNN's (high nibble first, ``q + 8``),
    ONNX's (low first, ``q & 15`` or unsigned), GGUF's (split halves per 32 values), OpenCL's (low first,
    ``q + 8``).

    ``order``: one of :data:`ORDERS`. ``encoding``: how a value becomes a nibble — ``offset8``
    (``q + 8``, q in [-8, 7]), ``twos_complement`` (``q & 15``), ``unsigned`` (u in [0, 15] stored as is).
    ``group``: the split-halves group length (elements), used by ``split_halves`` only.
    """

    order: str
    encoding: str = "offset8"
    group: int = 32

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.group < 2 or self.group % 2:
            raise ValueError(f"group must be an even number >= 2, got {self.group!r}")

    @property
    def value_range(self) -> tuple[int, int]:
        return (0, 15) if self.encoding == "unsigned" else (-8, 7)

    def packed_length(self, n: int) -> int:
        """Bytes for ``n`` values along the packed axis."""
        if self.order == "split_halves" and n % self.group:
            raise ValueError(f"split_halves packing needs a multiple of {self.group} values, got {n}")
        return (n + 1) // 2

    def _encode(self, v: np.ndarray) -> np.ndarray:
        lo, hi = self.value_range
        v = np.asarray(v)
        if v.ndim == 0:
            raise ValueError("int4 packing needs an array with at least one dimension, got a scalar")
        if v.dtype.kind not in "iu":
            raise TypeError(f"int4 values must be integers, got dtype {v.dtype}")
        if v.size and (int(v.min()) < lo or int(v.max()) > hi):
            raise ValueError(f"int4 values must lie in the range [{lo}, {hi}], got [{int(v.min())}, {int(v.max())}]")
        v = v.astype(np.int16)
        if self.encoding == "offset8":
            v = v + 8
        return (v & 15).astype(np.uint8)

    def _decode(self, nib: np.ndarray) -> np.ndarray:
        nib = nib.astype(np.int16)
        if self.encoding == "offset8":
            nib = nib - 8
        elif self.encoding == "twos_complement":
            nib = np.where(nib >= 8, nib - 16, nib)
        return nib.astype(np.int8 if self.encoding != "unsigned" else np.uint8)

    def pack_array(self, values) -> np.ndarray:
        """Integer array ``(..., n)`` -> uint8 ``(..., ceil(n/2))``."""
        nib = self._encode(values)
        n = nib.shape[-1]
        nbytes = self.packed_length(n)
        if self.order == "split_halves":
            g = nib.reshape(*nib.shape[:-1], n // self.group, 2, self.group // 2)
            out = g[..., 0, :] | (g[..., 1, :] << 4)
            return np.ascontiguousarray(out.reshape(*nib.shape[:-1], nbytes))
        if n % 2:
            pad = self._encode(np.zeros(nib.shape[:-1] + (1,), dtype=np.int8)) if self.encoding != "unsigned" \
                else np.zeros(nib.shape[:-1] + (1,), dtype=np.uint8)
            nib = np.concatenate([nib, pad], axis=-1)
        first, second = nib[..., 0::2], nib[..., 1::2]
        if self.order == "high_first":
            return np.ascontiguousarray((first << 4) | second)
        return np.ascontiguousarray(first | (second << 4))

    def unpack_array(self, packed, shape) -> np.ndarray:
        """uint8 ``(..., ceil(n/2))`` -> values ``(..., n)`` (int8, or uint8 for ``unsigned``).

        ``shape``: the logical shape ``(..., n)`` or just ``n``.
        """
        b = np.asarray(packed)
        n = _last_dim(shape)
        if b.dtype != np.uint8:
            raise TypeError(f"packed int4 data must be uint8, got dtype {b.dtype}")
        if b.ndim == 0 or b.shape[-1] != self.packed_length(n):
            raise ValueError(f"packed int4 data must end in {self.packed_length(n)} bytes for {n} values, "
                             f"got shape {b.shape}")
        lo_n, hi_n = b & 15, b >> 4
        if self.order == "split_halves":
            g = b.reshape(*b.shape[:-1], n // self.group, self.group // 2)
            nib = np.concatenate([g & 15, g >> 4], axis=-1).reshape(*b.shape[:-1], n)
        else:
            first, second = (hi_n, lo_n) if self.order == "high_first" else (lo_n, hi_n)
            nib = np.stack([first, second], axis=-1).reshape(*b.shape[:-1], -1)[..., :n]
        return np.ascontiguousarray(self._decode(nib))

    @classmethod
    def hypothesis_case(cls):
        """Strategy of ``(spec, values)`` over every order and encoding, odd lengths included."""
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from(ORDERS)), draw(st.sampled_from(ENCODINGS)),
                       draw(st.sampled_from([32, 2, 8])))
            rows = draw(st.integers(1, 4))
            n = spec.group * draw(st.integers(1, 3)) if spec.order == "split_halves" else draw(st.integers(1, 41))
            lo, hi = spec.value_range
            seed = draw(st.integers(0, 2**32 - 1))
            vals = np.random.default_rng(seed).integers(lo, hi + 1, size=(rows, n))
            return spec, vals.astype(np.uint8 if spec.encoding == "unsigned" else np.int8)

        return case()


def _last_dim(shape) -> int:
    """``n`` or the last entry of a shape tuple, as a non-negative int."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        n = int(shape)
    else:
        try:
            last = tuple(shape)[-1]
        except (TypeError, IndexError):
            last = None
        if not isinstance(last, (int, np.integer)):
            raise ValueError(f"shape must be an int or a non-empty tuple of ints, got {shape!r}")
        n = int(last)
    if n < 0:
        raise ValueError(f"the number of int4 values must be >= 0, got {n}")
    return n


MNN_INT4 = Int4Packing("high_first", "offset8")
ONNX_INT4 = Int4Packing("low_first", "twos_complement")
ONNX_UINT4 = Int4Packing("low_first", "unsigned")
GGUF_Q4 = Int4Packing("split_halves", "offset8", group=32)
