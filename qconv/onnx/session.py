"""``InferenceSession``: run a quantized (or float) ONNX model in onnxruntime with qconv's kernels.

At construction the qconv nodes (:mod:`qconv.onnx.nodes`) are read, each becomes a prepared qconv layer (its
weight goes straight from the packed initializers into the engine's layout: no float copy of a quantized
weight is made), and onnxruntime gets the graph with those nodes reduced to ``X -> Y`` plus a key attribute
(:mod:`qconv.onnx.kernels`), without the weight initializers; the parsed model is then dropped (bytes or a
``ModelProto`` given are kept as bytes for pickling: a pickled session re-creates itself from them).

Activations: ``act_quant="auto"`` (the default) is, on the CPU, per node what ``quantize_model`` measured: a conv
whose ``act_allowed`` (``qconv.summary``, from the activation search of a model quantized with calibration
inputs) lists ``"tensor"`` runs per-tensor dynamic int8 where that is faster (the direct int8 conv of AMX / AVX-512
VNNI CPUs; with the AVX2 kernel float is faster, and kept), every other conv
float activations (weight-only quantization; depthwise and grouped convs always:
:func:`qconv.onnx.kernels.auto_act_quant`); QMatMul nodes per-row symmetric int8 (``qconv.Linear``: a row's result
never depends on the other rows of the batch, e.g. on the sequence length). A narrow int8 node (at most
:data:`~qconv.onnx.kernels.ACT_TIMED_PRODUCTS` products an output: stems, 1x1 convs of few channels) is timed in
both modes at its first call and runs float where that is clearly faster on this CPU (``QCONV_ACT_TIMING=0``: never;
:func:`qconv.onnx.measure_model` measures the recorded modes). ``session.act_modes`` says what each node runs. Other engines keep their own default (OpenCL: float). ``act_quant="tensor"`` runs every conv with
per-tensor dynamic int8, as ``qconv.Conv2d`` does by default; ``"none"`` every node float.
"""
from __future__ import annotations

import inspect
import itertools
import os
import weakref

import numpy as np

from .._ext._ortops import KEY_ATTR
from .kernels import KERNELS, make_kernel, register, take_error
from . import wire
from .nodes import DOMAIN, is_qnode, read_qnode

_IDS = itertools.count(1)
_SPIN = "session.intra_op.allow_spinning"
_REGISTERED = weakref.WeakSet()   # the SessionOptions objects qconv's custom-op library is registered on
_NP_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _runtime_graph(data, nodes: list, inits: dict, key_prefix: str, layer_options: dict,
                   node_options: dict, fuse_chains: bool = True) -> tuple[bytes, dict]:
    """``(model bytes, {key: kernel})``: the ModelProto ``data`` (its graph's ``nodes`` and ``inits``, as
    :func:`wire.graph_parts` reads them) with every qconv node replaced by its ``X -> Y`` form and their weight
    initializers left out, and the nodes' prepared kernels. ``node_options``: ``{node name: {option: value}}``
    (``act_block``, ``act_allowed``) over ``layer_options`` per node. On the CPU (and with ``fuse_chains``) the
    elementwise chains between nodes become ``QFused`` nodes (:mod:`qconv.onnx.fusion`) with their kernels."""
    kernels, replace, drop, keys = {}, {}, set(), {}
    for i, node in enumerate(nodes):
        if not is_qnode(node):
            continue
        qn = read_qnode(node, inits)
        key = f"{key_prefix}/{qn.name}"
        if key in kernels:
            raise ValueError(f"two qconv nodes are named {qn.name!r}")
        kernels[key] = make_kernel(qn, **layer_options, **node_options.get(qn.name, {}))
        keys[i] = key
        drop.update(n for n in node.input[1:] if n)
        replace[i] = wire.make_node(node.op_type, [node.input[0]], [node.output[0]], node.name, DOMAIN,
                                    {KEY_ATTR: key})
    dropped = set()
    if kernels and layer_options.get("device", "cpu") == "cpu" and fuse_chains:
        from .excite import excite
        from .fusion import fuse
        from .pool import pools
        outputs, threads = set(wire.graph_outputs(data)), layer_options.get("threads") or 1
        if not any(n.op_type in ("If", "Loop", "Scan") for n in nodes):   # their bodies may read any value
            # squeeze-excitation blocks first (their qconv nodes run inside the block's kernel), then the chains
            e_replace, dropped, excited = excite(nodes, inits, outputs, key_prefix, threads,
                                                 {i: k for i, k in keys.items() if nodes[i].op_type == "QConv"},
                                                 kernels)
            for i in dropped:
                replace.pop(i, None)
            replace.update(e_replace)
            kernels.update(excited)
            p_replace, pooled = pools(nodes, key_prefix, threads, skip=dropped | set(replace))
            replace.update(p_replace)
            kernels.update(pooled)
        f_replace, f_dropped, fused = fuse(nodes, inits, outputs, key_prefix, threads,
                                           skip=dropped | set(replace) - set(keys))
        dropped |= f_dropped
        replace.update(f_replace)
        kernels.update(fused)
        if not any(n.op_type in ("If", "Loop", "Scan") for n in nodes):
            # 1x1 convs and the depthwise convs of their outputs, as one node each
            from .pair import pair
            free = {i: k for i, k in keys.items() if nodes[i].op_type == "QConv" and i not in dropped
                    and wire.read_node(replace[i]).op_type == "QConv"}
            r_replace, r_dropped, paired = pair(nodes, outputs, key_prefix, free, kernels, threads)
            for i in r_dropped:
                replace.pop(i, None)
            dropped |= r_dropped
            replace.update(r_replace)
            kernels.update(paired)
    used = {n for i, node in enumerate(nodes) if i not in replace and i not in dropped for n in node.input}
    used |= {n for i in replace for n in wire.read_node(replace[i]).input}
    # what only the replaced and dropped nodes read goes too (a fused Resize's scales, a Clip's bounds: initializers
    # or Constant nodes; onnxruntime would warn about each)
    gone = {n for i in set(dropped) | set(replace) for n in nodes[i].input}
    drop |= gone & set(inits)
    dropped |= {i for i, n in enumerate(nodes) if n.op_type == "Constant" and n.output and n.output[0] not in used
                and n.output[0] in gone}
    return wire.rewrite_graph(data, replace, drop - used, frozenset(dropped)), kernels


def _read_model(model) -> tuple[bytes, list, dict]:
    """``(bytes, nodes, initializers)`` of a path, the bytes of a model or an ``onnx.ModelProto``
    (:func:`wire.graph_parts`). A file whose tensors keep their data in external files is loaded with ``onnx``
    (which reads them in); other files are read as they are. Model bytes must hold their tensors' data."""
    if hasattr(model, "SerializeToString"):
        data = model.SerializeToString()
        return (data,) + wire.graph_parts(data)
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        try:
            nodes, inits = wire.graph_parts(data)
        except ValueError as exc:
            raise ValueError(f"the model bytes are not a readable ONNX model ({exc})") from None
        external = [name for name, t in inits.items() if t.external]
        if external:
            raise ValueError(f"the model bytes keep tensor(s) {external[:3]} in external files; pass the model's path "
                             "(the files are found beside it)")
        return data, nodes, inits
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"path_or_bytes must be a path, the bytes of a model or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    with open(model, "rb") as f:
        data = f.read()
    try:
        nodes, inits = wire.graph_parts(data)
    except ValueError as exc:
        raise ValueError(f"{model}: not a readable ONNX model ({exc})") from None
    if any(t.external for t in inits.values()):
        from ..onnx_model import load_model
        return _read_model(load_model(model))
    return data, nodes, inits


def _file_stamp(path) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _options_state(so) -> dict:
    """The attributes of the ``onnxruntime.SessionOptions`` ``so`` that differ from a new one's (enums as ints), and
    the config entry qconv sets itself if ``so`` has it: what :func:`_options_from_state` re-creates it from."""
    import onnxruntime as ort

    default = ort.SessionOptions()
    state = {}
    for name in _option_names():
        value = getattr(so, name)
        if value != getattr(default, name):
            state[name] = value if isinstance(value, (bool, int, float, str)) else int(value)
    spin = _config_entry(so, _SPIN)
    return {"attributes": state, "config": {} if spin is None else {_SPIN: spin}}


def _options_from_state(state: dict):
    import onnxruntime as ort

    so = ort.SessionOptions()
    for name, value in state["attributes"].items():
        setattr(so, name, type(getattr(so, name))(value))
    for key, value in state["config"].items():
        so.add_session_config_entry(key, value)
    return so


def _option_names() -> list:
    """The settable attributes of ``onnxruntime.SessionOptions`` (``intra_op_num_threads``, ...)."""
    import onnxruntime as ort

    cls = ort.SessionOptions
    return [n for n in dir(cls) if not n.startswith("_") and isinstance(getattr(cls, n), property)
            and getattr(cls, n).fset is not None]


def _config_entry(so, key: str):
    """The session config entry ``key`` of ``so``, or None where it has none."""
    try:
        return so.get_session_config_entry(key)
    except RuntimeError:   # onnxruntime: "SessionOptions does not have configuration with key: ..."
        return None


def _layer_option_names(device) -> list:
    """The engine options of ``device``'s engine that a session passes on to its layers (``kernel``, ...)."""
    from ..layer import engine_class

    params = inspect.signature(engine_class(device).__init__).parameters
    return sorted(n for n, p in params.items() if n not in ("self", "spec", "device", "threads")
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _release(keys):
    for k in keys:
        KERNELS.pop(k, None)


class _FromModel:
    def __repr__(self):
        return "<the model's>"


_FROM_MODEL = _FromModel()   # act_quant / act_block not given: what quantize_model recorded in the model, if any


class InferenceSession:
    """onnxruntime's ``InferenceSession`` over a model quantized by :func:`qconv.onnx.quantize_model` (the qconv
    nodes run qconv's kernels; a float model runs too: plain onnxruntime). ``docs/onnxruntime.md`` maps every
    onnxruntime argument and method to what qconv does with it.

    Arguments, in onnxruntime's order:

    * ``path_or_bytes``: a path (str / ``os.PathLike``) of an ``.onnx`` file, the model's bytes, or an
      ``onnx.ModelProto``.
    * ``sess_options``: an ``onnxruntime.SessionOptions`` or None. Its settings are onnxruntime's for the whole
      graph (``graph_optimization_level``, ``log_severity_level``, ``enable_profiling``, ``enable_mem_pattern``,
      config entries, ...), with these rules: its ``intra_op_num_threads``, when > 0, sizes onnxruntime's pool and,
      when ``threads`` is not given, qconv's layers too; when 0 (onnxruntime's default) both get ``threads``. An
      ``inter_op_num_threads`` of 0 becomes 1, and ``session.intra_op.allow_spinning`` becomes ``"0"`` unless the
      options set it (idle onnxruntime workers would hold the cores qconv's threads need). The options object
      keeps qconv's custom-op library and that config entry registered on it (it can serve more sessions); its
      thread counts are left as given. With None, qconv's own options: those rules, and onnxruntime's memory
      pattern off (``enable_mem_pattern=False``: lower peak memory, the arena serves every tensor); a given
      ``sess_options`` keeps its own ``enable_mem_pattern``.
    * ``providers``, ``provider_options``: onnxruntime's execution providers for the nodes that are not qconv's
      (default, for None or empty: ``["CPUExecutionProvider"]``); qconv's nodes always run on the host.

    qconv's options, keyword-only: ``device`` (the engine of the qconv nodes: ``"cpu"``, ``"opencl"``,
    ``"opencl:P:D"``, ``"reference"``; on an OpenCL device the whole graph runs there, not in onnxruntime:
    :attr:`device_graph`, :mod:`qconv.onnx.device_graph`; ``run_options`` is then ignored); ``threads`` (int >= 1, threads of qconv's layers; default: see
    ``sess_options``, else every core of this process); ``act_quant`` (default: what the model was quantized with,
    else ``"auto"``, see the module docstring; ``"none"`` or None: float activations; else ``"tensor"``,
    ``"row"``, ``"block"`` where the engine runs them); ``act_block`` (default: each node's from
    ``quantize_model(act_block=...)``, else the weight's block); and ``device``'s engine options (``kernel``,
    ``tile_cols``, ...: :func:`qconv.layer.engine_class`). Any other keyword raises ``TypeError`` naming it.

    ``run(output_names, input_feed, run_options=None)`` -> list of numpy arrays, as onnxruntime's.

    A session pickles (``pickle``, ``concurrent.futures.ProcessPoolExecutor``, Dask, Ray): the copy re-creates
    itself from the model's bytes and the arguments above. Bytes or a ``ModelProto`` given are kept for that
    (a path is read again when the session is pickled: it must not have changed); the copy runs the activation
    modes the original's first calls chose by timing (``act_quant="auto"``, see the module docstring). Of ``sess_options`` the copy
    gets the attributes that differ from a new ``SessionOptions`` and ``session.intra_op.allow_spinning``; other
    config entries, initializers and custom-op libraries added to it are not carried. ``device`` must be a string.
    """

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, *, device="cpu",
                 threads=None, act_quant=_FROM_MODEL, act_block=_FROM_MODEL, **layer_options):
        import onnxruntime as ort

        from .. import _validate as V
        from ..cpu.engine import default_threads
        from ..layer import engine_class
        from .quantize import model_summary

        given = dict(layer_options, device=device)   # the qconv options as given, for a pickled copy
        given.update((k, v) for k, v in (("threads", threads), ("act_quant", act_quant), ("act_block", act_block))
                     if v is not _FROM_MODEL)
        engine_cls = engine_class(device)
        names = _layer_option_names(device)
        for name in layer_options:
            if name not in names:
                hint = ("an onnxruntime.SessionOptions attribute: set it on the sess_options given"
                        if name in _option_names() else
                        "qconv's keyword options: device, threads, act_quant, act_block"
                        + "".join(f", {n}" for n in names))
                raise TypeError(f"InferenceSession() got an unexpected keyword argument {name!r} ({hint})")
        if sess_options is not None and not isinstance(sess_options, ort.SessionOptions):
            raise TypeError(f"sess_options must be an onnxruntime.SessionOptions or None, got "
                            f"{type(sess_options).__name__} {sess_options!r}"
                            + (" (qconv's device is keyword-only: device=...)" if isinstance(sess_options, str)
                               else ""))
        if threads is not None:
            threads = V.check_int(threads, "threads", minimum=1)
        data, nodes, inits = _read_model(path_or_bytes)
        summary = model_summary(data)
        if act_quant is _FROM_MODEL:
            act_quant = summary.get("act_quant") or "auto"
        elif isinstance(act_quant, str) and act_quant == "none":
            act_quant = None
        V.check_choice(act_quant, "act_quant", ("auto",) + tuple(engine_cls.supported_act_quant) + ("none",))
        options = dict(layer_options)
        node_options = {name: {} for name in summary.get("layers", {})}
        if act_block is _FROM_MODEL:   # quantize_model(act_block=...) resolved per layer
            for name, e in summary.get("layers", {}).items():
                if "act_block" in e:
                    node_options[name]["act_block"] = e["act_block"]
        else:
            options["act_block"] = act_block
        if act_quant == "auto" and "act_search" in summary:   # the modes measured per node (quantize_model)
            for name, e in summary["layers"].items():
                node_options[name]["act_allowed"] = e.get("act_allowed")

        self._args = dict(providers=providers, provider_options=provider_options, qconv=given,   # __getstate__
                          sess_options=None if sess_options is None else _options_state(sess_options))
        if isinstance(path_or_bytes, (str, os.PathLike)):
            self._source, self._stamp = os.fspath(path_or_bytes), _file_stamp(path_or_bytes)
        else:
            self._source = data

        if sess_options is None:
            so = ort.SessionOptions()
            so.enable_mem_pattern = False
        else:
            so = sess_options
        if threads is None:
            threads = so.intra_op_num_threads if so.intra_op_num_threads > 0 else default_threads()
        self.device, self.threads, self.act_quant = device, threads, act_quant
        self._id = f"s{next(_IDS)}"
        data, kernels = _runtime_graph(data, nodes, inits, self._id, dict(device=device, threads=threads,
                                                                          act_quant=act_quant, **options),
                                       node_options)
        del nodes, inits
        from .excite import ExciteKernel
        from .fusion import FusedKernel
        from .pair import PairKernel
        from .pool import PoolKernel
        fused_types = (FusedKernel, ExciteKernel, PairKernel, PoolKernel)
        self.kernels = [k for k in kernels.values() if not isinstance(k, fused_types)]   # one per qconv node
        #: the fused nodes' kernels: elementwise chains (:mod:`qconv.onnx.fusion`), squeeze-excitation blocks
        #: (:mod:`qconv.onnx.excite`), 1x1 + depthwise pairs (:mod:`qconv.onnx.pair`) and global average pools
        #: (:mod:`qconv.onnx.pool`; the CPU only)
        self.fused = [k for k in kernels.values() if isinstance(k, fused_types)]
        KERNELS.update(kernels)
        self._finalizer = weakref.finalize(self, _release, list(kernels))
        given_threads = so.intra_op_num_threads, so.inter_op_num_threads
        try:
            if so.intra_op_num_threads == 0:
                so.intra_op_num_threads = threads
            if so.inter_op_num_threads == 0:
                so.inter_op_num_threads = 1
            if _config_entry(so, _SPIN) is None:
                so.add_session_config_entry(_SPIN, "0")
            if kernels and so not in _REGISTERED:   # onnxruntime refuses the library twice on one options object
                so.register_custom_ops_library(register())
                _REGISTERED.add(so)
            self._sess = ort.InferenceSession(data, so, providers=providers or ["CPUExecutionProvider"],
                                              provider_options=provider_options)
            #: the :class:`~qconv.onnx.device_graph.DeviceGraph` that runs the model on an OpenCL device (None on
            #: the CPU and the reference, where onnxruntime runs the graph)
            self.device_graph = None
            self._first_run = True   # the CPU: the run that makes the nodes' native calls (see run())
            if engine_cls.__name__ == "OpenCLEngine":
                from .device_graph import DeviceGraph
                self.device_graph = DeviceGraph(data, kernels, device)
        except Exception:
            self._finalizer()
            raise
        finally:
            so.intra_op_num_threads, so.inter_op_num_threads = given_threads
        del data
        self._inputs = self._sess.get_inputs()

    @property
    def act_modes(self) -> dict:
        """``{node name: activation mode}`` each qconv node runs with now (``"float"`` for float activations). Under
        ``act_quant="auto"`` a narrow int8 node may turn float at its first call, where that is faster on this CPU
        (:data:`qconv.onnx.kernels.ACT_TIMED_PRODUCTS`)."""
        return {k.name: k.layer.spec.act_quant or "float" for k in self.kernels}

    def _live(self):
        if self._sess is None:
            raise RuntimeError("this session is closed")
        return self._sess

    def get_inputs(self) -> list:
        """onnxruntime's ``NodeArg`` list of the model's inputs (``name``, ``shape``, ``type``)."""
        return self._live().get_inputs()

    def get_outputs(self) -> list:
        """onnxruntime's ``NodeArg`` list of the model's outputs."""
        return self._live().get_outputs()

    def get_modelmeta(self):
        """onnxruntime's ``ModelMetadata`` of the model (producer, graph name, custom metadata map, ...)."""
        return self._live().get_modelmeta()

    def get_providers(self) -> list:
        """onnxruntime's execution providers of the session (the qconv nodes run on the host, as CPU nodes)."""
        return self._live().get_providers()

    def get_provider_options(self) -> dict:
        """onnxruntime's ``{provider: {option: value}}`` of the session."""
        return self._live().get_provider_options()

    def get_session_options(self):
        """The ``onnxruntime.SessionOptions`` the session runs with (qconv's thread counts and config entry in)."""
        return self._live().get_session_options()

    def end_profiling(self) -> str:
        """Ends onnxruntime's profiling (``sess_options.enable_profiling``) and returns its JSON file's name; each
        qconv node is one entry of the profile."""
        return self._live().end_profiling()

    def io_binding(self):
        raise NotImplementedError("qconv.onnx.InferenceSession has no io_binding: qconv's kernels read and write "
                                  "numpy arrays in host memory; use run(output_names, input_feed)")

    def check_feeds(self, input_feed: dict) -> None:
        """Raise a clear error for missing, unknown, wrongly typed or wrongly shaped inputs."""
        if not isinstance(input_feed, dict):
            raise TypeError(f"input_feed must be a dict {{input name: array}}, got {type(input_feed).__name__}")
        names = [i.name for i in self._inputs]
        missing = [n for n in names if n not in input_feed]
        if missing:
            raise ValueError(f"missing input(s) {missing}; the model takes {names}")
        unknown = [n for n in input_feed if n not in names]
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; the model takes {names}")
        for inp in self._inputs:
            x = input_feed[inp.name]
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

    def run(self, output_names, input_feed, run_options=None) -> list:
        """``output_names`` (None = all) -> list of numpy arrays for ``input_feed`` ``{input name: array}``;
        ``run_options``: an ``onnxruntime.RunOptions`` or None. An exception of a qconv layer fails its node
        (onnxruntime raises) and is raised as it is, onnxruntime's error chained."""
        sess = self._live()
        self.check_feeds(input_feed)
        if self.device_graph is not None:
            return self.device_graph.run(output_names, input_feed)
        take_error()
        try:
            out = sess.run(output_names, input_feed, run_options)
            if self._first_run:
                # the first run made the nodes' native calls, whose scratch is the custom operator's: the
                # calling thread's arena then holds sizes that only the Python path of those nodes needed
                self._first_run = False
                from ..cpu import scratch
                scratch.release()
            return out
        except Exception as exc:
            kernel_exc = take_error()
            if kernel_exc is not None:
                raise kernel_exc from exc
            raise

    def _model_bytes(self) -> bytes:
        if isinstance(self._source, bytes):
            return self._source
        if _file_stamp(self._source) != self._stamp:
            raise RuntimeError(f"{self._source} changed since this session read it: a pickled session re-creates "
                               f"itself from the model's bytes")
        return _read_model(self._source)[0]

    def __getstate__(self) -> dict:
        """The model's bytes and the constructor's arguments (see the class docstring)."""
        self._live()
        if not isinstance(self.device, str):
            raise TypeError(f"a session on device {self.device!r} cannot be pickled: give the device as a string "
                            f"(\"opencl:P:D\")")
        chosen = {k.name: k.layer.spec.act_quant for k in self.kernels if getattr(k, "act_timed", False)}
        return dict(self._args, model=self._model_bytes(), act_chosen=chosen)

    def __setstate__(self, state: dict) -> None:
        so = None if state["sess_options"] is None else _options_from_state(state["sess_options"])
        self.__init__(state["model"], so, state["providers"], state["provider_options"], **state["qconv"])
        chosen = state.get("act_chosen", {})   # the modes the original's timing chose: the copy runs the same
        for k in self.kernels:
            if k.name in chosen:
                k.set_act_quant(chosen[k.name])

    def close(self) -> None:
        """Release the prepared kernels (the session cannot run afterwards)."""
        self._finalizer()
        self._sess = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
