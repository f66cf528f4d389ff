"""Hypothesis strategies for quantized convolution (one source of test strategy for qconv and its users).

All strategies are shrink-friendly: sizes shrink toward small values, random tensors come from a
drawn integer seed (which shrinks toward 0), and choices toward their first option.

Bounds (defaults; each is a keyword argument):

* ``conv_geometries``: N 1..3, channels per group 1..``max_channels`` (biased to odd/prime counts),
  kernel 1..``max_kernel`` (7), stride 1..3, padding 0..3, dilation 1..3, groups 1..3 when
  ``groups=True``, spatial size 1..``max_spatial`` but always large enough for an output >= 1.
* ``quant_schemes(in_channels=DEFAULT_IN_CHANNELS)``: bits 4/8, block size a divisor of ``in_channels``
  (or 0; ``block_filter`` keeps only the sizes an engine accepts), sym/asym.
* ``activations``: random normal; about one input in :data:`CONSTANT_ODDS` is constant (0.0 is one of its
  four values): a constant input hides permuted channels or pixels and an all-zero one passes an engine that
  returns zeros, so they are rare here and tested on purpose (``constant=True``; qconv's own
  ``tests/test_constant_inputs.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from ..weights import QuantizedWeight, quantize_weight

# Sizes biased toward the awkward ones: primes, odd counts, 1, and pack/tile edges.
EDGE_COUNTS = (1, 3, 5, 7, 11, 13, 17, 2, 4, 8, 16, 31, 32, 33)

# quant_schemes() without a channel count: 64 has divisors 1..32 (blocks of 2, 4, 8, 16, 32 for every engine).
DEFAULT_IN_CHANNELS = 64

# activations(constant=None): one in CONSTANT_ODDS inputs is constant.
CONSTANT_ODDS = 32


@dataclass(frozen=True)
class ConvGeometry:
    """One valid conv problem: input ``(n, c, h, w)``, weight ``(o, c/groups, *kernel)``."""

    n: int
    c: int
    o: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int = 1

    @property
    def in_per_group(self) -> int:
        return self.c // self.groups

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((s + 2 * p - d * (k - 1) - 1) // st_ + 1 for s, k, st_, p, d in
                     zip((self.h, self.w), self.kernel, self.stride, self.padding, self.dilation))

    def conv_kwargs(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation)


def _count(max_value: int):
    edges = [c for c in EDGE_COUNTS if c <= max_value]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_value))


@st.composite
def conv_geometries(draw, max_channels: int = 24, max_out_channels: int = 24, max_spatial: int = 12,
                    max_kernel: int = 7, max_stride: int = 3, max_padding: int = 3, max_dilation: int = 3,
                    max_batch: int = 3, groups: bool = False, square: bool = False,
                    pointwise: bool = False) -> ConvGeometry:
    """Valid conv geometries. ``pointwise=True`` gives 1x1 stride-1 unpadded convs."""
    g = draw(st.integers(1, 3)) if groups else 1
    cpg = draw(_count(max(1, max_channels // g)))
    opg = draw(_count(max(1, max_out_channels // g)))
    n = draw(st.integers(1, max_batch))
    dims = []
    for axis in range(1 if square else 2):
        if pointwise:
            k, s, p, d = 1, 1, 0, 1
        else:
            k = draw(st.integers(1, max_kernel))
            s = draw(st.integers(1, max_stride))
            p = draw(st.integers(0, min(max_padding, k - 1) if k > 1 else 0))
            d = draw(st.integers(1, max_dilation)) if k > 1 else 1
        span = d * (k - 1) + 1
        lo = max(1, span - 2 * p)
        size = draw(st.integers(lo, max(lo, max_spatial)))
        dims.append((k, s, p, d, size))
    if square:
        dims = dims * 2
    (kh, sh, ph, dh, h), (kw, sw, pw, dw, w) = dims
    return ConvGeometry(n, cpg * g, opg * g, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw), g)


@st.composite
def quant_schemes(draw, in_channels: int = DEFAULT_IN_CHANNELS, bits=(8, 4), blocks: bool = True,
                  block_filter=None) -> dict:
    """``dict(bits, block_size, symmetric)`` valid for ``in_channels`` input channels per group
    (default :data:`DEFAULT_IN_CHANNELS`, for a test that only wants "a scheme").

    ``block_filter``: a predicate on block sizes; only the divisors it accepts are drawn (per channel,
    ``block_size=0``, is always possible), e.g. ``lambda b: b % 4 == 0`` for an engine that needs scale
    blocks of a multiple of 4 channels."""
    if isinstance(in_channels, bool) or not isinstance(in_channels, (int, np.integer)) or in_channels < 1:
        raise ValueError(f"in_channels must be a positive int, got {in_channels!r}")
    in_channels = int(in_channels)
    divisors = [d for d in range(1, in_channels + 1) if in_channels % d == 0 and d < in_channels
                and (block_filter is None or block_filter(d))]
    block = draw(st.sampled_from([0] + divisors)) if blocks and divisors else 0
    return dict(bits=draw(st.sampled_from(list(bits))), block_size=block, symmetric=draw(st.booleans()))


def _rng(draw):
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


@st.composite
def float_weights(draw, shape) -> np.ndarray:
    """float32 weights: normal, with some rows scaled, occasional zero or constant blocks."""
    rng = _rng(draw)
    kind = draw(st.sampled_from(["normal", "scaled_rows", "zero_row", "constant_row", "positive"]))
    w = rng.standard_normal(shape).astype(np.float32)
    if kind == "scaled_rows":
        w *= (10.0 ** rng.uniform(-3, 2, size=(shape[0],) + (1,) * (len(shape) - 1))).astype(np.float32)
    elif kind == "zero_row":
        w[0] = 0
    elif kind == "constant_row":
        w[0] = np.float32(0.37)
    elif kind == "positive":
        w = np.abs(w) + np.float32(0.5)
    return w


@st.composite
def quantized_weights(draw, geometry: ConvGeometry | None = None, bits=(8, 4),
                      blocks: bool = True, block_filter=None) -> QuantizedWeight:
    """A :class:`QuantizedWeight` for ``geometry`` (drawn when None) under a drawn scheme, in
    ``quantize_weight``'s default stored form (float16 scales and offsets when they fit, the engines' compact
    tables) or, one in four, with float32 ones (``scale_dtype="float32"``); an asymmetric one is, one in three,
    in the integer zero-point form (``zero_point=True``, the default scheme ``int8-ch-zp``'s grid).
    ``block_filter``: see :func:`quant_schemes`."""
    if geometry is None:
        geometry = draw(conv_geometries())
    scheme = draw(quant_schemes(geometry.in_per_group, bits=bits, blocks=blocks, block_filter=block_filter))
    w = draw(float_weights((geometry.o, geometry.in_per_group) + tuple(geometry.kernel)))
    scale_dtype = "float32" if draw(st.integers(0, 3)) == 0 else "auto"
    zero_point = not scheme["symmetric"] and draw(st.integers(0, 2)) == 0
    return quantize_weight(w, groups=geometry.groups, scale_dtype=scale_dtype, zero_point=zero_point, **scheme)


@st.composite
def activations(draw, shape, outliers: bool | None = None, constant: bool | None = None,
                negative: bool | None = None) -> np.ndarray:
    """float32 activations of ``shape``. Each option: True forces it, False forbids it, None lets
    hypothesis choose. ``outliers``: a few channels x1000; ``constant``: one value everywhere (with None:
    one input in :data:`CONSTANT_ODDS`; shrinking moves away from constant inputs); ``negative``: all
    values < 0."""
    rng = _rng(draw)
    pick = lambda flag: draw(st.booleans()) if flag is None else flag  # noqa: E731
    if constant is None:
        constant = draw(st.integers(0, CONSTANT_ODDS - 1)) == CONSTANT_ODDS - 1
    if constant:
        return np.full(shape, np.float32(draw(st.sampled_from([0.0, 1.5, -2.25, 3.7]))), np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    if pick(negative):
        x = -np.abs(x) - np.float32(0.1)
    if pick(outliers) and len(shape) >= 2 and shape[1] > 1:
        chans = rng.choice(shape[1], size=max(1, shape[1] // 8), replace=False)
        x[:, chans] *= np.float32(1000)
    return x


@st.composite
def conv_problems(draw, max_channels: int = 20, max_out_channels: int = 40, **geometry_kwargs):
    """``(geometry, weight, x, bias, activation)``: a whole conv problem for engine tests — a
    :func:`conv_geometries` draw (grouped included, spatial up to 10), its :func:`quantized_weights`, NCHW
    :func:`activations`, a float32 ``(O,)`` bias or None, and ``activation`` None / ``"relu"`` / ``"relu6"`` / ``"hardswish"`` / ``"silu"``."""
    geo = draw(conv_geometries(groups=True, max_spatial=10, max_channels=max_channels,
                               max_out_channels=max_out_channels, **geometry_kwargs))
    weight = draw(quantized_weights(geo))
    x = draw(activations((geo.n, geo.c, geo.h, geo.w)))
    bias = _rng(draw).standard_normal(geo.o).astype(np.float32) if draw(st.booleans()) else None
    return geo, weight, x, bias, draw(st.sampled_from([None, "relu", "relu6", "hardswish", "silu"]))


@st.composite
def layout_cases(draw):
    """``(spec, x)`` pairs for every layout in :mod:`qconv.layouts`, ``x`` in the spec's logical form."""
    from ..layouts import all_specs

    classes = all_specs()
    cls = draw(st.sampled_from(classes))
    return draw(cls.hypothesis_case())


def layout_specs():
    """Layout spec instances of every layout class (spec only; see :func:`layout_cases` for data)."""
    return layout_cases().map(lambda case: case[0])
