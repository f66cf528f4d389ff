"""Pipelines: a sequence of layers run by one Python call, intermediates kept on the device.

``qconv.Pipeline(steps)`` takes layers (:class:`qconv.Conv2d`, :class:`qconv.Linear`, all on one device), nested
pipelines (inlined) and :class:`Residual` blocks (``y = activation(block(x) + shortcut(x))``, shortcut the
identity unless given)::

    block = qconv.Pipeline([conv1, qconv.Residual([conv2, conv3], activation="relu"), conv4])
    y = block(x)                       # numpy in, numpy out, on every engine
    y = block(x_dev, out=y_dev)        # OpenCL: pyopencl.array.Array in and out, one finish-free call

The same script runs on the CPU engine (numpy arrays; each layer called in turn, the adds in numpy) and on
OpenCL. On OpenCL the first call of an input shape (or :meth:`Pipeline.prepare`) plans every launch: each
layer's chosen kernels (tuned like a layer's first call; the layer's own launch steps) and one ``add_act`` per
residual add (``kernels/eltwise.cl``) become one :class:`~qconv.gpu.launch.LaunchPlan` of the pipeline's (its own
kernel objects, every constant and every intermediate buffer bound once); a later call of that shape binds the
input and output buffers and enqueues the launches back to back: no Array made for intermediates (one for the
result, none with ``out``), no host synchronisation. Intermediates are the plan's scratch buffers, one set per
command queue and input shape, kept for the pipeline's lifetime (calls on one in-order queue run in order, so
they never share a buffer at the same time; on an out-of-order queue each launch waits for the previous one and
a call for the previous call on that queue). Calls are thread-safe: the plan enqueues under its lock.

Results equal the layers called one by one (same kernels, same arguments) followed by numpy's float32 add and
the activation (``relu``: ``max(v, 0)``, ``relu6``: ``min(max(v, 0), 6)``), bitwise for finite values.

Shapes: every step must accept the previous step's output: 4-D NCHW ``(N, C, H, W)`` or, with
``layout="nc4hw4"``, ``(ceil(C/4), N, H, W, 4)``; a pipeline of :class:`~qconv.Linear` layers also takes
``(N, K)`` inputs (then every step must be a Linear). Outputs: float32 of the last step's shape.
"""
from __future__ import annotations

import threading

import numpy as np

from .layer import LAYOUTS, Conv2d, Linear, _is_cl_array

_ACTIVATIONS = (None, "relu", "relu6")


class Residual:
    """``activation(block(x) + shortcut(x))``: ``block`` a non-empty list of steps (layers, pipelines,
    residuals), ``shortcut`` None (the identity) or such a list (e.g. a projection conv); both results must
    have the same shape. ``activation``: None, ``"relu"`` or ``"relu6"``, applied after the add."""

    def __init__(self, block, shortcut=None, activation=None):
        self.block = _flatten(block, "Residual block")
        if not self.block:
            raise ValueError("a Residual needs a non-empty block (the identity would add x to itself)")
        self.shortcut = None if shortcut is None else _flatten(shortcut, "Residual shortcut")
        if self.shortcut is not None and not self.shortcut:
            raise ValueError("shortcut must be None (the identity) or a non-empty list of steps")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be None, 'relu' or 'relu6', got {activation!r}")
        self.activation = activation

    def __repr__(self) -> str:
        sc = "" if self.shortcut is None else f", shortcut={self.shortcut!r}"
        act = "" if self.activation is None else f", activation={self.activation!r}"
        return f"Residual({self.block!r}{sc}{act})"


def _flatten(steps, what) -> list:
    if isinstance(steps, (Conv2d, Residual, Pipeline)):
        steps = [steps]
    try:
        steps = list(steps)
    except TypeError:
        raise TypeError(f"{what} must be a list of layers / Residual / Pipeline, got {type(steps).__name__}") from None
    out = []
    for s in steps:
        if isinstance(s, Pipeline):
            out += s.steps
        elif isinstance(s, (Conv2d, Residual)):
            out.append(s)
        else:
            raise TypeError(f"{what}: a step must be a qconv.Conv2d / qconv.Linear, a qconv.Residual or a "
                            f"qconv.Pipeline, got {type(s).__name__}")
    return out


def _layers(steps):
    for s in steps:
        if isinstance(s, Residual):
            yield from _layers(s.block)
            if s.shortcut is not None:
                yield from _layers(s.shortcut)
        else:
            yield s


class _Program:
    """Steps as register operations: ``("layer", layer, src, dst)`` and ``("add", None, src, dst, act)``
    (``dst = act(dst + src)`` in place); register 0 is the input, ``result`` the output's."""

    def __init__(self, steps):
        self.ops = []
        self.nregs = 1
        self.result = self._emit(steps, 0)

    def _new(self) -> int:
        self.nregs += 1
        return self.nregs - 1

    def _emit(self, steps, src) -> int:
        cur = src
        for s in steps:
            if isinstance(s, Residual):
                a = self._emit(s.block, cur)
                b = cur if s.shortcut is None else self._emit(s.shortcut, cur)
                self.ops.append(("add", None, b, a, s.activation))
                cur = a
            else:
                dst = self._new()
                self.ops.append(("layer", s, cur, dst, None))
                cur = dst
        return cur


class _DevicePlan:
    """The launches of one input shape on OpenCL: one :class:`~qconv.gpu.launch.LaunchPlan` (``launch``) of every
    step's kernels in order, the input as ``X``, the result as ``Y``, intermediates as its ``Scratch`` buffers
    (one set per queue); ``labels``: a description per launch; register shapes."""

    def __init__(self, in_shape, launch, labels, shapes, result):
        from .gpu.engine import _Prepared, _c_strides

        self.in_shape, self.in_strides = in_shape, _c_strides(in_shape)
        self.launch, self.labels, self.shapes, self.result = launch, labels, shapes, result
        self.out = _Prepared.__new__(_Prepared)  # output shape/strides/size for the engine's Array maker
        self.out.out_shape, self.out.out_strides = shapes[result], _c_strides(shapes[result])
        self.out.out_size = int(np.prod(shapes[result]))
        self.out.out_nbytes = 4 * self.out.out_size


class Pipeline:
    """A sequence of steps run as one call (see the module docstring).

    ``Pipeline(steps)``: layers of one device, nested pipelines, :class:`Residual` blocks.
    ``pipe(x, layout="nchw", out=None)``: numpy input -> numpy output on every engine (``out``: a numpy array to
    copy the result into); a ``pyopencl.array.Array`` input (OpenCL) -> an Array on ``x.queue``, or written into
    ``out`` (float32, C-contiguous, offset 0, the result's shape, not sharing ``x``'s buffer).
    """

    def __init__(self, steps):
        self.steps = _flatten(steps, "Pipeline")
        if not self.steps:
            raise ValueError("a Pipeline needs at least one step")
        layers = list(_layers(self.steps))
        kinds = {type(layer.engine) for layer in layers}
        if len(kinds) > 1:
            raise ValueError(f"all layers of a Pipeline must run on one engine, got {sorted(k.name for k in kinds)}")
        self.engine_class = kinds.pop()
        self.opencl = layers[0].engine.supports_device_arrays
        if self.opencl:
            ctx = layers[0].engine.ctx
            if any(layer.engine.ctx != ctx for layer in layers):
                raise ValueError("all layers of an OpenCL Pipeline must use one OpenCL context (one device)")
            self.ctx, self._engine0 = ctx, layers[0].engine
        self._program = _Program(self.steps)
        self._plans: dict = {}
        self._lock = threading.Lock()

    @property
    def queue(self):
        """OpenCL: the calling thread's call queue (the first layer's engine's; one per host thread)."""
        return self._engine0.queue

    @property
    def _pool(self):
        return self._engine0._pool

    def __repr__(self) -> str:
        return f"Pipeline({self.steps!r})"

    @property
    def layers(self) -> list:
        """Every layer of the pipeline, in program order (blocks before their shortcuts)."""
        return list(_layers(self.steps))

    # --- host engines -----------------------------------------------------------------------------
    def _run_host(self, x, layout):
        regs = {0: x}
        for kind, layer, src, dst, act in self._program.ops:
            if kind == "layer":
                v = regs[src]
                if v.ndim == 2:
                    if not isinstance(layer, Linear):
                        raise ValueError(f"(N, K) inputs need Linear layers only, got {layer!r}")
                    regs[dst] = layer(v)
                else:
                    regs[dst] = Conv2d.__call__(layer, v, layout)
            else:
                regs[dst] = _add_host(regs[dst], regs[src], act)
        return regs[self._program.result]

    # --- OpenCL -------------------------------------------------------------------------------------
    def prepare(self, shape, layout: str = "nchw"):
        """Plans every launch for float32 inputs of ``shape`` (OpenCL; tunes each layer's kernel like its
        first call would; a no-op on other engines). Returns the output's shape."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if not self.opencl:
            return None
        return self._plan(tuple(int(v) for v in shape), layout).shapes[self._program.result]

    def _plan(self, shape, layout):
        key = (shape, layout)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        from .gpu.eltwise import add_steps
        from .gpu.launch import X, Y, LaunchPlan, Scratch, remap

        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                return plan
            linear = len(shape) == 2
            if linear and layout != "nchw":
                raise ValueError("(N, K) inputs take layout='nchw'")
            shapes = {0: shape}
            ops = []  # (steps, src register, dst register)
            for kind, layer, src, dst, act in self._program.ops:
                if kind == "layer":
                    if linear and not isinstance(layer, Linear):
                        raise ValueError(f"(N, K) inputs need Linear layers only, got {layer!r}")
                    try:
                        p = layer.engine.prepare(shapes[src], layout, linear=linear)
                    except ValueError as exc:
                        raise ValueError(f"step {layer!r} cannot take the previous step's output "
                                         f"{shapes[src]}: {exc}") from exc
                    shapes[dst] = p.out_shape
                    ops.append((p.plan.cand.info["steps"](p.plan.lws), src, dst))  # the layer's own launches
                else:
                    if shapes[src] != shapes[dst]:
                        raise ValueError(f"Residual: the block gives {shapes[dst]}, the shortcut {shapes[src]}")
                    ops.append((add_steps(int(np.prod(shapes[dst])), act), src, dst))
            result = self._program.result
            regs = {r: X if r == 0 else Y if r == result else Scratch(4 * int(np.prod(shp)), f"register {r}")
                    for r, shp in shapes.items()}
            steps = [st for op_steps, src, dst in ops for st in remap(op_steps, {X: regs[src], Y: regs[dst]})]
            labels = [f"{st.program}:{st.kernel}" for st in steps]
            launch = LaunchPlan(self.ctx, steps, f"pipeline {shape} {layout}")
            plan = self._plans[key] = _DevicePlan(shape, launch, labels, shapes, result)
            return plan

    def _run_device(self, x, layout, out):
        from .gpu.engine import _F32, _new_array

        plan = self._plans.get((x.shape, layout))
        if plan is None or x.dtype != _F32 or x.offset or x.base_data is None or x.strides != plan.in_strides \
                or (x.context is not self.ctx and x.context != self.ctx):
            x = self._checked_input(x)
            plan = self._plan(tuple(x.shape), layout)
        queue = x.queue if x.queue is not None else self.queue
        if out is None:
            y = _new_array(queue, self.ctx, x.allocator or self._pool, plan.out)
            wait = x.events or None
        else:
            self._check_out(plan, x, out)
            y, wait = out, (x.events + out.events) or None
        _, ev = plan.launch.enqueue(queue, x.base_data, y.base_data, wait)
        if out is not None:
            del y.events[:]
        y.events.append(ev)
        return y

    def _checked_input(self, x):
        from .gpu.engine import check_device_input

        check_device_input(x, self.ctx, "the pipeline's layers")
        if x.offset or x.base_data is None:
            x = x.copy(queue=x.queue if x.queue is not None else self.queue)
        return x

    def _check_out(self, plan, x, out):
        import pyopencl.array as cla

        from .gpu.engine import _same_buffer

        if not isinstance(out, cla.Array):
            raise TypeError(f"out must be a pyopencl.array.Array for a device-array input, got {type(out).__name__}")
        if out.dtype != np.float32 or tuple(out.shape) != plan.out.out_shape:
            raise ValueError(f"out must be float32 of shape {plan.out.out_shape}, got {out.dtype} {tuple(out.shape)}")
        if out.context != self.ctx or out.offset or out.base_data is None or out.strides != plan.out.out_strides:
            raise ValueError("out must be a C-contiguous Array at offset 0 in the pipeline's context")
        if _same_buffer(out.base_data, x.base_data):
            raise ValueError("out shares its buffer with x; pass a separate output array")

    def kernel_times_ns(self, x, layout: str = "nchw", repeats: int = 20) -> list:
        """OpenCL only (for benchmarks): ``[(kernel, ns)]`` of every planned launch for device array ``x`` (timed on
        the engines' profiling queue, not ``x``'s), each the median of its event time (start to end) over ``repeats`` forwards queued
        back to back. Their sum is the pipeline's kernel time."""
        import statistics

        if not self.opencl or not _is_cl_array(x):
            raise TypeError("kernel_times_ns takes a pyopencl.array.Array input of an OpenCL pipeline")
        from .gpu.context import profiling_queue

        y = self(x, layout)
        (x.queue if x.queue is not None else self.queue).finish()
        queue = profiling_queue(self.ctx, self.queue.device)
        plan = self._plans[(tuple(x.shape), layout)]
        runs = []
        with plan.launch.lock:
            for _ in range(repeats):
                events = []
                plan.launch.enqueue_locked(queue, x.base_data, y.base_data, None, events)
                runs.append(events)
        queue.finish()
        return [(label, float(statistics.median(run[i].profile.end - run[i].profile.start for run in runs)))
                for i, label in enumerate(plan.labels)]

    # --- calls ----------------------------------------------------------------------------------------
    def __call__(self, x, layout: str = "nchw", out=None):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if self.opencl:
            if _is_cl_array(x):
                return self._run_device(x, layout, out)
            import pyopencl.array as cla

            from .layer import _into

            xh = np.ascontiguousarray(np.asarray(x, dtype=np.float32)) if not (
                isinstance(x, np.ndarray) and x.dtype == np.float32) else np.ascontiguousarray(x)
            if not np.isfinite(xh).all():
                raise ValueError("x contains non-finite values (NaN or inf); qconv refuses them")
            xd = cla.to_device(self.queue, xh, allocator=self._pool)
            return _into(out, self._run_device(xd, layout, None).get(), x)
        if _is_cl_array(x):
            raise TypeError("this pipeline runs on a host engine: pass a numpy array")
        from .layer import _into

        return _into(out, self._run_host(x, layout), x)


def _add_host(a, b, act):
    """``act(a + b)`` in float32 (a new array: ``a`` may be a layer's output the caller still holds)."""
    if a.shape != b.shape:
        raise ValueError(f"Residual: the block gives {a.shape}, the shortcut {b.shape}")
    y = np.add(a, b, dtype=np.float32)
    if act == "relu":
        np.maximum(y, np.float32(0), out=y)
    elif act == "relu6":
        np.minimum(np.maximum(y, np.float32(0), out=y), np.float32(6), out=y)
    return y
