"""``ConvSpec``: a validated description of one weight-quantized convolution.

Engines are built from a ``ConvSpec``; the oracle takes the same fields as keyword arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _validate as V
from .weights import QuantizedWeight

ACT_QUANT_MODES = ("tensor", "row", "block", None)


@dataclass(frozen=True, eq=False)
class ConvSpec:
    """Weight, bias and hyper-parameters of a conv.

    ``weight``: :class:`~qconv.weights.QuantizedWeight` ``(O, I/groups, kh, kw)``; ``bias``: float32 ``(O,)``
    or None; ``stride``/``padding``/``dilation``: ``(h, w)`` pairs (padding is applied on both sides);
    ``activation``: None, ``"relu"``, ``"relu6"``, ``"hardswish"`` (``(v * min(max(v + 3, 0), 6)) / 6``, float32
    op by op) or ``"silu"`` (``v / (1 + exp(-v))``, ``x * sigmoid(x)``: YOLO's SiLU; float32, exp within 2 ulp of
    numpy's); ``act_quant``: ``"tensor"``, ``"row"``, ``"block"`` or None;
    ``act_block``: input channels per activation block of ``act_quant="block"`` (0 = the weight's
    ``block_channels``); it must divide the input channels per group and either divide or be a multiple
    of the weight's block channels. ``post_affine``: None or ``(scale, shift)``, float32 ``(O,)`` each: the
    output is ``y * scale + shift`` after the activation, per output channel (a multiply, then an add, in float32),
    as an ONNX ``Mul`` / ``Add`` by constants after a fused activation.
    """

    weight: QuantizedWeight
    bias: np.ndarray | None = None
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    activation: str | None = None
    act_quant: str | None = "tensor"
    act_block: int = 0
    post_affine: tuple | None = None

    def __post_init__(self):
        if not isinstance(self.weight, QuantizedWeight):
            raise TypeError(f"weight must be a qconv.QuantizedWeight, got {type(self.weight).__name__} "
                            "(use qconv.quantize_weight to make one)")
        object.__setattr__(self, "stride", V.as_pair(self.stride, "stride", minimum=1))
        object.__setattr__(self, "padding", V.as_pair(self.padding, "padding", minimum=0))
        object.__setattr__(self, "dilation", V.as_pair(self.dilation, "dilation", minimum=1))
        V.check_choice(self.activation, "activation", V.ACTIVATIONS)
        V.check_choice(self.act_quant, "act_quant", ACT_QUANT_MODES)
        ab = V.check_int(self.act_block, "act_block", minimum=0) or self.weight.block_channels
        ipg, wb = self.weight.q.shape[1], self.weight.block_channels
        if ipg % ab or (wb % ab and ab % wb):
            raise ValueError(f"act_block={self.act_block} must divide the {ipg} input channels per group and "
                             f"divide or be a multiple of the weight block ({wb} channels)")
        object.__setattr__(self, "act_block", ab)
        if self.bias is not None:
            bias = V.float_array(self.bias, "bias", ndim=1)
            if bias.shape != (self.weight.out_channels,):
                raise ValueError(f"bias must have shape ({self.weight.out_channels},), got {bias.shape}")
            bias.setflags(write=False)
            object.__setattr__(self, "bias", bias)
        if self.post_affine is not None:
            pa = self.post_affine
            if not isinstance(pa, (tuple, list)) or len(pa) != 2:
                raise TypeError("post_affine must be None or a (scale, shift) pair")
            o = self.weight.out_channels
            arrs = []
            for name, a in zip(("scale", "shift"), pa):
                a = V.float_array(a, f"post_affine {name}", ndim=1)
                if a.shape != (o,):
                    raise ValueError(f"post_affine {name} must have shape ({o},), got {a.shape}")
                a = np.ascontiguousarray(a, np.float32)
                a.setflags(write=False)
                arrs.append(a)
            object.__setattr__(self, "post_affine", tuple(arrs))

    @property
    def groups(self) -> int:
        return self.weight.groups

    @property
    def in_channels(self) -> int:
        return self.weight.in_channels

    @property
    def out_channels(self) -> int:
        return self.weight.out_channels

    @property
    def kernel_size(self) -> tuple[int, int]:
        return self.weight.kernel_size

    @property
    def is_pointwise(self) -> bool:
        """1x1 kernel, stride 1, no padding, dilation 1 (a GEMM over pixels)."""
        return (self.kernel_size == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)
                and self.dilation == (1, 1))

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        """Output ``(OH, OW)`` for an ``h x w`` input; ``ValueError`` when either would be <= 0."""
        cache = self.__dict__.setdefault("_out_hw_cache", {})   # on the per-call path of small layers
        hw = cache.get((h, w))
        if hw is None:
            hw = cache[(h, w)] = self._out_hw(h, w)
            if len(cache) > 64:
                cache.pop(next(iter(cache)))
        return hw

    def _out_hw(self, h: int, w: int) -> tuple[int, int]:
        out = []
        for size, k, s, p, d, name in zip((h, w), self.kernel_size, self.stride, self.padding, self.dilation,
                                          ("height", "width")):
            span = d * (k - 1) + 1
            o = (size + 2 * p - span) // s + 1
            if o <= 0:
                raise ValueError(f"output {name} would be {o} <= 0: input {name} {size}, padding {p}, "
                                 f"dilated kernel {span}, stride {s}")
            out.append(o)
        return out[0], out[1]

    @property
    def fine_block_channels(self) -> int:
        """Channels of the finest common block of weights and activations (integer sums run over these)."""
        return min(self.act_block, self.weight.block_channels)

    def bias_or_zeros(self) -> np.ndarray:
        return self.bias if self.bias is not None else np.zeros(self.out_channels, np.float32)
