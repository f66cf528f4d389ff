"""OpenCL weight layouts: the byte streams the kernels of :mod:`qconv.gpu` read, as data.

Each spec is a frozen dataclass with exact inverses ``pack_array`` / ``unpack_array`` (vectorised numpy)
and a ``build_options`` property: the ``-D`` options that tell a kernel how to decode the stream. The
kernels never hard-code a constant these specs own.

=========================  ===================================================  =========================
spec                       layout (logical q is int8 ``(O, I, kh, kw)``)          read by
=========================  ===================================================  =========================
``OpenCLConvWeightLayout``  ``[ceil(I/4)*4/p][ceil(O/4)][kh*kw][p][4]``           ``conv_general.cl``
                            ``p = ic_pack``: 1 is MNN's ``[ICp][O/4][K][4]``;
                            4 (default) puts a 4x4 (in x out) tile in one load
``OpenCL1x1BufferLayout``   ``[ceil(I/KC)][ceil(O/4)*4][KC]``, ``KC = ic_pack``    ``conv_1x1.cl`` (buffer)
``OpenCL1x1ImageLayout``    Image2D ``CL_RGBA/CL_SIGNED_INT32``, width            ``conv_1x1.cl`` (image)
                            ``ceil(O/4)*4``, height ``ceil(I/KC)``; texel
                            ``(o, k)`` = the 16 bytes of buffer chunk ``[k][o]``
``OpenCLMMAWeightLayout``   ``[ceil(O/128)*128][ceil(I/32)*kh*kw][32 or 16]``:    ``conv_mma.cl``
                            steps of 32 input channels x 1 tap (int4: nibbles
                            ``8j + 0,4,1,5,2,6,3,7`` in word ``j``)
``OpenCLGemvMMALayout``     ``[ceil(O/16)][ceil(I/KT)][32][16]``, ``KT`` = 64     ``gemv_mma.cl``
                            (int4) or 32 (int8): lane ``l``'s 16 bytes are its
                            ``mma.m16n8k16`` A fragments
``OpenCLGemvMMAScaleLayout``  ``[1 or 2][ceil(O/16)][n_blocks][8][2]``: rows ``g``,  ``gemv_mma.cl`` (blocks)
                            ``g + 8`` of a tile's block (scales, then offsets)
``OpenCLScaleLayout``       scales/offsets ``(O, n_blocks)`` -> ``[n_blocks][ceil(O/4)*4]``  every kernel
                            float32 or float16 (``vload_half``)
=========================  ===================================================  =========================

Values: int8 is stored as two's-complement bytes. int4 is stored with :data:`OPENCL_INT4` (low nibble
first, code ``q + 8``; a kernel decodes ``(word >> 4*e) & 15) - 8`` for element ``e`` of a little-endian
32-bit word). Padding (output channels ``>= O``, input channels ``>= I``) always holds ``q = 0``
(nibble 8) and scale/offset ``0``: never NaN, never uninitialised (mnn-semantics s.6 items 1-3, 9, 10).
Kernels also mask padded input lanes, so asymmetric offsets never leak into padding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .int4 import Int4Packing

OPENCL_INT4 = Int4Packing("low_first", "offset8")
"""Nibble order of every OpenCL int4 stream: element ``2b`` in bits 0-3 of byte ``b``, code ``q + 8``."""

_QRANGE = {8: (-128, 127), 4: (-8, 7)}


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or int(bits) not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return int(bits)


def _check_q(q, bits: int, ndim=(4,)) -> np.ndarray:
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise TypeError(f"quantized weights must be int8, got dtype {q.dtype}")
    if q.ndim not in ndim:
        raise ValueError(f"quantized weights must have {' or '.join(map(str, ndim))} dimensions, got shape {q.shape}")
    if q.size == 0:
        raise ValueError(f"quantized weights must not be empty, got shape {q.shape}")
    lo, hi = _QRANGE[bits]
    if bits == 4 and (int(q.min()) < lo or int(q.max()) > hi):
        raise ValueError(f"int4 values must lie in the range [{lo}, {hi}], got [{int(q.min())}, {int(q.max())}]")
    return q


def _encode(values: np.ndarray, bits: int) -> np.ndarray:
    """int8 values ``(..., n)`` (n even) -> the stored bytes ``(..., n*bits/8)`` as uint8."""
    if bits == 8:
        return np.ascontiguousarray(values.astype(np.int8)).view(np.uint8)
    return OPENCL_INT4.pack_array(values)


def _decode(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    if bits == 8:
        return np.ascontiguousarray(np.asarray(data).view(np.int8))
    return OPENCL_INT4.unpack_array(np.asarray(data, np.uint8), n)


def _random_scales(rng, shape, dtype: str) -> np.ndarray:
    """float32 values over five decades (exact in ``dtype``) for the scale specs' property tests."""
    v = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 1, shape)).astype(np.float32)
    return v.astype(np.float16).astype(np.float32) if dtype == "float16" else v


def _random_q(rng, bits, shape) -> np.ndarray:
    lo, hi = _QRANGE[bits]
    return rng.integers(lo, hi + 1, size=shape).astype(np.int8)


# {{{ general conv weights

@dataclass(frozen=True)
class OpenCLConvWeightLayout:
    """Weights of the general conv kernels (``conv_general.cl``; ``conv_gemm.cl`` on that path):
    ``[ceil(I/4)*4/p][ceil(O/4)][kh*kw][p][4]``, ``p = ic_pack``: 1 is MNN's ``[ICp][ceil(O/4)][K][4]``, 4 (the
    default) puts a 4x4 (in x out) tile in one load.

    Logical ``q``: int8 ``(O, I, kh, kw)`` with ``I`` the input channels of one group. Stored as
    ``(ceil(I/4)*4/p, ceil(O/4), kh*kw, unit)`` with ``p = ic_pack``. One unit holds the values
    ``v[t][j] = q[4*oc4 + j, p*ib + t, ky*kw + kx]`` for ``t < p`` (input lane) and ``j < 4`` (output lane),
    flattened ``e = 4*t + j``: ``4p`` int8 bytes, or ``2p`` bytes of :data:`OPENCL_INT4` nibbles.

    ``ic_pack = 1`` is MNN's general layout ``[ICp][ceil(O/4)][K][4]`` (with our nibble order);
    ``ic_pack = 4`` (the default) stores a whole 4x4 (input x output) tile in one 16-byte (int8) or 8-byte
    (int4) load.
    """

    bits: int = 8
    ic_pack: int = 4

    def __post_init__(self):
        object.__setattr__(self, "bits", _check_bits(self.bits))
        if self.ic_pack not in (1, 4):
            raise ValueError(f"ic_pack must be 1 or 4, got {self.ic_pack!r}")

    @property
    def unit_values(self) -> int:
        return 4 * self.ic_pack

    @property
    def unit_bytes(self) -> int:
        return self.unit_values * self.bits // 8

    @property
    def build_options(self) -> tuple[str, ...]:
        return (f"-DQBITS={self.bits}", f"-DWPACK={self.ic_pack}")

    @staticmethod
    def scale_group_options(block_channels: int) -> tuple[str, ...]:
        """``-D`` options of scale blocks of ``block_channels`` input channels: ``BLOCK_ALIGN4`` when a block
        holds whole 4-channel units (one scale per unit)."""
        return ("-DBLOCK_ALIGN4",) if block_channels % 4 == 0 else ()

    @staticmethod
    def edge_options(in_channels: int) -> tuple[str, ...]:
        """``IC_LEAVE`` when ``in_channels`` (per group) leaves a partial 4-channel unit."""
        return ("-DIC_LEAVE",) if in_channels % 4 else ()

    def packed_shape(self, shape) -> tuple[int, int, int, int]:
        o, i, kh, kw = (int(s) for s in shape)
        return (_cdiv(i, 4) * 4 // self.ic_pack, _cdiv(o, 4), kh * kw, self.unit_bytes)

    def nbytes(self, shape) -> int:
        return int(np.prod(self.packed_shape(shape)))

    def pack_array(self, q) -> np.ndarray:
        """int8 ``(O, I, kh, kw)`` -> uint8 :meth:`packed_shape`."""
        q = _check_q(q, self.bits)
        o, i, kh, kw = q.shape
        o4, ip, p = _cdiv(o, 4), _cdiv(i, 4) * 4, self.ic_pack
        full = np.zeros((o4 * 4, ip, kh * kw), np.int8)
        full[:o, :i] = q.reshape(o, i, kh * kw)
        v = full.reshape(o4, 4, ip // p, p, kh * kw).transpose(2, 0, 4, 3, 1)  # (ib, oc4, k, t, j)
        return np.ascontiguousarray(_encode(v.reshape(ip // p, o4, kh * kw, 4 * p), self.bits))

    def unpack_array(self, packed, shape) -> np.ndarray:
        """Inverse of :meth:`pack_array`; ``shape`` is the logical ``(O, I, kh, kw)``."""
        o, i, kh, kw = (int(s) for s in shape)
        want = self.packed_shape(shape)
        packed = np.asarray(packed)
        if packed.shape != want:
            raise ValueError(f"packed conv weights must have shape {want} for {tuple(shape)}, got {packed.shape}")
        p = self.ic_pack
        v = _decode(packed, self.bits, 4 * p).reshape(want[0], want[1], kh * kw, p, 4)
        full = v.transpose(1, 4, 0, 3, 2).reshape(want[1] * 4, want[0] * p, kh * kw)
        return np.ascontiguousarray(full[:o, :i].reshape(o, i, kh, kw))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from([8, 4])), draw(st.sampled_from([4, 1])))
            shape = (draw(st.integers(1, 11)), draw(st.integers(1, 11)), draw(st.integers(1, 3)),
                     draw(st.integers(1, 3)))
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, _random_q(rng, spec.bits, shape)

        return case()

# }}}


# {{{ 1x1 weights: buffer and Image2D

@dataclass(frozen=True)
class OpenCL1x1BufferLayout:
    """Weights of the 1x1 / GEMV kernels in a buffer (``conv_1x1.cl``, ``gemv_a8.cl``; ``conv_gemm.cl`` on
    that path): ``[ceil(I/KC)][OCp][KC]``, one 16-byte chunk (16 int8 or 32 int4 values) per (k, o).

    Logical ``q``: int8 ``(O, I)`` or ``(O, I, 1, 1)``. Stored as ``(ceil(I/KC), OCp, chunk_bytes)`` with
    ``KC = ic_pack`` input channels per chunk and ``OCp = ceil(O/oc_pack)*oc_pack``: element
    ``[k][o][l] = q[o, k*KC + l]``. ``ic_pack = 0`` picks 16 (int8) or 32 (int4): one 16-byte load per
    (chunk, output channel), which is what the kernels read (``chunk_bytes == 16``). Adjacent output
    channels are adjacent 16-byte chunks, so work-items of adjacent channels load contiguously.
    """

    bits: int = 8
    ic_pack: int = 0
    oc_pack: int = 4

    def __post_init__(self):
        object.__setattr__(self, "bits", _check_bits(self.bits))
        if self.ic_pack == 0:
            object.__setattr__(self, "ic_pack", 16 if self.bits == 8 else 32)
        if self.ic_pack < 2 or self.ic_pack % 2:
            raise ValueError(f"ic_pack must be an even number >= 2, got {self.ic_pack!r}")
        if self.oc_pack < 1:
            raise ValueError(f"oc_pack must be >= 1, got {self.oc_pack!r}")

    @property
    def chunk_bytes(self) -> int:
        return self.ic_pack * self.bits // 8

    @property
    def build_options(self) -> tuple[str, ...]:
        return (f"-DQBITS={self.bits}", f"-DKC={self.ic_pack}")

    def scale_group(self, block_channels: int) -> int | None:
        """Input channels of one scale inside a chunk of ``ic_pack`` (the largest of ``ic_pack``, 16, 8, 4
        dividing both), or None when no such group exists (scales change per lane)."""
        kc = self.ic_pack
        return next((g for g in (kc, 16, 8, 4) if kc % g == 0 and block_channels % g == 0), None)

    def scale_group_options(self, block_channels: int) -> tuple[str, ...]:
        """``-D`` options of scale blocks of ``block_channels`` input channels: ``SG=<scale_group>``, or
        ``LANE_SCALE`` (a scale per lane) when there is no group."""
        sg = self.scale_group(block_channels)
        return (f"-DSG={sg}",) if sg else ("-DLANE_SCALE",)

    def edge_options(self, in_channels: int) -> tuple[str, ...]:
        """``IC_LEAVE`` when ``in_channels`` leaves a partial chunk."""
        return ("-DIC_LEAVE",) if in_channels % self.ic_pack else ()

    @staticmethod
    def _oi(shape) -> tuple[int, int]:
        shape = tuple(int(s) for s in shape)
        if len(shape) == 4 and shape[2:] != (1, 1):
            raise ValueError(f"1x1 layouts need a (O, I, 1, 1) weight, got shape {shape}")
        if len(shape) not in (2, 4):
            raise ValueError(f"1x1 layouts need a (O, I) or (O, I, 1, 1) weight, got shape {shape}")
        return shape[0], shape[1]

    def packed_shape(self, shape) -> tuple[int, int, int]:
        o, i = self._oi(shape)
        return (_cdiv(i, self.ic_pack), _cdiv(o, self.oc_pack) * self.oc_pack, self.chunk_bytes)

    def nbytes(self, shape) -> int:
        return int(np.prod(self.packed_shape(shape)))

    def pack_array(self, q) -> np.ndarray:
        """int8 ``(O, I)`` / ``(O, I, 1, 1)`` -> uint8 :meth:`packed_shape`."""
        q = _check_q(q, self.bits, ndim=(2, 4))
        o, i = self._oi(q.shape)
        nk, ocp, _ = self.packed_shape(q.shape)
        full = np.zeros((ocp, nk * self.ic_pack), np.int8)
        full[:o, :i] = q.reshape(o, i)
        v = full.reshape(ocp, nk, self.ic_pack).transpose(1, 0, 2)
        return np.ascontiguousarray(_encode(v, self.bits))

    def unpack_array(self, packed, shape) -> np.ndarray:
        o, i = self._oi(shape)
        want = self.packed_shape(shape)
        packed = np.asarray(packed)
        if packed.shape != want:
            raise ValueError(f"packed 1x1 weights must have shape {want} for {tuple(shape)}, got {packed.shape}")
        v = _decode(packed, self.bits, self.ic_pack)  # (nk, ocp, KC)
        full = v.transpose(1, 0, 2).reshape(want[1], want[0] * self.ic_pack)
        return np.ascontiguousarray(full[:o, :i].reshape(tuple(int(s) for s in shape)))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            bits = draw(st.sampled_from([8, 4]))
            spec = cls(bits, draw(st.sampled_from([0, 16, 8, 32])), draw(st.sampled_from([4, 1, 8])))
            o, i = draw(st.integers(1, 13)), draw(st.integers(1, 70))
            shape = (o, i) if draw(st.booleans()) else (o, i, 1, 1)
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, _random_q(rng, bits, shape)

        return case()


@dataclass(frozen=True)
class OpenCL1x1ImageLayout:
    """The 1x1 weights as an Image2D of ``CL_RGBA / CL_SIGNED_INT32`` texels (``read_imagei``): texel
    ``(o, k)`` = buffer chunk ``[k][o]``; the engine falls back to the buffer beyond the device's image limits.

    A texel is 16 bytes = 16 int8 or 32 int4 values, so the image holds exactly the bytes of
    :class:`OpenCL1x1BufferLayout` with ``ic_pack = 16 / 32`` and ``oc_pack = 4``: texel ``(x=o, y=k)`` =
    chunk ``[k][o]``, its bytes little-endian in the RGBA int32 channels. Integer texels, not float bit
    patterns (mnn-semantics s.6 item 9). ``max_width`` / ``max_height`` are the device's image limits
    (``CL_DEVICE_IMAGE2D_MAX_WIDTH/HEIGHT``): callers check :meth:`fits` and fall back to the buffer.

    ``pack_array`` returns int32 ``(height, width, 4)``, the host array of ``pyopencl.Image``.
    """

    bits: int = 8
    max_width: int = 16384
    max_height: int = 16384

    def __post_init__(self):
        object.__setattr__(self, "bits", _check_bits(self.bits))
        if self.max_width < 1 or self.max_height < 1:
            raise ValueError(f"image limits must be >= 1, got {self.max_width}x{self.max_height}")

    @property
    def buffer_layout(self) -> OpenCL1x1BufferLayout:
        return OpenCL1x1BufferLayout(self.bits, 0, 4)

    @property
    def ic_pack(self) -> int:
        return self.buffer_layout.ic_pack

    @property
    def build_options(self) -> tuple[str, ...]:
        return self.buffer_layout.build_options + ("-DUSE_IMAGE",)

    def scale_group_options(self, block_channels: int) -> tuple[str, ...]:
        return self.buffer_layout.scale_group_options(block_channels)

    def edge_options(self, in_channels: int) -> tuple[str, ...]:
        return self.buffer_layout.edge_options(in_channels)

    def image_shape(self, shape) -> tuple[int, int]:
        """``(width, height)`` in texels for a logical weight ``shape``."""
        nk, ocp, _ = self.buffer_layout.packed_shape(shape)
        return ocp, nk

    def fits(self, shape) -> bool:
        w, h = self.image_shape(shape)
        return w <= self.max_width and h <= self.max_height

    def packed_shape(self, shape) -> tuple[int, int, int]:
        w, h = self.image_shape(shape)
        return (h, w, 4)

    def pack_array(self, q) -> np.ndarray:
        b = self.buffer_layout.pack_array(q)
        return np.ascontiguousarray(b.view("<i4").reshape(b.shape[0], b.shape[1], 4))

    def unpack_array(self, packed, shape) -> np.ndarray:
        packed = np.asarray(packed)
        want = self.packed_shape(shape)
        if packed.shape != want or packed.dtype.kind != "i" or packed.dtype.itemsize != 4:
            raise ValueError(f"packed 1x1 image must be int32 {want} for {tuple(shape)}, got "
                             f"{packed.dtype} {packed.shape}")
        b = np.ascontiguousarray(packed.astype("<i4", copy=False)).view(np.uint8).reshape(want[0], want[1], 16)
        return self.buffer_layout.unpack_array(b, shape)

    @classmethod
    def for_device(cls, bits: int, device) -> "OpenCL1x1ImageLayout":
        """Spec with ``device``'s Image2D limits (a ``pyopencl.Device``)."""
        return cls(bits, int(device.image2d_max_width), int(device.image2d_max_height))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            bits = draw(st.sampled_from([8, 4]))
            spec = cls(bits, draw(st.integers(1, 64)), draw(st.integers(1, 64)))
            shape = (draw(st.integers(1, 13)), draw(st.integers(1, 70)))
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, _random_q(rng, bits, shape)

        return case()

# }}}


# {{{ scales, offsets

@dataclass(frozen=True)
class OpenCLScaleLayout:
    """Scales or offsets of every OpenCL kernel: float32 ``(O, n_blocks)`` -> ``[n_blocks][OCp]``, stored as
    float32 or float16 (``vload_half``).

    ``dtype``: ``"float32"`` or ``"float16"`` (read with ``vload_half``, core OpenCL, no ``cl_khr_fp16``
    needed). Padding channels ``[O, OCp)`` hold 0. Adjacent output channels are adjacent, so a work-item
    of 4 channels reads one ``vload4`` / ``vload_half4``. The float16 form is exact only for values that
    :meth:`lossless` accepts; the engine uses it when they all are (``scale_dtype="auto"``).
    """

    dtype: str = "float32"
    oc_pack: int = 4

    def __post_init__(self):
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {self.dtype!r}")
        if self.oc_pack < 1:
            raise ValueError(f"oc_pack must be >= 1, got {self.oc_pack!r}")

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "float16" else 4

    @property
    def build_options(self) -> tuple[str, ...]:
        return ("-DSCALE_HALF",) if self.dtype == "float16" else ()

    def options_for(self, n_blocks: int, block_channels: int, asym: bool) -> tuple[str, ...]:
        """:attr:`build_options` plus those of the weight's scale blocks: ``ASYM`` (offsets stored too), then
        ``NBLK1`` (one scale per output channel) or ``BLOCK_CH=<block_channels>``."""
        return (self.build_options + (("-DASYM",) if asym else ())
                + (("-DNBLK1",) if n_blocks == 1 else (f"-DBLOCK_CH={block_channels}",)))

    @staticmethod
    def lossless(values) -> bool:
        """True when every value survives float32 -> float16 -> float32 exactly."""
        v = np.asarray(values, np.float32)
        with np.errstate(over="ignore"):
            back = v.astype(np.float16).astype(np.float32)
        return bool(np.array_equal(back.view(np.uint32), v.view(np.uint32)))

    def packed_shape(self, shape) -> tuple[int, int]:
        o, nb = (int(s) for s in shape)
        return (nb, _cdiv(o, self.oc_pack) * self.oc_pack)

    def pack_array(self, values) -> np.ndarray:
        v = np.asarray(values)
        if v.ndim != 2 or v.dtype != np.float32:
            raise ValueError(f"scales must be float32 (O, n_blocks), got {v.dtype} {v.shape}")
        nb, ocp = self.packed_shape(v.shape)
        out = np.zeros((nb, ocp), np.dtype(self.dtype))
        with np.errstate(over="ignore"):
            out[:, :v.shape[0]] = v.T.astype(self.dtype)
        return out

    def unpack_array(self, packed, shape) -> np.ndarray:
        o, nb = (int(s) for s in shape)
        packed = np.asarray(packed)
        if packed.shape != self.packed_shape(shape) or packed.dtype != np.dtype(self.dtype):
            raise ValueError(f"packed scales must be {self.dtype} {self.packed_shape(shape)}, got "
                             f"{packed.dtype} {packed.shape}")
        return np.ascontiguousarray(packed[:, :o].T.astype(np.float32))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from(["float32", "float16"])), draw(st.sampled_from([4, 1, 16])))
            shape = (draw(st.integers(1, 13)), draw(st.integers(1, 5)))
            return spec, _random_scales(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, spec.dtype)

        return case()

# }}}




# {{{ tensor-core (mma) weights

@dataclass(frozen=True)
class OpenCLMMAWeightLayout:
    """Weights of the int8 tensor-core implicit GEMM (``conv_mma.cl``, ``act_quant="row"``):
    ``[OCp][ceil(I/32)*kh*kw][32 or 16 bytes]``, a step = 32 input channels x one tap; int4 nibbles ordered so
    that two masks give two int8 words.

    Logical ``q``: int8 ``(O, I, kh, kw)`` (ungrouped) or ``(O, I)``. K is walked in steps of 32 input
    channels x one tap, chunk-major: step ``s = c*kh*kw + t`` holds ``q[o, 32c + e, ky, kx]`` for
    ``e < 32`` (``t = ky*kw + kx``; channels ``>= I`` are 0). Stored as ``(OCp, S, step_bytes)`` with
    ``OCp = ceil(O/oc_pack)*oc_pack`` (rows ``>= O`` are 0), ``S = ceil(I/32)*kh*kw``: int8 steps are the 32
    bytes as they are; int4 steps are 16 bytes of :data:`OPENCL_INT4` nibbles in the order
    ``e = 8j + (0, 4, 1, 5, 2, 6, 3, 7)``, so that the low nibbles of 32-bit word ``j`` are elements
    ``8j .. 8j+3`` and the high nibbles ``8j+4 .. 8j+7`` (two masks give two int8 words of the mma operand).

    ``digits`` > 1 (float activations on the same kernel): every 32-channel chunk is stored ``digits`` times in
    a row (virtual chunk ``digits*c + d``, ``S = digits*ceil(I/32)*kh*kw``), one copy per base-256 digit of the
    activations ``X = rint(x * 2^sh) = sum_d X_d 256^(digits-1-d)`` (``|X| <= 2^x_bits``, ``X_d`` signed
    bytes, :meth:`digit_scales` the per-copy scales), so the int8 products of every copy sum to ``q X``
    exactly.
    """

    bits: int = 8
    oc_pack: int = 128
    digits: int = 1

    STEP_CHANNELS = 32
    DIGIT_BITS = 8

    def __post_init__(self):
        object.__setattr__(self, "bits", _check_bits(self.bits))
        if self.oc_pack < 1 or self.oc_pack % 16:
            raise ValueError(f"oc_pack must be a positive multiple of 16 (the mma tile), got {self.oc_pack!r}")
        if self.digits not in (1, 2, 3):
            raise ValueError(f"digits must be 1, 2 or 3, got {self.digits!r}")

    @property
    def x_bits(self) -> int:
        """``|X| <= 2^x_bits`` for the split activations (``digits`` > 1): the leading digit stays within
        ``[-64, 64]`` whatever rounding does."""
        return self.DIGIT_BITS * self.digits - 2

    def digit_scales(self, values, block_channels: int, in_channels: int) -> np.ndarray:
        """Scales or offsets ``(O, n_blocks)`` of the logical weight (blocks of ``block_channels`` input
        channels) -> ``(O, digits * ceil(I/32))`` float32, one per virtual chunk: chunk ``digits*c + d`` takes
        its channels' block value times ``256^(digits-1-d)`` (exact: powers of two). Needs ``block_channels``
        a multiple of 32 or a single block."""
        v = np.asarray(values, np.float32)
        nch = _cdiv(int(in_channels), self.STEP_CHANNELS)
        if v.ndim != 2 or (v.shape[1] > 1 and block_channels % self.STEP_CHANNELS):
            raise ValueError(f"digit scales need (O, n_blocks) values with blocks of a multiple of 32 channels, "
                             f"got {v.shape} with blocks of {block_channels}")
        blk = np.minimum(np.arange(nch) * self.STEP_CHANNELS // max(int(block_channels), 1), v.shape[1] - 1)
        pow256 = np.float32(2.0 ** self.DIGIT_BITS) ** np.arange(self.digits - 1, -1, -1, dtype=np.float32)
        return np.ascontiguousarray((v[:, blk, None] * pow256).reshape(v.shape[0], nch * self.digits))

    @property
    def step_bytes(self) -> int:
        return self.STEP_CHANNELS * self.bits // 8

    @property
    def build_options(self) -> tuple[str, ...]:
        return (f"-DQBITS={self.bits}", f"-DMMA_OCP={self.oc_pack}")

    @staticmethod
    def _oikk(shape) -> tuple[int, int, int, int]:
        shape = tuple(int(s) for s in shape)
        if len(shape) == 2:
            return (*shape, 1, 1)
        if len(shape) != 4:
            raise ValueError(f"mma weights must be (O, I) or (O, I, kh, kw), got shape {shape}")
        return shape

    def packed_shape(self, shape) -> tuple[int, int, int]:
        o, i, kh, kw = self._oikk(shape)
        return (_cdiv(o, self.oc_pack) * self.oc_pack, self.digits * _cdiv(i, self.STEP_CHANNELS) * kh * kw,
                self.step_bytes)

    def nbytes(self, shape) -> int:
        return int(np.prod(self.packed_shape(shape)))

    def _nibble_order(self) -> np.ndarray:
        return (8 * np.arange(4)[:, None] + np.array([0, 4, 1, 5, 2, 6, 3, 7])[None, :]).reshape(-1)

    def pack_array(self, q) -> np.ndarray:
        """int8 ``(O, I[, kh, kw])`` -> uint8 :meth:`packed_shape`."""
        q = _check_q(q, self.bits, ndim=(2, 4))
        o, i, kh, kw = self._oikk(q.shape)
        ocp, steps, _ = self.packed_shape(q.shape)
        nch = steps // (kh * kw)   # virtual chunks: digits copies of each
        full = np.zeros((ocp, nch // self.digits, self.STEP_CHANNELS, kh * kw), np.int8)
        full.reshape(ocp, -1, kh * kw)[:o, :i] = q.reshape(o, i, kh * kw)
        full = np.repeat(full, self.digits, axis=1)
        v = full.transpose(0, 1, 3, 2)  # (o, c, t, e)
        v = v.reshape(ocp, steps, self.STEP_CHANNELS)
        if self.bits == 4:
            v = v[..., self._nibble_order()]
        return np.ascontiguousarray(_encode(v, self.bits))

    def unpack_array(self, packed, shape) -> np.ndarray:
        """Inverse of :meth:`pack_array`; ``shape`` is the logical ``(O, I[, kh, kw])``."""
        o, i, kh, kw = self._oikk(shape)
        want = self.packed_shape(shape)
        packed = np.asarray(packed)
        if packed.shape != want:
            raise ValueError(f"packed mma weights must have shape {want} for {tuple(shape)}, got {packed.shape}")
        v = _decode(packed, self.bits, self.STEP_CHANNELS)  # (ocp, steps, 32)
        if self.bits == 4:
            v = v[..., np.argsort(self._nibble_order())]
        nch = want[1] // (kh * kw)
        full = v.reshape(want[0], nch, kh * kw, self.STEP_CHANNELS)[:, ::self.digits].transpose(0, 1, 3, 2)
        full = full.reshape(want[0], nch // self.digits * self.STEP_CHANNELS, kh * kw)
        return np.ascontiguousarray(full[:o, :i].reshape(tuple(int(s) for s in shape)))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from([8, 4])), draw(st.sampled_from([128, 16, 32])),
                       draw(st.sampled_from([1, 3, 2])))
            o, i = draw(st.integers(1, 40)), draw(st.integers(1, 70))
            shape = (o, i) if draw(st.booleans()) else (o, i, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, _random_q(rng, spec.bits, shape)

        return case()

# }}}


# {{{ f16 tensor-core GEMV weights

@dataclass(frozen=True)
class OpenCLGemvMMALayout:
    """Weights of the tensor-core GEMV (``gemv_mma.cl``: linear layers on one row, float activations):
    ``[ceil(O/16)][ceil(I/KT)][32 lanes][16 bytes]``, ``KT`` = 64 (int4) or 32 (int8); a lane's 16 bytes are
    its ``mma.m16n8k16`` A fragments (``gemv_mma`` reads each pair of steps as one ``m16n8k32`` s8 product:
    in every byte of an int4 step the low nibble is row ``g`` and the high nibble row ``g + 8``).

    Logical ``q``: int8 ``(O, I)`` or ``(O, I, 1, 1)``. Output channels go in tiles of 16 rows, K in
    loads of ``KT = 64`` (int4) or ``32`` (int8) input channels; stored as ``(ceil(O/16), ceil(I/KT), 32,
    16)`` uint8 (rows ``>= O`` and channels ``>= I`` are 0): the 16 bytes of lane ``l`` of a warp are its
    ``mma.m16n8k16`` A fragments for the ``KT/16`` k-steps of the load. With ``g = l // 4``, ``t = l % 4``
    and row ``r``, column ``c`` inside the 16x16 step, fragment element ``j`` (the PTX ISA's ``a_j``) is
    ``(g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1) (g, 2t+8) (g, 2t+9) (g+8, 2t+8) (g+8, 2t+9)`` for
    ``j = 0 .. 7``. int8 steps are the 8 bytes ``a_0 .. a_7``; int4 steps are one 32-bit word of
    :data:`OPENCL_INT4` nibbles ``a_0 a_2 a_4 a_6 a_1 a_3 a_5 a_7`` (bits 0-3 first), so one mask of
    ``0x000F000F`` (then ``0x00F000F0``, then both after ``>> 8``) puts the pairs ``(a_0, a_1)``,
    ``(a_2, a_3)``, ... into the halves of a 32-bit word.
    """

    bits: int = 4

    TILE_ROWS = 16

    def __post_init__(self):
        object.__setattr__(self, "bits", _check_bits(self.bits))

    @property
    def k_per_load(self) -> int:
        """Input channels per 16-byte load of a lane (KT)."""
        return 64 if self.bits == 4 else 32

    @property
    def build_options(self) -> tuple[str, ...]:
        return (f"-DQBITS={self.bits}",)

    @staticmethod
    def _oi(shape) -> tuple[int, int]:
        shape = tuple(int(s) for s in shape)
        if len(shape) == 4 and shape[2:] == (1, 1):
            shape = shape[:2]
        if len(shape) != 2:
            raise ValueError(f"gemv mma weights must be (O, I) or (O, I, 1, 1), got shape {shape}")
        return shape

    def packed_shape(self, shape) -> tuple[int, int, int, int]:
        o, i = self._oi(shape)
        return (_cdiv(o, self.TILE_ROWS), _cdiv(i, self.k_per_load), 32, 16)

    def nbytes(self, shape) -> int:
        return int(np.prod(self.packed_shape(shape)))

    def _fragments(self):
        """(row, column) inside a 16x16 step of lane l's element j: arrays (32, 8)."""
        lane = np.arange(32)
        g, t = lane // 4, lane % 4
        rows = np.stack([g, g, g + 8, g + 8, g, g, g + 8, g + 8], 1)
        cols = np.stack([2 * t, 2 * t + 1, 2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9, 2 * t + 8, 2 * t + 9], 1)
        return rows, cols

    _INT4_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])

    def pack_array(self, q) -> np.ndarray:
        """int8 ``(O, I[, 1, 1])`` -> uint8 :meth:`packed_shape`."""
        q = _check_q(q, self.bits, ndim=(2, 4))
        o, i = self._oi(q.shape)
        ot, kl, _, _ = self.packed_shape(q.shape)
        steps = self.k_per_load // 16
        full = np.zeros((ot * 16, kl * self.k_per_load), np.int8)
        full[:o, :i] = q.reshape(o, i)
        tiles = full.reshape(ot, 16, kl, steps, 16)  # (tile, row, load, step, column)
        rows, cols = self._fragments()
        v = tiles[:, rows, :, :, cols]  # (32, 8, tile, load, step)
        v = v.transpose(2, 3, 0, 4, 1)  # (tile, load, lane, step, j)
        if self.bits == 4:
            v = v[..., self._INT4_ORDER]
        return np.ascontiguousarray(_encode(v.reshape(ot, kl, 32, steps * 8), self.bits))

    def unpack_array(self, packed, shape) -> np.ndarray:
        """Inverse of :meth:`pack_array`; ``shape`` is the logical ``(O, I[, 1, 1])``."""
        o, i = self._oi(shape)
        want = self.packed_shape(shape)
        packed = np.asarray(packed)
        if packed.shape != want:
            raise ValueError(f"packed gemv mma weights must have shape {want} for {tuple(shape)}, "
                             f"got {packed.shape}")
        ot, kl = want[:2]
        steps = self.k_per_load // 16
        v = _decode(packed, self.bits, steps * 8).reshape(ot, kl, 32, steps, 8)
        if self.bits == 4:
            v = v[..., np.argsort(self._INT4_ORDER)]
        rows, cols = self._fragments()
        tiles = np.zeros((ot, 16, kl, steps, 16), np.int8)
        tiles[:, rows, :, :, cols] = v.transpose(2, 4, 0, 1, 3)
        full = tiles.reshape(ot * 16, kl * self.k_per_load)
        return np.ascontiguousarray(full[:o, :i].reshape(tuple(int(s) for s in shape)))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from([8, 4])))
            o, i = draw(st.integers(1, 40)), draw(st.integers(1, 150))
            shape = (o, i) if draw(st.booleans()) else (o, i, 1, 1)
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return spec, _random_q(rng, spec.bits, shape)

        return case()

# }}}

@dataclass(frozen=True)
class OpenCLGemvMMAScaleLayout:
    """Block scales (and offsets) of the tensor-core GEMV's blockwise path (``gemv_mma.cl`` without
    ``NBLK1``): ``[ceil(O/16)][n_blocks][8][2]`` per plane (the scales; with ``asym`` the offsets follow as a
    second plane, ``[2][ceil(O/16)][n_blocks][8][2]``), the numbers lane ``l`` of a warp folds its block sums
    with, next to each other, so that one 4-byte (float16; 8 bytes as float32) load per block brings them. The
    planes are apart because a block's scale is read by all four lanes of a row pair and its offset by one
    (the lanes share out the offsets' terms).

    Logical values: float32 ``(O, n_blocks)`` scales, or, with ``asym``, ``(2, O, n_blocks)``: scales then
    offsets. Output channels go in tiles of 16 rows; for plane ``v``, tile ``T``, block ``b`` and ``g = l // 4``
    in ``0..7`` the entry holds ``v[16T + g, b], v[16T + g + 8, b]``: the rows ``g`` and ``g + 8`` of
    ``mma.m16n8k32``'s C fragment. Rows ``>= O`` hold 0. ``dtype``: ``"float32"`` or ``"float16"`` (read with
    ``vloada_half2``).
    """

    dtype: str = "float16"
    asym: bool = False

    TILE_ROWS = 16

    def __post_init__(self):
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {self.dtype!r}")

    @property
    def planes(self) -> int:
        """1 (scales) or 2 (scales, then offsets)."""
        return 2 if self.asym else 1

    @property
    def build_options(self) -> tuple[str, ...]:
        return ("-DSCALE_HALF",) if self.dtype == "float16" else ()

    def _onb(self, shape) -> tuple[int, int]:
        shape = tuple(int(s) for s in shape)
        want = 3 if self.asym else 2
        if len(shape) != want or (self.asym and shape[0] != 2):
            form = "(2, O, n_blocks)" if self.asym else "(O, n_blocks)"
            raise ValueError(f"gemv mma scales must be {form}, got shape {shape}")
        return shape[-2:]

    def packed_shape(self, shape) -> tuple[int, ...]:
        o, nb = self._onb(shape)
        return (2,) * self.asym + (_cdiv(o, self.TILE_ROWS), nb, 8, 2)

    def pack_array(self, values) -> np.ndarray:
        """float32 ``(O, n_blocks)`` or ``(2, O, n_blocks)`` -> :attr:`dtype` :meth:`packed_shape`."""
        v = np.asarray(values)
        if v.dtype != np.float32:
            raise ValueError(f"gemv mma scales must be float32, got {v.dtype}")
        ot, nb = self.packed_shape(v.shape)[-4:-2]
        o = v.shape[-2]
        full = np.zeros((self.planes, ot * 16, nb), np.float32)
        full[:, :o] = v.reshape(-1, o, nb)
        t = full.reshape(-1, ot, 2, 8, nb)  # (plane, tile, half of the tile's rows, g, block)
        t = t.transpose(0, 1, 4, 3, 2).reshape(self.packed_shape(v.shape))
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(t.astype(self.dtype))

    def unpack_array(self, packed, shape) -> np.ndarray:
        """Inverse of :meth:`pack_array`; ``shape`` is the logical ``(O, n_blocks)`` or ``(2, O, n_blocks)``."""
        o, nb = self._onb(shape)
        want = self.packed_shape(shape)
        packed = np.asarray(packed)
        if packed.shape != want or packed.dtype != np.dtype(self.dtype):
            raise ValueError(f"packed gemv mma scales must be {self.dtype} {want}, got {packed.dtype} "
                             f"{packed.shape}")
        ot = want[-4]
        t = packed.astype(np.float32).reshape(self.planes, ot, nb, 8, 2).transpose(0, 1, 4, 3, 2)
        full = t.reshape(self.planes, ot * 16, nb)[:, :o]
        return np.ascontiguousarray(full.reshape(tuple(int(s) for s in shape)))

    @classmethod
    def hypothesis_case(cls):
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from(["float32", "float16"])), draw(st.booleans()))
            shape = (draw(st.integers(1, 40)), draw(st.integers(1, 6)))
            if spec.asym:
                shape = (2,) + shape
            return spec, _random_scales(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, spec.dtype)

        return case()

# }}}


SPECS = (OpenCLConvWeightLayout, OpenCL1x1BufferLayout, OpenCL1x1ImageLayout, OpenCLMMAWeightLayout,
         OpenCLGemvMMALayout, OpenCLGemvMMAScaleLayout, OpenCLScaleLayout)

__all__ = ["OPENCL_INT4", "OpenCLConvWeightLayout", "OpenCL1x1BufferLayout", "OpenCL1x1ImageLayout",
           "OpenCLMMAWeightLayout", "OpenCLGemvMMALayout", "OpenCLGemvMMAScaleLayout", "OpenCLScaleLayout",
           "SPECS"]

# vim: foldmethod=marker
