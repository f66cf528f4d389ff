"""Calibrated weight quantization: GPTQ-style error feedback using real layer inputs.

``quantize_weight_calibrated(w, x, ...)`` quantizes the weight columns (OIHW-flattened order, so a
block is a contiguous run of columns, as in :class:`~qconv.weights.QuantizedWeight`) one at a time and
spreads each column's rounding error over the columns not yet quantized, weighted by the inverse
Hessian ``H = X X^T`` of the layer's im2col inputs (Frantar et al., "GPTQ", 2022). Each block's scale and
offset are fixed when its first column is reached, from the error-updated weights (``minmax`` range by
default: a clipped ``mse`` range fixed before the updates clips the weights the updates move, which
measured worse on per-channel blocks). It minimises the layer's *output* error on the calibration input rather than the
weight error, so it needs real activations (``python -m qconv inspect`` captures them).

Cost: one ``K x K`` Cholesky (K = I/groups*kh*kw) per group and ``K`` rank-1 updates of ``O x K``.
"""
from __future__ import annotations

import numpy as np

from . import _validate as V
from . import reference
from .geometry import ConvSpec
from .weights import METHODS, QuantizedWeight, _mse_range, _quantize_blocks, check_quantize_args


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
                               damp: float = 0.01, max_columns: int = 8192) -> QuantizedWeight:
    """GPTQ quantization of float ``w (O, I/groups, kh, kw)`` (or ``(O, K)``) calibrated on input ``x``
    (float NCHW, or ``(N, K)`` for a linear weight) of the conv with the given geometry; ``x`` may be a list
    of such inputs (several calibration images, sizes may differ): their im2col columns are pooled.

    ``range_method``: how each block's range is chosen (``"minmax"`` or ``"mse"``). ``damp``: diagonal
    damping of ``H`` as a fraction of its mean diagonal. ``max_columns``: im2col columns used (evenly
    subsampled beyond that).
    """
    V.check_choice(range_method, "range_method", METHODS)
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
    nb = k // block_len
    og = o // groups
    q = np.empty((o, k), np.float64)
    scales = np.empty((o, nb), np.float32)
    offsets = None if symmetric else np.empty((o, nb), np.float32)
    for g in range(groups):
        rows = slice(g * og, (g + 1) * og)
        wg = w.reshape(o, k)[rows].astype(np.float64)
        qg, sg, og_ = _gptq_group(wg, cols[:, g, :], bits, block_len, bool(symmetric), range_method, damp)
        q[rows], scales[rows] = qg, sg
        if offsets is not None:
            offsets[rows] = og_
    return QuantizedWeight(q.astype(np.int8).reshape(w.shape), scales, offsets, bits, block_size, groups)


def _hessian_inverse_factor(cols: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor of ``(X^T X + damping)^-1`` for im2col ``cols (P, K)``."""
    h = cols.T @ cols
    diag = np.diag(h).copy()
    dead = diag == 0
    h[dead, dead] = 1.0
    h[np.diag_indices_from(h)] += damp * max(float(np.mean(np.diag(h))), 1e-12)
    hinv = np.linalg.inv(h)
    return np.linalg.cholesky((hinv + hinv.T) / 2).T


def _gptq_group(w: np.ndarray, cols: np.ndarray, bits: int, block_len: int, symmetric: bool, range_method: str,
                damp: float):
    o, k = w.shape
    w = w.copy()
    u = _hessian_inverse_factor(cols, damp)
    nb = k // block_len
    q = np.empty((o, k))
    scales = np.empty((o, nb), np.float32)
    offsets = np.empty((o, nb), np.float32)
    for b in range(nb):
        sl = slice(b * block_len, (b + 1) * block_len)
        blk = w[:, sl].astype(np.float32)[:, None, :]
        if symmetric:
            lo, hi = None, np.abs(blk).max(axis=2)
        else:
            lo, hi = blk.min(axis=2), blk.max(axis=2)
        if range_method == "mse":
            lo, hi = _mse_range(blk, lo, hi, bits, symmetric)
        _, s, off = _quantize_blocks(blk, lo, hi, bits, symmetric)
        scales[:, b] = s[:, 0]
        if not symmetric:
            offsets[:, b] = off[:, 0]
        for i in range(sl.start, sl.stop):
            col = w[:, i].astype(np.float32)[:, None, None]
            qi, _, _ = _quantize_blocks(col, lo, hi, bits, symmetric)
            q[:, i] = qi[:, 0, 0]
            deq = qi[:, 0, 0].astype(np.float32) * s[:, 0] + (0 if symmetric else off[:, 0])
            err = (w[:, i] - deq) / u[i, i]
            w[:, i + 1:] -= np.outer(err, u[i, i + 1:])
    return q, scales, (None if symmetric else offsets)
