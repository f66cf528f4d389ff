"""The numpy oracle: what every fast engine computes, written plainly.

Three steps, each exposed so engines can test their own parts against it:

1. :func:`quantize_activation` — dynamic int8 quantization of the float input (``"tensor"`` or ``"row"``).
2. :func:`integer_parts` — exact integer sums ``A`` (weights x inputs) and ``S`` (input sums) per block.
3. :func:`conv2d` — the float epilogue: ``y = sum_k dx*(s*A_k + a*S_k) + bias``, then the activation.

Padding taps contribute exactly zero (they are quantized zeros ``u = xq - z = 0``); MNN's padded-L
artefact (mnn-semantics 6.11) is deliberately not reproduced. Integer sums are computed with float64
BLAS on integer-valued operands, which is exact while ``|sum| < 2**53``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _validate as V
from .geometry import ConvSpec
from .weights import QuantizedWeight, round_half_away


@dataclass(frozen=True)
class ActQuant:
    """Quantized activations: ``x ~= (xq - zero[n]) * scale[n]``.

    ``xq``: int8, the shape of ``x``. ``scale``: float32 ``(1,)`` (tensor) or ``(N,)`` (row).
    ``zero``: int32, same shape as ``scale``. ``mode``: ``"tensor"`` or ``"row"``.
    """

    xq: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    mode: str

    def per_sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, zero)`` broadcast to ``(n,)``."""
        return (np.broadcast_to(self.scale, (n,)).astype(np.float32),
                np.broadcast_to(self.zero, (n,)).astype(np.int32))

    def dequantize(self) -> np.ndarray:
        n = self.xq.shape[0]
        s, z = self.per_sample(n)
        shape = (n,) + (1,) * (self.xq.ndim - 1)
        return ((self.xq.astype(np.float64) - z.reshape(shape)) * s.reshape(shape)).astype(np.float32)


def _usable(amax: np.ndarray) -> np.ndarray:
    """absmax values with a finite float32 ``127/amax`` (0 and tiny ranges quantize everything to 0)."""
    with np.errstate(over="ignore", divide="ignore"):
        return (amax > 0) & np.isfinite(np.float32(127.0) / np.where(amax > 0, amax, 1).astype(np.float32))


def quantize_activation(x, mode: str = "tensor") -> ActQuant:
    """Dynamic int8 quantization of float32 ``x`` (any shape with the batch first).

    ``"tensor"``: ``lo = min(min x, 0)``, ``hi = max(max x, 0)``; ``qs = 255/(hi-lo)``, ``dx = (hi-lo)/255``
    (float32), ``z = round(-lo*qs) - 128``; ``xq = clip(round(x*qs) + z, -128, 127)``. An all-zero input
    (or one so tiny that ``255/range`` overflows float32) gives ``qs = dx = 1, z = 0``.
    ``"row"``: per sample ``n``, ``a = max|x[n]|``, ``qs = 127/a``, ``dx = a/127``, ``xq = clip(round(x*qs), -127, 127)``,
    ``z = 0`` (``a == 0`` gives ``qs = dx = 1``).
    Rounding is half away from zero, applied to the float32 product ``x*qs`` before adding ``z``.
    """
    x = V.float_array(x, "x")
    V.check_choice(mode, "act_quant", ("tensor", "row"))
    if mode == "tensor":
        lo = min(float(x.min()), 0.0)
        hi = max(float(x.max()), 0.0)
        rng = np.float32(np.float32(hi) - np.float32(lo))
        with np.errstate(over="ignore", divide="ignore"):
            qs = np.float32(np.float32(255.0) / rng) if rng > 0 else np.float32(np.inf)
        if np.isfinite(qs):
            dx = np.float32(rng / np.float32(255.0))
            z = int(round_half_away(np.float32(-np.float32(lo)) * qs)) - 128
        else:  # range 0, or so tiny that 255/range overflows: everything quantizes to 0
            qs, dx, z = np.float32(1), np.float32(1), 0
        xq = np.clip(round_half_away(x * qs) + z, -128, 127).astype(np.int8)
        return ActQuant(xq, np.array([dx], np.float32), np.array([z], np.int32), "tensor")
    n = x.shape[0]
    amax = np.abs(x.reshape(n, -1)).max(axis=1).astype(np.float32)
    pos = _usable(amax)
    qs = np.where(pos, np.float32(127.0) / np.where(pos, amax, 1), 1).astype(np.float32)
    dx = np.where(pos, amax / np.float32(127.0), 1).astype(np.float32)
    shape = (n,) + (1,) * (x.ndim - 1)
    xq = np.clip(round_half_away(x * qs.reshape(shape)), -127, 127).astype(np.int8)
    return ActQuant(xq, dx, np.zeros(n, np.int32), "row")


def _spec(weight, bias, stride, padding, dilation, activation, act_quant, act_block=0, post_affine=None) -> ConvSpec:
    return ConvSpec(weight, bias, stride, padding, dilation, activation, act_quant, act_block, post_affine)


def _check_input(x, spec: ConvSpec, empty_batch: bool = False) -> np.ndarray:
    """``x`` as float32 NCHW with the weight's channel count; ``empty_batch``: ``N = 0`` is allowed."""
    x = V.float_array(x, "x", ndim=4, empty_ok=empty_batch)
    if x.shape[1] != spec.in_channels:
        raise ValueError(f"x has {x.shape[1]} channels but the weight expects {spec.in_channels} "
                         f"(x shape {x.shape})")
    if 0 in x.shape[1:]:
        raise ValueError(f"x must not be empty, got shape {x.shape}")
    return x


def _columns(u: np.ndarray, spec: ConvSpec) -> np.ndarray:
    """im2col: float64 ``(N, C, H, W)`` -> ``(N*OH*OW, groups, (C/groups)*kh*kw)`` in OIHW row order.

    Out-of-image taps are 0 (for quantized inputs ``u = xq - z``, a zero is an exact quantized zero).
    """
    n, c, h, w = u.shape
    kh, kw = spec.kernel_size
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    oh, ow = spec.out_hw(h, w)
    V.check_alloc(8 * n * oh * ow * c * kh * kw, "reference im2col buffer")
    up = np.pad(u, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((n, oh, ow, c, kh, kw), np.float64)
    for ky in range(kh):
        for kx in range(kw):
            ys, xs = ky * dh, kx * dw
            patch = up[:, :, ys: ys + sh * (oh - 1) + 1: sh, xs: xs + sw * (ow - 1) + 1: sw]
            cols[:, :, :, :, ky, kx] = patch.transpose(0, 2, 3, 1)
    g = spec.groups
    return cols.reshape(n * oh * ow, g, (c // g) * kh * kw)


def _weight_blocks(weight: QuantizedWeight, values: np.ndarray) -> np.ndarray:
    """``(O, ...)`` per-weight values -> ``(groups, n_blocks, block_len, O/groups)`` float64 for matmul."""
    g, nb, bl = weight.groups, weight.n_blocks, weight.block_len
    return values.reshape(g, weight.out_channels // g, nb, bl).transpose(0, 2, 3, 1).astype(np.float64)


def integer_parts(x, weight: QuantizedWeight, stride=1, padding=0, dilation=1, act_quant: str = "tensor"):
    """Exact integer sums of the quantized conv.

    Returns ``(A, S, aq)``: ``A`` int64 ``(N, O, OH, OW, n_blocks)`` = ``sum_{l in block} q[o,l] * u[l]``,
    ``S`` int64 ``(N, groups, OH, OW, n_blocks)`` = ``sum_{l in block} u[l]``, with ``u = xq - z`` and
    padding taps ``u = 0``; ``aq`` the :class:`ActQuant` of ``x``.
    """
    spec = _spec(weight, None, stride, padding, dilation, None, act_quant)
    if act_quant is None:
        raise ValueError("integer_parts needs act_quant='tensor' or 'row'")
    x = _check_input(x, spec)
    aq = quantize_activation(x, act_quant)
    n = x.shape[0]
    _, z = aq.per_sample(n)
    u = aq.xq.astype(np.float64) - z.reshape(n, 1, 1, 1)
    return (*_integer_sums(u, spec), aq)


def _integer_sums(u: np.ndarray, spec: ConvSpec):
    weight = spec.weight
    n = u.shape[0]
    oh, ow = spec.out_hw(u.shape[2], u.shape[3])
    g, nb, bl = weight.groups, weight.n_blocks, weight.block_len
    cols = _columns(u, spec).reshape(-1, g, nb, bl).transpose(1, 2, 0, 3)  # (G, nb, P, L)
    acc = np.matmul(cols, _weight_blocks(weight, weight.q))  # (G, nb, P, O/G)
    a = np.rint(acc).astype(np.int64).transpose(2, 0, 3, 1)  # (P, G, O/G, nb)
    a = a.reshape(n, oh, ow, weight.out_channels, nb).transpose(0, 3, 1, 2, 4)
    s = np.rint(cols.sum(axis=3)).astype(np.int64).transpose(2, 0, 1)  # (P, G, nb)
    s = s.reshape(n, oh, ow, g, nb).transpose(0, 3, 1, 2, 4)
    return np.ascontiguousarray(a), np.ascontiguousarray(s)


def apply_activation(y: np.ndarray, activation) -> np.ndarray:
    if activation == "relu":
        return np.maximum(y, 0)
    if activation == "relu6":
        return np.clip(y, 0, 6)
    if activation == "hardswish":   # float32 op by op, as PyTorch's x * relu6(x + 3) / 6
        y = np.asarray(y, np.float32)
        return (y * np.clip(y + np.float32(3), np.float32(0), np.float32(6))) / np.float32(6)
    if activation == "silu":   # v / (1 + exp(-v)) in float32 (the engines' exp is within 2 ulp of numpy's)
        y = np.asarray(y, np.float32)
        with np.errstate(over="ignore"):
            return y / (np.float32(1) + np.exp(-y))
    return y


def quantize_columns(cols: np.ndarray, block_len: int):
    """``act_quant="block"``: symmetric int8 per (column, block) of an im2col matrix.

    ``cols``: float ``(P, G, L)`` (L in OIHW row order, ``block_len`` consecutive values a block).
    Returns ``(vq int8 (P, G, L), dx float32 (P, G, L // block_len))`` with, per block, ``a = max|v|``,
    ``qs = 127/a``, ``dx = a/127`` (``a == 0``: ``qs = dx = 1``) and ``vq = round(float32(v*qs))``.
    """
    p, g, length = cols.shape
    v = cols.astype(np.float32).reshape(p, g, length // block_len, block_len)
    amax = np.abs(v).max(axis=3)
    pos = _usable(amax)
    qs = np.where(pos, np.float32(127.0) / np.where(pos, amax, 1), 1).astype(np.float32)
    dx = np.where(pos, amax / np.float32(127.0), 1).astype(np.float32)
    vq = np.clip(round_half_away(v * qs[..., None]), -127, 127).astype(np.int8)
    return vq.reshape(p, g, length), dx


def block_integer_parts(x, weight: QuantizedWeight, stride=1, padding=0, dilation=1, act_block: int = 0):
    """Integer parts of ``act_quant="block"``.

    Returns ``(A, S, dx)``: ``A`` int64 ``(N, O, OH, OW, n_fine)``, ``S`` int64 ``(N, G, OH, OW, n_fine)`` over
    the fine blocks (``ConvSpec.fine_block_channels`` channels x all taps) and ``dx`` float32
    ``(N, G, OH, OW, n_act_blocks)``.
    """
    spec = _spec(weight, None, stride, padding, dilation, None, "block", act_block)
    x = _check_input(x, spec)
    return _block_parts(x, spec)


def _block_parts(x, spec: ConvSpec):
    weight = spec.weight
    n = x.shape[0]
    oh, ow = spec.out_hw(x.shape[2], x.shape[3])
    g, o, taps = weight.groups, weight.out_channels, weight.taps
    cols = _columns(x.astype(np.float64), spec)  # (P, G, L)
    vq, dx = quantize_columns(cols, spec.act_block * taps)
    fine = spec.fine_block_channels * taps
    nf = cols.shape[2] // fine
    vf = vq.astype(np.float64).reshape(-1, g, nf, fine).transpose(1, 2, 0, 3)  # (G, nf, P, fine)
    wf = weight.q.reshape(g, o // g, nf, fine).transpose(0, 2, 3, 1).astype(np.float64)  # (G, nf, fine, O/G)
    a = np.rint(np.matmul(vf, wf)).astype(np.int64).transpose(2, 0, 3, 1)  # (P, G, O/G, nf)
    a = a.reshape(n, oh, ow, o, nf).transpose(0, 3, 1, 2, 4)
    s = np.rint(vf.sum(axis=3)).astype(np.int64).transpose(2, 0, 1).reshape(n, oh, ow, g, nf)
    dx = dx.reshape(n, oh, ow, g, -1).transpose(0, 3, 1, 2, 4)
    return np.ascontiguousarray(a), np.ascontiguousarray(s.transpose(0, 3, 1, 2, 4)), np.ascontiguousarray(dx)


def _block_epilogue(a, s, dx, spec: ConvSpec) -> np.ndarray:
    """float64 ``(N, O, OH, OW)``: ``sum_f dx[b(f)] * (scale[o, w(f)] * A_f + offset[o, w(f)] * S_f)``."""
    weight = spec.weight
    o, g = weight.out_channels, weight.groups
    nf = a.shape[-1]
    fine = spec.fine_block_channels
    w_of_f = np.arange(nf) * fine // weight.block_channels
    a_of_f = np.arange(nf) * fine // spec.act_block
    dxo = np.repeat(dx, o // g, axis=1)[..., a_of_f].astype(np.float64)
    y = (a * weight.scales.astype(np.float64)[:, w_of_f][None, :, None, None, :] * dxo).sum(axis=-1)
    if weight.offsets is not None:
        so = np.repeat(s, o // g, axis=1)
        y = y + (so * weight.offsets.astype(np.float64)[:, w_of_f][None, :, None, None, :] * dxo).sum(axis=-1)
    return y


def conv2d(x, weight: QuantizedWeight, bias=None, stride=1, padding=0, dilation=1, activation=None,
           act_quant: str | None = "tensor", act_block: int = 0, post_affine=None) -> np.ndarray:
    """Reference weight-quantized conv: float32 NCHW ``x`` -> float32 NCHW ``(N, O, OH, OW)``.

    ``act_quant``: ``"tensor"`` / ``"row"`` quantize ``x`` dynamically (see :func:`quantize_activation`) and
    use exact integer sums; ``"block"`` quantizes each im2col column per block of ``act_block`` input
    channels x all taps, symmetric (see :func:`quantize_columns`); ``None`` convolves the float input with
    ``weight.dequantize()`` in float64.
    Epilogue (float64): ``y = sum_k dx * (scale[o,k]*A_k + offset[o,k]*S_k) + bias``, then ``activation``, then
    (float32) ``y * scale + shift`` per output channel with ``post_affine=(scale, shift)``.
    An empty batch (``N = 0``) gives an empty ``(0, O, OH, OW)`` result.
    """
    spec = _spec(weight, bias, stride, padding, dilation, activation, act_quant, act_block, post_affine)
    x = _check_input(x, spec, empty_batch=True)
    n = x.shape[0]
    oh, ow = spec.out_hw(x.shape[2], x.shape[3])
    o, g = weight.out_channels, weight.groups
    if n == 0:
        return np.empty((0, o, oh, ow), np.float32)
    if act_quant == "block":
        y = _block_epilogue(*_block_parts(x, spec), spec)
    elif act_quant is None:
        cols = _columns(x.astype(np.float64), spec).transpose(1, 0, 2)  # (G, P, L)
        w = weight.dequantize(np.float64).reshape(g, o // g, -1).transpose(0, 2, 1)  # (G, L, O/G)
        y = np.matmul(cols, w).transpose(1, 0, 2).reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    else:
        aq = quantize_activation(x, act_quant)
        dx, z = aq.per_sample(n)
        u = aq.xq.astype(np.float64) - z.reshape(n, 1, 1, 1)
        a, s = _integer_sums(u, spec)
        s = np.repeat(s, o // g, axis=1)  # (N, O, OH, OW, nb): each output channel's group sums
        scales = weight.scales.astype(np.float64)[None, :, None, None, :]
        y = (a * scales).sum(axis=-1)
        if weight.offsets is not None:
            y = y + (s * weight.offsets.astype(np.float64)[None, :, None, None, :]).sum(axis=-1)
        y = y * dx.astype(np.float64).reshape(n, 1, 1, 1)
    y = y + spec.bias_or_zeros().astype(np.float64).reshape(1, o, 1, 1)
    y = apply_activation(y, activation).astype(np.float32)
    if spec.post_affine is not None:
        ps, pt = spec.post_affine
        y = y * ps.reshape(1, o, 1, 1) + pt.reshape(1, o, 1, 1)
    return np.ascontiguousarray(y)


def float_conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """Plain float conv (float64 accumulation) of float weights ``w (O, I/groups, kh, kw)``: the accuracy baseline."""
    w = V.float_array(w, "w", ndim=4)
    o = w.shape[0]
    fake = QuantizedWeight(np.zeros(w.shape, np.int8), np.ones((o, 1), np.float32), None, 8, 0, groups)
    spec = _spec(fake, bias, stride, padding, dilation, None, None)
    x = _check_input(x, spec)
    n = x.shape[0]
    oh, ow = spec.out_hw(x.shape[2], x.shape[3])
    cols = _columns(x.astype(np.float64), spec).transpose(1, 0, 2)
    wm = w.astype(np.float64).reshape(groups, o // groups, -1).transpose(0, 2, 1)
    y = np.matmul(cols, wm).transpose(1, 0, 2).reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    y = y + spec.bias_or_zeros().astype(np.float64).reshape(1, o, 1, 1)
    return np.ascontiguousarray(y.astype(np.float32))
