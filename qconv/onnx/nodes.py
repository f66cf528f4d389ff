"""The qconv custom nodes of a quantized ONNX model: how a quantized layer is written and read back.

Domain ``ai.qconv`` (opset 1), two operators:

``QConv(X, q, scales, offsets?, B?) -> Y``
  ``X`` float32 NCHW ``(N, C, H, W)``; ``Y`` float32 ``(N, O, OH, OW)``. Attributes: ``strides``, ``pads``
  (ONNX order ``[top, left, bottom, right]``, asymmetric allowed), ``dilations``, ``group``, ``bits``,
  ``block_size`` (input channels per block, 0 = per channel), ``activation`` (``""``, ``"relu"``,
  ``"relu6"``, ``"hardswish"``, ``"silu"``: a fused Relu / Clip / hardswish / x * Sigmoid(x)), ``post_scale`` / ``post_shift`` (floats, one per
  output channel or one for all, optional: the layer's ``post_affine``, ``y * scale + shift`` after the activation: the per-channel
  Mul / Add after a fused activation), ``depth_to_space`` (int ``b`` >= 2, optional: the output then goes through
  ONNX ``DepthToSpace`` in mode ``CRD``, ``Y`` is ``(N, O/b^2, OH*b, OW*b)`` and
  ``Y[n, c, h*b + i, w*b + j]`` is conv output channel ``(c*b + i)*b + j`` at ``(h, w)``
  (:class:`~qconv.layouts.DepthToSpace`): a ``ConvTranspose``
  whose kernel equals its stride is this of a 1x1 conv), ``scheme`` (the label it was quantized with,
  informative).
``QMatMul(X, q, scales, offsets?, B?) -> Y``
  ``Y = X @ W.T + B`` over the last axis: ``X`` float32 ``(..., K)``, ``Y`` float32 ``(..., N)`` (a MatMul with a
  constant ``[K, N]`` weight, or a Gemm, ``alpha``/``beta`` folded in). Attributes ``bits``, ``block_size``,
  ``activation``, ``post_scale`` / ``post_shift``, ``scheme``.

Weight initializers, exactly the fields of :class:`~qconv.weights.QuantizedWeight` (no float weight anywhere):
``q`` the integer codes ``(O, I/groups, kh, kw)`` (``(N, K, 1, 1)`` for QMatMul) as ONNX ``INT8``, or ``INT4``
for 4-bit weights (two codes a byte, first in the low nibble: :data:`~qconv.layouts.ONNX_INT4`); ``scales``
``(O, n_blocks)``; ``offsets`` ``(O, n_blocks)`` for asymmetric weights (``w = q * s + a``), absent (``""``)
for symmetric ones; both ``FLOAT16`` when the weight is ``half_exact`` (``quantize_weight``'s default form),
else ``FLOAT`` (:meth:`~qconv.weights.QuantizedWeight.stored_params`), read back as the same float32 values;
``B`` float32 ``(O,)`` or absent.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..interop.onnx_format import to_tensor_proto
from ..weights import QuantizedWeight

DOMAIN = "ai.qconv"
OPSET = 1
QCONV = "QConv"
QMATMUL = "QMatMul"
OPS = (QCONV, QMATMUL)
ACTIVATIONS = ("", "relu", "relu6", "hardswish", "silu")


@dataclass
class QNode:
    """A qconv node read back from a model: everything needed to build its qconv layer."""

    name: str
    op: str                      # QCONV or QMATMUL
    weight: QuantizedWeight
    bias: np.ndarray | None
    activation: str | None       # None, "relu", "relu6", "hardswish", "silu"
    input_name: str
    output_name: str
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)   # top, left, bottom, right
    dilation: tuple[int, int] = (1, 1)
    scheme: str = ""
    post_affine: tuple | None = None   # (scale, shift) float32 (O,) each, after the activation
    depth_to_space: int = 1            # b > 1: the output through DepthToSpace (CRD) of block b

    @property
    def padding(self) -> tuple[int, int]:
        """The symmetric part of the padding (what qconv's layers take)."""
        t, l, b, r = self.pads
        return min(t, b), min(l, r)

    @property
    def extra_pad(self) -> tuple[int, int, int, int]:
        """``(top, bottom, left, right)`` beyond :attr:`padding`, applied to the input with zeros."""
        t, l, b, r = self.pads
        ph, pw = self.padding
        return t - ph, b - ph, l - pw, r - pw


def is_qnode(node) -> bool:
    return node.domain == DOMAIN and node.op_type in OPS


def make_qnode(name: str, op: str, qw: QuantizedWeight, bias, activation, input_name: str, output_name: str,
               *, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), scheme: str = "", post_affine=None,
               depth_to_space: int = 1):
    """``(NodeProto, [TensorProto])``: a qconv node and its initializers (named ``name + ".q"`` etc.)."""
    import onnx

    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    _check_depth_to_space(name, op, depth_to_space, qw.out_channels)
    activation = activation or ""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    params = qw.stored_params()
    inits = [to_tensor_proto(f"{name}.q", qw.q, qw.bits),
             onnx.numpy_helper.from_array(params["scales"], f"{name}.scales")]
    names = [input_name, inits[0].name, inits[1].name, "", ""]
    if "offsets" in params:
        inits.append(onnx.numpy_helper.from_array(params["offsets"], f"{name}.offsets"))
        names[3] = inits[-1].name
    if bias is not None:
        inits.append(onnx.numpy_helper.from_array(np.ascontiguousarray(bias, np.float32), f"{name}.bias"))
        names[4] = inits[-1].name
    while names[-1] == "":
        names.pop()
    attrs = dict(bits=qw.bits, block_size=qw.block_size, activation=activation, scheme=scheme)
    if post_affine is not None:   # one value when every channel has the same (a scalar Mul / Add)
        for key, v in zip(("post_scale", "post_shift"), post_affine):
            v = np.asarray(v, np.float32).reshape(-1)
            attrs[key] = [float(x) for x in (v[:1] if (v == v[0]).all() else v)]
    if op == QCONV:
        attrs.update(strides=list(stride), pads=list(pads), dilations=list(dilation), group=qw.groups)
    if depth_to_space > 1:
        attrs["depth_to_space"] = int(depth_to_space)
    node = onnx.helper.make_node(op, names, [output_name], name=name, domain=DOMAIN, **attrs)
    return node, inits


def _check_depth_to_space(name: str, op: str, b, out_channels: int) -> int:
    """``b`` as an int, or ValueError when a node of ``op`` with ``out_channels`` cannot take it."""
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
        raise ValueError(f"qconv node {name!r}: depth_to_space must be an int >= 1, got {b!r}")
    if b > 1 and (op != QCONV or out_channels % (b * b)):
        raise ValueError(f"qconv node {name!r}: depth_to_space={b} needs a QConv whose output channels "
                         f"({out_channels}) split into blocks of {b}x{b}")
    return int(b)


def read_qnode(node, initializers: dict) -> QNode:
    """A qconv node and its initializers -> :class:`QNode` (ValueError on a malformed node). ``node``: a
    :class:`qconv.onnx.wire.Node`, ``initializers``: ``{name: qconv.onnx.wire.Tensor}`` (:func:`wire.graph_parts`
    of the model's bytes; an ``onnx`` object becomes them through ``wire.read_node(proto.SerializeToString())``)."""
    if not is_qnode(node):
        raise ValueError(f"node {node.name!r} ({node.domain}:{node.op_type}) is not a qconv node")
    a = {k: v.decode() if isinstance(v, bytes) else v for k, v in node.attrs.items()}

    def tensor(i):
        name = node.input[i] if i < len(node.input) else ""
        if not name:
            return None, 8
        if name not in initializers:
            raise ValueError(f"qconv node {node.name!r}: input {name!r} is not an initializer")
        return initializers[name].to_array()

    (q, qbits), (scales, _), (offsets, _), (bias, _) = (tensor(i) for i in (1, 2, 3, 4))
    if q is None or scales is None:
        raise ValueError(f"qconv node {node.name!r} has no weight codes/scales")
    bits = int(a.get("bits", qbits))
    if q.ndim == 2:
        q = q[:, :, None, None]
    qw = QuantizedWeight(q.astype(np.int8, copy=False), np.asarray(scales, np.float32),
                         None if offsets is None else np.asarray(offsets, np.float32), bits,
                         int(a.get("block_size", 0)), int(a.get("group", 1)))
    extra = {}
    if "post_scale" in a or "post_shift" in a:
        o = qw.out_channels
        ps = np.asarray(a.get("post_scale", [1.0]), np.float32)
        pt = np.asarray(a.get("post_shift", [0.0]), np.float32)
        if ps.shape not in ((1,), (o,)) or pt.shape not in ((1,), (o,)):
            raise ValueError(f"qconv node {node.name!r}: post_scale / post_shift need 1 or {o} values each")
        extra["post_affine"] = (np.broadcast_to(ps, (o,)).copy(), np.broadcast_to(pt, (o,)).copy())
    if node.op_type == QCONV:
        extra.update(stride=tuple(a.get("strides", (1, 1))), pads=tuple(a.get("pads", (0, 0, 0, 0))),
                     dilation=tuple(a.get("dilations", (1, 1))))
    if "depth_to_space" in a:
        extra["depth_to_space"] = _check_depth_to_space(node.name, node.op_type, a["depth_to_space"],
                                                        qw.out_channels)
    return QNode(node.name or node.output[0], node.op_type, qw, None if bias is None else bias.astype(np.float32),
                 a.get("activation", "") or None, node.input[0], node.output[0], scheme=a.get("scheme", ""), **extra)


def _tensor_nbytes(t) -> int:
    """Bytes a TensorProto stores (raw data; INT4 two values a byte)."""
    import onnx

    n = int(np.prod(t.dims)) if len(t.dims) else 1
    if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (n + 1) // 2
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def weight_bytes(model) -> dict:
    """Bytes of the weights of every Conv/MatMul/Gemm layer of ``model`` (float or quantized):

    ``{"stored": bytes as stored (qconv nodes: codes + scales + offsets; float layers: float32 weight),
    "float": the same weights in float32, "ratio": stored / float, "quantized_layers": n, "float_layers": n}``.
    Biases are not counted (they stay float32 either way). ``model``: an ``onnx.ModelProto`` or a path."""
    import os

    from ..onnx_model import load_model, model_layers

    if isinstance(model, (str, os.PathLike)):
        model = load_model(model)

    inits = {t.name: t for t in model.graph.initializer}
    stored = flt = nq = 0
    for node in model.graph.node:
        if is_qnode(node):
            q = inits[node.input[1]]
            stored += sum(_tensor_nbytes(inits[n]) for n in node.input[1:4] if n)
            flt += 4 * int(np.prod(q.dims))
            nq += 1
    layers = model_layers(model, skipped={})
    for layer in layers:
        stored += 4 * layer.weight.size
        flt += 4 * layer.weight.size
    return dict(stored=stored, float=flt, ratio=stored / flt if flt else float("nan"), quantized_layers=nq,
                float_layers=len(layers))
