"""Activation smoothing: move each conv input's channel range into the conv's weight, so that int8 activations
lose less (SmoothQuant, Xiao et al. 2023, applied to convs and folded offline).

A conv ``y = W * x`` whose input ``x`` has channels of very different ranges quantizes ``x`` per tensor badly: the
widest channel sets the step of all. With a per-input-channel factor ``s`` (``(C,)``, positive),
``y = (W diag(s)) * (x / s)`` exactly; the factor ``s_c = max|x_c|^alpha / max|W_c|^(1 - alpha)`` evens the
channels of ``x / s`` (``max|x_c|`` over calibration inputs, ``max|W_c|`` over the weight's outputs and taps of
input channel ``c``; ``alpha = 0.5`` shares the difficulty between weights and activations).

:func:`smooth_model` rewrites the float model: the consumer's weight becomes ``W diag(s)`` and a ``Mul`` by
``1 / s`` is inserted on its input. The rewrite is made only where ``quantize_model`` folds that ``Mul`` into the
producing layer (its bias and weight rows when no activation follows it, else its ``post_affine``), so the
quantized model has no extra node and runs at the same cost: the edge must be a conv layer's fused output
(through per-channel affine ops and one fusable activation) feeding the consumer alone. Where the fold does not
happen, :func:`smooth_model`'s caller (``quantize_model(smooth=...)``) drops that edge's smoothing and says so.
The float model stays the same function up to float32 rounding (``tests/test_onnx_smooth.py``).
"""
from __future__ import annotations

import numpy as np

#: Name prefix of the inserted ``Mul`` nodes and their constants (``quantize_model`` checks none survives).
PREFIX = "qconv.smooth/"
#: SmoothQuant's migration strength: the share of the activation range moved into the weights.
DEFAULT_ALPHA = 0.5
_S_MIN, _S_MAX = 1e-4, 1e4


def channel_ranges(model, layers, feeds, threads: int = 2) -> dict:
    """``{layer name: max|x_c|}`` (float64 ``(C,)``) of each conv layer's input over every feed (N, H, W pooled),
    from the float model run by onnxruntime (one feed at a time)."""
    from ..onnx_model import capture

    convs = [la for la in layers if not la.is_linear]
    out: dict = {}
    for feed in feeds:
        got = capture(model, convs, feed, threads)
        for la in convs:
            x = np.asarray(got[la.input_name])
            if x.ndim != 4:
                continue
            m = np.abs(x).max(axis=(0, 2, 3)).astype(np.float64)
            out[la.name] = m if la.name not in out else np.maximum(out[la.name], m)
    return out


def weight_ranges(layer) -> np.ndarray:
    """``max|W_c|`` (float64 ``(C,)``) per input channel ``c`` of a conv layer's ``(O, C/g, kh, kw)`` weight:
    over the outputs of ``c``'s group and the kernel taps."""
    w = np.abs(np.asarray(layer.weight, np.float64))
    o, cg, kh, kw = w.shape
    g = layer.groups
    return w.reshape(g, o // g, cg, kh * kw).max(axis=(1, 3)).reshape(g * cg)


def factors(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s = x_max^alpha / w_max^(1-alpha)``, 1 where a channel is all zero, clipped to
    [1e-4, 1e4]; float64 ``(C,)``."""
    s = np.ones_like(x_max)
    ok = (x_max > 0) & (w_max > 0)
    s[ok] = x_max[ok] ** alpha / w_max[ok] ** (1.0 - alpha)
    return np.clip(s, _S_MIN, _S_MAX)


def eligible(model, layers) -> list:
    """The conv layers whose input edge can be smoothed: the input is produced by a node (not a graph input or
    initializer), feeds this layer alone and is not a graph output. Whether the ``Mul`` then folds into the
    producer is ``quantize_model``'s to find (see the module docstring)."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    produced = {o for n in graph.node for o in n.output}
    users: dict = {}
    for n in graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    return [la for la in layers if not la.is_linear and la.input_name in produced
            and la.input_name not in outputs and users.get(la.input_name) == 1]


def smooth_model(model, layers, ranges: dict, alpha: float = DEFAULT_ALPHA, only=None):
    """``(smoothed ModelProto, {layer name: s})``: a copy of the float ``model`` with the layers of
    :func:`eligible` (those in ``only`` when given) that have a range in ``ranges`` smoothed: weight ``W diag(s)``,
    input through an inserted ``Mul(x, 1/s)`` (``(1, C, 1, 1)`` float32) named ``qconv.smooth/<layer>``. ``layers``
    are :func:`qconv.onnx_model.model_layers` of ``model``; the returned model's layers are read anew by the
    caller (node indices move)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    graph = m.graph
    done: dict = {}
    inserts = []   # (producer position, Mul node)
    position = {o: k for k, n in enumerate(graph.node) for o in n.output}
    for la in eligible(model, layers):
        if (only is not None and la.name not in only) or la.name not in ranges:
            continue
        s = factors(ranges[la.name], weight_ranges(la), alpha)
        if np.all(s == 1.0):
            continue
        node = graph.node[la.node_index]
        o, cg = la.weight.shape[:2]
        g = la.groups
        w = np.asarray(la.weight, np.float64)
        w = (w.reshape(g, o // g, cg, *w.shape[2:]) * s.reshape(g, 1, cg, 1, 1)).reshape(w.shape)
        name = PREFIX + la.name
        graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), name + "/w"))
        node.input[1] = name + "/w"   # a new weight: the old one may be a Constant node's or shared
        name = PREFIX + la.name
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32).reshape(1, -1, 1, 1), name + "/inv_s")
        graph.initializer.append(inv)
        mul = helper.make_node("Mul", [la.input_name, inv.name], [name + "/x"], name=name)
        node.input[0] = name + "/x"
        inserts.append((position[la.input_name], mul))
        done[la.name] = s
    for pos, mul in sorted(inserts, key=lambda t: -t[0]):   # right after each producer: the order stays topological
        graph.node.insert(pos + 1, mul)
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]   # the replaced weights go
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return m, done
