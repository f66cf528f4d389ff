"""Calibrated weight quantization on real layer inputs: GPTQ error feedback, and bias correction.

``quantize_weight_calibrated(w, x, ...)`` quantizes the weight columns (OIHW-flattened order, so a
block is a contiguous run of columns, as in :class:`~qconv.weights.QuantizedWeight`) one at a time and
spreads each column's rounding error over the columns not yet quantized, weighted by the inverse
Hessian ``H = X X^T`` of the layer's im2col inputs (Frantar et al., "GPTQ", 2022). Each block's scale and
offset are fixed when its first column is reached, from the error-updated weights (``minmax`` range by
default: a clipped ``mse`` range fixed before the updates clips the weights the updates move, which
measured worse on per-channel blocks). It minimises the layer's *output* error on the calibration input rather than the
weight error, so it needs real activations (``python -m qconv inspect`` captures them).

Cost: one ``K x K`` Cholesky (K = I/groups*kh*kw) per group and ``K`` rank-1 updates of ``O x K``.

``output_shift(w, qw, x, ...)`` is bias correction (Nagel et al., "Data-free quantization", 2019, empirical
form): the mean, over the calibration inputs' output pixels, of ``conv(x, w_deq - w)`` per output channel, the
systematic shift the weight rounding adds to the layer's output; subtracting it from the bias removes it.
"""
from __future__ import annotations

import numpy as np

from . import _validate as V
from . import reference
from .geometry import ConvSpec
from .weights import (METHODS, QuantizedWeight, _mse_range, _quantize_blocks, check_quantize_args, in_param_form,
                      scale_dtype_name)


def _columns(xs, out_channels: int, in_per_group: int, kernel, groups: int, stride, padding, dilation):
    """im2col ``(P, G, K)`` of every calibration input in ``xs`` (NCHW arrays, any spatial sizes) together."""
    fake = QuantizedWeight(np.zeros((out_channels, in_per_group) + tuple(kernel), np.int8),
                           np.ones((out_channels, 1), np.float32), None, 8, 0, groups)
    spec = ConvSpec(fake, None, stride, padding, dilation, None, None)
    cols = []
    for x in xs:
        x = V.float_array(x, "x", ndim=4)
        if x.shape[1] != in_per_group * groups:
            raise ValueError(f"x has {x.shape[1]} channels, the weight expects {in_per_group * groups}")
        cols.append(reference._columns(x.astype(np.float64), spec))
    return np.concatenate(cols) if len(cols) > 1 else cols[0]


def quantize_weight_calibrated(w, x, bits: int = 4, block_size: int = 0, symmetric: bool = False,
                               groups: int = 1, stride=1, padding=0, dilation=1, range_method: str = "minmax",
                               damp: float = 0.01, max_columns: int = 8192, scale_dtype="auto") -> QuantizedWeight:
    """GPTQ quantization of float ``w (O, I/groups, kh, kw)`` (or ``(O, K)``) calibrated on input ``x``
    (float NCHW, or ``(N, K)`` for a linear weight) of the conv with the given geometry; ``x`` may be a list
    of such inputs (several calibration images, sizes may differ): their im2col columns are pooled.

    ``range_method``: how each block's range is chosen (``"minmax"`` or ``"mse"``). ``damp``: diagonal
    damping of ``H`` as a fraction of its mean diagonal. ``max_columns``: im2col columns used (evenly
    subsampled beyond that). ``scale_dtype``: the stored form of the scales and offsets, as in
    :func:`~qconv.weights.quantize_weight` (default ``"auto"``: float16 values, fixed before the codes and the
    error feedback, unless one leaves the normal float16 range).
    """
    V.check_choice(range_method, "range_method", METHODS)
    form = scale_dtype_name(scale_dtype)
    linear = isinstance(w, np.ndarray) and w.ndim == 2
    w, bits, block_size, groups = check_quantize_args(w, bits, block_size, symmetric, groups)
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    if not xs:
        raise ValueError("x: give at least one calibration input")
    if linear:
        xs = [V.float_array(xi, "x", ndim=(2, 4)) for xi in xs]
        xs = [xi[:, :, None, None] if xi.ndim == 2 else xi for xi in xs]
    o, ipg = w.shape[0], w.shape[1]
    cols = _columns(xs, o, ipg, w.shape[2:], groups, stride, padding, dilation)
    if cols.shape[0] > max_columns:
        cols = cols[np.linspace(0, cols.shape[0] - 1, max_columns).astype(np.int64)]
    k = ipg * w.shape[2] * w.shape[3]
    block_len = (block_size or ipg) * w.shape[2] * w.shape[3]
    og = o // groups
    wg = w.reshape(groups, og, k).astype(np.float64)
    q, scales, offsets = in_param_form(
        form, lambda half: _gptq_groups(wg, cols, bits, block_len, bool(symmetric), range_method, damp, half))
    return QuantizedWeight(q.astype(np.int8).reshape(w.shape), scales, offsets, bits, block_size, groups)


def _hessian_inverse_factor(cols: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factors ``(G, K, K)`` of ``(X_g^T X_g + damping)^-1`` for im2col ``cols (P, G, K)``."""
    xg = cols.transpose(1, 0, 2)
    h = np.matmul(xg.transpose(0, 2, 1), xg)
    diag = h[:, np.arange(h.shape[1]), np.arange(h.shape[1])]            # (G, K) copy
    gi, ki = np.nonzero(diag == 0)
    h[gi, ki, ki] = 1.0
    mean = np.maximum(h[:, np.arange(h.shape[1]), np.arange(h.shape[1])].mean(axis=1), 1e-12)
    h[:, np.arange(h.shape[1]), np.arange(h.shape[1])] += damp * mean[:, None]
    hinv = np.linalg.inv(h)
    return np.linalg.cholesky((hinv + hinv.transpose(0, 2, 1)) / 2).transpose(0, 2, 1)


def _gptq_groups(w: np.ndarray, cols: np.ndarray, bits: int, block_len: int, symmetric: bool, range_method: str,
                 damp: float, half: bool):
    """GPTQ of ``w (G, O/G, K)`` float64 on ``cols (P, G, K)``, every group at once (a depthwise layer is one
    pass over its ``K`` columns, not ``G``). Returns ``(q (O, K), scales (O, nb), offsets or None)``."""
    g, og, k = w.shape
    w = w.copy()
    u = _hessian_inverse_factor(cols, damp)
    nb = k // block_len
    q = np.empty((g, og, k))
    scales = np.empty((g * og, nb), np.float32)
    offsets = None if symmetric else np.empty((g * og, nb), np.float32)
    for b in range(nb):
        sl = slice(b * block_len, (b + 1) * block_len)
        blk = w[:, :, sl].reshape(g * og, 1, block_len).astype(np.float32)
        if symmetric:
            lo, hi = None, np.abs(blk).max(axis=2)
        else:
            lo, hi = blk.min(axis=2), blk.max(axis=2)
        if range_method == "mse":
            lo, hi = _mse_range(blk, lo, hi, bits, symmetric, half)
        _, s, off = _quantize_blocks(blk, lo, hi, bits, symmetric, half)
        scales[:, b] = s[:, 0]
        if not symmetric:
            offsets[:, b] = off[:, 0]
        for i in range(sl.start, sl.stop):
            col = w[:, :, i].reshape(g * og, 1, 1).astype(np.float32)
            qi, _, _ = _quantize_blocks(col, lo, hi, bits, symmetric, half)
            q[:, :, i] = qi[:, 0, 0].reshape(g, og)
            deq = qi[:, 0, 0].astype(np.float32) * s[:, 0] + (0 if symmetric else off[:, 0])
            err = (w[:, :, i] - deq.reshape(g, og)) / u[:, i, i][:, None]
            w[:, :, i + 1:] -= err[:, :, None] * u[:, None, i, i + 1:]
    return q.reshape(g * og, k), scales, offsets


def output_shift(w, qw: QuantizedWeight, x, stride=1, padding=0, dilation=1) -> np.ndarray:
    """float64 ``(O,)``: per output channel, the mean over the output pixels of ``conv(x, qw.dequantize() - w)``.

    ``w``: the float weight ``(O, I/groups, kh, kw)`` (or ``(O, K)``) that ``qw`` quantizes; ``x``: float NCHW
    calibration input of the conv with the given geometry (``(N, K)`` for a linear weight), or a list of such
    inputs (sizes may differ; every output pixel counts once). The mean of an im2col column is taken tap by
    tap over strided views of the zero-padded input, so no im2col buffer is built. Bias correction is
    ``bias - output_shift(...)``.
    """
    linear = isinstance(w, np.ndarray) and w.ndim == 2
    w = V.float_array(w, "w", ndim=(2, 4))
    w = w[:, :, None, None] if w.ndim == 2 else w
    if w.shape != qw.q.shape:
        raise ValueError(f"w has shape {w.shape}, the quantized weight {qw.q.shape}")
    mean_cols = mean_columns(x, ConvSpec(qw, None, stride, padding, dilation, None, None), linear)
    g, o = qw.groups, qw.out_channels
    dw_ = (qw.dequantize(np.float64) - w.astype(np.float64)).reshape(g, o // g, -1)
    return (dw_ * mean_cols.reshape(g, 1, -1)).sum(axis=2).reshape(o)


def mean_columns(x, spec: ConvSpec, linear: bool = False) -> np.ndarray:
    """float64 ``(I, kh, kw)``: the mean im2col column of the conv ``spec`` over every output pixel of ``x``
    (float NCHW, ``(N, K)`` when ``linear``, or a list of such inputs; sizes may differ, every output pixel
    counts once). Taken tap by tap over strided views of the zero-padded input: no im2col buffer. The mean
    output of the conv is ``W . mean column`` per output channel (``W`` reshaped ``(G, O/G, I/G*kh*kw)``)."""
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    if not xs:
        raise ValueError("x: give at least one calibration input")
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    kh, kw = spec.kernel_size
    total, pixels = np.zeros((spec.in_channels, kh, kw)), 0
    for xi in xs:
        xi = V.float_array(xi, "x", ndim=(2, 4) if linear else 4)
        xi = xi[:, :, None, None] if xi.ndim == 2 else xi
        if xi.shape[1] != spec.in_channels:
            raise ValueError(f"x has {xi.shape[1]} channels, the weight expects {spec.in_channels}")
        oh, ow = spec.out_hw(xi.shape[2], xi.shape[3])
        up = np.pad(xi.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        for ky in range(kh):
            for kx in range(kw):
                ys, xs_ = ky * dh, kx * dw
                total[:, ky, kx] += up[:, :, ys: ys + sh * (oh - 1) + 1: sh, xs_: xs_ + sw * (ow - 1) + 1: sw].sum(
                    axis=(0, 2, 3))
        pixels += xi.shape[0] * oh * ow
    return total / pixels
