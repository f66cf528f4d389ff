"""``quantize_model``: rewrite an ONNX model so every Conv / constant-weight MatMul / Gemm is one qconv node.

The layers are found by :func:`qconv.onnx_model.model_layers` (the reader ``inspect`` uses); each is quantized
with a :class:`~qconv.model_report.Scheme` (one for all, or per layer from a :class:`~qconv.model_report.Plan`)
and replaced by a ``ai.qconv`` node (:mod:`qconv.onnx.nodes`) carrying its weight as packed initializers; the
float weight initializers (and ``Constant`` nodes) no other node uses are removed, so the saved file is small.

Fusions, where the producer's output feeds only that one node and is not a graph output:
``Relu`` -> ``activation="relu"``; ``Clip(0, 6)`` -> ``"relu6"``; ``Clip(0, none)`` -> ``"relu"``; for a MatMul
without bias, a following ``Add`` of a constant broadcast along the last axis (shape ``(N,)``, ``(1, N)``, ...)
becomes the node's bias (then Relu/Clip after it fuse too).

Calibration: ``gptq`` and ``-bc`` (bias correction) schemes use each layer's input captured by running the
float model on the calibration feeds. Activations: ``act_quant`` / ``act_block`` record in the model how the
session quantizes each node's input (``act_block`` resolved per layer, see :func:`layer_act_block`).
"""
from __future__ import annotations

import json
import warnings

import numpy as np

from .. import _validate as V
from ..geometry import ConvSpec
from ..model_report import CALIB_SEED, Plan, Scheme
from .nodes import DOMAIN, OPSET, QCONV, QMATMUL, make_qnode

SUMMARY_KEY = "qconv.summary"


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


def _bias_add(node, produced: str, consts, n_out: int):
    """The ``(N,)`` bias when ``node`` is ``Add(produced, c)`` with a constant ``c`` along the last axis."""
    if node.op_type != "Add" or len(node.input) != 2:
        return None
    other = node.input[1] if node.input[0] == produced else node.input[0]
    c = consts.get(other)
    if c is None or other == produced:
        return None
    c = np.asarray(c)
    if c.dtype != np.float32 or c.size != n_out or c.shape[-1] != n_out:
        return None
    return c.reshape(-1).astype(np.float32)


def _calibration_feeds(model, calibration):
    """``calibration``: None, a feed dict, an array (the first input), or a list of those -> list of feeds."""
    if calibration is None:
        return []
    if isinstance(calibration, (dict, np.ndarray)):
        calibration = [calibration]
    name = model.graph.input[0].name
    return [c if isinstance(c, dict) else {name: np.asarray(c, np.float32)} for c in calibration]


def _layer_calibration(model, layers, feeds, need):
    """``{layer name: [NCHW calibration input per feed]}`` for the layers in ``need``."""
    from ..onnx_model import capture, default_input

    if not need:
        return {}
    if not feeds:
        warnings.warn(f"{len(need)} layer(s) with a calibrated scheme (gptq, -bc) are calibrated on a random feed: "
                      "pass real calibration inputs (quantize_model(calibration=...), --calibration)", stacklevel=3)
        feeds = [default_input(model, seed=CALIB_SEED)]
    captured = [capture(model, [la for la in layers if la.name in need], f) for f in feeds]
    return {layer.name: [layer.conv_input(t[layer.input_name]) for t in captured] for layer in layers
            if layer.name in need}


def layer_act_block(weight, act_block: int) -> int:
    """The activation block of one layer for a model-wide ``act_block``: the largest divisor of the weight's
    block (its input channels per group when per-channel) that is ``<= act_block`` (0 stays 0: the weight's
    block), so that every layer takes it (:class:`~qconv.geometry.ConvSpec` needs ``act_block`` to divide the
    weight block or be a multiple of it)."""
    if not act_block:
        return 0
    wb = weight.block_channels
    return max(d for d in range(1, min(act_block, wb) + 1) if wb % d == 0)


def quantize_model(model, scheme: str | None = "int8-ch-sym", plan: Plan | str | None = None, calibration=None,
                   *, fuse: bool = True, act_quant: str | None = None, act_block: int = 0):
    """Quantize the Conv / constant-weight MatMul / Gemm layers of an ONNX model into qconv nodes.

    ``model``: ``onnx.ModelProto`` (not modified) or a path. ``scheme``: a scheme label for every layer
    (``int8-ch-sym``, ``int4-b32-asym``, ``int4-b32-asym-mse``, ``int4-b64-asym-gptq``, ... see
    :class:`~qconv.model_report.Scheme`), or ``plan``: a :class:`~qconv.model_report.Plan` (or its JSON path,
    from ``inspect --target-sqnr T --save-plan P``) giving each layer's scheme; layers it does not name, and
    ``float`` ones, stay float. ``calibration``: feeds for calibrated schemes, ``gptq`` and ``-bc`` (a feed
    dict, an array for the first input, or a list of those; default the seeded random feed ``inspect`` uses,
    which suits no image model: pass real inputs, held out from those you evaluate on). ``fuse``: fold a
    following Relu / Clip(0, 6) / bias Add into the node (see the module docstring).

    ``act_quant``: the activation mode the session runs the nodes with (``"tensor"``, ``"row"``, ``"block"``;
    None: the plan's, else the session's default); ``act_block``: with ``"block"``, the input channels per
    activation block, per layer the largest divisor of its weight block that is ``<= act_block``
    (:func:`layer_act_block`; 0 = the weight's block). Both are recorded in ``qconv.summary`` and are what
    :class:`~qconv.onnx.InferenceSession` uses unless told otherwise. On PP-OCRv4 det the default per-tensor
    activations cost far more accuracy than int8 weights (``qconv/onnx/README.md``).

    Returns a new ``onnx.ModelProto``; its metadata ``qconv.summary`` (JSON) lists each layer's scheme (and
    ``act_block``) and the layers left float with the reason. Raises ValueError when the model has no layer
    qconv can take.
    """
    import onnx

    from ..onnx_model import _constants, model_layers

    m = _load(model)
    if plan is not None:
        plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    if act_quant is None and plan is not None:
        act_quant = plan.act_quant
    V.check_choice(act_quant, "act_quant", ("tensor", "row", "block", None))
    act_block = V.check_int(act_block, "act_block", minimum=0)
    if act_block and act_quant != "block":
        raise ValueError(f"act_block={act_block} needs act_quant='block' (got {act_quant!r})")
    skipped: dict = {}
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
    else:
        if scheme is None:
            raise ValueError("give a scheme or a plan")
        s = Scheme.parse(scheme)
        schemes = {la.name: s for la in layers}
    calib = _layer_calibration(m, layers, _calibration_feeds(m, calibration),
                               {n for n, s in schemes.items() if s.calibrated})

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

    for layer in layers:
        sch = schemes[layer.name]
        if sch.bits is None:
            summary["float"][layer.name] = "float in the plan"
            continue
        kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
        try:
            qw = sch.quantize(layer.weight, layer.groups, calib.get(layer.name), **kw)
        except ValueError as exc:
            summary["float"][layer.name] = f"{sch.label}: {exc}"
            continue
        bias = sch.corrected_bias(layer.weight, qw, layer.bias, calib.get(layer.name), **kw)
        activation, out_name, fused = None, layer.output_name, []
        if fuse:
            nxt, idx = single_consumer(out_name)
            if nxt is not None and layer.is_linear and layer.bias is None:
                b = _bias_add(nxt, out_name, consts, qw.out_channels)
                if b is not None:
                    bias, out_name = b if bias is None else b + bias, nxt.output[0]
                    fused.append(idx)
                    nxt, idx = single_consumer(out_name)
            act = _activation_of(nxt, consts) if nxt is not None else None
            if act is not None:
                activation, out_name = act, nxt.output[0]
                fused.append(idx)
        try:
            ConvSpec(qw, bias, activation=activation, **kw)  # what the session's layer will check
        except (ValueError, TypeError) as exc:
            summary["float"][layer.name] = f"{sch.label}: {exc}"
            continue
        t, b_, l_, r = layer.extra_pad
        ph, pw = layer.padding
        node, inits = make_qnode(layer.name, QMATMUL if layer.is_linear else QCONV, qw, bias, activation,
                                 layer.input_name, out_name, stride=layer.stride,
                                 pads=(ph + t, pw + l_, ph + b_, pw + r), dilation=layer.dilation,
                                 scheme=sch.label)
        removed.update([layer.node_index] + fused)
        replacement[layer.node_index] = node
        new_inits += inits
        summary["layers"][layer.name] = dict(scheme=sch.label, op=layer.op, activation=activation or "",
                                             fused_bias_add=bool(fused) and nodes[fused[0]].op_type == "Add")
        if act_block:
            summary["layers"][layer.name]["act_block"] = layer_act_block(qw, act_block)
    if not replacement:
        raise ValueError(f"no layer of the model could be quantized: {summary['float'] or summary['skipped']}")

    kept = []
    for i, node in enumerate(nodes):
        if i in replacement:
            kept.append(replacement[i])
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
    if not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.append(onnx.helper.make_opsetid(DOMAIN, OPSET))
    meta = [p for p in m.metadata_props if p.key != SUMMARY_KEY]
    del m.metadata_props[:]
    m.metadata_props.extend(meta)
    if act_quant:
        summary["act_quant"] = act_quant
    m.metadata_props.add(key=SUMMARY_KEY, value=json.dumps(summary))
    return m


def model_summary(model) -> dict:
    """The ``qconv.summary`` metadata of a quantized model (``{}`` for a float model)."""
    for p in model.metadata_props:
        if p.key == SUMMARY_KEY:
            return json.loads(p.value)
    return {}
