"""A pixel shuffle: ONNX ``DepthToSpace`` in mode ``CRD`` (PyTorch's ``PixelShuffle``), with the map as data.

A conv whose output has ``C*b*b`` channels at ``(H, W)`` is read as ``C`` channels at ``(H*b, W*b)``: element
``(n, (c*b + i)*b + j, h, w)`` of the logical NCHW array lives at index ``[n][c][h*b + i][w*b + j]`` of the packed
one. A QConv node with ``depth_to_space=b`` writes its output this way (``qconv._ext._cpu.depth_to_space`` is the
native copy), which is also exactly a ``ConvTranspose`` whose kernel equals its stride ``b`` (see
:mod:`qconv.onnx.quantize`).

==========  =================  ========================================
axis        size               index of element (n, (c*b + i)*b + j, h, w)
==========  =================  ========================================
0           ``N``              ``n``
1           ``C``              ``c``
2           ``H*b``            ``h*b + i``
3           ``W*b``            ``w*b + j``
==========  =================  ========================================
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DepthToSpace:
    """A conv output of ``C*b*b`` channels at ``(H, W)`` as ``C`` channels at ``(H*b, W*b)``: ONNX
    ``DepthToSpace`` mode ``CRD``, ``b = block`` (a QConv node's ``depth_to_space``)."""

    block: int = 2

    def __post_init__(self):
        if isinstance(self.block, bool) or not isinstance(self.block, (int, np.integer)) or self.block < 1:
            raise ValueError(f"block must be an int >= 1, got {self.block!r}")

    def packed_shape(self, shape) -> tuple[int, int, int, int]:
        """``(N, C*b*b, H, W)`` -> ``(N, C, H*b, W*b)``; ValueError when the channels do not split."""
        n, cbb, h, w = (int(s) for s in shape)
        b = self.block
        if cbb % (b * b):
            raise ValueError(f"{cbb} channels do not split into blocks of {b}x{b}")
        return (n, cbb // (b * b), h * b, w * b)

    def pack_array(self, x: np.ndarray) -> np.ndarray:
        """``(N, C*b*b, H, W)`` -> ``(N, C, H*b, W*b)``, same dtype (values copied)."""
        x = np.asarray(x)
        if x.ndim != 4:
            raise ValueError(f"depth to space needs an (N, C*b*b, H, W) array, got shape {x.shape}")
        n, c, hb, wb = self.packed_shape(x.shape)
        b = self.block
        h, w = hb // b, wb // b
        return np.ascontiguousarray(x.reshape(n, c, b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c, hb, wb))

    def unpack_array(self, a: np.ndarray, shape) -> np.ndarray:
        """``(N, C, H*b, W*b)`` -> ``(N, C*b*b, H, W)``; ``shape`` is the logical ``(N, C*b*b, H, W)``."""
        a = np.asarray(a)
        if a.shape != self.packed_shape(shape):
            raise ValueError(f"the packed array of logical shape {tuple(shape)} has shape "
                             f"{self.packed_shape(shape)}, got {a.shape}")
        n, cbb, h, w = (int(s) for s in shape)
        b = self.block
        c = cbb // (b * b)
        return np.ascontiguousarray(a.reshape(n, c, h, b, w, b).transpose(0, 1, 3, 5, 2, 4).reshape(n, cbb, h, w))

    @classmethod
    def hypothesis_case(cls):
        """Strategy of ``(spec, x)``: blocks 1-4, float32 ``x`` with odd sizes."""
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.integers(1, 4)))
            shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)) * spec.block ** 2,
                     draw(st.integers(1, 7)), draw(st.integers(1, 9)))
            seed = draw(st.integers(0, 2**32 - 1))
            return spec, np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

        return case()
