"""The device graph: a model's whole graph on an OpenCL device, one upload and one download a run.

:class:`DeviceGraph` runs the graph an :class:`~qconv.onnx.InferenceSession` on ``device="opencl"`` gives
onnxruntime (qconv nodes reduced to ``X -> Y`` plus their key, :mod:`qconv.onnx.kernels`) itself, node by node
in the graph's order, on the layers' command queue: the qconv nodes through their layers' device-array calls
(padding, ``post_affine`` and ``depth_to_space`` as device kernels), the operators of :data:`DEVICE_OPS` through
:class:`qconv.gpu.graph_ops.GraphOps`. Float32 tensors live on the device from the inputs' upload to the
outputs' download; a device tensor is released (back to the memory pool) after its last reader.

Host values: initializers, ``Constant`` outputs and everything computed from them alone are folded once, at
construction; ``Shape`` gives a host value, and a node whose inputs are all host values runs on the host
(onnxruntime, one node). Integer tensors never go to the device.

Other operators, and operator forms the kernels do not take (:meth:`DeviceGraph.unsupported`), run per node on
the host (the node alone in onnxruntime: its device inputs are read back, its outputs uploaded): never silently.
The construction warns with the operator types that will, and :attr:`DeviceGraph.host_nodes` lists the nodes that
did in a run.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from .._ext._ortops import KEY_ATTR

UNARY_OPS = {"Relu": "relu", "Sigmoid": "sigmoid", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish",
             "LeakyRelu": "leaky_relu", "Tanh": "tanh", "Exp": "exp", "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs",
             "Reciprocal": "reciprocal", "Clip": "clip"}
BINARY_OPS = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min", "Pow": "pow"}
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")
#: operator types the device runs (some forms go to the host: :meth:`DeviceGraph.unsupported` says which)
DEVICE_OPS = frozenset(UNARY_OPS) | frozenset(BINARY_OPS) | frozenset(VIEW_OPS) | {
    "BatchNormalization", "GlobalAveragePool", "ReduceMean", "MaxPool", "AveragePool", "Resize", "Concat", "Split",
    "Slice", "Transpose", "Softmax", "DepthToSpace", "Shape", "Cast", "Pad", "Constant", "QConv", "QMatMul", "MatMul"}
_FLOAT = 1   # TensorProto.FLOAT


class DeviceGraph:
    """``run(output_names, feeds)`` of a session's runtime graph ``data`` (bytes) on the OpenCL device of
    ``kernels`` (``{key: ConvKernel | MatMulKernel}``, every qconv node's, built for that device). Runs go one at
    a time (a lock) on the command queue of the thread that built the graph."""

    def __init__(self, data: bytes, kernels: dict, device):
        import onnx
        from onnx import numpy_helper

        from ..gpu import context as gctx
        from ..gpu.graph_ops import GraphOps

        model = onnx.load_from_string(data)
        g = model.graph
        self._opsets, self._ir_version = list(model.opset_import), model.ir_version
        self.ctx, self.dev = gctx.resolve(device)
        self.queue = gctx.call_queue(self.ctx, self.dev)
        self.ops = GraphOps(self.ctx, self.queue, gctx.memory_pool(self.ctx, self.dev))
        self.inputs = [i.name for i in g.input if i.name not in {t.name for t in g.initializer}]
        self.outputs = [o.name for o in g.output]
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.nodes, self.kernels = [], {}
        for node in g.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type in ("QConv", "QMatMul"):
                key = attrs[KEY_ATTR].decode() if isinstance(attrs[KEY_ATTR], bytes) else attrs[KEY_ATTR]
                self.kernels[node.name] = kernels[key]
            self.nodes.append((node, attrs))
        self._host_sessions: dict = {}  # node name -> onnxruntime session of the node alone
        self._host_memo: dict = {}      # node name -> (its small inputs, its outputs) of the last host run
        self._fold_constants()
        self._fuse()
        self._uploaded: dict = {}      # host constant name -> its device copy (float32)
        self._recordings: dict = {}    # input shapes -> _Recording
        self._lock = threading.Lock()  # one run at a time: the runs share the queue, the arena and the recordings
        self._replayable = True        # False once a run sent a node's device inputs to the host
        self.host_nodes: list = []     # (name, op type, reason) of the nodes the last run ran on the host
        uses: dict = {}
        for i, (node, _) in enumerate(self.nodes):
            for name in node.input:
                uses[name] = i
        self._last_use = uses
        # values known on the host without reading a device tensor: constants, non-float inputs, shapes
        host = set(self.consts) | {i.name for i in g.input if i.type.tensor_type.elem_type != _FLOAT}
        static = []
        for node, attrs in self.nodes:
            if node.op_type == "Shape" or all(n == "" or n in host for n in node.input):
                host.update(node.output)
            elif (why := self.unsupported(node, attrs, None)) is not None:
                static.append((node.op_type, why))
        if static:
            kinds = sorted({f"{op} ({why})" for op, why in static})
            warnings.warn(f"qconv device graph: {len(static)} node(s) run on the host (their inputs are read back "
                          f"and their outputs uploaded): {', '.join(kinds)}", RuntimeWarning, stacklevel=3)

    # {{{ construction

    def _fold_constants(self) -> None:
        """Evaluate ``Constant`` nodes and nodes whose inputs are all constants once; drop them from the graph."""
        from onnx import numpy_helper

        kept = []
        for node, attrs in self.nodes:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = _constant_value(attrs, numpy_helper)
                continue
            if node.domain in ("", "ai.onnx") and node.input and all(n == "" or n in self.consts
                                                                      for n in node.input):
                outs = self._host_run(node, [self.consts.get(n) if n else None for n in node.input])
                self.consts.update(zip(node.output, outs))
                continue
            kept.append((node, attrs))
        self.nodes = kept

    def _fuse(self) -> None:
        """Fold a unary node into the binary node that is its one reader (that operand's ``_pre_a`` / ``_pre_b``),
        then an activation node into the binary node it is the one reader of (``_act``): one launch instead of
        two. A node whose output is a graph output is never folded away."""
        readers: dict = {}
        for node, _ in self.nodes:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        outputs = set(self.outputs)
        producer = {o: i for i, (node, _) in enumerate(self.nodes) for o in node.output}
        gone = set()
        for i, (node, attrs) in enumerate(self.nodes):   # unary -> binary operand
            if node.op_type not in BINARY_OPS:
                continue
            for k, key in ((0, "_pre_a"), (1, "_pre_b")):
                j = producer.get(node.input[k]) if k < len(node.input) else None
                if j is None or j in gone or readers.get(node.input[k]) != 1 or node.input[k] in outputs:
                    continue
                u, uattrs = self.nodes[j]
                pre = self._unary_params(u, uattrs) if u.op_type in UNARY_OPS and u.domain in ("", "ai.onnx") \
                    else None
                if pre is not None:
                    attrs[key] = pre
                    node.input[k] = u.input[0]
                    gone.add(j)
        for i, (node, attrs) in enumerate(self.nodes):   # binary -> activation
            if node.op_type not in BINARY_OPS or i in gone or node.output[0] in outputs \
                    or readers.get(node.output[0]) != 1:
                continue
            j = next((j for j, (n, _) in enumerate(self.nodes) if j not in gone and node.output[0] in n.input), None)
            act = None if j is None else _activation_of(*self.nodes[j], self.consts)
            if act is not None:
                attrs["_act"] = act
                node.output[0] = self.nodes[j][0].output[0]
                gone.add(j)
        self.nodes = [n for j, n in enumerate(self.nodes) if j not in gone]

    def _unary_params(self, node, attrs, ins=None):
        """``(GraphOps unary op, p0, p1)`` of a unary node (its Clip bounds from ``ins`` or the constants), or
        None where a Clip bound is computed at run time."""
        op = UNARY_OPS[node.op_type]
        p0, p1 = 0.0, 0.0
        if op == "clip":
            p0, p1 = attrs.get("min", -np.inf), attrs.get("max", np.inf)
            for k in (1, 2):
                if len(node.input) > k and node.input[k]:
                    v = ins[k] if ins is not None else self.consts.get(node.input[k])
                    if v is None:
                        return None
                    if k == 1:
                        p0 = float(_host(v))
                    else:
                        p1 = float(_host(v))
        elif op == "hard_sigmoid":
            p0, p1 = attrs.get("alpha", 0.2), attrs.get("beta", 0.5)
        elif op == "leaky_relu":
            p0 = attrs.get("alpha", 0.01)
        return op, p0, p1

    def unsupported(self, node, attrs, ins):
        """Why ``node`` runs on the host (None: it runs on the device). ``ins``: its input values (None before a
        run: the checks that need shapes are left for then)."""
        op = node.op_type
        if op not in DEVICE_OPS:
            return "no device kernel"
        if op in ("MaxPool", "AveragePool"):
            if len(node.output) > 1:
                return "indices output"
            if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                return "auto_pad"
            if len(attrs.get("kernel_shape", ())) != 2:
                return "not 2-D"
            if op == "AveragePool" and attrs.get("ceil_mode", 0) and attrs.get("count_include_pad", 0):
                return "ceil_mode with count_include_pad"
        if op == "Resize":
            mode = _s(attrs.get("mode", "nearest"))
            ctm = _s(attrs.get("coordinate_transformation_mode", "half_pixel"))
            if mode not in ("nearest", "linear") or ctm == "tf_crop_and_resize" or attrs.get("antialias", 0):
                return f"mode {mode}, {ctm}"
        if op == "Pad" and _s(attrs.get("mode", "constant")) != "constant":
            return "not constant padding"
        if op == "DepthToSpace" and _s(attrs.get("mode", "DCR")) not in ("DCR", "CRD"):
            return "mode"
        if ins is None:
            return None
        x = ins[0] if ins else None
        if op == "Cast" and attrs.get("to") != _FLOAT:
            return "not a cast to float"
        if op == "Resize" and (x is None or len(x.shape) != 4):
            return "not 4-D"
        if op in ("MaxPool", "AveragePool", "GlobalAveragePool") and len(x.shape) != 4:
            return "not 4-D"
        if op == "ReduceMean" and _reduce_axes(node, attrs, ins, len(x.shape)) is None:
            return "axes other than the trailing ones"
        if op == "Resize" and _resize_hw(node, attrs, ins) is None:
            return "scales on N or C"
        if op == "MatMul" and min(len(v.shape) for v in ins[:2]) < 2:
            return "a 1-D operand"
        return None

    # }}}

    # {{{ running

    def run(self, output_names, feeds: dict, profile: dict | None = None) -> list:
        """``output_names`` (None = all) -> numpy arrays for ``feeds`` ``{input name: array}``.

        The first run of an input shape records its launches (:class:`_Recording`); later runs of that shape
        replay them: the inputs copied into the recorded input buffers, every launch enqueued again with its
        arguments as bound, the outputs read back. A graph that ran a node on the host with device inputs is
        not recorded (its launches depend on values read back); it runs node by node every time.

        ``profile``: a dict that gets ``{op type: [calls, host seconds, seconds to finish]}`` added: the time in
        the node's Python call, and from its start until the queue has finished it (the queue is finished after
        every node, so a profiled run is slower than a plain one; it is neither recorded nor replayed)."""
        key = tuple((n, np.shape(feeds[n]), np.asarray(feeds[n]).dtype.str) for n in self.inputs)
        names = self.outputs if output_names is None else list(output_names)
        with self._lock:
            rec = self._recordings.get(key) if profile is None else None
            if rec is not None:
                return rec.replay(feeds, names)
            record = profile is None and self._replayable
            env, rec = self._execute(feeds, profile, record)
            if rec is not None:
                self._recordings[key] = rec
            return [_host(env[n]) for n in names]

    def _execute(self, feeds, profile, record):
        """One run node by node: ``(env, recording or None)``."""
        import time

        import pyopencl.array as cla

        env = dict(self.consts)
        inputs = {}
        for name in self.inputs:
            x = np.ascontiguousarray(feeds[name])
            if x.dtype == np.float32:
                env[name] = inputs[name] = cla.to_device(self.queue, x, allocator=self.ops.allocator)
            else:
                env[name] = x
        rec = _Recording(self.queue, inputs) if record else None
        if rec is not None:
            self.ops.record, self.ops.take = rec.launches, rec.take
        self.host_nodes = []
        keep = set(self.outputs) | set(self.inputs) | set(self.consts)
        if profile is not None:
            self.queue.finish()
        try:
            for i, (node, attrs) in enumerate(self.nodes):
                if profile is not None:
                    t0 = time.perf_counter()
                ins = [env.get(n) if n else None for n in node.input]
                if all(v is None or isinstance(v, np.ndarray) for v in ins) and node.op_type not in ("QConv",
                                                                                                   "QMatMul"):
                    outs = self._host_run(node, ins)
                else:
                    why = self.unsupported(node, attrs, ins)
                    if why is None:
                        op = getattr(self, "_op_" + node.op_type, None) or self._unary
                        try:
                            outs = op(node, attrs, ins)
                        except ValueError as exc:   # a shape the node cannot take: say which node
                            shapes = [None if v is None else tuple(v.shape) for v in ins]
                            raise ValueError(f"device graph node {node.name!r} ({node.op_type}) on inputs of shapes "
                                             f"{shapes}: {exc}") from exc
                    else:
                        self.host_nodes.append((node.name, node.op_type, why))
                        rec = None
                        self.ops.record = self.ops.take = None
                        self._replayable = False
                        outs = self._upload_all(self._host_run(node, [_host(v) for v in ins]))
                env.update(zip(node.output, outs))
                if rec is not None:
                    for o in outs:
                        rec.hold(o)
                if profile is not None:
                    t1 = time.perf_counter()
                    self.queue.finish()
                    entry = profile.setdefault(node.op_type, [0, 0.0, 0.0])
                    entry[0] += 1
                    entry[1] += t1 - t0
                    entry[2] += time.perf_counter() - t0
                for name in node.input:   # release device tensors after their last reader
                    if self._last_use.get(name) == i and name not in keep:
                        v = env.pop(name, None)
                        if rec is not None and v is not None:
                            rec.release(v)
        finally:
            self.ops.record = self.ops.take = None
        if rec is not None:
            rec.outputs = {n: env[n] for n in self.outputs if not isinstance(env[n], np.ndarray)}
            rec.host_outputs = {n: env[n] for n in self.outputs if isinstance(env[n], np.ndarray)}
        return env, rec

    def _layer(self, engine, x, linear=False):
        """A qconv layer's launch on device tensor ``x`` (recorded when recording): its output Array."""
        p = engine.prepare(tuple(x.shape), "nchw", linear=linear, x=x, queue=self.queue)
        y = self.ops.empty(p.out_shape)
        with p.launch.lock:
            p.launch.enqueue_locked(self.queue, x.base_data, y.base_data)
        if self.ops.record is not None:
            self.ops.record.append((p.launch, x.base_data, y.base_data))
        return y

    def _dev(self, v, name=None):
        """A float32 device tensor for input value ``v`` (host constants uploaded once per name)."""
        if not isinstance(v, np.ndarray):
            return v
        if name is not None and name in self.consts:
            d = self._uploaded.get(name)
            if d is None:
                d = self._uploaded[name] = self._upload(v)
            return d
        return self._upload(v)

    def _upload(self, v):
        import pyopencl.array as cla

        v = np.ascontiguousarray(v, np.float32)
        return cla.to_device(self.queue, v, allocator=self.ops.allocator)

    def _upload_all(self, outs):
        return [self._upload(o) if isinstance(o, np.ndarray) and o.dtype == np.float32 else o for o in outs]

    def _host_run(self, node, ins) -> list:
        """The node alone in onnxruntime on host values (None: an omitted optional input). Small inputs (shape
        arithmetic) key a memo of the node's last result: a run with the same shapes repeats none of them."""
        key = node.name or id(node)
        small = all(v is None or v.size <= 64 for v in ins)
        memo = tuple(None if v is None else (v.dtype.str, v.shape, v.tobytes()) for v in ins) if small else None
        hit = self._host_memo.get(key)
        if memo is not None and hit is not None and hit[0] == memo:
            return hit[1]
        sess = self._host_sessions.get(key)
        if sess is None:
            sess = self._host_sessions[key] = _node_session(node, ins, self._opsets, self._ir_version)
        feeds = {n: v for n, v in zip(node.input, ins) if n and v is not None}
        outs = sess.run(None, feeds)
        if memo is not None:
            self._host_memo[key] = (memo, outs)
        return outs

    def _ins(self, node, ins, k):
        return self._dev(ins[k], node.input[k])

    # each _op_<Type>(node, attrs, ins) -> list of outputs

    def _unary(self, node, attrs, ins):
        return [self.ops.unary(self._ins(node, ins, 0), *self._unary_params(node, attrs, ins))]

    def _binary(self, node, attrs, ins):
        a, b = self._ins(node, ins, 0), self._ins(node, ins, 1)
        return [self.ops.binary(a, b, BINARY_OPS[node.op_type], attrs.get("_act"), pre_a=attrs.get("_pre_a"),
                                pre_b=attrs.get("_pre_b"))]

    _op_Add = _op_Sub = _op_Mul = _op_Div = _op_Max = _op_Min = _op_Pow = _binary

    def _op_MatMul(self, node, attrs, ins):
        return [self.ops.matmul(self._ins(node, ins, 0), self._ins(node, ins, 1))]

    def _op_QConv(self, node, attrs, ins):
        k = self.kernels[node.name]
        x = self._ins(node, ins, 0)
        if any(k.extra_pad):
            t, b, l, r = k.extra_pad
            n, c, h, w = x.shape
            x = self._pad(x, [0, 0, t, l, 0, 0, b, r], 0.0)
        y = self._layer(k.layer.engine, x)
        if k.host_affine is not None:
            y = self.ops.affine(y, *self._affine_of(node.name, k.host_affine))
        if k.block > 1:
            y = self._depth_to_space(y, k.block, "CRD")
        return [y]

    def _op_QMatMul(self, node, attrs, ins):
        k = self.kernels[node.name]
        x = self._ins(node, ins, 0)
        lead = tuple(x.shape[:-1])
        y = self._layer(k.layer.engine, x.reshape(-1, k.k), linear=True)
        if k.host_affine is not None:
            y = self.ops.affine(y, *self._affine_of(node.name, k.host_affine))
        return [y.reshape(lead + (y.shape[-1],))]

    def _affine_of(self, name, affine):
        key = ("affine", name)
        d = self._uploaded.get(key)
        if d is None:
            d = self._uploaded[key] = (self._upload(np.ravel(affine[0])), self._upload(np.ravel(affine[1])))
        return d

    def _op_BatchNormalization(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        key = ("bn", node.name)
        d = self._uploaded.get(key)
        if d is None:
            s, b, m, v = (np.asarray(_host(t), np.float64) for t in ins[1:5])
            sc = s / np.sqrt(v + attrs.get("epsilon", 1e-5))
            d = self._uploaded[key] = (self._upload(sc), self._upload(b - m * sc))
        return [self.ops.affine(x, *d)]

    def _op_GlobalAveragePool(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        n, c, h, w = x.shape
        return [self.ops.mean_rows(x, n * c, h * w, (n, c, 1, 1))]

    def _op_ReduceMean(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        axes = _reduce_axes(node, attrs, ins, len(x.shape))
        keep = attrs.get("keepdims", 1)
        inner = int(np.prod([x.shape[a] for a in axes]))
        rows = int(np.prod(x.shape)) // max(inner, 1)
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape)) if keep else \
            tuple(s for d, s in enumerate(x.shape) if d not in axes)
        return [self.ops.mean_rows(x, rows, inner, shape)]

    def _op_MaxPool(self, node, attrs, ins, kind="max"):
        x = self._ins(node, ins, 0)
        n, c, h, w = x.shape
        kh, kw = attrs["kernel_shape"]
        sh, sw = attrs.get("strides", (1, 1))
        dh, dw = attrs.get("dilations", (1, 1))
        pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
        ceil = attrs.get("ceil_mode", 0)

        def out(size, k, s, d, p0, p1):
            span = size + p0 + p1 - d * (k - 1) - 1
            o = (-(-span // s) if ceil else span // s) + 1
            if ceil and (o - 1) * s >= size + p0:   # the last window must start inside the input or left pad
                o -= 1
            return o

        oh, ow = out(h, kh, sh, dh, pt, pb), out(w, kw, sw, dw, pl, pr)
        return [self.ops.pool2d(x, (kh, kw), (sh, sw), (pt, pl), (dh, dw), (oh, ow), kind,
                                bool(attrs.get("count_include_pad", 0)))]

    def _op_AveragePool(self, node, attrs, ins):
        return self._op_MaxPool(node, attrs, ins, "avg")

    def _op_Resize(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        (oh, ow), (sh, sw) = _resize_hw(node, attrs, ins)
        linear = _s(attrs.get("mode", "nearest")) == "linear"
        ctm = _s(attrs.get("coordinate_transformation_mode", "half_pixel"))
        return [self.ops.resize2d(x, (oh, ow), (sh, sw), linear, ctm,
                                  _s(attrs.get("nearest_mode", "round_prefer_floor")))]

    def _op_Concat(self, node, attrs, ins):
        xs = [self._ins(node, ins, k) for k in range(len(ins))]
        shape0 = xs[0].shape
        axis = attrs["axis"] % len(shape0)
        total = sum(int(x.shape[axis]) for x in xs)
        shape = shape0[:axis] + (total,) + shape0[axis + 1:]
        y = self.ops.empty(shape)
        outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
        off = 0
        for x in xs:
            a = int(x.shape[axis])
            self.ops.copy_nd(x, y, (outer, a, inner), (a * inner, inner, 1), (total * inner, inner, 1), 0, off * inner)
            off += a
        return [y]

    def _op_Split(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        axis = attrs.get("axis", 0) % len(x.shape)
        size = int(x.shape[axis])
        if len(ins) > 1 and ins[1] is not None:
            parts = [int(v) for v in _host(ins[1])]
        elif "split" in attrs:
            parts = list(attrs["split"])
        else:
            k = len(node.output)
            step = -(-size // k)
            parts = [min(step, size - i * step) for i in range(k)]
        outer, inner = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis + 1:]))
        outs, off = [], 0
        for a in parts:
            y = self.ops.empty(x.shape[:axis] + (a,) + x.shape[axis + 1:])
            self.ops.copy_nd(x, y, (outer, a, inner), (size * inner, inner, 1), (a * inner, inner, 1), off * inner, 0)
            outs.append(y)
            off += a
        return outs

    def _op_Slice(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        nd = len(x.shape)
        starts, ends = (np.asarray(_host(v)).tolist() for v in ins[1:3])
        axes = np.asarray(_host(ins[3])).tolist() if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = np.asarray(_host(ins[4])).tolist() if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
        xs = list(_strides(x.shape))
        shape, offset = list(x.shape), 0
        for s, e, a, st in zip(starts, ends, axes, steps):
            a %= nd
            rng = range(*slice(int(s), int(e), int(st)).indices(int(x.shape[a])))
            shape[a] = len(rng)
            offset += (rng.start if len(rng) else 0) * xs[a]
            xs[a] *= int(st)
        y = self.ops.empty(tuple(shape))
        return [self.ops.copy_nd(x, y, shape, xs, _strides(shape), offset, 0)]

    def _op_Transpose(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        perm = attrs.get("perm", list(range(len(x.shape)))[::-1])
        xs = _strides(x.shape)
        shape = tuple(x.shape[p] for p in perm)
        y = self.ops.empty(shape)
        return [self.ops.copy_nd(x, y, shape, [xs[p] for p in perm], _strides(shape))]

    def _op_DepthToSpace(self, node, attrs, ins):
        return [self._depth_to_space(self._ins(node, ins, 0), attrs["blocksize"], _s(attrs.get("mode", "DCR")))]

    def _depth_to_space(self, x, b, mode):
        n, c, h, w = x.shape
        oc = c // (b * b)
        y = self.ops.empty((n, oc, h * b, w * b))
        # y[n][o][hh][i][ww][j] = x[n][channel(o, i, j)][hh][ww]
        sn, sc, sh = c * h * w, h * w, w
        if mode == "CRD":   # channel o*b*b + i*b + j
            xs = (sn, b * b * sc, sh, b * sc, 1, sc)
        else:               # DCR: channel (i*b + j)*oc + o
            xs = (sn, sc, sh, b * oc * sc, 1, oc * sc)
        shape = (n, oc, h, b, w, b)
        return self.ops.copy_nd(x, y, shape, xs, _strides(shape))

    def _op_Pad(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        pads = np.asarray(_host(ins[1])).tolist() if len(ins) > 1 and ins[1] is not None else attrs["pads"]
        value = float(_host(ins[2])) if len(ins) > 2 and ins[2] is not None and np.size(_host(ins[2])) else \
            attrs.get("value", 0.0)
        nd = len(x.shape)
        if len(ins) > 3 and ins[3] is not None:   # axes
            full = [0] * (2 * nd)
            axes = [int(a) % nd for a in np.asarray(_host(ins[3])).tolist()]
            for k, a in enumerate(axes):
                full[a], full[nd + a] = pads[k], pads[len(axes) + k]
            pads = full
        return [self._pad(x, pads, value)]

    def _pad(self, x, pads, value):
        nd = len(x.shape)
        before, after = pads[:nd], pads[nd:]
        shape = tuple(int(s) + int(a) + int(b) for s, a, b in zip(x.shape, before, after))
        y = self.ops.fill(self.ops.empty(shape), value)
        ys = _strides(shape)
        # negative pads crop: the copied region starts past them in x
        src = [max(-int(a), 0) for a in before]
        dst = [max(int(a), 0) for a in before]
        region = [int(s) - src[d] - max(-int(after[d]), 0) for d, s in enumerate(x.shape)]
        if min(region) > 0:
            xs = _strides(x.shape)
            self.ops.copy_nd(x, y, region, xs, ys, sum(i * s for i, s in zip(src, xs)),
                             sum(i * s for i, s in zip(dst, ys)))
        return y

    def _op_Softmax(self, node, attrs, ins):
        x = self._ins(node, ins, 0)
        opset = next((o.version for o in self._opsets if o.domain in ("", "ai.onnx")), 13)
        axis = attrs.get("axis", -1 if opset >= 13 else 1) % len(x.shape)
        if opset >= 13 and axis != len(x.shape) - 1:
            perm = [d for d in range(len(x.shape)) if d != axis] + [axis]
            xt = self._op_Transpose(node, {"perm": perm}, [x])[0]
            yt = self.ops.softmax_rows(xt, int(x.shape[axis]))
            return self._op_Transpose(node, {"perm": list(np.argsort(perm))}, [yt])
        return [self.ops.softmax_rows(x, int(np.prod(x.shape[axis:])))]

    def _op_Shape(self, node, attrs, ins):
        shape = np.asarray(ins[0].shape, np.int64)
        return [shape[attrs.get("start", 0):attrs["end"] if "end" in attrs else None]]

    def _op_Cast(self, node, attrs, ins):
        return [ins[0]]

    def _view(self, node, attrs, ins):
        x = ins[0]
        if isinstance(x, np.ndarray):
            return self._host_run(node, ins)
        shape = _view_shape(node, attrs, ins, tuple(x.shape))
        return [x.reshape(shape)] + ([None] * (len(node.output) - 1))

    _op_Reshape = _op_Flatten = _op_Squeeze = _op_Unsqueeze = _op_Identity = _op_Dropout = _view

    # }}}


class _Recording:
    """The launches of one run of an input shape and the buffers they use, kept for :meth:`replay`.

    Device tensors of the recorded run come from an arena: a tensor's buffer goes back to a free list (by size)
    once no live value uses it (views share their source's), and a later tensor of that size takes it, as the
    memory pool would; every buffer stays referenced by the recording."""

    def __init__(self, queue, inputs: dict):
        self.queue, self.inputs = queue, inputs
        self.launches: list = []   # (kernel, gsize, lsize) or (LaunchPlan, x buffer, y buffer)
        self.outputs: dict = {}
        self.host_outputs: dict = {}
        self._arrays: list = list(inputs.values())
        self._free: dict = {}      # nbytes -> [Array]
        self._users: dict = {}     # buffer int_ptr -> live values using it

    def take(self, shape):
        import pyopencl.array as cla

        n = 4 * int(np.prod(shape))
        free = self._free.get(n)
        if free:
            return free.pop().reshape(shape)
        a = cla.empty(self.queue, shape, np.float32)
        self._arrays.append(a)
        return a

    def hold(self, v) -> None:
        if v is not None and not isinstance(v, np.ndarray):
            p = v.base_data.int_ptr
            self._users[p] = self._users.get(p, 0) + 1

    def release(self, v) -> None:
        if isinstance(v, np.ndarray):
            return
        p = v.base_data.int_ptr
        left = self._users.get(p, 0) - 1
        self._users[p] = left
        if left == 0 and all(v.base_data.int_ptr != a.base_data.int_ptr for a in self.inputs.values()):
            self._free.setdefault(v.nbytes, []).append(v)

    def replay(self, feeds: dict, names: list) -> list:
        cl = __import__("pyopencl")
        enqueue = cl.enqueue_nd_range_kernel
        q = self.queue
        held = []   # the host inputs stay alive until the outputs are read (the copies do not block)
        for name, a in self.inputs.items():
            held.append(np.ascontiguousarray(feeds[name], np.float32))
            cl.enqueue_copy(q, a.base_data, held[-1], is_blocking=False)
        for a, b, c in self.launches:
            if isinstance(a, cl.Kernel):
                enqueue(q, a, b, c)
            else:
                with a.lock:
                    a.enqueue_locked(q, b, c)
        return [self.host_outputs[n] if n in self.host_outputs else self.outputs[n].get(q) for n in names]


def _activation_of(node, attrs, consts):
    """The layer activation (:data:`qconv.gpu.graph_ops.ACTS`) a node computes, or None: Relu, HardSwish, and a
    Clip to [0, 6] (bounds as attributes or constants)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Relu":
        return "relu"
    if node.op_type == "HardSwish":
        return "hardswish"
    if node.op_type == "Clip":
        lo, hi = attrs.get("min"), attrs.get("max")
        for k in (1, 2):
            if len(node.input) > k and node.input[k]:
                v = consts.get(node.input[k])
                if v is None:
                    return None
                lo, hi = (float(v), hi) if k == 1 else (lo, float(v))
        return "relu6" if (lo, hi) == (0.0, 6.0) else None
    return None


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _host(v):
    """A numpy array for a value (device tensors read back)."""
    return v if v is None or isinstance(v, np.ndarray) else v.get()


def _strides(shape) -> tuple:
    from ..gpu.graph_ops import contiguous_strides
    return contiguous_strides(shape)


def _constant_value(attrs, numpy_helper):
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for k, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if k in attrs:
            return np.asarray(attrs[k], dt)
    for k, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if k in attrs:
            return np.asarray(list(attrs[k]), dt)
    raise ValueError(f"Constant node with attributes {sorted(attrs)} is not supported by the device graph")


def _reduce_axes(node, attrs, ins, nd):
    """ReduceMean's axes when they are the trailing ones (a contiguous row per output), else None."""
    if len(ins) > 1 and ins[1] is not None:
        axes = np.asarray(_host(ins[1])).tolist()
    else:
        axes = attrs.get("axes")
    if axes is None or len(axes) == 0:
        axes = list(range(nd))
    axes = sorted(int(a) % nd for a in axes)
    return axes if axes == list(range(nd - len(axes), nd)) else None


def _resize_hw(node, attrs, ins):
    """``((oh, ow), (scale_h, scale_w))`` of a 4-D Resize that keeps N and C, else None."""
    x = ins[0]
    n, c, h, w = x.shape
    scales = _host(ins[2]) if len(ins) > 2 and ins[2] is not None and np.size(_host(ins[2])) else None
    sizes = _host(ins[3]) if len(ins) > 3 and ins[3] is not None and np.size(_host(ins[3])) else None
    if sizes is not None:
        sizes = [int(v) for v in sizes]
        if sizes[0] != n or sizes[1] != c:
            return None
        oh, ow = sizes[2:]
        return (oh, ow), (oh / h, ow / w)
    if scales is None:
        return None
    scales = [float(v) for v in scales]
    if scales[0] != 1 or scales[1] != 1:
        return None
    return (int(np.floor(h * scales[2])), int(np.floor(w * scales[3]))), (scales[2], scales[3])


def _view_shape(node, attrs, ins, shape):
    """The output shape of a Reshape / Flatten / Squeeze / Unsqueeze / Identity / Dropout of ``shape``."""
    op, nd = node.op_type, len(shape)
    if op == "Reshape":
        target = [int(v) for v in _host(ins[1])]
        allow_zero = attrs.get("allowzero", 0)
        out = [shape[i] if v == 0 and not allow_zero else v for i, v in enumerate(target)]
        if -1 in out:
            known = int(np.prod([v for v in out if v != -1]))
            out[out.index(-1)] = int(np.prod(shape)) // max(known, 1)
        return tuple(out)
    if op == "Flatten":
        a = attrs.get("axis", 1) % (nd + 1) if nd else 0
        return (int(np.prod(shape[:a])), int(np.prod(shape[a:])))
    if op in ("Squeeze", "Unsqueeze"):
        axes = np.asarray(_host(ins[1])).tolist() if len(ins) > 1 and ins[1] is not None else attrs.get("axes")
        if op == "Squeeze":
            if axes is None:
                return tuple(s for s in shape if s != 1)
            axes = {int(a) % nd for a in axes}
            return tuple(s for d, s in enumerate(shape) if d not in axes)
        out = list(shape)
        for a in sorted(int(a) % (nd + len(axes)) for a in axes):
            out.insert(a, 1)
        return tuple(out)
    return shape


def _node_session(node, ins, opsets, ir_version):
    """An onnxruntime session of ``node`` alone, its inputs typed as ``ins`` are (ranks left open), in the model's
    IR version (an older onnxruntime refuses the newer one ``onnx.helper`` writes)."""
    import onnxruntime as ort
    from onnx import helper

    inputs = []
    for name, v in zip(node.input, ins):
        if name and v is not None:
            elem = helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype)
            inputs.append(helper.make_tensor_value_info(name, elem, None))
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], f"node_{node.name}", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[o for o in opsets if o.domain in ("", "ai.onnx")])
    model.ir_version = ir_version
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
