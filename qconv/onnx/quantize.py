"""``quantize_model``: rewrite an ONNX model so every Conv / constant-weight MatMul / Gemm is one qconv node.

The layers are found by :func:`qconv.onnx_model.model_layers` (the reader ``inspect`` uses); each is quantized
with a :class:`~qconv.model_report.Scheme` (one for all, or per layer from a :class:`~qconv.model_report.Plan`)
and replaced by a ``ai.qconv`` node (:mod:`qconv.onnx.nodes`) carrying its weight as packed initializers; the
float weight initializers (and ``Constant`` nodes) no other node uses are removed, so the saved file is small.

Fusions, where the producer's output feeds only that one node and is not a graph output: first, a chain of
per-output-channel affine ops with constant operands -- ``Mul`` / ``Add`` / ``Sub`` / ``Div`` by a scalar or a
per-channel constant (``(O, 1, 1)`` / ``(1, O, 1, 1)`` after a Conv, ``(O,)`` / ``(1, O)`` after a MatMul or Gemm),
``BatchNormalization`` in inference form -- folds into the layer's float weight and bias before quantization
(``a*(W x + b0) + b = (a W) x + (a b0 + b)``; per-channel and blockwise quantization scale with ``a``, so the codes
are those of the unfolded weight); then ``Relu`` -> ``activation="relu"``; ``Clip(0, 6)`` -> ``"relu6"``;
``Clip(0, none)`` -> ``"relu"``; ``HardSwish``, or the pattern ``x * Clip(x + 3, 0, 6) / 6`` (either order of the
product and the division) -> ``"hardswish"``; ``Mul(x, Sigmoid(x))`` -> ``"silu"``; then, after a fused activation, another chain of such affine ops ->
the node's ``post_affine`` (``y * scale + shift``). ``qconv.summary`` lists each layer's ``folded`` and ``post``
ops.

Calibration: ``gptq`` and ``-bc`` (bias correction) schemes use each layer's input captured by running the
float model on the calibration feeds. Activations: ``act_quant`` / ``act_block`` record in the model how the
session quantizes each node's input (``act_block`` resolved per layer, see :func:`layer_act_block`).
"""
from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np

from .. import _validate as V
from .._progress import bar
from ..geometry import ConvSpec
from ..metrics import sqnr_db
from ..model_report import CALIB_SEED, Plan, Scheme
from . import wire
from .accuracy import ACT_BUDGET_DB, DEFAULT_SCHEME, MIN_SQNR_DB
from .smooth import DEFAULT_ALPHA as SMOOTH_ALPHA
from .nodes import DOMAIN, OPSET, QCONV, QMATMUL, make_qnode

SUMMARY_KEY = "qconv.summary"
#: Metadata key of a quantized model saying how to run it (plain onnxruntime cannot: ``ai.qconv`` nodes).
RUNTIME_KEY = "qconv.runtime"
RUNTIME_NOTE = ("This model holds ai.qconv custom nodes (quantized weights): run it with "
                "qconv.onnx.InferenceSession(path) (pip install qconv[onnx]); plain onnxruntime cannot run them. "
                "See qconv/onnx/README.md and docs/onnxruntime.md in qconv's repository.")

QDQ_NOTE = ("Standard ONNX (DequantizeLinear weights) written by qconv.onnx.quantize_model(format='qdq'): any "
            "onnxruntime runs it.")


class _NotQDQ(ValueError):
    """A quantized weight that QDQ (integer zero points) cannot hold exactly."""


def _qdq_nodes(layer, qw, bias, activation, post_affine, out_name: str, pads, label: str):
    """``([NodeProto], [TensorProto])``: the layer as DequantizeLinear -> Conv / MatMul (+ bias Add) -> its fused
    activation -> its post-affine Mul / Add, writing ``out_name`` (see ``format="qdq"``)."""
    import onnx
    from onnx import helper, numpy_helper

    from ..interop.onnx_format import dequantize_linear_node

    p = f"{layer.name}/qdq"
    dq, inits, report = dequantize_linear_node(qw, f"{p}/w", layout="matmul" if layer.is_linear else "conv")
    if not report.lossless:
        raise _NotQDQ(f"format='qdq' cannot hold {label} weights exactly (layer {layer.name}: "
                      f"{'; '.join(report.notes) or 'offsets off the integer zero-point grid'}): use a symmetric "
                      "or zero-point scheme (int8-ch-sym, int8-ch-zp, int4-b32-sym, ...) or format='qconv'")
    nodes, y = [dq], f"{p}/y"
    o = qw.out_channels
    if layer.is_linear:
        nodes.append(helper.make_node("MatMul", [layer.input_name, dq.output[0]], [y], name=f"{p}/matmul"))
        if bias is not None:
            inits.append(numpy_helper.from_array(np.asarray(bias, np.float32), f"{p}/b"))
            nodes.append(helper.make_node("Add", [y, f"{p}/b"], [f"{p}/yb"], name=f"{p}/bias"))
            y = f"{p}/yb"
    else:
        ins = [layer.input_name, dq.output[0]]
        if bias is not None:
            inits.append(numpy_helper.from_array(np.asarray(bias, np.float32), f"{p}/b"))
            ins.append(f"{p}/b")
        nodes.append(helper.make_node("Conv", ins, [y], name=f"{p}/conv", strides=list(layer.stride),
                                      pads=list(pads), dilations=list(layer.dilation), group=layer.groups))
    shape = (o,) if layer.is_linear else (o, 1, 1)
    if activation == "relu":
        nodes.append(helper.make_node("Relu", [y], [f"{p}/act"], name=f"{p}/relu"))
    elif activation == "relu6":
        inits += [numpy_helper.from_array(np.array(v, np.float32), f"{p}/{n}") for n, v in (("lo", 0), ("hi", 6))]
        nodes.append(helper.make_node("Clip", [y, f"{p}/lo", f"{p}/hi"], [f"{p}/act"], name=f"{p}/clip"))
    elif activation == "hardswish":
        nodes.append(helper.make_node("HardSwish", [y], [f"{p}/act"], name=f"{p}/hardswish"))
    elif activation == "silu":
        nodes += [helper.make_node("Sigmoid", [y], [f"{p}/sigmoid"], name=f"{p}/sigmoid"),
                  helper.make_node("Mul", [y, f"{p}/sigmoid"], [f"{p}/act"], name=f"{p}/silu")]
    y = f"{p}/act" if activation else y
    if post_affine is not None:
        scale, shift = (np.broadcast_to(np.asarray(v, np.float32), (o,)).reshape(shape) for v in post_affine)
        inits += [numpy_helper.from_array(np.ascontiguousarray(scale), f"{p}/ps"),
                  numpy_helper.from_array(np.ascontiguousarray(shift), f"{p}/pb")]
        nodes += [helper.make_node("Mul", [y, f"{p}/ps"], [f"{p}/pm"], name=f"{p}/post_scale"),
                  helper.make_node("Add", [f"{p}/pm", f"{p}/pb"], [f"{p}/pa"], name=f"{p}/post_shift")]
        y = f"{p}/pa"
    nodes.append(helper.make_node("Identity", [y], [out_name], name=f"{p}/out"))
    del onnx
    return nodes, inits


def _raise_opset(m, target: int):
    """``m`` with its default-domain opset raised to ``target`` (onnx's version converter) when lower."""
    import onnx

    current = max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if current >= target:
        return m
    try:
        return onnx.version_converter.convert_version(m, target)
    except Exception as exc:
        raise ValueError(f"format='qdq' needs opset {target} (DequantizeLinear{' with blocks / int4' if target == 21 else ''}); "
                         f"onnx's version converter could not raise this model's opset {current}: "
                         f"{type(exc).__name__}: {str(exc)[:200]}") from None


class LowAccuracyWarning(UserWarning):
    """The quantized model's output SQNR is below ``quantize_model``'s ``min_sqnr`` floor."""


def _load(model):
    import onnx

    from ..onnx_model import load_model

    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    return load_model(model)


def _consumers(graph) -> dict:
    out: dict = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name:
                out.setdefault(name, []).append(i)
    return out


def _const_value(name, consts):
    return None if not name else consts.get(name)


def _activation_of(node, consts):
    """``"relu"`` / ``"relu6"`` when ``node`` is a Relu or a Clip qconv can fuse, else None."""
    import onnx

    if node.op_type == "Relu":
        return "relu"
    if node.op_type != "Clip":
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    lo = attrs.get("min")
    hi = attrs.get("max")
    if len(node.input) > 1 and node.input[1]:
        lo = _const_value(node.input[1], consts)
        if lo is None:
            return None
    if len(node.input) > 2 and node.input[2]:
        hi = _const_value(node.input[2], consts)
        if hi is None:
            return None
    lo = None if lo is None else float(np.asarray(lo).reshape(-1)[0])
    hi = None if hi is None else float(np.asarray(hi).reshape(-1)[0])
    if lo != 0.0:
        return None
    if hi is None or np.isinf(hi) or hi >= 3.4e38:
        return "relu"
    return "relu6" if hi == 6.0 else None


def _scalar_is(name, consts, value) -> bool:
    c = consts.get(name)
    return c is not None and np.asarray(c).size == 1 and float(np.asarray(c).reshape(-1)[0]) == value


def _hardswish_after(produced: str, nodes, consumers, consts, graph_outputs):
    """``(output name, node indices)`` when ``produced`` (``x``) feeds only a hardswish: a ``HardSwish`` node, or
    ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` (PyTorch's and Paddle's order, qconv's definition), or
    ``Mul(x, Div(Clip(Add(x, 3), 0, 6), 6))`` (the same up to float32 rounding); else None."""
    def only_user(name, op):
        users = consumers.get(name, [])
        ok = len(users) == 1 and name not in graph_outputs and nodes[users[0]].op_type == op
        return users[0] if ok else None

    users = consumers.get(produced, [])
    if produced in graph_outputs:
        return None
    if len(users) == 1 and nodes[users[0]].op_type == "HardSwish":
        return nodes[users[0]].output[0], users
    ops = sorted(nodes[i].op_type for i in users)
    if ops != ["Add", "Mul"]:
        return None
    add, mul = sorted(users, key=lambda i: nodes[i].op_type)
    a = nodes[add]
    if len(a.input) != 2 or not _scalar_is(a.input[1] if a.input[0] == produced else a.input[0], consts, 3.0):
        return None
    clip = only_user(a.output[0], "Clip")
    if clip is None or _activation_of(nodes[clip], consts) != "relu6":
        return None
    t = nodes[clip].output[0]

    def div6(i, name):
        return i is not None and nodes[i].input[0] == name and _scalar_is(nodes[i].input[1], consts, 6.0)

    if sorted(nodes[mul].input) == sorted([produced, t]) and consumers.get(t) == [mul]:      # (x * t) / 6
        div = only_user(nodes[mul].output[0], "Div")
        return (nodes[div].output[0], [add, clip, mul, div]) if div6(div, nodes[mul].output[0]) else None
    div = only_user(t, "Div")                                                                  # x * (t / 6)
    if not div6(div, t) or sorted(nodes[mul].input) != sorted([produced, nodes[div].output[0]]):
        return None
    return (nodes[mul].output[0], [add, clip, div, mul]) if only_user(nodes[div].output[0], "Mul") == mul else None


def _silu_after(produced: str, nodes, consumers, graph_outputs):
    """``(output name, node indices)`` when ``produced`` (``x``) feeds only a SiLU, ``Mul(x, Sigmoid(x))`` (either
    operand order; YOLO's and PyTorch's export of ``nn.SiLU``), the Sigmoid's output used by that Mul alone; else
    None."""
    users = consumers.get(produced, [])
    if produced in graph_outputs or sorted(nodes[i].op_type for i in users) != ["Mul", "Sigmoid"]:
        return None
    mul, sig = sorted(users, key=lambda i: nodes[i].op_type)
    s = nodes[sig].output[0]
    if (sorted(nodes[mul].input) != sorted([produced, s]) or consumers.get(s) != [mul] or s in graph_outputs
            or len(nodes[sig].output) != 1):
        return None
    return nodes[mul].output[0], [sig, mul]


def _channel_vector(c, n_out: int, linear: bool):
    """A constant operand as one float64 value per output channel ``(n_out,)``, or None when it does not broadcast
    along the channel axis alone (a scalar; ``(O,)`` / ``(1, O)`` for a linear layer; ``(O, 1, 1)`` /
    ``(1, O, 1, 1)`` for a conv's NCHW output)."""
    if c is None:
        return None
    c = np.asarray(c)
    if c.dtype != np.float32 or c.ndim > (2 if linear else 4):
        return None
    if c.size == 1:
        return np.full(n_out, float(c.reshape(-1)[0]))
    on_axis = c.ndim >= 1 and c.shape[-1] == n_out if linear else c.ndim >= 3 and c.shape[-3] == n_out
    if c.size != n_out or not on_axis:
        return None
    return c.reshape(-1).astype(np.float64)


def _affine_of(node, produced: str, consts, n_out: int, linear: bool):
    """``(a, b)`` float64 ``(n_out,)`` when ``node`` computes ``a * produced + b`` per output channel with constant
    operands (``Mul`` / ``Add`` / ``Sub`` / ``Div`` by a constant, ``BatchNormalization`` in inference form),
    else None."""
    import onnx

    ins = list(node.input)
    if node.op_type == "BatchNormalization":
        if linear or len(node.output) != 1 or len(ins) != 5 or ins[0] != produced:
            return None
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("training_mode", 0):
            return None
        v = [consts.get(n) for n in ins[1:]]   # (C,) each: BatchNormalization's channel vectors
        if any(x is None or x.dtype != np.float32 or x.shape != (n_out,) for x in v):
            return None
        v = [x.astype(np.float64) for x in v]
        scale, shift, mean, var = v
        a = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        return a, shift - mean * a
    if node.op_type not in ("Mul", "Add", "Sub", "Div") or len(ins) != 2 or ins.count(produced) != 1:
        return None
    first = ins[0] == produced
    if not first and node.op_type in ("Sub", "Div"):
        return None
    c = _channel_vector(consts.get(ins[1] if first else ins[0]), n_out, linear)
    if c is None:
        return None
    one, zero = np.ones(n_out), np.zeros(n_out)
    if node.op_type == "Mul":
        return c, zero
    if node.op_type == "Add":
        return one, c
    if node.op_type == "Sub":
        return one, -c
    return (1.0 / c, zero) if np.all(c != 0) else None


def _depth_to_space_of(node) -> int:
    """The block ``b`` of a ``DepthToSpace`` node in mode ``CRD`` (the one a QConv node fuses), else 0."""
    import onnx

    if node.op_type != "DepthToSpace" or node.domain not in ("", "ai.onnx") or len(node.input) != 1:
        return 0
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    mode = a.get("mode", b"DCR")
    return int(a.get("blocksize", 0)) if (mode.decode() if isinstance(mode, bytes) else mode) == "CRD" else 0


def _transposed_convs(m) -> int:
    """Rewrite, in place, every ``ConvTranspose`` of ``m`` that is a 1x1 conv and a pixel shuffle
    (:func:`qconv.onnx_model.transposed_block`: kernel = stride s, one group, no padding, constant weight
    ``(C, O, s, s)``) as ``Conv`` 1x1 ``C -> O*s*s`` (output channel ``(o*s + i)*s + j``
    takes ``weight[:, o, i, j]``) and ``DepthToSpace(blocksize=s, mode="CRD")``, which puts that channel at
    ``(h*s + i, w*s + j)``: the same sums as the ConvTranspose, whose windows never overlap. The per-channel affine
    ops after it (its bias ``Add``, ``BatchNormalization``, ...) fold into the conv, and a ``Relu`` / ``Clip(0, 6)``
    after them moves before the DepthToSpace (elementwise: they commute), so the conv quantizes as any other and
    its node fuses the DepthToSpace (PP-OCRv4 det's head: two 2x2 stride-2 ConvTranspose). Needs opset 11
    (DepthToSpace's mode); returns the number rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    from ..onnx_model import _constants, transposed_block

    if max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0) < 11:
        return 0
    graph = m.graph
    consts = _constants(m)
    consumers = _consumers(graph)
    outputs = {o.name for o in graph.output}
    nodes = list(graph.node)

    def single(name):
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in outputs else None

    placed, removed, inits = {}, set(), []
    for k, node in enumerate(nodes):
        s = transposed_block(node, consts)
        if not s:
            continue
        w = consts[node.input[1]]
        c, o = w.shape[:2]
        bias = consts[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros(o, np.float32)
        ga, gb, chain, out = np.ones(o), bias.astype(np.float64), [k], node.output[0]
        while (j := single(out)) is not None and (ab := _affine_of(nodes[j], out, consts, o, False)) is not None:
            ga, gb = ga * ab[0], gb * ab[0] + ab[1]
            chain.append(j)
            out = nodes[j].output[0]
        act = single(out)
        act = act if act is not None and _activation_of(nodes[act], consts) is not None else None
        p = f"qconv.convtranspose/{node.name or node.output[0]}"
        rows = (w.astype(np.float64) * ga[None, :, None, None]).transpose(1, 2, 3, 0).reshape(o * s * s, c, 1, 1)
        inits += [numpy_helper.from_array(rows.astype(np.float32), p + "/w"),
                  numpy_helper.from_array(np.repeat(gb, s * s).astype(np.float32), p + "/b")]
        y = p + "/y"
        new = [helper.make_node("Conv", [node.input[0], p + "/w", p + "/b"], [y], name=node.name or p,
                                kernel_shape=[1, 1])]
        if act is not None:   # after the chain's last node: a Clip's bounds may come from Constant nodes
            chain.append(act)
            moved = onnx.NodeProto()
            moved.CopyFrom(nodes[act])
            moved.input[0], moved.output[0] = y, p + "/act"
            y = moved.output[0]
            new.append(moved)
        new.append(helper.make_node("DepthToSpace", [y], [nodes[chain[-1]].output[0]], name=p + "/d2s",
                                    blocksize=s, mode="CRD"))
        removed.update(chain)
        placed[chain[-1]] = new   # where the chain's output was made: every input exists by then
    if placed:
        kept = [x for i, n in enumerate(nodes) for x in (placed[i] if i in placed else [] if i in removed else [n])]
        del graph.node[:]
        graph.node.extend(kept)
        graph.initializer.extend(inits)
    return len(placed)


def _calibration_feeds(model, calibration):
    """``calibration``: None, a feed dict, an array (the first input), or a list of those -> list of feeds."""
    if calibration is None:
        return []
    if isinstance(calibration, (dict, np.ndarray)):
        calibration = [calibration]
    name = model.graph.input[0].name
    return [c if isinstance(c, dict) else {name: np.asarray(c, np.float32)} for c in calibration]


def synthetic_feed(model, like=()) -> dict | None:
    """The input of data-free bias correction: seeded uniform [0, 1) values (a picture's range), shaped as the
    first feed of ``like`` (evaluation or calibration feeds: their shape only, never their values) or as the
    model's first input (dynamic batch 1, other dynamic dims 256). None for a model with several inputs."""
    from ..onnx_model import default_input, first_input

    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(inputs) != 1:
        return None
    name, _ = first_input(model)
    shape = np.shape(like[0][name]) if like and name in like[0] else None
    return default_input(model, shape, seed=CALIB_SEED, uniform=True)


def _layer_calibration(model, layers, feeds, need, like=()) -> tuple[dict, str | None]:
    """``({layer name: [NCHW calibration input per feed]}, source)`` for the layers in ``need``.

    Without ``feeds`` the inputs come from :func:`synthetic_feed` (``like``: feeds whose shape it takes): the
    bias correction of the ``-bc`` schemes is then data-free (the mean output shift of a layer's rounding depends
    mostly on its weights; on the zoo a synthetic input gives most of what real pictures give,
    ``qconv/onnx/README.md``). ``source`` says which, or why none ran (``({}, reason)``: the model does not run
    on the synthetic input, e.g. a recognizer whose height is fixed inside a dynamic input shape)."""
    from ..onnx_model import capture

    if not need:
        return {}, None
    source = f"{len(feeds)} calibration input(s)"
    if not feeds:
        feed = synthetic_feed(model, like)
        if feed is None:
            return {}, "none: data-free bias correction needs a model with one input; pass calibration="
        shape = "x".join(map(str, next(iter(feed.values())).shape))
        feeds, source = [feed], f"a synthetic input (uniform [0, 1), {shape})"
    try:
        captured = [capture(model, [la for la in layers if la.name in need], f) for f in feeds]
    except Exception as exc:   # onnxruntime's errors have no common base class
        if not source.startswith("a synthetic"):
            raise
        text = str(exc).strip().split("Status Message:")[-1].strip()
        first = text.splitlines()[0][:120] if text else type(exc).__name__
        return {}, (f"none: the model does not run on {source} ({first}); pass eval= or calibration= inputs "
                    "of its shape")
    return {layer.name: [layer.conv_input(t[layer.input_name]) for t in captured] for layer in layers
            if layer.name in need}, source


def layer_act_block(weight, act_block: int) -> int:
    """The activation block of one layer for a model-wide ``act_block``: the largest divisor of the weight's
    block (its input channels per group when per-channel) that is ``<= act_block`` (0 stays 0: the weight's
    block), so that every layer takes it (:class:`~qconv.geometry.ConvSpec` needs ``act_block`` to divide the
    weight block or be a multiple of it)."""
    if not act_block:
        return 0
    wb = weight.block_channels
    return max(d for d in range(1, min(act_block, wb) + 1) if wb % d == 0)


def _rounded(db: float) -> float | None:
    """A dB figure for JSON: 2 decimals, None for +-inf (JSON has no infinity)."""
    return None if not np.isfinite(db) else round(float(db), 2)


_LOW_PRECISION = {10: "float16", 16: "bfloat16"}   # onnx.TensorProto data types


def _check_float32(m) -> None:
    """ValueError for a model whose weights or inputs are float16 / bfloat16: qconv quantizes float32 models."""
    found = [(t.name, _LOW_PRECISION[t.data_type]) for t in m.graph.initializer if t.data_type in _LOW_PRECISION]
    found += [(i.name, _LOW_PRECISION[i.type.tensor_type.elem_type]) for i in m.graph.input
              if i.type.tensor_type.elem_type in _LOW_PRECISION]
    if found:
        name, kind = found[0]
        raise ValueError(f"the model is {kind} ({len(found)} tensor(s), e.g. {name!r}): qconv quantizes float32 "
                         "models; convert it to float32 first (e.g. onnxconverter_common's float16 tools, or "
                         "export it again in float32)")


def _proxy(m_float, layers, feeds, threads, calib_feeds=(), gptq_fit: slice = slice(None)):
    """A :class:`~qconv.onnx.accuracy.WeightProxy` of the float model on ``feeds`` and its
    :class:`~qconv.onnx.accuracy.Candidates`, bias-corrected on ``calib_feeds`` (else data-free, see
    :func:`_layer_calibration`), GPTQ fitted on ``calib_feeds[gptq_fit]``."""
    from .accuracy import Candidates, WeightProxy

    proxy = WeightProxy(m_float, layers, feeds, threads or 2)
    calib, _ = _layer_calibration(m_float, layers, calib_feeds, {la.name for la in layers}, like=feeds)
    return Candidates(proxy, calib, gptq_fit)


#: The rungs of accuracy control, in increasing bytes per weight, all bias-corrected (on the calibration inputs,
#: or data-free).
LADDER = ("int4-b32-asym-bc", DEFAULT_SCHEME, "int8-b32-zp-bc", "int8-b16-zp-bc", "float")
#: With two calibration inputs or more a second search runs with a GPTQ-rounded int4 rung, fitted on the
#: even-numbered inputs only (:data:`GPTQ_FIT`: the odd ones, on which every plan must hold too, are inputs its
#: rounding never saw). Its plan is kept only when it saves at least :data:`GPTQ_MIN_SAVING` of all-int8's bytes
#: more than plain rounding's: a plan fitted to the calibration inputs loses more on inputs unlike them (PP-OCRv4
#: rec, rendered calibration lines, target 25: 25.4 dB on them, 24.3 on the picture's lines, against 27.2 for plain
#: rounding, which saved 2.6% less), while on det it saves 12% more and holds (26.0 dB held out).
LADDER_GPTQ = ("int4-b32-asym-gptq-bc",) + LADDER[1:]
GPTQ_FIT = slice(0, None, 2)
GPTQ_MIN_SAVING = 0.10
#: The search aims this far above the target on the calibration inputs (``searched_for_db`` in the record): plans
#: found right at it measured up to 1 dB less on held-out inputs (PP-OCRv4 rec, target 25: 25.0 dB on rendered
#: lines, 24.2 on the picture's). When all-int8 meets the target but not the band, all-int8 is the plan.
GUARD_DB = 1.0


def _accuracy_control(m, layers, target: float, calib_feeds, progress: bool, threads) -> tuple[dict, dict]:
    """``({layer name: Scheme}, search record)`` of :func:`~qconv.onnx.accuracy.search_plan` on the calibration
    feeds with :data:`LADDER` (:data:`LADDER_GPTQ` with two calibration inputs or more)."""
    from .accuracy import search_plan

    source = "calibration inputs"
    if not calib_feeds:
        warnings.warn("target_sqnr without calibration inputs searches on a random feed, which suits no image "
                      "model: pass calibration=... (inputs held out from those you evaluate on)", stacklevel=3)
        from ..onnx_model import default_input
        calib_feeds, source = [default_input(m, seed=CALIB_SEED)], "random feed (no calibration inputs)"
    calibrated = source == "calibration inputs"
    gptq = calibrated and len(calib_feeds) >= 2
    cands = _proxy(m, layers, calib_feeds, threads, calib_feeds if calibrated else (), GPTQ_FIT)
    ladder = [Scheme.parse(s) for s in LADDER]
    base = ladder[1]
    s0 = cands.sqnr({la.name: base for la in layers})
    # the guard band, unless all-int8 meets the target but not the band: then all-int8 it stays (no more bytes)
    goal = s0 if target <= s0 < target + GUARD_DB else target + GUARD_DB
    r = search_plan(cands, goal, ladder, base, progress=progress)
    gptq_note = None
    if gptq:
        ladder_g = [Scheme.parse(s) for s in LADDER_GPTQ]
        rg = search_plan(cands, goal, ladder_g, base, progress=progress)
        saving = (r.nbytes - rg.nbytes) / r.base_nbytes
        kept = rg.sqnr_db >= goal and saving >= GPTQ_MIN_SAVING
        gptq_note = (f"{'kept' if kept else 'not kept'}: its plan saves {saving:.1%} of all-int8's bytes more than "
                     f"plain rounding's ({'>=' if saving >= GPTQ_MIN_SAVING else '<'} {GPTQ_MIN_SAVING:.0%}); GPTQ "
                     "fitted on the even-numbered calibration inputs")
        if kept:
            r, ladder = rg, ladder_g
    schemes = dict(r.schemes)
    record = dict(target_sqnr_db=target, searched_for_db=_rounded(goal), on=f"{len(calib_feeds)} {source}",
                  sqnr_db=_rounded(r.sqnr_db),
                  nbytes=r.nbytes, int8_sqnr_db=_rounded(r.base_sqnr_db), int8_nbytes=r.base_nbytes,
                  int8_scheme=base.label, ladder=[s.label for s in ladder], evaluations=r.evaluations,
                  seconds=round(r.seconds, 1))
    if gptq_note:
        record["gptq"] = gptq_note
    return schemes, record


def _summary_layers(q) -> list:
    return list(model_summary(q).get("layers", {}).values())


def _smoothed(m, layers, calib_feeds, alpha, threads, fuse, min_weights):
    """``(model, layers, record)``: ``m`` with the conv inputs that :mod:`qconv.onnx.smooth` can fold smoothed
    (ranges from ``calib_feeds``), its layers read anew, and ``qconv.summary["smooth"]``. Edges whose ``Mul`` the
    layer loop does not fold into the producer (found by quantizing the smoothed model once with a plain scheme)
    are left as they were."""
    from ..onnx_model import model_layers
    from . import smooth

    ranges = smooth.channel_ranges(m, layers, calib_feeds, threads or 2)
    ms, done = smooth.smooth_model(m, layers, ranges, alpha)
    if not done:
        return m, layers, dict(alpha=alpha, smoothed=0)
    probe = quantize_model(ms, "int8-ch-sym", measure=False, fuse=fuse, min_weights=min_weights, act_budget=None,
                           smooth=None)
    unfolded = {n.name[len(smooth.PREFIX):] for n in probe.graph.node if n.name.startswith(smooth.PREFIX)}
    if unfolded:
        ms, done = smooth.smooth_model(m, layers, ranges, alpha, only=set(done) - unfolded)
    return ms, model_layers(ms, {}), dict(alpha=alpha, smoothed=len(done), not_folded=len(unfolded))


def _measure(float_bytes, q, layers, schemes, eval_feeds, calib_feeds, min_sqnr, threads, act_quant) -> dict:
    """``summary["accuracy"]``: :func:`~qconv.onnx.accuracy.measure_model` on the evaluation feeds (else the
    calibration feeds, else a random feed, said in ``source``), and the guard."""
    import onnx

    from ..onnx_model import default_input
    from .accuracy import measure_model, restore_ranking

    if eval_feeds:
        feeds, source = eval_feeds, f"{len(eval_feeds)} evaluation input(s)"
    elif calib_feeds:
        feeds, source = calib_feeds, f"the {len(calib_feeds)} calibration input(s) (pass eval= for held-out inputs)"
    else:
        inputs = [i for i in q.graph.input if i.name not in {t.name for t in q.graph.initializer}]
        dims = [d for i in inputs for d in i.type.tensor_type.shape.dim]
        if len(inputs) != 1 or any(not d.HasField("dim_value") or d.dim_value < 1 for d in dims):
            return dict(source="not measured: no eval= or calibration= inputs, and no random feed fits the model's "
                               f"input(s) {[i.name for i in inputs]} (dynamic or several)", min_sqnr=min_sqnr,
                        below_floor=False)
        feeds, source = [default_input(q, seed=0)], "a random feed (seed 0; pass eval= with real inputs)"
    opts = {} if act_quant is None else {"act_quant": act_quant}
    acc = measure_model(float_bytes, q, feeds, threads=threads, source=source, **opts)
    out = dict(source=source, feeds=acc["feeds"], sqnr_db=_rounded(acc["sqnr_db"]),
               outputs={k: dict(sqnr_db=_rounded(v["sqnr_db"]), max_abs_err=float(v["max_abs_err"]))
                        for k, v in acc["outputs"].items()}, min_sqnr=min_sqnr)
    out["below_floor"] = bool(min_sqnr is not None and acc["sqnr_db"] < min_sqnr)
    if act_quant is None and any(len(e.get("act_allowed", ())) > 1 for e in _summary_layers(q)):
        from .kernels import cpu_kernel

        out["cpu_kernel"] = cpu_kernel()   # "auto" runs the allowed int8 nodes int8 only on INT8_FAST_KERNELS
        flt = measure_model(float_bytes, q, feeds, threads=threads, act_quant="none")
        out["float_act_sqnr_db"] = _rounded(flt["sqnr_db"])   # the same weights with float activations
    if out["below_floor"]:
        quantized = {n: s for n, s in schemes.items() if s.bits is not None}
        cands = _proxy(onnx.load_from_string(float_bytes), layers, feeds, threads, calib_feeds)
        ranking = restore_ranking(cands, {la.name: quantized.get(la.name, Scheme(None)) for la in layers},
                                  Scheme.parse(DEFAULT_SCHEME))
        out["restore"] = [dict(layer=n, to="float" if quantized[n] == Scheme.parse(DEFAULT_SCHEME) else DEFAULT_SCHEME,
                               sqnr_db=_rounded(db)) for n, db in ranking]
        names = ", ".join(f"{r['layer']} (to {r['to']}: {r['sqnr_db']} dB)" for r in out["restore"])
        warnings.warn(f"the quantized model's output SQNR is {acc['sqnr_db']:.1f} dB on {source}, below the floor "
                      f"min_sqnr={min_sqnr:g} dB; the layers whose return helps most: {names}",
                      LowAccuracyWarning, stacklevel=3)
    return out


def quantize_model(model, scheme: str | None = DEFAULT_SCHEME, plan: Plan | str | None = None, calibration=None,
                   *, eval=None, target_sqnr: float | None = None, min_sqnr: float | None = MIN_SQNR_DB,
                   measure: bool = True, progress: bool = False, threads: int | None = None, fuse: bool = True,
                   act_quant: str | None = None, act_block: int = 0, min_weights: int = 0, format: str = "qconv",
                   act_budget: float | None = ACT_BUDGET_DB, smooth: float | None = SMOOTH_ALPHA):
    """Quantize the Conv / constant-weight MatMul / Gemm layers of an ONNX model into qconv nodes.

    ``model``: ``onnx.ModelProto`` (not modified) or a path. ``scheme``: a scheme label for every layer
    (``int8-ch-sym``, ``int4-b32-asym``, ``int4-b32-asym-mse``, ``int4-b64-asym-gptq``, ... see
    :class:`~qconv.model_report.Scheme`), or ``plan``: a :class:`~qconv.model_report.Plan` (or its JSON path,
    from ``inspect --target-sqnr T --save-plan P``) giving each layer's scheme; layers it does not name, and
    ``float`` ones, stay float. ``calibration``: feeds for calibrated schemes, ``gptq`` and ``-bc`` (a feed
    dict, an array for the first input, or a list of those; default the seeded random feed ``inspect`` uses,
    which suits no image model: pass real inputs, held out from those you evaluate on). ``fuse``: fold the
    per-channel affine ops (bias Add, Mul, BatchNormalization, ...) and the Relu / Clip(0, 6) that follow a layer
    into its node (see the module docstring). ``min_weights``: layers with fewer weights stay float (0: none);
    the smallest layers (a network's first RGB conv, depthwise and squeeze-excitation convs) hold a tiny share of
    the bytes, while quantizing their activations costs more than their float arithmetic on a CPU without VNNI
    (``qconv/onnx/README.md`` measures PP-OCRv4 det with ``min_weights=1024``).

    ``act_quant``: the activation mode the session runs the nodes with (``"tensor"``, ``"row"``, ``"block"``;
    None: the session's default; a plan records weight schemes only, its ``act_quant`` is not used); ``act_block``: with ``"block"``, the input channels per
    activation block, per layer the largest divisor of its weight block that is ``<= act_block``
    (:func:`layer_act_block`; 0 = the weight's block). Both are recorded in ``qconv.summary`` and are what
    :class:`~qconv.onnx.InferenceSession` uses unless told otherwise. On PP-OCRv4 det the default per-tensor
    activations cost far more accuracy than int8 weights (``qconv/onnx/README.md``).

    Integer activations, measured per node (with ``calibration`` inputs, ``format="qconv"`` and ``act_quant``
    None). ``smooth``: SmoothQuant's ``alpha`` (:mod:`qconv.onnx.smooth`): each conv input's channel ranges on the
    calibration inputs move into the conv's weight (``W diag(s)``) and the ``1/s`` folds into the producing
    layer, where it folds (None: off). ``act_budget``: the dB of output SQNR (calibration inputs) that int8
    activations may cost against float activations of the same weights: :func:`~qconv.onnx.accuracy.search_act_modes`
    finds the conv nodes that run per-tensor int8 within it, recorded per layer as ``act_allowed`` (``["float",
    "tensor"]`` or ``["float"]``) and in ``qconv.summary["act_search"]``; a session's ``act_quant="auto"`` (its
    default) runs those nodes int8 (None: no search, every node float). Without calibration inputs neither runs:
    the nodes keep float activations.

    Accuracy (:mod:`qconv.onnx.accuracy`). ``eval``: evaluation feeds (same forms as ``calibration``); the quantized
    model is run by a qconv session and compared with the float model at every output (SQNR, max abs error), on
    ``eval``, else on the calibration feeds, else on a seeded random feed (meaningless for image models), the
    source recorded beside the figures (``measure=False`` skips it). ``target_sqnr``: accuracy control -- per-layer
    schemes (``int4-b32-asym``, the per-channel int8 default, float; with ``calibration`` their bias-corrected
    forms) chosen by :func:`~qconv.onnx.accuracy.search_plan` so that the model's output reaches ``target_sqnr`` dB
    on the calibration feeds with the fewest weight bytes (never worse than all-int8 at more bytes); ``scheme``
    and ``plan`` are then ignored. ``min_sqnr``: the accuracy floor (default 15 dB; None: no guard); below it a
    :class:`LowAccuracyWarning` names the three layers whose return to int8 (or float) raises the output SQNR
    most, each re-measured. ``progress``: progress bars on stderr. ``threads``: of the measuring sessions.

    ``format``: ``"qconv"`` (``ai.qconv`` nodes, run by :class:`~qconv.onnx.InferenceSession`) or ``"qdq"``: standard
    ONNX that plain onnxruntime runs -- each layer a ``DequantizeLinear`` of its codes (int8 / int4, per channel or
    blocked: opset 14 (HardSwish), or 21 for int4 and blocks; the model's opset is raised with onnx's version converter when
    lower) feeding the original Conv / MatMul, the fused activation and affine ops written back as ONNX ops. The
    weights are the same codes and scales as the qconv file's (float16 values in float32); schemes whose offsets
    are not integer zero points on the scale grid (``asym``, MNN's float minimum) are refused, naming the scheme;
    ``sym`` and ``zp`` ones (the default among them) convert exactly. onnxruntime's
    extended graph optimizations (its default) fuse DequantizeLinear -> MatMul into a MatMul with dynamically
    quantized int8 activations; convs stay float.

    Returns a new ``onnx.ModelProto``; its metadata ``qconv.summary`` (JSON) lists each layer's scheme (and
    ``act_block``), its stored bytes and weight SQNR, the layers left float with the reason, and ``accuracy``
    (:func:`~qconv.onnx.accuracy.measure_model`'s result with the session's default activations, plus ``min_sqnr``,
    ``below_floor``, ``restore`` and, where nodes run int8, ``float_act_sqnr_db``; with ``target_sqnr``,
    ``search``; with calibration, ``smooth`` and ``act_search``). Raises ValueError when the model has no layer qconv can take, for float16 /
    bfloat16 weights, and for scheme names the engines do not run.
    """
    import onnx

    from ..onnx_model import _constants, model_layers

    m = _load(model)
    _check_float32(m)
    float_bytes = m.SerializeToString() if measure or (calibration is not None and act_budget is not None) else None
    if format == "qdq":   # before the layers are read: the converter may renumber nodes
        labels = [scheme or ""] if plan is None else [e["scheme"] for e in
                                                     (plan if isinstance(plan, Plan) else Plan.load(plan)).layers.values()]
        small = target_sqnr is not None or any(Scheme.parse(x).bits == 4 or Scheme.parse(x).block_size
                                               for x in labels if x and x != "float")
        m = _raise_opset(m, 21 if small else 14)   # 21: int4 and blocked DequantizeLinear; 14: HardSwish
    if min_sqnr is not None:
        min_sqnr = float(min_sqnr)
    if plan is not None:
        plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    V.check_choice(act_quant, "act_quant", ("tensor", "row", "block", None))
    V.check_choice(format, "format", ("qconv", "qdq"))
    if format == "qdq" and act_quant is not None:
        raise ValueError("format='qdq' runs in plain onnxruntime with float activations: act_quant must be None")
    act_block = V.check_int(act_block, "act_block", minimum=0)
    min_weights = V.check_int(min_weights, "min_weights", minimum=0)
    if act_budget is not None:
        act_budget = V.check_float(act_budget, "act_budget", minimum=0.0)
    if smooth is not None:
        smooth = V.check_float(smooth, "smooth", minimum=0.0, maximum=1.0)
    if act_block and act_quant != "block":
        raise ValueError(f"act_block={act_block} needs act_quant='block' (got {act_quant!r})")
    skipped: dict = {}
    transposed = _transposed_convs(m) if fuse else 0
    layers = model_layers(m, skipped)
    if not layers:
        why = f" ({len(skipped)} skipped: {skipped})" if skipped else ""
        raise ValueError(f"the model has no Conv or constant-weight MatMul/Gemm layer qconv can quantize{why}")
    if plan is not None:
        schemes = {la.name: Scheme.parse(plan.layers[la.name]["scheme"]) if la.name in plan.layers
                   else Scheme(None) for la in layers}
        unknown = sorted(set(plan.layers) - {la.name for la in layers})
        if unknown:
            raise ValueError(f"the plan names layers this model does not have: {unknown[:5]}"
                             f"{' ...' if len(unknown) > 5 else ''} (was it made for another model?)")
    elif target_sqnr is None:
        if scheme is None:
            raise ValueError("give a scheme or a plan")
        s = Scheme.parse(scheme)
        schemes = {la.name: s for la in layers}
    calib_feeds = _calibration_feeds(m, calibration)
    eval_feeds = _calibration_feeds(m, eval)
    act_search = calib_feeds and act_budget is not None and format == "qconv" and act_quant is None
    smooth_record = None
    if act_search and smooth is not None and fuse:
        m, layers, smooth_record = _smoothed(m, layers, calib_feeds, smooth, threads, fuse, min_weights)
    search = None
    if target_sqnr is not None:
        schemes, search = _accuracy_control(m, layers, float(target_sqnr), calib_feeds, progress, threads)
    if not calib_feeds and any(s.method == "gptq" for s in schemes.values()):
        raise ValueError("gptq schemes fit the weights to real layer inputs: pass calibration= inputs (held out "
                         "from those you evaluate on)")
    calib, bc_source = _layer_calibration(m, layers, calib_feeds, {n for n, s in schemes.items() if s.calibrated},
                                          like=eval_feeds)
    if bc_source is not None and not calib:   # -bc without inputs it can run on: plain rounding, said
        schemes = {n: dataclasses.replace(s, bias_correction=False) for n, s in schemes.items()}

    graph = m.graph
    consts = _constants(m)
    consumers = _consumers(graph)
    graph_outputs = {o.name for o in graph.output}
    nodes = list(graph.node)
    removed: set = set()          # node indices replaced or fused away
    replacement: dict = {}        # node index -> new NodeProto
    new_inits = []
    summary = dict(layers={}, float={}, skipped=dict(skipped))

    def single_consumer(name):
        users = consumers.get(name, [])
        return nodes[users[0]] if len(users) == 1 and name not in graph_outputs else None, \
            (users[0] if len(users) == 1 else None)

    for layer in bar(layers, desc="quantize", unit="layer", enabled=progress):
        sch = schemes[layer.name]
        if sch.bits is None:
            summary["float"][layer.name] = "float in the plan"
            continue
        if layer.weight.size < min_weights:
            summary["float"][layer.name] = f"{layer.weight.size} weights < min_weights={min_weights}"
            continue
        kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
        weight, bias, activation, out_name, fused, folded = layer.weight, layer.bias, None, layer.output_name, [], []
        post, post_affine, depth_to_space = [], None, 1
        if fuse:
            # per-channel affine ops after the layer (Mul / Add / Sub / Div by constants, BatchNormalization)
            # fold into its float weight and bias before quantization: y = a*(W x + b0) + b = (a W) x + (a b0 + b)
            n_out = weight.shape[0]
            a, b = np.ones(n_out), np.zeros(n_out) if bias is None else np.asarray(bias, np.float64)
            nxt, idx = single_consumer(out_name)
            while nxt is not None and (ab := _affine_of(nxt, out_name, consts, n_out, layer.is_linear)) is not None:
                a, b = a * ab[0], b * ab[0] + ab[1]
                out_name = nxt.output[0]
                fused.append(idx)
                folded.append(nxt.op_type)
                nxt, idx = single_consumer(out_name)
            if folded:
                weight = (weight.astype(np.float64) * a.reshape(-1, 1, 1, 1)).astype(np.float32)
                bias = b.astype(np.float32)
            act = _activation_of(nxt, consts) if nxt is not None else None
            hsw = _hardswish_after(out_name, nodes, consumers, consts, graph_outputs)
            silu = _silu_after(out_name, nodes, consumers, graph_outputs) if act is None and hsw is None else None
            if act is not None:
                activation, out_name = act, nxt.output[0]
                fused.append(idx)
            elif hsw is not None:
                activation, out_name = "hardswish", hsw[0]
                fused += hsw[1]
            elif silu is not None:
                activation, out_name = "silu", silu[0]
                fused += silu[1]
            if activation is not None:   # per-channel affine ops after the activation: the node's post_affine
                pa = np.ones(n_out), np.zeros(n_out)
                nxt, idx = single_consumer(out_name)
                while nxt is not None and (ab := _affine_of(nxt, out_name, consts, n_out, layer.is_linear)) is not None:
                    pa = pa[0] * ab[0], pa[1] * ab[0] + ab[1]
                    out_name = nxt.output[0]
                    fused.append(idx)
                    post.append(nxt.op_type)
                    nxt, idx = single_consumer(out_name)
                if post:
                    post_affine = (pa[0].astype(np.float32), pa[1].astype(np.float32))
            nxt, idx = single_consumer(out_name)
            b = _depth_to_space_of(nxt) if nxt is not None and format == "qconv" and not layer.is_linear else 0
            if b > 1 and n_out % (b * b) == 0:   # the node writes the DepthToSpace's output
                depth_to_space, out_name = b, nxt.output[0]
                fused.append(idx)
                post.append("DepthToSpace")
        fit = calib.get(layer.name)
        if fit is not None and sch.method == "gptq" and search is not None:   # as the search fitted it
            fit = fit[GPTQ_FIT]
        try:
            qw = sch.quantize(weight, layer.groups, fit, **kw)
        except ValueError as exc:
            summary["float"][layer.name] = f"{sch.label}: {exc}"
            continue
        bias = sch.corrected_bias(weight, qw, bias, calib.get(layer.name), **kw)
        try:
            ConvSpec(qw, bias, activation=activation, post_affine=post_affine, **kw)  # what the session's layer checks
        except (ValueError, TypeError) as exc:
            summary["float"][layer.name] = f"{sch.label}: {exc}"
            continue
        t, b_, l_, r = layer.extra_pad
        ph, pw = layer.padding
        pads = (ph + t, pw + l_, ph + b_, pw + r)
        if format == "qdq":
            try:
                node, inits = _qdq_nodes(layer, qw, bias, activation, post_affine, out_name, pads, sch.label)
            except _NotQDQ as exc:
                raise ValueError(str(exc)) from None
        else:
            node, inits = make_qnode(layer.name, QMATMUL if layer.is_linear else QCONV, qw, bias, activation,
                                     layer.input_name, out_name, stride=layer.stride, pads=pads,
                                     dilation=layer.dilation, scheme=sch.label, post_affine=post_affine,
                                     depth_to_space=depth_to_space)
        removed.update([layer.node_index] + fused)
        replacement[layer.node_index] = node
        new_inits += inits
        summary["layers"][layer.name] = dict(scheme=sch.label, op=layer.op, activation=activation or "",
                                             folded=folded, post=post, bytes=int(qw.nbytes), block_size=int(qw.block_size),
                                             weight_sqnr_db=_rounded(sqnr_db(qw.dequantize(), weight)))
        if act_block:
            summary["layers"][layer.name]["act_block"] = layer_act_block(qw, act_block)
    if not replacement:
        raise ValueError(f"no layer of the model could be quantized: {summary['float'] or summary['skipped']}")

    kept = []
    for i, node in enumerate(nodes):
        if i in replacement:
            kept.extend(replacement[i] if isinstance(replacement[i], list) else [replacement[i]])
        elif i not in removed:
            kept.append(node)
    used = {n for node in kept for n in node.input} | graph_outputs
    for node in kept:  # names used inside subgraphs (If/Loop bodies) count too
        for a in node.attribute:
            for g in list(a.graphs) + ([a.g] if a.HasField("g") else []):
                used |= {n for sub in g.node for n in sub.input}
    kept = [n for n in kept if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                                    and n.output[0] not in used)]
    del graph.node[:]
    graph.node.extend(kept)
    old_inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(old_inits + new_inits)
    produced = {o for n in kept for o in n.output} | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    keep_inputs = [i for i in graph.input if i.name in used or i.name not in consts]
    del graph.input[:]
    graph.input.extend(keep_inputs)
    keep_vi = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(keep_vi)
    if format == "qconv" and not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.append(onnx.helper.make_opsetid(DOMAIN, OPSET))
    if act_quant:
        summary["act_quant"] = act_quant
    if search is not None:
        summary["search"] = search
    if bc_source is not None:
        summary["bias_correction"] = bc_source
    if smooth_record is not None:
        summary["smooth"] = smooth_record
    if transposed:
        summary["convtranspose_as_conv"] = transposed
    for entry in summary["layers"].values():
        entry["act_allowed"] = ["float"]
    summary["format"] = format
    if act_search:
        from .accuracy import search_act_modes
        found = search_act_modes(float_bytes, _with_summary(m, summary), calib_feeds,
                                 budget_db=act_budget, threads=threads, progress=progress)
        for name, entry in summary["layers"].items():
            entry["act_allowed"] = found.allowed.get(name, ["float"])
        summary["act_search"] = dict(found.record(), budget_db=act_budget, on=f"{len(calib_feeds)} calibration input(s)")
    if measure:
        summary["accuracy"] = _measure(float_bytes, _with_summary(m, summary), layers, schemes, eval_feeds,
                                       calib_feeds, min_sqnr, threads, act_quant)
    return _with_summary(m, summary)


def _with_summary(m, summary: dict):
    """``m`` with ``qconv.summary`` = ``summary`` and the runtime note (replacing any earlier ones), returned."""
    meta = [p for p in m.metadata_props if p.key not in (SUMMARY_KEY, RUNTIME_KEY)]
    del m.metadata_props[:]
    m.metadata_props.extend(meta)
    m.metadata_props.add(key=SUMMARY_KEY, value=json.dumps(summary))
    m.metadata_props.add(key=RUNTIME_KEY, value=RUNTIME_NOTE if summary.get("format") != "qdq" else QDQ_NOTE)
    return m


def model_summary(model) -> dict:
    """The ``qconv.summary`` metadata of a quantized model (``{}`` for a float model): ``model`` an
    ``onnx.ModelProto``, its serialized bytes or a path."""
    import os

    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as fh:
            model = fh.read()
    if isinstance(model, (bytes, bytearray, memoryview)):
        value = wire.metadata(model).get(SUMMARY_KEY)
    else:
        value = next((p.value for p in model.metadata_props if p.key == SUMMARY_KEY), None)
    return json.loads(value) if value is not None else {}
