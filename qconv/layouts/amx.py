"""``AmxWeightLayout``: the weight tiles of the CPU engine's AMX-INT8 kernel.

AMX's ``tdpbusd`` / ``tdpbsud`` multiply a 16 x 64-byte A tile (16 output columns x 64 reduction bytes) by a
B tile of 16 rows of 64 bytes, each row **16 output channels x 4 consecutive reduction values** (the "K/4 x N x 4"
form). A weight of ``G`` groups, ``Og = O/G`` output channels and ``NB`` blocks of ``BC`` input channels times
``K = kh*kw`` taps is stored as

    [G][ceil(Og/32)][NB][2][KP/4][16][4]       int8 q (8-bit weights) or uint8 q + 8 (4-bit weights)

i.e. per 32-channel tile (the engine's UNIT, so the fused tables of :class:`~qconv.layouts.gemm_tiles.TiledWeightLayout`
serve both kernels) and block, two 16-channel halves, each ``KP/4`` rows of 64 bytes; B tile ``s`` (K step ``s``)
of half ``h`` is the 1 KiB at ``h*16*KP + s*1024``, loaded with a row stride of 64 bytes. The reduction order
inside a block is the tiled layout's: ``l = tap*ICL + c`` with ``ICL = round_up(BC, 4)``, ``Lb = K*ICL``
positions; ``KP = round_up(Lb, 64)`` (the 64-byte K step of a tile).

Padding: inside ``Lb`` every position that is not a real (output channel, channel, tap) -- padded channel lanes,
padded output channels -- holds ``q = 0`` (the byte 8 for 4-bit weights, as the nibble 8 of the tiled layout,
so the kernels' weight-sum corrections are the same); the K tail ``Lb .. KP-1`` holds the byte **0** for both
widths, and the kernel's packed A holds 0 there too, so the tail adds exactly nothing to the int32 sums.

4-bit weights are stored one value a byte (twice the bytes of the packed nibbles): the AMX kernel runs the
compute-bound calls (convs, batched linears), where the tiles are read from cache many times, and
single-row GEMVs keep the VNNI kernel on the packed tiled layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemm_tiles import BlockedWeightCodes, _up


@dataclass(frozen=True)
class AmxWeightLayout(BlockedWeightCodes):
    """AMX-INT8 weight tiles of the CPU engine: ``[G][ceil(Og/32)][blocks][2][KP/4][16][4]`` -- per 32-channel tile and
    block, two halves of ``KP/4`` rows x 16 output channels x 4 reduction values (``tdpbusd``'s B form), int8
    ``q`` or uint8 ``q + 8`` (4-bit), blocks zero-padded to the 64-byte K step (details in the module docstring).

    ``out_channels``: ``O`` (all groups); ``in_channels``: input channels per group; ``taps``: ``kh*kw``;
    ``n_blocks``: blocks per output channel (must divide ``in_channels``); ``bits``: 8 or 4; ``groups``.
    """

    out_channels: int
    in_channels: int
    taps: int = 1
    n_blocks: int = 1
    bits: int = 8
    groups: int = 1

    unit = 32       # output channels per tile (the engine's UNIT; tables are per 32-channel tile)
    tile_n = 16     # output channels per AMX B tile (one half of a unit)
    src_unit = 4    # reduction values per channel and B-tile row
    k_step = 64     # reduction bytes per AMX tile step

    def __post_init__(self):
        self._validate()

    # --- constants the kernel reads ---------------------------------------------------------------
    @property
    def block_icl(self) -> int:
        """``ICL = round_up(BC, 4)``: the tap stride in a block's reduction order (as the tiled layout's)."""
        return _up(self.block_channels, self.src_unit)

    @property
    def block_values(self) -> int:
        """``Lb = taps * ICL``: reduction positions per block before the K-step padding."""
        return self.taps * self.block_icl

    @property
    def block_bytes(self) -> int:
        """``KP = round_up(Lb, 64)``: reduction bytes per block and output channel, padding included."""
        return _up(self.block_values, self.k_step)

    @property
    def half_stride(self) -> int:
        """Bytes between the two 16-channel halves of a (tile, block)."""
        return self.tile_n * self.block_bytes

    @property
    def block_stride(self) -> int:
        """Bytes between consecutive blocks of one output-channel tile."""
        return self.unit * self.block_bytes

    @property
    def oc_tile_stride(self) -> int:
        """Bytes between consecutive output-channel tiles of one group."""
        return self.n_blocks * self.block_stride

    @property
    def group_stride(self) -> int:
        return self.oc_tiles * self.oc_tile_stride

    @property
    def packed_shape(self) -> tuple:
        return (self.groups, self.oc_tiles, self.n_blocks, 2, self.block_bytes // self.src_unit, self.tile_n,
                self.src_unit)

    def byte_offset(self, o, c, kpos):
        """Byte offset in the packed array of weight ``(o, c, kpos)``: output channel ``o`` (all groups), input
        channel ``c`` of its group, tap ``kpos`` (arrays broadcast)."""
        o, c, kpos = np.asarray(o), np.asarray(c), np.asarray(kpos)
        og, bc = self.group_out_channels, self.block_channels
        g, oo = o // og, o % og
        l = kpos * self.block_icl + c % bc
        return (g * self.group_stride + (oo // self.unit) * self.oc_tile_stride + (c // bc) * self.block_stride
                + ((oo % self.unit) // self.tile_n) * self.half_stride + (l // 4) * (self.tile_n * 4)
                + (oo % self.tile_n) * 4 + l % 4)

    @classmethod
    def hypothesis_case(cls):
        """Strategy of ``(spec, q)``: int8 ``q (O, I/groups, kh, kw)`` over bits, groups, blocks (lengths across the
        64-byte step) and channel counts across the 16 / 32 channel tiles."""
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            groups = draw(st.integers(1, 3))
            og = draw(st.sampled_from([1, 3, 15, 16, 17, 32, 33]))
            nb = draw(st.integers(1, 3))
            bc = draw(st.sampled_from([1, 3, 4, 7, 13, 16, 17, 64]))
            kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
            bits = draw(st.sampled_from([8, 4]))
            spec = cls(og * groups, bc * nb, kh * kw, nb, bits, groups)
            lo, hi = (-8, 7) if bits == 4 else (-128, 127)
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, rng.integers(lo, hi + 1, (og * groups, bc * nb, kh, kw)).astype(np.int8)

        return case()

    # --- packing ---------------------------------------------------------------------------------------
    def pack_array(self, q: np.ndarray) -> np.ndarray:
        """int8 ``q (O, I/groups, kh, kw)`` (or ``(O, I/groups)``) -> :attr:`packed_shape` array (int8 ``q``, or uint8
        ``q + 8`` for 4-bit weights; padding as in the module docstring)."""
        q = self._check_logical(q)
        g, nb, ocp, kp, lb = self.groups, self.n_blocks, self.oc_padded, self.block_bytes, self.block_values
        flat = self._reduction_rows(q, kp, np.int16)
        if self.bits == 4:
            flat[..., :lb] += 8        # padding inside Lb is the code of 0; the K tail stays the byte 0
        t = flat.reshape(g, nb, ocp // self.unit, 2, self.tile_n, kp // 4, 4).transpose(0, 2, 1, 3, 5, 4, 6)
        return np.ascontiguousarray(t).astype(self.packed_dtype)

    def unpack_array(self, packed: np.ndarray, shape=None) -> np.ndarray:
        """Inverse of :meth:`pack_array`: int8 ``(O, I/groups, kh, kw)`` (``shape``, default ``(O, I/G, taps, 1)``)."""
        packed, shape = self._check_packed(packed, shape)
        g, nb, ocp, kp = self.groups, self.n_blocks, self.oc_padded, self.block_bytes
        off = 8 if self.bits == 4 else 0
        t = packed.astype(np.int16).transpose(0, 2, 1, 3, 5, 4, 6)     # (G, NB, OCU, 2, 16, KP/4, 4)
        return self._from_reduction_rows(t.reshape(g, nb, ocp, kp) - off, shape)


@dataclass(frozen=True)
class AmxConvWeightLayout(BlockedWeightCodes):
    """AMX-INT8 weight tiles of the CPU engine's direct int8 conv (``qconv_direct_int8.h``):
    ``[ceil(O/16)][taps][steps][16][kg][4]`` -- per 16-channel tile, tap and K step, one A tile of 16 output channels
    x ``kg`` channel quads x 4 channels, int8 ``q`` (4-bit weights too, one signed value a byte), zero-padded
    channels.

    In the direct conv the weights are the A operand (signed, ``tdpbsud``) and the activations the B operand, read
    in place from padded quad-major phase planes of the input (one tile row = one quad of 16 consecutive pixels).
    Each weight block (``BC`` channels x all taps) is ``bq = ceil(BC/4)`` quads; a K step is ``kg = min(16, bq)``
    quads of one tap and one block, and block ``b`` owns steps ``b*spb .. (b+1)*spb - 1`` of every tap
    (``spb = ceil(bq/kg)``, the last zero-padded), so its integer sums stay apart for the per-block epilogue. Step
    ``b*spb + j``, row ``r`` reads input quad ``b*bq + j*kg + r``. The output tile is 16 channels x 16 pixels,
    channel-major as NCHW wants it. One group; with several blocks, ``BC`` a multiple of 4.

    ``out_channels``: ``O``; ``in_channels``: ``C``; ``taps``: ``kh*kw``; ``n_blocks``: blocks per output channel;
    ``bits``: 8 or 4.
    """

    out_channels: int
    in_channels: int
    taps: int = 1
    n_blocks: int = 1
    bits: int = 8
    groups: int = 1

    unit = 16        # output channels per A tile (its rows)
    src_unit = 4     # channels per quad (4 bytes of one tile row per quad)
    max_quads = 16   # quads per K step: 64 bytes, the longest tile row

    def __post_init__(self):
        self._validate()
        if self.groups != 1:
            raise ValueError(f"AmxConvWeightLayout holds one group, got groups={self.groups}")
        if self.n_blocks > 1 and self.block_channels % self.src_unit:
            raise ValueError(f"AmxConvWeightLayout needs blocks of a multiple of 4 channels, got "
                             f"{self.block_channels} ({self.n_blocks} blocks of {self.in_channels} channels)")

    @classmethod
    def supports(cls, weight) -> bool:
        """Whether a :class:`~qconv.weights.QuantizedWeight` has this layout: one group, and blocks of a multiple
        of 4 channels when it has several."""
        return weight.groups == 1 and (weight.n_blocks == 1 or weight.block_channels % cls.src_unit == 0)

    # --- constants the kernel reads ---------------------------------------------------------------
    @property
    def quads(self) -> int:
        """``ceil(C/4)``: channel quads of the input."""
        return -(-self.in_channels // self.src_unit)

    @property
    def block_quads(self) -> int:
        """``bq``: quads of one block (``ceil(C/4)`` with one block)."""
        return -(-self.block_channels // self.src_unit)

    @property
    def kg(self) -> int:
        """Quads per K step: the A tile's row bytes / 4 and the B tile's rows."""
        return min(self.max_quads, self.block_quads)

    @property
    def block_steps(self) -> int:
        """``spb``: K steps of one block per tap."""
        return -(-self.block_quads // self.kg)

    @property
    def steps(self) -> int:
        """K steps per tap (all blocks)."""
        return self.n_blocks * self.block_steps

    @property
    def quads_padded(self) -> int:
        """The quad planes the kernel reads: the last block's last step ends at quad
        ``(n_blocks-1)*bq + spb*kg`` (the input buffer holds this many planes)."""
        return (self.n_blocks - 1) * self.block_quads + self.block_steps * self.kg

    @property
    def tile_bytes(self) -> int:
        """Bytes of one A tile: 16 rows of ``4*kg``."""
        return self.unit * self.src_unit * self.kg

    @property
    def oc_tile_stride(self) -> int:
        """Bytes between consecutive 16-channel tiles."""
        return self.taps * self.steps * self.tile_bytes

    @property
    def group_stride(self) -> int:
        return self.oc_tiles * self.oc_tile_stride

    @property
    def packed_dtype(self):
        return np.dtype(np.int8)

    @property
    def packed_shape(self) -> tuple:
        return (self.oc_tiles, self.taps, self.steps, self.unit, self.kg, self.src_unit)

    def byte_offset(self, o, c, kpos):
        """Byte offset in the packed array of weight ``(o, c, kpos)`` (arrays broadcast)."""
        o, c, kpos = np.asarray(o), np.asarray(c), np.asarray(kpos)
        b, qb = c // self.block_channels, (c % self.block_channels) // 4
        step = b * self.block_steps + qb // self.kg
        return ((o // self.unit) * self.oc_tile_stride + (kpos * self.steps + step) * self.tile_bytes
                + (o % self.unit) * (4 * self.kg) + (qb % self.kg) * 4 + c % 4)

    @classmethod
    def hypothesis_case(cls):
        """Strategy of ``(spec, q)``: int8 ``q (O, C, kh, kw)`` over bits, blocks of 4-96 channels and channel
        counts across the quad, K-step and 16-channel tile boundaries."""
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            o = draw(st.sampled_from([1, 3, 15, 16, 17, 33]))
            nb = draw(st.sampled_from([1, 1, 2, 3]))
            c = draw(st.sampled_from([1, 3, 4, 7, 63, 64, 65, 130])) if nb == 1 else \
                nb * 4 * draw(st.sampled_from([1, 3, 4, 8, 16, 17, 24]))
            kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
            bits = draw(st.sampled_from([8, 4]))
            lo, hi = (-8, 7) if bits == 4 else (-128, 127)
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return cls(o, c, kh * kw, nb, bits), rng.integers(lo, hi + 1, (o, c, kh, kw)).astype(np.int8)

        return case()

    # --- packing ---------------------------------------------------------------------------------------
    def _rows(self):
        """``(rows, valid)``: for each padded reduction row ``(step-in-block j, r, lane)`` of a block, the channel
        offset ``4*(j*kg + r) + lane`` inside the block, and whether it is a real channel of the block."""
        spb, kg, bc = self.block_steps, self.kg, self.block_channels
        off = (4 * (np.arange(spb)[:, None, None] * kg + np.arange(kg)[None, :, None])
               + np.arange(4)[None, None, :]).reshape(-1)
        return off, off < bc

    def pack_array(self, q: np.ndarray) -> np.ndarray:
        """int8 ``q (O, C, kh, kw)`` (or ``(O, C)``) -> int8 :attr:`packed_shape` (padding 0)."""
        q = self._check_logical(q)
        o, k, nb, bc = self.out_channels, self.taps, self.n_blocks, self.block_channels
        off, valid = self._rows()
        full = np.zeros((self.oc_padded, nb, off.size, k), np.int8)     # (O, block, padded row, tap)
        full[:o, :, valid] = q.reshape(o, nb, bc, k)[:, :, off[valid]]
        t = full.reshape(self.oc_tiles, self.unit, self.steps, self.kg, 4, k).transpose(0, 5, 2, 1, 3, 4)
        return np.ascontiguousarray(t)

    def unpack_array(self, packed: np.ndarray, shape=None) -> np.ndarray:
        """Inverse of :meth:`pack_array`: int8 ``(O, C, kh, kw)`` (``shape``, default ``(O, C, taps, 1)``)."""
        packed, shape = self._check_packed(packed, shape)
        off, valid = self._rows()
        full = packed.transpose(0, 3, 2, 4, 5, 1).reshape(self.oc_padded, self.n_blocks, off.size, self.taps)
        q = np.zeros((self.out_channels, self.n_blocks, self.block_channels, self.taps), np.int8)
        q[:, :, off[valid]] = full[:self.out_channels, :, valid]
        return np.ascontiguousarray(q.reshape(shape))


__all__ = ["AmxWeightLayout", "AmxConvWeightLayout"]
