"""Squeeze-excitation blocks of the CPU session as one node (``ai.qconv::QFused`` with one input).

A block computes ``y = x * g`` with ``g = gate(f(GlobalAveragePool(x)))``: ``f`` 1x1 convs on one pixel (qconv nodes)
and elementwise ops, the gate a Sigmoid (EfficientNet) or HardSigmoid (MobileNetV3). As onnxruntime nodes that is a
GlobalAveragePool and a Mul over the whole NCHW tensor plus a call per small node: on EfficientNet-B0 (2 threads,
Zen 4, 2026-12-06) the 16 blocks' GlobalAveragePool and Mul took 3.0x and 1.8x the time of onnxruntime's own
NCHWc ones, and each conv on one pixel 25-40 us. :func:`find_blocks` finds the blocks; :class:`ExciteKernel`
runs one: the channel means and the scaling in native row loops (``qconv._ext._fused``: one pass over ``x`` each),
the middle on the ``(N, C)`` means natively too (``_fused.excite_gate``: 1x1 convs as products of their dequantized
weights, the elementwise ops), a node that is more than a 1x1 conv through its own kernel.

Each value is float32: the means and the products' sums are summed in the order ``qconv_fused.h`` states (not
onnxruntime's), Sigmoid is ``1 / (1 + exp(-v))``, the other ops as :mod:`qconv.onnx.fusion` computes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import wire
from .fusion import _constant_values, _params

#: elementwise ops between the pooling and the Mul (one input each; Clip with constant bounds)
UNARY = ("Identity", "Relu", "Sigmoid", "HardSigmoid", "HardSwish", "Clip")


@dataclass
class Block:
    """A squeeze-excitation block: node indices of its GlobalAveragePool, of the nodes between (graph order) and of
    its Mul; ``x`` the pooled (and scaled) value, ``output`` the Mul's; ``params``: middle elementwise node index ->
    ``(p0, p1)`` (:func:`qconv.onnx.fusion._params`; Sigmoid and Identity ``(0, 0)``)."""
    pool: int
    middle: list
    mul: int
    x: str
    output: str
    params: dict


def find_blocks(nodes, inits, graph_outputs, qconv_nodes) -> list:
    """The :class:`Block` s of a graph (``nodes``: :class:`wire.Node` in graph order; ``qconv_nodes``: indices of the
    qconv nodes the session prepared). A block's pooled value and every value between feed exactly one node and are no
    graph output; the Mul multiplies the pooled value ``x`` by the chain's end; at least one qconv node is between."""
    consts = _constant_values(nodes, inits)
    readers: dict = {}
    for i, n in enumerate(nodes):
        for v in n.input:
            if v:
                readers.setdefault(v, []).append(i)
    blocks = []
    for i, n in enumerate(nodes):
        if n.op_type != "GlobalAveragePool" or n.domain not in ("", "ai.onnx") or len(n.output) != 1:
            continue
        x, cur, middle, params = n.input[0], n.output[0], [], {}
        while cur not in graph_outputs and len(readers.get(cur, [])) == 1:
            k = readers[cur][0]
            m = nodes[k]
            if (m.op_type == "Mul" and m.domain in ("", "ai.onnx") and len(m.input) == 2
                    and sorted(m.input) == sorted([x, cur]) and x != cur):
                if any(j in qconv_nodes for j in middle):
                    blocks.append(Block(i, middle, k, x, m.output[0], params))
                break
            plain = m.domain in ("", "ai.onnx") and m.op_type in UNARY and len(m.output) == 1
            if plain:
                p = (0.0, 0.0) if m.op_type in ("Sigmoid", "Identity") else _params(m, consts)
                if p is None:
                    break
                params[k] = p[:2]
            if not (k in qconv_nodes or plain) or m.input[0] != cur:
                break
            middle.append(k)
            cur = m.output[0]
    return blocks


class ExciteKernel:
    """The prepared kernel of a squeeze-excitation block's ``QFused`` node: ``out_shape(shape)``, then
    ``kernel(x, y)`` (float32 ``(N, C, H, W)`` both). ``steps``: per middle node in order, ``(op, p0, p1)`` of an
    elementwise op or a 1x1 conv (:func:`_float_conv`), or a qconv node's prepared kernel
    (:class:`qconv.onnx.kernels.ConvKernel`)."""

    def __init__(self, steps: list, threads: int, name: str = ""):
        from .._ext import _fused

        self.name, self.steps, self.threads = name, steps, max(1, int(threads))
        self._fused = _fused
        # runs of steps for _fused.excite_gate (lists), between the qconv kernels of nodes that are more than that
        self._segments: list = []
        for step in steps:
            if not isinstance(step, tuple):
                self._segments.append(step)
                continue
            if not self._segments or not isinstance(self._segments[-1], list):
                self._segments.append([])
            op, p0, p1 = step
            if op == "Conv":
                (w, b), (act, pa) = p0, p1
                self._segments[-1].append(("Conv", np.ascontiguousarray(w.T), b, _fused.GATE_ACTS[act],
                                           *(pa if pa is not None else (None, None))))
            else:
                self._segments[-1].append((_fused.GATE_OPS[op], float(p0), float(p1)))

    def out_shape(self, shape) -> tuple:
        shape = tuple(shape)
        if len(shape) < 3:
            raise ValueError(f"squeeze-excitation node {self.name!r}: the input must be (N, C, ...), got {shape}")
        return shape

    def gate(self, means: np.ndarray) -> np.ndarray:
        """``g`` (float32 ``(N, C, 1, 1)``) of the channel means ``(N, C, 1, 1)``: the middle nodes in order."""
        n = means.shape[0]
        v = np.ascontiguousarray(means, np.float32).reshape(n, -1)
        for seg in self._segments:
            if isinstance(seg, list):
                v = self._fused.excite_gate(v, seg)
                continue
            x = np.ascontiguousarray(v.reshape(n, -1, 1, 1))
            v = seg(x, np.empty(seg.out_shape(x.shape), np.float32)).reshape(n, -1)
        return v.reshape(n, -1, 1, 1)

    def native(self, shape):
        """The call on a float32 NCHW input of ``shape`` as a :class:`qconv._ext._cpu.NativeCall` that the custom
        operator runs without Python (``_fused.excite_native``: the same native passes and gate), or None: when a
        middle node is a qconv kernel, or for other ranks."""
        if len(shape) != 4 or len(self._segments) != 1 or not isinstance(self._segments[0], list):
            return None
        self._native = self._fused.excite_native(tuple(shape), self._segments[0], self.threads)
        return self._native

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        n, c = x.shape[:2]
        if x.ndim != 4 or not x.size:   # other ranks (and empty planes): numpy, one op at a time
            m = x.mean(axis=tuple(range(2, x.ndim)), dtype=np.float32, keepdims=True)
            y[...] = x * self.gate(m.reshape(n, c, 1, 1)).reshape(m.shape)
            return y
        x = np.ascontiguousarray(x, np.float32)
        means = np.empty((n, c), np.float32)
        self._fused.channel_means(x, means, self.threads)
        if not np.isfinite(means).all():
            raise ValueError(f"squeeze-excitation node {self.name!r}: x contains NaN or infinite values")
        g = self.gate(means.reshape(n, c, 1, 1))
        if g.shape != (n, c, 1, 1):
            raise ValueError(f"squeeze-excitation node {self.name!r}: the gate has shape {g.shape}, want {(n, c, 1, 1)}")
        self._fused.scale_channels(x, np.ascontiguousarray(g.reshape(n, c)), y, self.threads)
        return y


def _float_conv(kernel):
    """``("Conv", (weight (O, C), bias), (activation, post_affine))``: a qconv node's 1x1 conv on one pixel as a
    float32 matrix-vector product of its dequantized weight (float activations: the oracle's ``act_quant=None``),
    or None for a node that is more than that (a larger kernel, groups, padding, a depth-to-space output, an
    activation the gate does not take)."""
    spec = getattr(getattr(kernel, "layer", None), "spec", None)
    if (spec is None or spec.kernel_size != (1, 1) or spec.groups != 1 or spec.padding != (0, 0)
            or getattr(kernel, "block", 1) != 1 or any(getattr(kernel, "extra_pad", ())) or kernel.host_affine
            or spec.activation not in ("relu", "relu6", "hardswish", "silu", None)):
        return None
    w = np.ascontiguousarray(spec.weight.dequantize().reshape(spec.weight.q.shape[0], -1), np.float32)
    pa = spec.post_affine
    pa = None if pa is None else (np.asarray(pa[0], np.float32), np.asarray(pa[1], np.float32))
    return "Conv", (w, spec.bias_or_zeros().astype(np.float32)), (spec.activation, pa)


def excite(nodes, inits, graph_outputs, key_prefix: str, threads: int, qconv_keys: dict, kernels: dict):
    """``(replace, drop, kernels)`` for :func:`qconv.onnx.session._runtime_graph`: node index -> the ``QFused``
    NodeProto bytes that replaces a block's Mul, the indices of its other nodes (dropped: the qconv nodes' kernels
    run inside the block's), and ``{key: ExciteKernel}``. ``qconv_keys``: qconv node index -> its kernel's key in
    ``kernels``."""
    from .._ext._ortops import KEY_ATTR
    from .nodes import DOMAIN

    replace, drop, out = {}, set(), {}
    for b in find_blocks(nodes, inits, graph_outputs, set(qconv_keys)):
        steps = []
        for k in b.middle:
            if k in qconv_keys:
                kern = kernels[qconv_keys[k]]
                steps.append(_float_conv(kern) or kern)
            elif nodes[k].op_type != "Identity":
                steps.append((nodes[k].op_type,) + tuple(b.params[k]))
        mul = nodes[b.mul]
        name = f"qconv.excite/{mul.name or b.output}"
        key = f"{key_prefix}/{name}"
        out[key] = ExciteKernel(steps, threads, name)
        replace[b.mul] = wire.make_node("QFused", [b.x], [b.output], name, DOMAIN, {KEY_ATTR: key})
        drop.update([b.pool] + b.middle)
    return replace, drop, out
