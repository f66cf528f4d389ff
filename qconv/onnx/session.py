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
import os
import weakref

import numpy as np

from .._ext._ortops import KEY_ATTR
from .kernels import KERNELS, make_kernel, register, take_error
from . import wire
from .nodes import DOMAIN, is_qnode, read_qnode

_IDS = itertools.count(1)
_NP_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _runtime_graph(data, nodes: list, inits: dict, key_prefix: str, layer_options: dict,
                   act_blocks: dict) -> tuple[bytes, dict]:
    """``(model bytes, {key: kernel})``: the ModelProto ``data`` (its graph's ``nodes`` and ``inits``, as
    :func:`wire.graph_parts` reads them) with every qconv node replaced by its ``X -> Y`` form and their weight
    initializers left out, and the nodes' prepared kernels. ``act_blocks``: ``{node name: act_block}``
    overriding ``layer_options`` per node."""
    kernels, replace, drop = {}, {}, set()
    for i, node in enumerate(nodes):
        if not is_qnode(node):
            continue
        qn = read_qnode(node, inits)
        key = f"{key_prefix}/{qn.name}"
        if key in kernels:
            raise ValueError(f"two qconv nodes are named {qn.name!r}")
        kernels[key] = make_kernel(qn, **(dict(layer_options, act_block=act_blocks[qn.name])
                                          if qn.name in act_blocks else layer_options))
        drop.update(n for n in node.input[1:] if n)
        replace[i] = wire.make_node(node.op_type, [node.input[0]], [node.output[0]], node.name, DOMAIN,
                                    {KEY_ATTR: key})
    used = {n for i, node in enumerate(nodes) if i not in replace for n in node.input}
    return wire.rewrite_graph(data, replace, drop - used), kernels


def _read_model(path_or_model) -> tuple[bytes, list, dict]:
    """``(bytes, nodes, initializers)`` of a path or an ``onnx.ModelProto`` (:func:`wire.graph_parts`). A file
    whose tensors keep their data in external files is loaded with ``onnx`` (which reads them in); other files
    are read as they are."""
    if hasattr(path_or_model, "SerializeToString"):
        data = path_or_model.SerializeToString()
        return (data,) + wire.graph_parts(data)
    if not isinstance(path_or_model, (str, os.PathLike)):
        raise TypeError(f"path_or_model must be a path or an onnx.ModelProto, got {type(path_or_model).__name__}")
    with open(path_or_model, "rb") as f:
        data = f.read()
    try:
        nodes, inits = wire.graph_parts(data)
    except ValueError as exc:
        raise ValueError(f"{path_or_model}: not a readable ONNX model ({exc})") from None
    if any(t.external for t in inits.values()):
        from ..onnx_model import load_model
        return _read_model(load_model(path_or_model))
    return data, nodes, inits


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
    ``log_severity_level``, ...). ``providers`` defaults to the CPU execution provider.

    ``run(output_names, feeds)`` -> list of numpy arrays, as onnxruntime's; ``get_inputs()``, ``get_outputs()``.
    """

    def __init__(self, path_or_model, device="cpu", threads=None, *, providers=None, **options):
        import onnxruntime as ort

        from ..cpu.engine import default_threads
        from .quantize import model_summary

        data, nodes, inits = _read_model(path_or_model)
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
        summary = model_summary(data)
        act_quant = options.pop("act_quant") if "act_quant" in options else summary.get("act_quant") or "auto"
        act_blocks = {} if "act_block" in options else {  # quantize_model(act_block=...) resolved per layer
            name: e["act_block"] for name, e in summary.get("layers", {}).items() if "act_block" in e}
        self.device, self.threads, self.act_quant = device, threads, act_quant
        self._id = f"s{next(_IDS)}"
        data, kernels = _runtime_graph(data, nodes, inits, self._id, dict(device=device, threads=threads,
                                                                          act_quant=act_quant, **options), act_blocks)
        del nodes, inits
        self.kernels = list(kernels.values())   # one per qconv node
        KERNELS.update(kernels)
        self._finalizer = weakref.finalize(self, _release, list(kernels))
        if kernels:
            so.register_custom_ops_library(register())
        try:
            self._sess = ort.InferenceSession(data, so,
                                              providers=providers or ["CPUExecutionProvider"])
        except Exception:
            self._finalizer()
            raise
        del data
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
        """``output_names`` (None = all) -> list of numpy arrays for ``feeds`` ``{input name: array}``. An exception
        of a qconv layer fails its node (onnxruntime raises) and is raised as it is, onnxruntime's error chained."""
        if self._sess is None:
            raise RuntimeError("this session is closed")
        self.check_feeds(feeds)
        take_error()
        try:
            return self._sess.run(output_names, feeds, run_options)
        except Exception as exc:
            kernel_exc = take_error()
            if kernel_exc is not None:
                raise kernel_exc from exc
            raise

    def close(self) -> None:
        """Release the prepared kernels (the session cannot run afterwards)."""
        self._finalizer()
        self._sess = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
