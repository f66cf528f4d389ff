"""``TiledWeightLayout``: the weight tiles of the CPU int8 GEMM (our generalisation of mnn-semantics 3.3).

A weight of ``G`` groups, ``Og = O/G`` output channels and ``NB`` blocks per group of ``BC`` input channels
times ``K = kh*kw`` taps is stored as

    int8:  [G][NB][ceil(Og/UNIT)][blockL][UNIT][SRC_UNIT]          (q, padded with 0)
    int4:  [G][NB][ceil(Og/UNIT)][blockL][UNIT*SRC_UNIT/2]         (half-split nibbles, see below)

``G == 1`` gives MNN's ``[blocks][ceil(O/UNIT)][blockL][UNIT][SRC_UNIT]`` with a leading axis of one.
``order="tile"`` swaps the two middle axes, ``[G][ceil(Og/UNIT)][NB][blockL]...``: each output-channel tile's
blocks are then one contiguous run (what a GEMV that keeps a tile's partial sums in registers over the
blocks streams); the CPU engine uses it. ``order="block"`` (the default) is MNN's.
Inside block ``b`` the reduction index of (channel ``c`` of the block, tap ``kpos = ky*kw + kx``) is

    l = kpos * ICL + c,   lq = l // SRC_UNIT (0 <= lq < blockL),   li = l % SRC_UNIT

with ``ICL = round_up(BC, P)`` when ``SRC_UNIT > P`` (MNN's generic/SSE order) and ``round_up(BC, SRC_UNIT)``
otherwise, and ``blockL = ceil(K*ICL / SRC_UNIT)``. Every position that is not a real (output channel, l) pair
-- padded output channels, padded channel lanes, the L tail -- holds ``q = 0`` (nibble 8): it contributes
exactly nothing once the kernels remove the nibble/``+128`` offsets (they do so with the weight sums).

int4: each ``[UNIT][SRC_UNIT]`` tile ``t`` (``T = UNIT*SRC_UNIT`` values, flattened) is folded into ``T/2``
bytes, ``byte[j] = ((t[j] + 8) << 4) | (t[j + T/2] + 8)``: the first half of the tile in the high nibbles,
the second half in the low ones. With UNIT=32, SRC_UNIT=4 a 64-byte load yields output channels 0-15 from
the high nibbles and 16-31 from the low nibbles, one 512-bit vector each.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


ORDERS = ("block", "tile")


def _up(a: int, b: int) -> int:
    return -(-a // b) * b


class BlockedWeightCodes:
    """What every CPU weight-tile spec shares (a mixin of frozen dataclasses with the fields ``out_channels``,
    ``in_channels`` (per group), ``taps``, ``n_blocks``, ``bits``, ``groups`` and a ``unit`` of output channels per
    tile): their validation, group, block and tile sizes, the check of the logical int8 codes
    ``q (O, I/groups, kh, kw)`` and of packed arrays, and the blocks' zero-padded reduction rows ``l = tap*ICL + c``
    that each spec then cuts into its own tiles."""

    def _validate(self, positive=("out_channels", "in_channels", "taps", "n_blocks", "groups")):
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits!r}")
        if self.out_channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide out_channels={self.out_channels}")
        if self.in_channels % self.n_blocks:
            raise ValueError(f"n_blocks={self.n_blocks} must divide the {self.in_channels} input channels per group")

    @classmethod
    def for_weight(cls, weight):
        """The layout of a :class:`~qconv.weights.QuantizedWeight` (its shape, blocks, bits and groups)."""
        return cls(weight.out_channels, int(weight.q.shape[1]), weight.taps, weight.n_blocks, weight.bits,
                   weight.groups)

    @property
    def group_out_channels(self) -> int:
        """``Og = O / groups``."""
        return self.out_channels // self.groups

    @property
    def block_channels(self) -> int:
        """``BC``: input channels of one block."""
        return self.in_channels // self.n_blocks

    @property
    def oc_tiles(self) -> int:
        """``ceil(Og / UNIT)``: output-channel tiles per group."""
        return -(-self.group_out_channels // self.unit)

    @property
    def oc_padded(self) -> int:
        """Output channels per group rounded up to UNIT."""
        return self.oc_tiles * self.unit

    @property
    def packed_dtype(self):
        """int8 codes (8 bits) or bytes of two nibbles / of ``q + 8`` (4 bits)."""
        return np.dtype(np.int8) if self.bits == 8 else np.dtype(np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weights: ``groups * group_stride`` (each spec defines its ``group_stride``)."""
        return self.groups * self.group_stride

    def _check_logical(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q)
        if q.dtype != np.int8:
            raise TypeError(f"q must be int8, got {q.dtype}")
        if q.ndim == 2:
            q = q[:, :, None, None]
        if q.ndim != 4 or q.shape[0] != self.out_channels or q.shape[1] != self.in_channels \
                or q.shape[2] * q.shape[3] != self.taps:
            raise ValueError(f"q must have shape ({self.out_channels}, {self.in_channels}, kh, kw) with "
                             f"kh*kw={self.taps}, got {q.shape}")
        if self.bits == 4 and q.size and (q.min() < -8 or q.max() > 7):
            raise ValueError("int4 values must lie in [-8, 7]")
        return q

    def _reduction_rows(self, q: np.ndarray, width: int, dtype) -> np.ndarray:
        """Logical ``q`` (checked) -> ``(G, NB, OCp, width)`` rows in the blocks' reduction order
        ``l = tap * ICL + c`` (``width >= taps * ICL``); padded channels, lanes and the tail hold 0."""
        g, og, nb, bc, k = self.groups, self.group_out_channels, self.n_blocks, self.block_channels, self.taps
        icl, ocp = self.block_icl, self.oc_padded
        full = np.zeros((g, nb, ocp, k, icl), dtype)
        full[:, :, :og, :, :bc] = q.reshape(g, og, nb, bc, k).transpose(0, 2, 1, 4, 3)   # (G, NB, Og, K, BC)
        rows = np.zeros((g, nb, ocp, width), dtype)
        rows[..., :k * icl] = full.reshape(g, nb, ocp, k * icl)
        return rows

    def _check_packed(self, packed: np.ndarray, shape) -> tuple:
        """``(packed as an array, the logical shape)`` after checking both (``shape`` default ``(O, I/G, taps, 1)``)."""
        packed = np.asarray(packed)
        if packed.shape != self.packed_shape or packed.dtype != self.packed_dtype:
            raise ValueError(f"packed weights must be {self.packed_dtype} {self.packed_shape}, "
                             f"got {packed.dtype} {packed.shape}")
        if shape is None:
            shape = (self.out_channels, self.in_channels, self.taps, 1)
        shape = tuple(int(s) for s in shape)
        if len(shape) != 4 or shape[:2] != (self.out_channels, self.in_channels) or shape[2] * shape[3] != self.taps:
            raise ValueError(f"shape {shape} does not match this layout")
        return packed, shape

    def _from_reduction_rows(self, rows: np.ndarray, shape) -> np.ndarray:
        """Inverse of :meth:`_reduction_rows`: ``(G, NB, OCp, width)`` -> int8 ``q`` of ``shape``."""
        g, og, nb, bc, k = self.groups, self.group_out_channels, self.n_blocks, self.block_channels, self.taps
        icl, ocp = self.block_icl, self.oc_padded
        full = rows[..., :k * icl].reshape(g, nb, ocp, k, icl)[:, :, :og, :, :bc]      # (G, NB, Og, K, BC)
        return np.ascontiguousarray(full.transpose(0, 2, 1, 4, 3).reshape(shape).astype(np.int8))


@dataclass(frozen=True)
class TiledWeightLayout(BlockedWeightCodes):
    """Weight tiles of the CPU int8 GEMM: ``[G][blocks][ceil(O/UNIT)][blockL][UNIT][SRC_UNIT]``
    (``order="block"``, MNN's) or ``[G][ceil(O/UNIT)][blocks][blockL][UNIT][SRC_UNIT]`` (``order="tile"``, the
    CPU engine's); reduction index ``l = tap * ICL + c`` per block; int4 tiles half-split into nibbles; padding
    ``q = 0`` (details in the module docstring).

    ``out_channels``: ``O`` (all groups); ``in_channels``: input channels per group (``I/groups``);
    ``taps``: ``kh*kw``; ``n_blocks``: blocks per output channel (must divide ``in_channels``);
    ``bits``: 8 or 4; ``groups``; ``unit`` (UNIT, output channels per tile), ``src_unit`` (SRC_UNIT, reduction
    values per output channel and tile row), ``pack`` (P, the activation channel pack) and ``order``
    (``"block"``: MNN's block-major order, ``"tile"``: tile-major).
    """

    out_channels: int
    in_channels: int
    taps: int = 1
    n_blocks: int = 1
    bits: int = 8
    groups: int = 1
    unit: int = 32
    src_unit: int = 4
    pack: int = 4
    order: str = "block"

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        self._validate(("out_channels", "in_channels", "taps", "n_blocks", "groups", "unit", "src_unit", "pack"))
        if self.bits == 4 and (self.unit * self.src_unit) % 2:
            raise ValueError("int4 tiles need an even UNIT*SRC_UNIT")

    @classmethod
    def for_weight(cls, weight, unit: int = 32, src_unit: int = 4, pack: int = 4,
                   order: str = "block") -> "TiledWeightLayout":
        """The layout of a :class:`~qconv.weights.QuantizedWeight` with these tile constants."""
        return cls(weight.out_channels, int(weight.q.shape[1]), weight.taps, weight.n_blocks, weight.bits,
                   weight.groups, unit, src_unit, pack, order)

    # --- constants the kernels read ---------------------------------------------------------------
    @property
    def block_icl(self) -> int:
        """``ICL``: channels of a block rounded up to the L alignment (the tap stride in L)."""
        align = self.pack if self.src_unit > self.pack else self.src_unit
        return _up(self.block_channels, align)

    @property
    def block_l(self) -> int:
        """``blockL``: tile rows (of SRC_UNIT values) per block."""
        return -(-self.taps * self.block_icl // self.src_unit)

    @property
    def block_values(self) -> int:
        """Reduction positions per block including padding: ``blockL * SRC_UNIT``."""
        return self.block_l * self.src_unit

    @property
    def tile_bytes(self) -> int:
        """Bytes of one ``[UNIT][SRC_UNIT]`` tile row (halved for int4)."""
        n = self.unit * self.src_unit
        return n if self.bits == 8 else n // 2

    @property
    def oc_tile_stride(self) -> int:
        """Bytes between consecutive output-channel tiles (same group and block)."""
        run = self.block_l * self.tile_bytes
        return run if self.order == "block" else self.n_blocks * run

    @property
    def block_stride(self) -> int:
        """Bytes between consecutive blocks (same group and output-channel tile)."""
        run = self.block_l * self.tile_bytes
        return self.oc_tiles * run if self.order == "block" else run

    @property
    def group_stride(self) -> int:
        """Bytes between consecutive groups."""
        return self.n_blocks * self.oc_tiles * self.block_l * self.tile_bytes

    @property
    def packed_shape(self) -> tuple:
        tail = (self.unit, self.src_unit) if self.bits == 8 else (self.unit * self.src_unit // 2,)
        mid = (self.n_blocks, self.oc_tiles) if self.order == "block" else (self.oc_tiles, self.n_blocks)
        return (self.groups,) + mid + (self.block_l,) + tail

    @property
    def logical_shape_tail(self) -> int:
        """Elements of one output channel's row: ``in_channels * taps``."""
        return self.in_channels * self.taps

    def l_index(self, c, kpos):
        """Position inside its block of channel ``c`` (of the block) at tap ``kpos``: ``kpos*ICL + c``."""
        return np.asarray(kpos) * self.block_icl + np.asarray(c)

    @classmethod
    def hypothesis_case(cls):
        """Strategy of ``(spec, q)``: int8 ``q (O, I/groups, kh, kw)`` over bits, groups, blocks and tile units."""
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            groups = draw(st.integers(1, 3))
            og = draw(st.sampled_from([1, 3, 5, 16, 31, 32, 33]))
            nb = draw(st.integers(1, 3))
            bc = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 13]))
            kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
            bits = draw(st.sampled_from([8, 4]))
            spec = cls(og * groups, bc * nb, kh * kw, nb, bits, groups, draw(st.sampled_from([4, 8, 16, 32])),
                       draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from([4, 8, 16])),
                       draw(st.sampled_from(ORDERS)))
            lo, hi = (-8, 7) if bits == 4 else (-128, 127)
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, rng.integers(lo, hi + 1, (og * groups, bc * nb, kh, kw)).astype(np.int8)

        return case()

    # --- packing ---------------------------------------------------------------------------------------
    def pack_array(self, q: np.ndarray) -> np.ndarray:
        """int8 ``q (O, I/groups, kh, kw)`` (or ``(O, I/groups)``) -> :attr:`packed_shape` array."""
        q = self._check_logical(q)
        g, nb, ocp, bl, u, su = self.groups, self.n_blocks, self.oc_padded, self.block_l, self.unit, self.src_unit
        flat = self._reduction_rows(q, bl * su, np.int8)
        tiles = flat.reshape(g, nb, ocp // u, u, bl, su).transpose(0, 1, 2, 4, 3, 5)
        if self.order == "tile":
            tiles = tiles.swapaxes(1, 2)
        tiles = np.ascontiguousarray(tiles)
        if self.bits == 8:
            return tiles
        t = (tiles.reshape(tiles.shape[:4] + (u * su,)).astype(np.int16) + 8).astype(np.uint8)
        h = u * su // 2
        return np.ascontiguousarray((t[..., :h] << 4) | t[..., h:])

    def unpack_array(self, packed: np.ndarray, shape=None) -> np.ndarray:
        """Inverse of :meth:`pack_array`: int8 ``(O, I/groups, kh, kw)`` (``shape``, default ``(O, I/G, taps, 1)``)."""
        packed, shape = self._check_packed(packed, shape)
        g, nb, ocp, bl, u, su = self.groups, self.n_blocks, self.oc_padded, self.block_l, self.unit, self.src_unit
        if self.order == "tile":
            packed = packed.swapaxes(1, 2)            # back to [G][NB][tiles]
        if self.bits == 4:
            hi = (packed >> 4).astype(np.int16) - 8
            lo = (packed & 15).astype(np.int16) - 8
            tiles = np.concatenate([hi, lo], axis=-1).astype(np.int8).reshape(g, nb, ocp // u, bl, u, su)
        else:
            tiles = packed
        return self._from_reduction_rows(tiles.transpose(0, 1, 2, 4, 3, 5).reshape(g, nb, ocp, bl * su), shape)


__all__ = ["TiledWeightLayout"]
