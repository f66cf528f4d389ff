"""Public layers: :class:`Conv2d`, :class:`Linear` and the functional :func:`conv2d`.

A layer validates its arguments once, picks an engine by ``device`` and lets the engine prepare the
weights (tiling, packing, fused tables). Calls validate the input, then run the engine.

Devices: ``"cpu"`` (Cython int8 GEMM engine), ``"reference"`` (the numpy oracle), ``"opencl"`` (first GPU,
else any OpenCL device), ``"opencl:P:D"``, or a ``pyopencl.Device`` / ``pyopencl.Context``.
``act_quant="auto"`` resolves to the engine's default: ``"tensor"`` on the CPU (``"row"`` for
:class:`Linear`; the CPU also takes ``"block"`` and ``None``, float activations), ``None`` (float activations) on
OpenCL, which also takes ``"row"`` (int8 per sample; integer dot products for a linear layer on one row).
"""
from __future__ import annotations

import numpy as np

from . import _validate as V
from . import reference
from ._ext._ortops import run_native
from .engines import Engine
from .geometry import ConvSpec
from .layouts.nc4hw4 import NC4HW4
from .weights import QuantizedWeight

LAYOUTS = ("nchw", "nc4hw4")
# input shapes a layer keeps prepared CPU calls for (more: the oldest are dropped)
NATIVE_SHAPES = 8
PUBLIC_NC4HW4 = NC4HW4(4)


class ReferenceEngine:
    """The numpy oracle behind the engine protocol (:class:`qconv.engines.Engine`; slow: for checks and as a
    fallback you ask for)."""

    name = "reference"
    supported_act_quant = ("tensor", "row", "block", None)
    default_act_quant = "tensor"
    default_linear_act_quant = "row"
    native_layouts = ("nchw",)
    rejects_nonfinite = False
    supports_device_arrays = False
    int8_input = False
    output_qparams = None

    def __init__(self, spec: ConvSpec):
        self.spec = spec

    def forward(self, x: np.ndarray, layout: str = "nchw") -> np.ndarray:
        s = self.spec
        return reference.conv2d(x, s.weight, s.bias, s.stride, s.padding, s.dilation, s.activation,
                                s.act_quant, s.act_block, s.post_affine)

    def describe(self) -> str:
        return "reference (numpy float64/int64 oracle)"


def _is_opencl_device(device) -> bool:
    if isinstance(device, str):
        return device == "opencl" or device.startswith("opencl:")
    mod = type(device).__module__ or ""
    return mod.startswith("pyopencl")


def engine_class(device) -> type:
    """The engine class (an :class:`qconv.engines.Engine`) that runs layers on ``device``."""
    if isinstance(device, str) and device == "cpu":
        try:
            from .cpu import CpuEngine
        except ImportError as exc:
            raise RuntimeError("the qconv CPU engine is not built (its Cython extension failed to import: "
                               f"{exc}); reinstall with `pip install -e .` and a C compiler") from exc
        return CpuEngine
    if isinstance(device, str) and device == "reference":
        return ReferenceEngine
    if _is_opencl_device(device):
        try:
            from .gpu import OpenCLEngine
        except ImportError as exc:
            raise RuntimeError(f"the OpenCL engine needs pyopencl (`pip install pyopencl`): {exc}") from exc
        return OpenCLEngine
    raise ValueError(f"device must be 'cpu', 'reference', 'opencl', 'opencl:P:D' or a pyopencl "
                     f"Device/Context, got {device!r}")


def _is_cl_array(x) -> bool:
    return type(x).__module__.startswith("pyopencl") and hasattr(x, "queue")


class Conv2d:
    """A prepared weight-quantized 2-D convolution.

    ``weight``: :class:`QuantizedWeight` ``(O, I/groups, kh, kw)``; ``bias``: float ``(O,)`` or None;
    ``stride``, ``padding``, ``dilation``: int or ``(h, w)``; ``activation``: None, ``"relu"``, ``"relu6"``,
    ``"hardswish"``;
    ``act_quant``: ``"auto"``, ``"tensor"``, ``"row"``, ``"block"`` or None (see the module docstring);
    ``threads``: CPU threads (None = all cores); ``act_block``: channels per activation block of
    ``act_quant="block"`` (0 = the weight's block); ``post_affine``: None or per-output-channel ``(scale, shift)``
    applied as ``y * scale + shift`` after the activation (CPU and reference engines; see
    :class:`~qconv.geometry.ConvSpec`). Extra keyword arguments go to the engine (e.g. ``input_qparams``,
    ``output_qparams`` of the CPU engine's static int8 path; ``check_finite=True`` of the OpenCL engine: NaN/inf
    in a ``pyopencl.array.Array`` input raise ``ValueError``, at the cost of a blocking read of a count; by
    default device arrays are not scanned, so calls stay asynchronous; numpy inputs are always checked).

    ``layer(x)`` takes float32 NCHW ``(N, C, H, W)`` and returns float32 NCHW ``(N, O, OH, OW)``;
    ``layer(x, layout="nc4hw4")`` takes ``(ceil(C/4), N, H, W, 4)`` arrays (the input's padding lanes are ignored)
    and returns them (padding lanes zero). An empty batch (``N = 0``) returns an empty output of that shape on
    every engine (a device array for a device array).

    ``layer(x, out=y)`` writes the result into ``y`` and returns it. On OpenCL with a ``pyopencl.array.Array``
    ``x``, ``y`` must be a float32 C-contiguous Array of exactly the output's shape in the layer's context, at
    offset 0, not sharing ``x``'s buffer (``TypeError``/``ValueError`` otherwise); the kernels write it directly
    (no Array is made). Elsewhere ``y`` is a numpy array of the output's shape and dtype, not sharing memory
    with ``x``, and the result is copied into it (the CPU engine writes a C-contiguous ``y`` directly). On the CPU a
    numpy float32 C-contiguous NCHW call of a shape seen before runs the engine's prepared native call for that
    shape (``CpuEngine.native_call``, the one onnxruntime's custom operators run; the same bits) without the Python
    path; what it does not take (other dtypes or layouts, NaN / inf inputs, an ``out`` it cannot write) goes
    through the checked path, which raises the errors. On OpenCL a device-array call of a shape seen before takes the
    prepared path (:mod:`qconv.gpu.launch`): kernels with their constant arguments bound once, one Array made per
    call (none with ``out``).
    """

    _default_act_quant_key = "default_act_quant"

    def __init__(self, weight: QuantizedWeight, bias=None, stride=1, padding=0, dilation=1,
                 activation=None, device="cpu", act_quant="auto", threads=None, act_block=0, post_affine=None,
                 **engine_options):
        engine_cls = engine_class(device)
        if act_quant == "auto":
            act_quant = getattr(engine_cls, self._default_act_quant_key)
        V.check_choice(act_quant, "act_quant", engine_cls.supported_act_quant)
        self.spec = ConvSpec(weight, bias, stride, padding, dilation, activation, act_quant, act_block, post_affine)
        self.device = device
        if threads is not None:
            threads = V.check_int(threads, "threads", minimum=1)
            engine_options["threads"] = threads
        if engine_cls is not ReferenceEngine and _is_opencl_device(device):
            engine_options["device"] = device
        self.engine: Engine = engine_cls(self.spec, **engine_options)
        # device arrays go straight to the engine's prepared path (bound once: calls are hot)
        self._forward_array = self.engine.forward_array if self.engine.supports_device_arrays else None
        # numpy float32 NCHW inputs of a shape seen before: the CPU engine's prepared call on it ({shape: (call,
        # output shape)}, None where the engine has none), made after the first checked call of that shape
        self._native_calls = {} if hasattr(self.engine, "native_call") else None

    # --- properties -----------------------------------------------------------------------------
    @property
    def weight(self) -> QuantizedWeight:
        return self.spec.weight

    @property
    def in_channels(self) -> int:
        return self.spec.in_channels

    @property
    def out_channels(self) -> int:
        return self.spec.out_channels

    def __repr__(self) -> str:
        s = self.spec
        act = f", activation={s.activation!r}" if s.activation else ""
        return (f"{type(self).__name__}({s.in_channels}->{s.out_channels}, kernel={s.kernel_size}, "
                f"stride={s.stride}, padding={s.padding}, dilation={s.dilation}, groups={s.groups}{act}, "
                f"weight=int{s.weight.bits} {'sym' if s.weight.symmetric else 'asym'} "
                f"{'block ' + str(s.weight.block_size) if s.weight.block_size else 'per-channel'}, "
                f"act_quant={s.act_quant!r}, engine={self.engine.describe()})")

    # --- calls ----------------------------------------------------------------------------------
    def _nhw(self, shape, layout: str):
        """``(N, H, W)`` of an input of ``shape`` in ``layout``; ``ValueError`` unless it fits the layer with
        ``H, W >= 1`` (``N = 0`` is allowed)."""
        c = self.spec.in_channels
        if layout == "nchw":
            if len(shape) != 4:
                raise ValueError(f"x must be NCHW (N, C, H, W), got shape {shape}")
            if shape[1] != c:
                raise ValueError(f"x has {shape[1]} channels, the layer expects {c} (x shape {shape})")
            n, h, w = shape[0], shape[2], shape[3]
        else:
            want = -(-c // 4)
            if len(shape) != 5 or shape[4] != 4 or shape[0] != want:
                raise ValueError(f"x must be NC4HW4 ({want}, N, H, W, 4) for {c} channels, got shape {shape}")
            n, h, w = shape[1], shape[2], shape[3]
        if h == 0 or w == 0:
            raise ValueError(f"x must not be empty, got shape {shape}")
        return n, h, w

    def _check_input(self, x, layout: str):
        V.check_choice(layout, "layout", LAYOUTS)
        if _is_cl_array(x):
            if x.size == 0:  # an empty batch is answered by the layer: check what the engine would have
                if x.dtype != np.float32:
                    raise TypeError(f"x must be a float32 pyopencl Array, got dtype {x.dtype}")
                self.spec.out_hw(*self._nhw(x.shape, layout)[1:])
            return x  # other device arrays are checked by the OpenCL engine
        int8_input = self.engine.int8_input
        if int8_input:
            x = np.asarray(x)
            if x.dtype != np.int8:
                raise TypeError(f"this layer has input_qparams, so x must be int8, got dtype {x.dtype}")
            x = np.ascontiguousarray(x)
        else:
            x = V.float_array(x, "x", finite=False, empty_ok=True)
        n, h, w = self._nhw(x.shape, layout)
        if not int8_input and not self.engine.rejects_nonfinite:
            self._check_finite(x, layout)
        oh, ow = self.spec.out_hw(h, w)
        V.check_alloc(4 * n * oh * ow * (-(-self.spec.out_channels // 4) * 4), "the output")
        return x

    def _check_finite(self, x, layout: str):
        """``ValueError`` when a real value of float32 ``x`` is NaN or inf (NC4HW4 padding lanes are not looked at)."""
        tail = self.spec.in_channels % 4
        parts = (x,) if layout == "nchw" or not tail else (x[:-1], x[-1, ..., :tail])
        bad = sum(p.size - int(np.count_nonzero(np.isfinite(p))) for p in parts)
        if bad:
            raise ValueError(f"x contains {bad} non-finite value(s) (NaN or inf); qconv refuses them")

    def _empty_output(self, x, layout: str):
        """The output of an empty batch ``x`` (validated): ``(0, O, OH, OW)`` or ``(ceil(O/4), 0, OH, OW, 4)``,
        int8 when the engine has ``output_qparams``, else float32; a device array (on ``x``'s queue) for one."""
        oh, ow = self.spec.out_hw(x.shape[2], x.shape[3])
        o = self.spec.out_channels
        shape = (0, o, oh, ow) if layout == "nchw" else (-(-o // 4), 0, oh, ow, 4)
        dtype = np.int8 if self.engine.output_qparams is not None else np.float32
        if _is_cl_array(x):
            import pyopencl.array as cla

            return cla.empty(x.queue if x.queue is not None else self.engine.queue, shape, dtype)
        return np.empty(shape, dtype)

    def __call__(self, x, layout: str = "nchw", out=None):
        """``out``: where to write the result (see the class docstring); returns it."""
        forward_array = self._forward_array
        if forward_array is not None and x.__class__.__module__.startswith("pyopencl") and x.size:
            if layout not in LAYOUTS:
                V.check_choice(layout, "layout", LAYOUTS)
            return forward_array(x, layout, out)  # the prepared path (the engine checks x and out)
        if self._native_calls and type(x) is np.ndarray and layout == "nchw":
            y = self._run_native(x.shape, x, out)
            if y is not None:
                return y
        x0 = x
        x = self._check_input(x, layout)
        if x.size == 0:  # an empty batch: _check_input lets no other empty input through
            return _into(out, self._empty_output(x, layout), x)
        if _is_cl_array(x) or layout in self.engine.native_layouts:
            if (out is not None and getattr(self.engine, "writes_out", False) and isinstance(out, np.ndarray)
                    and out.flags.c_contiguous and out.flags.writeable):
                y = self.engine.forward(x, layout, out=out)   # written in place (the engine checks it)
            else:
                y = _into(out, self.engine.forward(x, layout), x)
            if layout == "nchw":
                self._prepare_native(x0, y)
            return y
        y = self.engine.forward(PUBLIC_NC4HW4.unpack_array(x, self.spec.in_channels), "nchw")
        return _into(out, PUBLIC_NC4HW4.pack_array(y), x)

    def _run_native(self, key, x, out):
        """The prepared call of input shape ``key`` on ``x`` (its values under that shape) into ``out`` (or a new
        array), or None when there is none or it did not run (the checked path then runs the call)."""
        entry = self._native_calls.get(key)
        if entry is None:
            return None
        call, oshape = entry
        if out is None:
            y = np.empty(oshape, np.float32)
        elif type(out) is np.ndarray and out.shape == oshape and not np.may_share_memory(out, x):
            y = out
        else:
            return None
        return y if run_native(call, x, y) else None

    def _prepare_native(self, x, y):
        """After a checked call on numpy float32 C-contiguous NCHW ``x`` into ``y``: the engine's prepared call
        on that shape, asked once per shape (a few shapes are kept)."""
        calls = self._native_calls
        if (calls is None or type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous
                or x.shape in calls or not isinstance(y, np.ndarray) or y.dtype != np.float32):
            return
        if len(calls) >= NATIVE_SHAPES:
            calls.clear()
        call = self.engine.native_call(x.shape, y.shape)
        calls[x.shape] = None if call is None else (call, y.shape)


class Linear(Conv2d):
    """A weight-quantized linear layer: ``y = x @ w.T + bias`` for ``x`` of shape ``(N, K)``.

    ``weight`` is a :class:`QuantizedWeight` of shape ``(O, K, 1, 1)`` (``quantize_weight`` of an ``(O, K)``
    array). It runs as a 1x1 conv on 1x1 spatial (the GEMV/LLM case); ``N = 0`` returns an empty ``(0, O)``
    result. ``act_quant="auto"`` is ``"row"`` on the CPU, so every row is quantized on its own and batching never
    changes a row's result.
    """

    _default_act_quant_key = "default_linear_act_quant"

    def __init__(self, weight: QuantizedWeight, bias=None, activation=None, device="cpu", act_quant="auto",
                 threads=None, act_block=0, post_affine=None, **engine_options):
        if isinstance(weight, QuantizedWeight) and weight.kernel_size != (1, 1):
            raise ValueError(f"Linear needs a weight of shape (O, K, 1, 1), got {weight.q.shape}")
        if getattr(engine_class(device), "has_direct_path", False):
            engine_options.setdefault("direct", False)   # one pixel a sample: the direct path's strips do not fit
        super().__init__(weight, bias, 1, 0, 1, activation, device, act_quant, threads, act_block, post_affine,
                         **engine_options)

    def __call__(self, x, out=None):
        """``x``: ``(N, K)`` float32 (numpy or device array) -> ``(N, O)``; ``out``: see :class:`Conv2d`."""
        forward_array = self._forward_array
        if forward_array is not None and x.__class__.__module__.startswith("pyopencl") and x.size:
            return forward_array(x, "nchw", out, True)  # the prepared path: no reshapes
        if _is_cl_array(x):
            if x.ndim != 2:
                raise ValueError(f"x must have shape (N, K), got {x.shape}")
            y = super().__call__(x.reshape(x.shape[0], x.shape[1], 1, 1))
            return _into(out, y.reshape(y.shape[0], y.shape[1]), x)
        if self._native_calls and type(x) is np.ndarray and x.ndim == 2:
            n = x.shape[0]
            y = self._run_native((n, x.shape[1], 1, 1), x.reshape(n, x.shape[1], 1, 1),
                                 None if out is None else _rows_as_4d(out))
            if y is not None:
                return y.reshape(n, y.shape[1]) if out is None else out
        x = V.float_array(x, "x", ndim=2, finite=False, empty_ok=True)   # Conv2d.__call__ checks values and shape
        y = super().__call__(x.reshape(x.shape[0], x.shape[1], 1, 1))
        return _into(out, y.reshape(y.shape[0], y.shape[1]), x)


def _rows_as_4d(out):
    """A C-contiguous numpy ``(N, O)`` ``out`` as an ``(N, O, 1, 1)`` view, else ``out`` itself (the prepared
    call then does not run)."""
    if type(out) is np.ndarray and out.ndim == 2 and out.flags.c_contiguous:
        return out.reshape(out.shape[0], out.shape[1], 1, 1)
    return out


def _into(out, y, x):
    """``y`` itself when ``out`` is None, else ``y`` copied into ``out`` and ``out`` returned (numpy: same
    shape and dtype, not sharing memory with ``x``; a device array: only for an empty result, the OpenCL engine
    writes other device outputs directly)."""
    if out is None:
        return y
    if _is_cl_array(y):
        if not _is_cl_array(out):
            raise TypeError(f"out must be a pyopencl.array.Array for a device-array input, got {type(out).__name__}")
        if out.shape != y.shape or out.dtype != y.dtype:
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}, the result is {y.shape} {y.dtype}")
        if y.size:
            out.set(y.get())
        return out
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array for a numpy input, got {type(out).__name__}")
    if out.shape != y.shape or out.dtype != y.dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}, the result is {y.shape} {y.dtype}")
    if isinstance(x, np.ndarray) and np.may_share_memory(out, x):
        raise ValueError("out shares memory with x; pass a separate output array")
    np.copyto(out, y)
    return out


def conv2d(x, weight: QuantizedWeight, bias=None, stride=1, padding=0, dilation=1, activation=None,
           device="cpu", act_quant="auto", threads=None, layout: str = "nchw", act_block=0, **engine_options):
    """Functional form of :class:`Conv2d` (prepares the weights on every call: use the layer when repeating)."""
    layer = Conv2d(weight, bias, stride, padding, dilation, activation, device, act_quant, threads, act_block,
                   **engine_options)
    return layer(x, layout=layout)
