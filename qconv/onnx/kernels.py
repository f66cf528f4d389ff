"""qconv nodes as onnxruntime custom operators (onnxruntime-extensions' Python operators).

onnxruntime-extensions registers Python operators process-wide, one per ``domain::op_type``; a session that
loads its library (``SessionOptions.register_custom_ops_library``) gets them all. So the two operators here
(``ai.qconv::QConv`` and ``ai.qconv::QMatMul``, one float32 input, one float32 output) only look up a prepared
kernel: the node that onnxruntime sees carries a single string attribute ``qconv_key``
(``"<session id>/<node name>"``), and :data:`KERNELS` maps it to the kernel its :class:`InferenceSession`
prepared (built once per session; removed when the session is closed or collected).

onnxruntime-extensions' stock invocation hook returns every output as a Python list (``tolist()``), which costs
tens of ns per element; :func:`_invoke` is the same hook returning the numpy array itself (its C++ side reads a
``py::array`` either way, then copies it into onnxruntime's output). It is installed for all Python operators
of the process; it changes nothing but the speed of numeric outputs.
"""
from __future__ import annotations

import threading

import numpy as np

from .nodes import DOMAIN, QCONV, QMATMUL, QNode

KEY_ATTR = "qconv_key"
KERNELS: dict = {}
_LOCK = threading.Lock()
_OCOS = None  # onnxruntime_extensions._ocos once the operators are registered


def _need_extensions():
    """onnxruntime-extensions' operator core (``_ocos``) without its package ``__init__``.

    The package ``__init__`` also imports its converters, and through them torch when it is installed: about
    190 MB of resident memory and 1.5 s for nothing qconv uses. So, unless the package is already imported, its
    ``_ocos`` module is loaded under a bare stand-in package that is removed again right after; a later
    ``import onnxruntime_extensions`` runs the real ``__init__``, which reuses the loaded ``_ocos`` (the same
    operator registry)."""
    import importlib
    import importlib.util
    import sys
    import types

    name = "onnxruntime_extensions"
    if name in sys.modules:
        return sys.modules[name + "._ocos"]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError("qconv.onnx sessions need onnxruntime-extensions: pip install onnxruntime-extensions "
                          "(or pip install qconv[interop])")
    stub = types.ModuleType(name)
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__spec__ = spec
    sys.modules[name] = stub
    try:
        return importlib.import_module(name + "._ocos")
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]


# act_quant="auto" of a QConv node on the CPU: float activations (weight-only quantization, MNN's "low memory"
# mode). On PP-OCRv4 det at 640 (2026-12-01, AVX2, 2 threads, one process, runs interleaved) they measure 26.6 dB
# output SQNR against per-tensor int8's 15.3 dB, and run a whole session in 0.96x its time (the direct path).
SESSION_CONV_ACT_QUANT = None


class ConvKernel:
    """A prepared ``QConv``: ``x`` float32 ``(N, C, H, W)`` -> float32 ``(N, O, OH, OW)``.

    On the CPU the result is written into the calling thread's scratch arena (:mod:`qconv.cpu.scratch`, buffer
    ``"onnx_out"``), reused by the next node: onnxruntime-extensions copies a node's output into onnxruntime's
    tensor before the hook returns, so no output array is allocated (and page-faulted) per node."""

    def __init__(self, qnode: QNode, device="cpu", threads=None, act_quant="auto", **options):
        import qconv

        self.name = qnode.name
        self.extra_pad = qnode.extra_pad
        pa, self.host_affine = _post_affine(qnode, device, (1, -1, 1, 1))
        if act_quant == "auto" and device == "cpu":
            act_quant = SESSION_CONV_ACT_QUANT
        self.layer = qconv.Conv2d(qnode.weight, qnode.bias, qnode.stride, qnode.padding, qnode.dilation,
                                  qnode.activation, device=device, act_quant=act_quant, threads=threads,
                                  post_affine=pa, **options)
        self._arena_out = getattr(self.layer.engine, "writes_out", False) and self.host_affine is None

    def __call__(self, x: np.ndarray, out: str = "onnx_out") -> np.ndarray:
        """``out``: the arena buffer the result goes to (a chain alternates two, :class:`ChainKernel`)."""
        if any(self.extra_pad):
            t, b, l, r = self.extra_pad
            x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
        if not self._arena_out or x.ndim != 4 or x.shape[0] == 0:
            return _apply(self.layer(x), self.host_affine)
        from ..cpu import scratch

        oh, ow = self.layer.spec.out_hw(x.shape[2], x.shape[3])
        shape = (x.shape[0], self.layer.out_channels, oh, ow)
        return self.layer(x, out=scratch.arena().take(out, int(np.prod(shape)), np.float32).reshape(shape))


class MatMulKernel:
    """A prepared ``QMatMul``: ``x`` float32 ``(..., K)`` -> float32 ``(..., N)`` (rows through qconv.Linear)."""

    def __init__(self, qnode: QNode, device="cpu", threads=None, act_quant="auto", **options):
        import qconv

        self.name = qnode.name
        pa, self.host_affine = _post_affine(qnode, device, (1, -1))
        self.layer = qconv.Linear(qnode.weight, qnode.bias, qnode.activation, device=device, act_quant=act_quant,
                                  threads=threads, post_affine=pa, **options)
        self.k = qnode.weight.in_channels

    def __call__(self, x: np.ndarray, out: str = "onnx_out") -> np.ndarray:
        if x.shape[-1] != self.k:
            raise ValueError(f"qconv node {self.name!r}: input has {x.shape[-1]} features on its last axis, "
                             f"the weight takes {self.k} (input shape {x.shape})")
        y = _apply(self.layer(x.reshape(-1, self.k)), self.host_affine)
        return y.reshape(x.shape[:-1] + (y.shape[-1],))


class SqueezeExcite:
    """A squeeze-and-excitation block as one step of a :class:`ChainKernel`: ``x * HardSigmoid(s2(s1(mean(x))))``
    (``mean`` over H and W: ONNX GlobalAveragePool; ``HardSigmoid``: ``min(max(alpha*v + beta, 0), 1)``), plus
    ``x`` when ``residual``, in float32; ``s1`` / ``s2``: the prepared 1x1 qconv kernels of the block."""

    def __init__(self, s1, s2, alpha: float, beta: float, residual: bool):
        self.s1, self.s2, self.residual = s1, s2, residual
        self.alpha, self.beta = np.float32(alpha), np.float32(beta)
        self.name = f"se({s1.name}, {s2.name})"

    def __call__(self, x: np.ndarray, out: str = "onnx_out") -> np.ndarray:
        from ..cpu import scratch

        g = x.mean(axis=(2, 3), keepdims=True, dtype=np.float32)
        h = self.s2(self.s1(g, "onnx_se0"), "onnx_se1") * self.alpha + self.beta
        np.clip(h, 0, 1, out=h)
        y = scratch.arena().take(out, x.size, np.float32).reshape(x.shape)
        np.multiply(x, h, out=y)
        if self.residual:
            np.add(y, x, out=y)
        return y


class ChainKernel:
    """qconv nodes where each feeds only the next, run as one operator call: onnxruntime-extensions copies a
    Python operator's input in and its output out, so a chain of n layers makes 2 copies instead of 2n. The layers
    between write into two arena buffers in turn (``"onnx_chain0"`` / ``"onnx_chain1"``), the last into
    ``"onnx_out"``; each layer's result is exactly what it gives alone."""

    def __init__(self, kernels):
        self.kernels = list(kernels)   # ConvKernel / MatMulKernel / SqueezeExcite steps
        self.name = "+".join(k.name for k in self.kernels)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        last = len(self.kernels) - 1
        for i, k in enumerate(self.kernels):
            x = k(x, "onnx_out" if i == last else f"onnx_chain{i % 2}")
        return x


def _post_affine(qnode: QNode, device, shape):
    """``(post_affine for the layer, (scale, shift) the kernel applies itself or None)``: the CPU and reference
    engines take a node's ``post_affine``; on OpenCL it is applied on the host after the layer (same float32
    rule: ``y * scale + shift``)."""
    pa = qnode.post_affine
    if pa is None or device in ("cpu", "reference"):
        return pa, None
    return None, (pa[0].reshape(shape), pa[1].reshape(shape))


def _apply(y, affine):
    if affine is None:
        return y
    y = y.get() if hasattr(y, "get") else y
    return y * affine[0] + affine[1]


def make_kernel(qnode: QNode, **options):
    """The prepared kernel of a qconv node (``options``: device, threads, act_quant, ... of the qconv layer;
    ``threads`` is dropped for the numpy reference, which has none)."""
    if options.get("device") == "reference":
        options.pop("threads", None)
    return (ConvKernel if qnode.op == QCONV else MatMulKernel)(qnode, **options)


def _run(x, qconv_key):
    kernel = KERNELS.get(qconv_key)
    if kernel is None:
        raise RuntimeError(f"qconv: no prepared kernel for {qconv_key!r} (its session was closed?)")
    if getattr(_ERRORS, "exc", None) is not None:
        return np.zeros(0, np.float32)  # an earlier node of this run failed: skip the work
    return kernel(x)


_ERRORS = threading.local()


def take_error():
    """The first exception a qconv kernel raised on this thread since the last call (or None), cleared."""
    exc = getattr(_ERRORS, "exc", None)
    _ERRORS.exc = None
    return exc


def _invoke(k_id, feed, attributes):
    """onnxruntime-extensions' invocation hook, returning numeric outputs as arrays (module docstring).

    An exception escaping the hook aborts the process (onnxruntime-extensions rethrows it as a C++ exception
    through onnxruntime's C API), so a qconv kernel's exception is kept (:func:`take_error`, raised again by
    :meth:`InferenceSession.run`) and the node returns an empty tensor instead."""
    op = _OCOS.Opdef._odlist.get(k_id)
    if op is None:
        raise RuntimeError(f"Unable to find function id={k_id}. Did you decorate the operator with @onnx_op?")
    if op.body is _run:
        try:
            rv = op.body(*feed, **op.cast_attributes(attributes))
        except BaseException as exc:  # noqa: BLE001 - reported by InferenceSession.run
            if getattr(_ERRORS, "exc", None) is None:
                _ERRORS.exc = exc
            return (k_id, (0,), np.zeros(0, np.float32))
    else:
        rv = op.body(*feed, **op.cast_attributes(attributes))
    res = [k_id]
    for r in (rv if isinstance(rv, tuple) else (rv,)):
        r = np.asarray(r)
        if r.dtype.kind in "OUS":
            res += [r.shape, r.flatten().tolist()]
        else:
            res += [r.shape, np.ascontiguousarray(r).reshape(-1)]
    return tuple(res)


def register() -> str:
    """Define the qconv Python operators once per process; returns the custom-op library path for sessions."""
    global _OCOS
    with _LOCK:
        if _OCOS is None:
            ocos = _need_extensions()
            dt = ocos.PyCustomOpDef
            for op in (QCONV, QMATMUL):
                ocos.Opdef.declare(op_type=f"{DOMAIN}::{op}", inputs=[dt.dt_float], outputs=[dt.dt_float],
                                   attrs={KEY_ATTR: dt.dt_string})(_run)
            dt.install_hooker(_invoke)
            _OCOS = ocos
    return _OCOS.get_library_path()
