"""``InferenceSession``: run a quantized (or float) ONNX model in onnxruntime with qconv's kernels.

At construction the qconv nodes (:mod:`qconv.onnx.nodes`) are read, each becomes a prepared qconv layer (its
weight goes straight from the packed initializers into the engine's layout: no float copy of a quantized
weight is made), and onnxruntime gets the graph with those nodes reduced to ``X -> Y`` plus a key attribute
(:mod:`qconv.onnx.kernels`), without the weight initializers; the parsed model is then dropped.

Activations: ``act_quant="auto"`` (the default) is, on the CPU, float activations for convs (weight-only
quantization: :data:`qconv.onnx.kernels.SESSION_CONV_ACT_QUANT`; on real vision models they are both more
accurate and faster than dynamic int8 on CPUs without VNNI: the direct float path reads and writes NCHW as it is)
and per-row symmetric int8 for QMatMul (``qconv.Linear``: a row's result never depends on the other rows of the
batch, e.g. on the sequence length); other engines keep their own default (OpenCL: float). ``act_quant="tensor"``
runs convs on the integer GEMM with per-tensor dynamic int8, as ``qconv.Conv2d`` does by default.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from .._ext._ortops import KEY_ATTR
from .kernels import KERNELS, make_kernel, register, take_error
from .nodes import DOMAIN, is_qnode, read_qnode

_IDS = itertools.count(1)
_NP_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _runtime_graph(model, key_prefix: str, layer_options: dict, act_blocks: dict, chain: bool = True) -> dict:
    """Replace every qconv node of ``model`` (in place) by its ``X -> Y`` form; returns ``{key: kernel}``.
    ``act_blocks``: ``{node name: act_block}`` overriding ``layer_options`` per node; ``chain``: merge runs of
    nodes into one operator call (:func:`_chain`)."""
    import onnx

    inits = {t.name: t for t in model.graph.initializer}
    kernels, drop = {}, set()
    for node in model.graph.node:
        if not is_qnode(node):
            continue
        qn = read_qnode(node, inits)
        key = f"{key_prefix}/{qn.name}"
        if key in kernels:
            raise ValueError(f"two qconv nodes are named {qn.name!r}")
        kernels[key] = make_kernel(qn, **(dict(layer_options, act_block=act_blocks[qn.name])
                                          if qn.name in act_blocks else layer_options))
        drop.update(n for n in node.input[1:] if n)
        new = onnx.helper.make_node(node.op_type, [node.input[0]], [node.output[0]], name=node.name,
                                    domain=DOMAIN, **{KEY_ATTR: key})
        node.CopyFrom(new)
    used = {n for node in model.graph.node for n in node.input}
    keep = [t for t in model.graph.initializer if not (t.name in drop and t.name not in used)]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    if chain:
        _chain(model, kernels)
    return kernels


def _chain(model, kernels: dict) -> None:
    """Merge every run of qconv nodes in which each node's output feeds only the next step (and is no graph output)
    into one node of a :class:`~qconv.onnx.kernels.ChainKernel`, in place. A step is the next qconv node, or a
    squeeze-and-excitation block on the node's output ``x`` (:class:`~qconv.onnx.kernels.SqueezeExcite`:
    ``GlobalAveragePool -> qconv -> qconv -> HardSigmoid -> Mul(x, .)``, optionally ``-> Add(., x)``, every
    intermediate read by the next op only). The chain is registered in ``kernels`` under its qconv nodes' keys
    joined by ``"|"``."""
    import onnx

    from .kernels import ChainKernel, SqueezeExcite

    graph = model.graph
    consumers: dict = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def key_of(node):
        return next(a.s.decode() for a in node.attribute if a.name == KEY_ATTR) if node.domain == DOMAIN else None

    def only(name, op=None):
        """The single consumer of tensor ``name`` (of ``op`` type, or a qconv node for op="q"), or None."""
        nxt = consumers.get(name, [])
        if name in outputs or len(nxt) != 1:
            return None
        n = nxt[0]
        ok = key_of(n) is not None if op == "q" else (op is None or (n.op_type == op and n.domain in ("", "ai.onnx")))
        return n if ok else None

    def se_after(x):
        """``(SqueezeExcite args, its nodes, its output name)`` when an SE block reads tensor ``x``, else None."""
        users = consumers.get(x, [])
        if x in outputs or len(users) not in (2, 3):
            return None
        gap = next((u for u in users if u.op_type == "GlobalAveragePool"), None)
        if gap is None or (s1 := only(gap.output[0], "q")) is None or s1.input[0] != gap.output[0]:
            return None
        if (s2 := only(s1.output[0], "q")) is None or (hs := only(s2.output[0], "HardSigmoid")) is None:
            return None
        mul = only(hs.output[0], "Mul")
        if mul is None or sorted(mul.input) != sorted([x, hs.output[0]]) or mul not in users:
            return None
        nodes, out, add = [gap, s1, s2, hs, mul], mul.output[0], None
        if len(users) == 3:
            add = only(mul.output[0], "Add")
            if add is None or sorted(add.input) != sorted([x, mul.output[0]]) or add not in users:
                return None
            nodes.append(add)
            out = add.output[0]
        if any(n.output[0] in outputs for n in nodes[:-1]):
            return None
        attrs = {a.name: a.f for a in hs.attribute}
        return (s1, s2, attrs.get("alpha", 0.2), attrs.get("beta", 0.5), add is not None), nodes, out

    def step_after(out):
        """The step that reads tensor ``out``: ``("q", node, node's output)``, ``("se", (args, nodes), output)``."""
        nxt = only(out, "q")
        if nxt is not None and nxt.input[0] == out and id(nxt) not in absorbed:
            return "q", nxt, nxt.output[0]
        se = se_after(out)
        return ("se", se[:2], se[2]) if se is not None else None

    absorbed: set = set()   # the SE blocks' qconv nodes: never chain heads of their own
    for node in graph.node:
        if key_of(node) is not None and (se := se_after(node.output[0])) is not None:
            absorbed.update(id(n) for n in se[1] if key_of(n) is not None)
    qnodes = [n for n in graph.node if key_of(n) is not None and id(n) not in absorbed]
    links = {id(n): step_after(n.output[0]) for n in qnodes}
    targets = set()
    for n in qnodes:
        out = n.output[0]
        while (st := step_after(out)) is not None and st[0] == "se":   # the node after an SE block
            out = st[2]
        if st is not None:
            targets.add(id(st[1]))
    merged: dict = {}   # id(head) -> the chain's node; id(other members) -> None (dropped)
    for head in (n for n in qnodes if links[id(n)] is not None and id(n) not in targets):
        steps, keys, dropped, out = [kernels[key_of(head)]], [key_of(head)], [], head.output[0]
        while (st := step_after(out)) is not None:
            kind, what, out = st
            if kind == "q":
                steps.append(kernels[key_of(what)])
                keys.append(key_of(what))
                dropped.append(what)
            else:
                (s1, s2, alpha, beta, residual), nodes = what
                steps.append(SqueezeExcite(kernels[key_of(s1)], kernels[key_of(s2)], alpha, beta, residual))
                keys += [key_of(s1), key_of(s2)]
                dropped += nodes
        key = "|".join(keys)
        kernels[key] = ChainKernel(steps)
        merged[id(head)] = onnx.helper.make_node(head.op_type, [head.input[0]], [out],
                                                 name="+".join(k.split("/", 1)[-1] for k in keys), domain=DOMAIN,
                                                 **{KEY_ATTR: key})
        merged.update({id(n): None for n in dropped})
    nodes = [merged.get(id(n), n) for n in graph.node]
    del graph.node[:]
    graph.node.extend(n for n in nodes if n is not None)


def _release(keys):
    for k in keys:
        KERNELS.pop(k, None)


class InferenceSession:
    """onnxruntime's ``InferenceSession`` interface over a model quantized by :func:`qconv.onnx.quantize_model`.

    ``path_or_model``: path of an ``.onnx`` file or an ``onnx.ModelProto`` (a float model runs too: plain
    onnxruntime). ``device``: the qconv engine of the qconv nodes (``"cpu"``, ``"opencl"``, ``"reference"``, ...).
    ``threads``: threads of both qconv's layers and onnxruntime's intra-op pool (default: every core of this
    process), with onnxruntime's spinning off (``session.intra_op.allow_spinning=0``) so that its idle workers do
    not hold the cores qconv's threads need, and its memory pattern off (``enable_mem_pattern=False``: lower peak
    memory, see the constructor). ``options``: ``act_quant`` (default ``"auto"``, see the module
    docstring; the ``act_quant`` the model was quantized with, if any), ``act_block`` (default: each node's
    from ``quantize_model(act_block=...)``, else the weight's block), other qconv layer
    options (``kernel``, ...) and any ``onnxruntime.SessionOptions`` attribute (``graph_optimization_level``,
    ``log_severity_level``, ...), and ``chain`` (default True: a run of qconv nodes that each feed only the next is
    one operator call; False keeps one per node, e.g. for onnxruntime's per-node profile). ``providers`` defaults
    to the CPU execution provider.

    ``run(output_names, feeds)`` -> list of numpy arrays, as onnxruntime's; ``get_inputs()``, ``get_outputs()``.
    """

    def __init__(self, path_or_model, device="cpu", threads=None, *, providers=None, **options):
        import onnx
        import onnxruntime as ort

        from ..cpu.engine import default_threads
        from ..onnx_model import load_model
        from .quantize import model_summary

        if isinstance(path_or_model, onnx.ModelProto):
            model = onnx.ModelProto()
            model.CopyFrom(path_or_model)
        else:
            model = load_model(path_or_model)
        threads = default_threads() if threads is None else int(threads)
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        so = ort.SessionOptions()
        # onnxruntime's memory pattern (a block for all planned tensors, allocated from the 2nd run on beside
        # the arena) raises the peak RSS on PP-OCRv4 det at 640 from 178 to 231 MiB here; without it the arena
        # serves every tensor. A user's enable_mem_pattern=True still wins.
        so.enable_mem_pattern = False
        for name in [k for k in options if hasattr(so, k) and not k.startswith("_")]:
            setattr(so, name, options.pop(name))
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        summary = model_summary(model)
        act_quant = options.pop("act_quant") if "act_quant" in options else summary.get("act_quant") or "auto"
        act_blocks = {} if "act_block" in options else {  # quantize_model(act_block=...) resolved per layer
            name: e["act_block"] for name, e in summary.get("layers", {}).items() if "act_block" in e}
        self.device, self.threads, self.act_quant = device, threads, act_quant
        self._id = f"s{next(_IDS)}"
        chain = bool(options.pop("chain", True))
        kernels = _runtime_graph(model, self._id, dict(device=device, threads=threads, act_quant=act_quant,
                                                       **options), act_blocks, chain)
        self.kernels = [k for key, k in kernels.items() if "|" not in key]   # one per qconv node
        KERNELS.update(kernels)
        self._finalizer = weakref.finalize(self, _release, list(kernels))
        if kernels:
            so.register_custom_ops_library(register())
        try:
            self._sess = ort.InferenceSession(model.SerializeToString(), so,
                                              providers=providers or ["CPUExecutionProvider"])
        except Exception:
            self._finalizer()
            raise
        del model
        self._inputs = self._sess.get_inputs()

    def get_inputs(self):
        return self._sess.get_inputs()

    def get_outputs(self):
        return self._sess.get_outputs()

    def get_modelmeta(self):
        return self._sess.get_modelmeta()

    def check_feeds(self, feeds: dict) -> None:
        """Raise a clear error for missing, unknown, wrongly typed or wrongly shaped inputs."""
        if not isinstance(feeds, dict):
            raise TypeError(f"feeds must be a dict {{input name: array}}, got {type(feeds).__name__}")
        names = [i.name for i in self._inputs]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}; the model takes {names}")
        unknown = [n for n in feeds if n not in names]
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; the model takes {names}")
        for inp in self._inputs:
            x = feeds[inp.name]
            want = _NP_TYPES.get(inp.type)
            dtype = getattr(x, "dtype", None)
            if want is not None and dtype != want:
                raise TypeError(f"input {inp.name!r} must be {np.dtype(want).name} ({inp.type}), got "
                                f"{dtype if dtype is not None else type(x).__name__}")
            shape = np.shape(x)
            if len(shape) != len(inp.shape):
                raise ValueError(f"input {inp.name!r} must have {len(inp.shape)} dimensions {inp.shape}, got shape "
                                 f"{shape}")
            bad = [(i, d, s) for i, (d, s) in enumerate(zip(inp.shape, shape)) if isinstance(d, int) and d != s]
            if bad:
                raise ValueError(f"input {inp.name!r} must have shape {inp.shape}, got {shape} (dimension "
                                 f"{bad[0][0]} must be {bad[0][1]})")

    def run(self, output_names, feeds, run_options=None):
        """``output_names`` (None = all) -> list of numpy arrays for ``feeds`` ``{input name: array}``."""
        if self._sess is None:
            raise RuntimeError("this session is closed")
        self.check_feeds(feeds)
        take_error()
        try:
            out = self._sess.run(output_names, feeds, run_options)
        except Exception as exc:
            kernel_exc = take_error()
            if kernel_exc is not None:
                raise kernel_exc from exc
            raise
        kernel_exc = take_error()
        if kernel_exc is not None:
            raise kernel_exc
        return out

    def close(self) -> None:
        """Release the prepared kernels (the session cannot run afterwards)."""
        self._finalizer()
        self._sess = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
