"""NC4HW4 activations: MNN's CPU channel-packed layout, with the pack as data.

Element ``(n, c, h, w)`` of an NCHW tensor lives at index ``[c // P][n][h][w][c % P]`` of an array of
shape ``(ceil(C/P), N, H, W, P)``; channels ``c >= C`` of the last block are padding lanes, always zero.
Note the batch sits inside the channel-block loop (``srcZStep = H*W*P*N``).

==========  ===============================  =====================================
axis        size                             index of element (n, c, h, w)
==========  ===============================  =====================================
0           ``ceil(C/P)``                    ``c // P``
1           ``N``                            ``n``
2, 3        ``H``, ``W``                     ``h``, ``w``
4           ``P`` (4 ... 32)                 ``c % P``
==========  ===============================  =====================================
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PACKS = (4, 8, 16, 32)  # 32: the int8 activations of the OpenCL tensor-core kernel (conv_mma)


def _channels(shape) -> int:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        return int(shape)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if len(dims) != 4 or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise ValueError(f"shape must be (N, C, H, W) or the channel count, got {shape!r}")
    return int(dims[1])


@dataclass(frozen=True)
class NC4HW4:
    """Activations ``[ceil(C/P)][N][H][W][P]``, ``P = pack`` in 4, 8, 16, 32: MNN's CPU layout (batch inside
    the channel blocks, padding lanes zero); the public ``layout="nc4hw4"`` uses P = 4, ``conv_mma``'s int8
    activations P = 32."""

    pack: int = 4

    def __post_init__(self):
        if self.pack not in PACKS:
            raise ValueError(f"pack must be one of {PACKS}, got {self.pack!r}")

    def packed_shape(self, shape) -> tuple[int, int, int, int, int]:
        n, c, h, w = (int(s) for s in shape)
        return (-(-c // self.pack), n, h, w, self.pack)

    def pack_array(self, x: np.ndarray) -> np.ndarray:
        """NCHW ``(N, C, H, W)`` -> ``(ceil(C/P), N, H, W, P)``, same dtype, padding lanes zero."""
        x = np.asarray(x)
        if x.ndim != 4:
            raise ValueError(f"NC4HW4 packing needs an (N, C, H, W) array, got shape {x.shape}")
        n, c, h, w = x.shape
        cb, p = -(-c // self.pack), self.pack
        out = np.zeros((cb * p, n, h, w), dtype=x.dtype)
        out[:c] = x.transpose(1, 0, 2, 3)
        return np.ascontiguousarray(out.reshape(cb, p, n, h, w).transpose(0, 2, 3, 4, 1))

    def unpack_array(self, a: np.ndarray, shape) -> np.ndarray:
        """``(ceil(C/P), N, H, W, P)`` -> NCHW ``(N, C, H, W)``; ``shape`` is ``(N, C, H, W)`` or just ``C``."""
        a = np.asarray(a)
        channels = _channels(shape)
        if a.ndim != 5 or a.shape[4] != self.pack:
            raise ValueError(f"NC4HW4 (pack {self.pack}) data must have shape (ceil(C/{self.pack}), N, H, W, "
                             f"{self.pack}), got {a.shape}")
        if not 0 <= channels <= a.shape[0] * self.pack or -(-channels // self.pack) != a.shape[0]:
            raise ValueError(f"channels={channels} does not match {a.shape[0]} channel blocks of {self.pack}")
        cb, n, h, w, p = a.shape
        x = a.transpose(0, 4, 1, 2, 3).reshape(cb * p, n, h, w)[:channels]
        return np.ascontiguousarray(x.transpose(1, 0, 2, 3))

    @classmethod
    def hypothesis_case(cls):
        """Strategy of ``(spec, x)``: every pack, float32 NCHW ``x`` with odd/prime sizes."""
        from hypothesis import strategies as st

        @st.composite
        def case(draw):
            spec = cls(draw(st.sampled_from(PACKS)))
            shape = tuple(draw(st.integers(1, m)) for m in (3, 37, 5, 6))
            seed = draw(st.integers(0, 2**32 - 1))
            return spec, np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

        return case()

