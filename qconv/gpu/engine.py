"""``OpenCLEngine``: weight-quantized conv on an OpenCL device (the engine protocol of ``docs/DESIGN.md``).

Three kernel families (``kernels/*.cl``):

* ``conv_general``: any kernel size, stride, padding, dilation and groups, with the seven output blockings
  ``c4h1w1 c4h1w2 c4h4w1 c8h2w1 c8h4w1 c4h1w4 c8h1w4``; weights in :class:`OpenCLConvWeightLayout`.
* ``conv_1x1``: 1x1, stride 1, unpadded, ungrouped convs as a GEMM over rows ``(n, h, w)`` (GEMV for a
  linear layer with N = 1), 1, 2 or 4 output channels per work-item from a buffer
  (:class:`OpenCL1x1BufferLayout`) or 1 or 2 from an Image2D (:class:`OpenCL1x1ImageLayout`), 1, 2 or 4
  rows per work-item, split-K over the work-group.
* ``conv_gemm``: ungrouped convs of either path as a tiled implicit GEMM (``gemm_<TM>x<TN>``: TM output
  channels x TN pixels per work-group, weights decoded once per tile into local memory); it reads the
  path's own weights (``OpenCLConvWeightLayout`` with ``ic_pack=4``, or ``OpenCL1x1BufferLayout``), so
  the tuner picks between it and the per-item kernels without a second copy. For batched layers.

* ``gemv_a8``: with ``act_quant="row"``, linear layers on one row (N = H = W = 1) with int8 activations:
  x is quantized once (``gemv_a8_c*``: a ``quant_x_a8`` launch first) or by every work-group into local
  memory (``gemv_a8f_c*``: one launch), and the weights stream through 4-way byte dot products (``dp4a``;
  PTX on NVIDIA, a portable fallback elsewhere), integer sums exact; a grid of at most g work-groups per
  compute unit loops over tiles of output channels (local sizes ``(l0, SPLIT, g)``).

* ``gemv_mma``: with float activations, linear layers on one row on f16 tensor cores (PTX ``mma.sync``
  m16n8k16 on NVIDIA sm_80+, offered to the tuner there; elsewhere only when forced, as an emulation): x
  split per element into two f16 numbers (``x * 2^e = hi + lo``), weights in :class:`OpenCLGemvMMALayout`
  (the mma's A fragments), f32 sums; local sizes ``(32, SPLIT, g)``.

* ``conv_mma``: with ``act_quant="row"``, ungrouped convs and batched linear layers as an implicit GEMM on
  int8 tensor cores (``mma_<TM>x<TN>``; PTX ``mma.sync`` on NVIDIA sm_80+, the tuner's first choice there;
  elsewhere only when forced, as an emulation), after ``row_amax`` + ``quant_rows_i8`` (``act_quant.cl``).

Activations and accumulation are float32 by default (``act_quant=None``); weights stay int8/int4 in device
memory and are dequantised in registers (``w = q*scale + offset``). ``act_quant="row"`` quantizes each
sample's activations to int8 exactly as the oracle does (``clip(round(x*127/amax), -127, 127)``): linear
layers then run ``gemv_a8``, other ungrouped shapes ``conv_mma`` where it runs, and the rest the float
kernels on the dequantized activations (``row_amax`` + ``quant_rows`` first, in ``act_quant.cl``). Inputs and outputs are float32 NCHW
``(N, C, H, W)`` or NC4HW4 ``(ceil(C/4), N, H, W, 4)`` (padding lanes written as zeros), numpy arrays
(copied in and out) or ``pyopencl.array.Array`` (kept on the device: the result is an Array on the
input's queue). The kernels read and write both layouts directly: no conversion launches.

The (variant, local size) of each input shape is auto-tuned at its first call (:mod:`.tuning`). Every
family describes its launches as :class:`~.launch.Step` lists (``steps(lws)``, wrapped by
:func:`~.launch.planned_candidate`); the chosen candidate's :class:`~.launch.LaunchPlan` is kept per input shape
(:meth:`OpenCLEngine.prepare`), so a later device-array call (:meth:`OpenCLEngine.forward_array`) binds only the
changed buffers and enqueues (``qconv/gpu/README.md``, "Calling layers from Python").
"""
from __future__ import annotations

import threading

import numpy as np

from ..layouts.opencl import (OpenCL1x1BufferLayout, OpenCL1x1ImageLayout, OpenCLConvWeightLayout,
                              OpenCLGemvMMALayout, OpenCLMMAWeightLayout, OpenCLScaleLayout)
from . import tuning
from .context import describe_device, import_pyopencl, memory_pool, profiling_queue, resolve
from .errors import OpenCLUnavailableError, wrap_cl_error
from .launch import X, Y, Scratch, Step, planned_candidate, remap
from .programs import get_kernel

GENERAL_VARIANTS = {  # name -> (CB blocks of 4 output channels, HB rows, WB columns)
    "c4h1w1": (1, 1, 1), "c4h1w2": (1, 1, 2), "c4h4w1": (1, 4, 1), "c8h2w1": (2, 2, 1),
    "c8h4w1": (2, 4, 1), "c4h1w4": (1, 1, 4), "c8h1w4": (2, 1, 4),
    "c4h2w4": (1, 2, 4), "c8h2w4": (2, 2, 4), "c16h1w4": (4, 1, 4), "c8h1w8": (2, 1, 8),
}
GEMM_VARIANTS = {  # name -> (TM output channels, TN pixels per work-group, RM, RN per work-item, KS split-K)
    "gemm_128x128": (128, 128, 8, 8, 1), "gemm_128x64": (128, 64, 8, 4, 1), "gemm_64x128": (64, 128, 4, 8, 1),
    "gemm_64x64": (64, 64, 4, 4, 1), "gemm_128x32": (128, 32, 8, 4, 1), "gemm_64x32": (64, 32, 4, 4, 1),
    "gemm_64x16": (64, 16, 4, 2, 1), "gemm_32x32": (32, 32, 4, 4, 1),
    "gemm_128x8": (128, 8, 8, 2, 1), "gemm_64x8": (64, 8, 4, 2, 1),
    "gemm_32x32k2": (32, 32, 4, 4, 2),
    "gemm_128x32k2": (128, 32, 8, 4, 2), "gemm_64x32k2": (64, 32, 4, 4, 2), "gemm_128x8k2": (128, 8, 8, 2, 2),
    "gemm_64x8k4": (64, 8, 4, 2, 4),
}
GEMV_VARIANTS = {  # name -> U: 16-byte weight chunks per item loaded before any is used (gemv_1x1, N=H=W=1)
    "gemv_u4": 4, "gemv_u8": 8,
}
A8_VARIANTS = {  # name -> (NC output channels per item, fused) (gemv_a8: act_quant="row", N=H=W=1); the fused
    # ones first: one launch, faster wherever x's int8 words fit in local memory (the H200, 2026-11-30)
    "gemv_a8f_c1": (1, True), "gemv_a8f_c2": (2, True), "gemv_a8_c1": (1, False), "gemv_a8_c2": (2, False),
}
MMA_VARIANTS = {  # name -> (WM, WN warps, MT, NT m16n8k32 tiles per warp) (conv_mma: act_quant="row", int8 tensor
    # cores, TM = 16*MT*WM output channels x TN = 8*NT*WN pixels per work-group of 32*WM*WN items)
    "mma_64x32": (2, 2, 2, 2), "mma_32x64": (2, 2, 1, 4), "mma_64x64": (2, 2, 2, 4), "mma_128x64": (2, 2, 4, 4),
    "mma_64x128": (2, 2, 2, 8), "mma_128x128": (2, 4, 4, 4),
}
GEMV_MMA_VARIANTS = {  # name -> U: 16-byte loads per lane in flight (gemv_mma: float activations, N=H=W=1, f16
    # tensor cores; x split into two f16 numbers per element)
    "gemv_mma": 8,
}
ROW_QUANT_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt",)
# gemv_a8 with per-channel scales sums q * xq over all input channels in int32: exact while K times the
# largest product fits (int8: 128 * 127; int4: (q + 8) * xq, unsigned nibbles, 15 * 127). Longer int8 rows
# (-DA8_WIDE) fold each lane's int32 sum into float before it can overflow and add the lanes in float (int4
# rows that long exceed A8_MAX_NV). Mirrored by an #error in gemv_a8.cl; tests/test_gpu_bounds.py runs both
# sides of the bound. (A first version summed in 64-bit integers in local memory: its unfused launches
# failed with OUT_OF_RESOURCES on the H200.)
A8_EXACT_MAX_IC = {8: (2**31 - 1) // (128 * 127), 4: (2**31 - 1) // (15 * 127)}
# gemv_a8 quantizes x with every float4 of it held in registers by the quantizing items (quant_x_a8's QL, or
# the fused variants' l0 * SPLIT): at most this many float4 per item (more crashed PoCL at 2.1 M channels;
# on a GPU they spill). Longer rows run the float kernels on quantized rows. Mirrored in gemv_a8.cl.
A8_MAX_NV = 256
_INT32_MAX = 2**31 - 1
_launch_lock = threading.Lock()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2ceil(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def _pow2floor(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)


def _roundup(n: int, m: int) -> int:
    return _cdiv(n, m) * m


def onex1_variants(image: bool) -> dict:
    """name -> (NC output channels per item, NB rows per item) of the 1x1 kernels."""
    ncs = (1, 2) if image else (4, 2, 1)
    store = "img" if image else "buf"
    return {f"{store}_c{nc}_r{nb}": (nc, nb) for nc in ncs for nb in (1, 2, 4)}


_F32 = np.dtype(np.float32)


def _c_strides(shape) -> tuple:
    """C-contiguous float32 strides of ``shape`` (as pyopencl computes them: dimensions of 0 count as 1)."""
    strides, acc = [], 4
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(1, dim)
    return tuple(reversed(strides))


def _same_buffer(a, b) -> bool:
    """Whether two pyopencl memory objects are the same buffer (sub-buffers made by hand are not detected)."""
    return a is b or a.int_ptr == b.int_ptr


_fast_array = [None]  # pyopencl's fast Array constructor works here (None: not tried yet)


def _new_array(queue, ctx, allocator, p):
    """A new float32 Array of ``p.out_shape`` on ``queue`` from ``allocator``: pyopencl's fast constructor
    (``Array(..., _fast=True)``: no numpy work on the shape, ~3 us instead of ~40 us on PoCL), or
    ``pyopencl.array.empty`` where that private signature is missing."""
    import pyopencl.array as cla

    if _fast_array[0] is not False:
        try:
            y = cla.Array(None, p.out_shape, _F32, allocator=allocator, strides=p.out_strides, _fast=True,
                          _size=p.out_size, _context=ctx, _queue=queue)
            _fast_array[0] = True
            return y
        except TypeError:
            _fast_array[0] = False
    return cla.empty(queue, p.out_shape, np.float32, allocator=allocator)


def check_device_input(x, ctx, owner: str) -> None:
    """``TypeError`` / ``ValueError`` unless ``x`` is a float32 C-contiguous ``pyopencl.array.Array`` in ``ctx``
    (``owner`` names whose context it must be, for the message)."""
    import pyopencl.array as cla

    if not isinstance(x, cla.Array):
        raise TypeError(f"x must be a pyopencl.array.Array, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"x must be a float32 pyopencl Array, got dtype {x.dtype}")
    if x.context != ctx:
        raise ValueError(f"x lives in another OpenCL context than {owner}")
    if not x.flags.c_contiguous:
        raise ValueError(f"x must be C-contiguous, got strides {x.strides}")


class _Prepared:
    """The prepared launch of one input shape as the caller passes it: ``plan`` (:class:`_Plan`), ``launch``
    (its :class:`~.launch.LaunchPlan`), the input's shape/strides/bytes and the output's shape/strides/size/
    bytes (float32, C-contiguous)."""

    __slots__ = ("plan", "launch", "in_shape", "in_strides", "in_nbytes", "out_shape", "out_strides", "out_size",
                 "out_nbytes")

    def __init__(self, plan, in_shape, out_shape):
        self.plan, self.launch = plan, plan.launch
        self.in_shape, self.in_strides = in_shape, _c_strides(in_shape)
        self.in_nbytes = 4 * int(np.prod(in_shape))
        self.out_shape, self.out_strides = tuple(int(v) for v in out_shape), _c_strides(out_shape)
        self.out_size = int(np.prod(out_shape))
        self.out_nbytes = 4 * self.out_size


class _Plan:
    """The kernel chosen for one input shape (layout, N, H, W): variant, options, local size and its
    :class:`~.launch.LaunchPlan` (``launch``)."""

    def __init__(self, cand, lws, ns, out_shape, in_elems, out_elems):
        self.cand, self.lws, self.ns, self.launch = cand, lws, ns, None
        self.out_shape, self.in_elems, self.out_elems = out_shape, in_elems, out_elems

    @property
    def variant(self) -> str:
        return self.cand.variant

    def describe(self) -> str:
        lws = "driver" if self.lws is None else "x".join(map(str, self.lws))
        if self.cand.program == "conv_mma":
            lws = f"{self.lws[0]} ksub={self.lws[1]}"
        t = "" if self.ns is None else f", {self.ns / 1e3:.1f} us"
        return f"{self.cand.program}:{self.variant} lws={lws}{t}"


class OpenCLEngine:
    """Weight-quantized conv on an OpenCL device.

    ``spec``: :class:`~qconv.geometry.ConvSpec` with ``act_quant=None`` (float activations) or ``"row"``
    (int8 activations per sample, see the module docstring). ``device``: see
    :func:`qconv.gpu.context.resolve`. Options:

    * ``tune``: ``"none" | "fast" | "full"`` (default ``$QCONV_TUNE``, else ``"fast"``);
    * ``variant``: force a kernel variant (``"c8h4w1"``..., or ``"buf_c4_r2"``, ``"img_c2_r1"``... for 1x1;
      ``"gemm_128x32"``, ``"gemm_64x8k4"``... for either path of an ungrouped conv, with a fixed local size);
    * ``local_size``: force the local size (a tuple; with ``variant`` or the heuristic variant; general
      path: ``(l0, l1)`` or ``(l0, l1, split)`` with split-K over input channels);
    * ``image``: 1x1 weights in an Image2D: ``None`` (auto: integrated GPUs, when it fits), ``True`` (when
      it fits the device's image limits, else the buffer), ``False``;
    * ``image_limits``: ``(max_width, max_height)`` instead of the device's (tests the fallback);
    * ``scale_dtype``: ``"auto"`` (fp16 when every scale/offset is exactly representable), ``"float32"``,
      ``"float16"`` (forced: rounds the scales);
    * ``specialize``: compile geometry constants into the kernels (default: on GPUs);
    * ``ic_pack``: input-channel pack of the general layout (4, or 1 = MNN's ``[ICp][O/4][K][4]``);
    * ``threads``: accepted and ignored (CPU option);
    * ``check_finite``: ``False`` (default) or ``True``. Numpy inputs are checked on the host by the layer
      (:class:`qconv.Conv2d` refuses NaN/inf with ``ValueError``). A ``pyopencl.array.Array`` input is by
      default **not scanned**: a call neither reads it back nor waits for it, so calls stay asynchronous, and
      NaN/inf inputs give NaN/inf outputs. With ``check_finite=True`` each device-array call first counts the
      non-finite values on the device (NC4HW4 padding lanes left out) and reads that count back (a blocking
      read that waits for ``x``), raising ``ValueError`` when there is any; numpy inputs are checked too.
    """

    name = "opencl"
    supported_act_quant = (None, "row")
    default_act_quant = None
    default_linear_act_quant = None
    native_layouts = ("nchw", "nc4hw4")
    rejects_nonfinite = False   # numpy inputs are checked by the layer; device arrays with check_finite=True
    supports_device_arrays = True
    int8_input = False
    output_qparams = None

    def __init__(self, spec, device="opencl", *, tune=None, variant=None, local_size=None, image=None,
                 image_limits=None, scale_dtype="auto", specialize=None, ic_pack=4, threads=None,
                 check_finite=False):
        cl = import_pyopencl()
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite must be True or False, got {check_finite!r}")
        self.check_finite = check_finite
        if spec.act_quant not in self.supported_act_quant:
            raise ValueError(f"the OpenCL engine supports act_quant None (float activations) or 'row' (int8 per "
                             f"sample), got {spec.act_quant!r}")
        self.spec = spec
        self.ctx, self.device = resolve(device)
        if not self.device.endian_little:
            raise OpenCLUnavailableError(f"{self.device.name}: big-endian OpenCL devices are not supported")
        self.act_row = spec.act_quant == "row"
        # Oclgrind (the memcheck job's simulator) does not set the flag but divides with the host's IEEE float
        # division, which is correctly rounded
        exact_div = (self.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
                     or self.device.name == "Oclgrind Simulator")
        if self.act_row and not exact_div:
            raise OpenCLUnavailableError(f"{self.device.name}: act_quant='row' needs correctly rounded float32 "
                                         f"division (CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) to quantize "
                                         f"exactly like the oracle; use act_quant=None on this device")
        self.queue = profiling_queue(self.ctx, self.device)
        self._pool = memory_pool(self.ctx, self.device)
        self.tune = tuning.tune_level(tune)
        self.is_gpu = bool(self.device.type & cl.device_type.GPU)
        self._nv_ptx = "NVIDIA" in self.device.platform.name.upper()  # inline PTX (dp4a, shuffles) builds
        self.specialize = self.is_gpu if specialize is None else bool(specialize)
        w = spec.weight
        self.path = "1x1" if (spec.is_pointwise and w.groups == 1) else "general"
        self._plans: dict = {}
        self._prepared: dict = {}  # (input shape, layout, linear) -> _Prepared
        self._last_plan = None
        self._lock = threading.Lock()

        if variant is not None:
            names = GENERAL_VARIANTS if self.path == "general" else {**onex1_variants(False), **onex1_variants(True)}
            names = {**names, **GEMM_VARIANTS}
            if self.path == "1x1":
                names = {**names, **GEMV_VARIANTS, **(A8_VARIANTS if self.act_row else {})}
                if spec.act_quant is None:
                    names = {**names, **GEMV_MMA_VARIANTS}
            if self.act_row:
                names = {**names, **MMA_VARIANTS}
            if variant not in names:
                raise ValueError(f"variant {variant!r} does not exist for the {self.path} path; choose from "
                                 f"{sorted(names)}")
            if variant in GEMM_VARIANTS:
                if w.groups != 1 or (self.path == "general" and ic_pack != 4):
                    raise ValueError(f"variant {variant!r} needs an ungrouped conv (and ic_pack=4)")
                if local_size is not None:
                    raise ValueError(f"variant {variant!r} has a fixed local size; do not pass local_size")
                if not self._gemm_fits(variant):
                    raise ValueError(f"variant {variant!r}: its tiles do not fit {self.device.name}'s local "
                                     f"memory for this kernel size (or its split-K sums its weight tiles)")
            if variant in MMA_VARIANTS:
                if local_size is not None:
                    raise ValueError(f"variant {variant!r} has a fixed local size; do not pass local_size")
                why = self._mma_unsupported()
                if why:
                    raise ValueError(f"variant {variant!r} cannot run this conv: {why}")
        self.forced_variant = variant
        if local_size is not None:
            local_size = tuple(int(v) for v in local_size)
            want = 2 if self.path == "general" else 3
            if (len(local_size) != want and not (self.path == "general" and len(local_size) == 3)) \
                    or min(local_size) < 1:
                raise ValueError(f"local_size must be {want} positive ints for the {self.path} kernels, got "
                                 f"{local_size!r}")
            if self.path == "1x1" and local_size[2] != 1:
                raise ValueError(f"the 1x1 kernels need local_size[2] == 1, got {local_size!r}")
        self.forced_lws = local_size

        # scales / offsets / bias
        if scale_dtype == "auto":
            ok = OpenCLScaleLayout.lossless(w.scales) and (w.offsets is None or OpenCLScaleLayout.lossless(w.offsets))
            scale_dtype = "float16" if ok else "float32"
        self.scale_layout = OpenCLScaleLayout(scale_dtype)
        self._ws = self._upload(self.scale_layout.pack_array(w.scales))
        self._wo = self._ws if w.offsets is None else self._upload(self.scale_layout.pack_array(w.offsets))
        ocp = _cdiv(w.out_channels, 4) * 4
        bias = np.zeros(ocp, np.float32)
        if spec.bias is not None:
            bias[:w.out_channels] = spec.bias
        self._bias = self._upload(bias)

        # weights
        self.image = False
        if self.path == "general":
            self.layout = OpenCLConvWeightLayout(w.bits, ic_pack)
            self._wq = self._upload(self.layout.pack_array(w.q))
        else:
            self.layout = OpenCL1x1BufferLayout(w.bits)
            use_image = self._want_image(image, image_limits)
            if use_image:
                self.layout = use_image
                self.image = True
                self._wq = self._upload_image(self.layout.pack_array(w.q))
            else:
                self._wq = self._upload(self.layout.pack_array(w.q))
            if variant is not None and variant.startswith("img") and not self.image:
                if image is False:
                    raise ValueError(f"variant {variant!r} needs image weights, but image=False")
                self.forced_variant = "buf" + variant[3:]  # image did not fit / no image support: buffer
            elif (variant in GEMM_VARIANTS or variant in GEMV_VARIANTS or variant in A8_VARIANTS
                  or variant in GEMV_MMA_VARIANTS) and self.image:
                raise ValueError(f"variant {variant!r} reads buffer weights; pass image=False")
            elif variant is not None and variant.startswith("buf") and self.image:
                raise ValueError(f"variant {variant!r} reads buffer weights; pass image=False")
        self._base_options = self._make_base_options()
        if variant in GEMV_VARIANTS and "-DLANE_SCALE" in self._base_options:
            raise ValueError(f"variant {variant!r} needs scale blocks of a multiple of 4 input channels")
        if variant in GEMV_MMA_VARIANTS and self._gemv_mma_unsupported():
            raise ValueError(f"variant {variant!r} cannot run this layer: {self._gemv_mma_unsupported()}")
        self._a8_group = self._a8_scale_group()
        if variant in A8_VARIANTS and self._a8_group is None:
            raise ValueError(f"variant {variant!r} needs per-channel scales or blocks that are a multiple or a "
                             f"divisor of {self.layout.ic_pack} input channels and of {32 // w.bits} or more")

    # {{{ preparation

    def _upload(self, arr: np.ndarray):
        cl = import_pyopencl()
        arr = np.ascontiguousarray(arr)
        try:
            return cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=arr)
        except cl.Error as exc:
            raise wrap_cl_error(exc, f"allocating {arr.nbytes} bytes on {self.device.name}") from exc

    def _upload_image(self, texels: np.ndarray):
        cl = import_pyopencl()
        h, w, _ = texels.shape
        fmt = cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.SIGNED_INT32)
        try:
            make = getattr(cl, "create_image", cl.Image)
            return make(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, fmt, shape=(w, h),
                            hostbuf=np.ascontiguousarray(texels, dtype=np.int32))
        except cl.Error as exc:
            raise wrap_cl_error(exc, f"creating a {w}x{h} RGBA/SIGNED_INT32 image on {self.device.name}") from exc

    def _image_supported(self) -> bool:
        cl = import_pyopencl()
        if not self.device.image_support:
            return False
        try:
            fmts = cl.get_supported_image_formats(self.ctx, cl.mem_flags.READ_ONLY, cl.mem_object_type.IMAGE2D)
        except cl.Error:
            return False
        return any(f.channel_order == cl.channel_order.RGBA and f.channel_data_type == cl.channel_type.SIGNED_INT32
                   for f in fmts)

    def _want_image(self, image, limits):
        """The image layout to use, or None (buffer): too large for the limits falls back to the buffer."""
        if image is False:
            return None
        if image is None and not (self.is_gpu and self.device.host_unified_memory):
            return None
        if not self._image_supported():
            return None
        bits = self.spec.weight.bits
        if limits is not None:
            mw, mh = (int(v) for v in limits)
            mw, mh = min(mw, self.device.image2d_max_width), min(mh, self.device.image2d_max_height)
            lay = OpenCL1x1ImageLayout(bits, mw, mh)
        else:
            lay = OpenCL1x1ImageLayout.for_device(bits, self.device)
        return lay if lay.fits(self.spec.weight.q.shape) else None

    def _make_base_options(self) -> tuple:
        s, w = self.spec, self.spec.weight
        opts = list(self.layout.build_options) + list(self.scale_layout.build_options)
        if w.offsets is not None:
            opts.append("-DASYM")
        if w.n_blocks == 1:
            opts.append("-DNBLK1")
        else:
            bc = w.block_channels
            opts.append(f"-DBLOCK_CH={bc}")
            if self.path == "general":
                if bc % 4 == 0:
                    opts.append("-DBLOCK_ALIGN4")
            else:
                kc = self.layout.ic_pack
                sg = next((g for g in (kc, 16, 8, 4) if kc % g == 0 and bc % g == 0), None)
                opts.append(f"-DSG={sg}" if sg else "-DLANE_SCALE")
        if s.bias is not None:
            opts.append("-DHAS_BIAS")
        if s.activation:
            opts.append(f"-DACT={1 if s.activation == 'relu' else 2}")
        ipg = w.q.shape[1]
        o = w.out_channels
        if o % 4:
            opts.append("-DOC_LANE_LEAVE")
        if self.path == "general":
            if ipg % 4:
                opts.append("-DIC_LEAVE")
            if w.groups > 1:
                opts.append("-DGROUPED")
                if ipg == 1 and o == w.groups:
                    opts.append("-DDEPTHWISE")
            if self.specialize:
                (kh, kw), (sh, sw), (ph, pw), (dh, dw) = s.kernel_size, s.stride, s.padding, s.dilation
                for name, val in (("IC", ipg), ("OC", o), ("GROUPS", w.groups), ("KH", kh), ("KW", kw),
                                  ("SH", sh), ("SW", sw), ("PH", ph), ("PW", pw), ("DH", dh), ("DW", dw)):
                    opts.append(f"-DG_{name}={val}")
        else:
            if ipg % self.layout.ic_pack:
                opts.append("-DIC_LEAVE")
            if self.specialize:
                opts += [f"-DG_IC={ipg}", f"-DG_OC={o}"]
        return tuple(opts)

    # }}}

    # {{{ candidates

    def _layout_options(self, layout: str, hw1: bool) -> list:
        opts = [] if layout == "nc4hw4" else ["-DIN_NCHW", "-DOUT_NCHW"]
        if hw1 and self.path == "1x1":
            opts.append("-DHW1")
        return opts

    def _general_candidates(self, layout, n, h, w, oh, ow):
        if self.forced_variant in MMA_VARIANTS:
            return [self._mma_candidate(self.forced_variant, layout, n, h, w, oh, ow)]
        cands = self._with_row_quant(self._float_general_candidates(layout, n, h, w, oh, ow), layout, n, h, w)
        return self._with_mma(cands, layout, n, h, w, oh, ow)

    def _float_general_candidates(self, layout, n, h, w, oh, ow):
        s, wt = self.spec, self.spec.weight
        o4 = _cdiv(wt.out_channels, 4)
        ipg = wt.q.shape[1]
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = s.kernel_size, s.stride, s.padding, s.dilation
        gemm = self._gemm_names(layout, n, h, w, oh, ow)
        if self.forced_variant in GEMM_VARIANTS:
            return [self._gemm_candidate(self.forced_variant, layout, n, h, w, oh, ow)]
        names = self._general_order(oh, ow, o4, n)
        if self.forced_variant:
            names = [self.forced_variant]
        elif self.tune == "fast":
            names = names[:3]
        scalars = [n, h, w, oh, ow, ipg, wt.out_channels, wt.groups, kh, kw, sh, sw, ph, pw, dh, dw]
        cands = []
        for name in names:
            cb, hb, wb = GENERAL_VARIANTS[name]
            g0, g1 = _cdiv(o4, cb) * _cdiv(ow, wb), n * _cdiv(oh, hb)
            opts = list(self._base_options) + [f"-DCB={cb}", f"-DHB={hb}", f"-DWB={wb}"]
            opts += self._layout_options(layout, False)
            if o4 % cb:
                opts.append("-DC_LEAVE")
            if oh % hb:
                opts.append("-DH_LEAVE")
            if ow % wb:
                opts.append("-DW_LEAVE")
            cands.append(self._candidate("conv_general", name, tuple(opts), (g0, g1), scalars,
                                         self._local_sizes_2d(g0, g1, _cdiv(ipg, 4), cb * hb * wb * 4),
                                         cb * hb * wb * 4))
        return self._with_gemm(cands, gemm, layout, n, h, w, oh, ow)

    def _general_order(self, oh, ow, o4, n=1):
        """Variants, the heuristic's favourite first."""
        order = []
        if self.is_gpu and n * oh * ow * o4 >= 262144 and ow >= 4:
            # big problems: more outputs per item amortise the weight decode and the input loads
            order += [v for v, ok in (("c8h2w4", oh >= 2 and o4 >= 2), ("c16h1w4", o4 >= 4),
                                      ("c8h1w8", ow >= 8 and o4 >= 2)) if ok]
        if ow >= 4:
            order += ["c8h1w4", "c4h1w4"] if o4 >= 2 else ["c4h1w4"]
        if oh >= 4:
            order += ["c8h4w1", "c4h4w1"] if o4 >= 2 else ["c4h4w1"]
        if ow >= 2:
            order.append("c4h1w2")
        if oh >= 2 and o4 >= 2:
            order.append("c8h2w1")
        order.append("c4h1w1")
        rest = [v for v in GENERAL_VARIANTS if v not in order]
        return order + rest

    def _local_sizes_2d(self, g0, g1, ic4=1, per_item=4):
        """Local sizes (l0, l1) or, with split-K over input channels, (l0, l1, SPLIT)."""
        if self.forced_lws is not None:
            return [self.forced_lws]
        maxwg = int(self.device.max_work_group_size)
        mi = self.device.max_work_item_sizes
        local_floats = int(self.device.local_mem_size) // 4 - 256
        p0, p1 = _pow2ceil(g0), _pow2ceil(g1)
        if self.tune == "full":
            sizes = [(a, b) for a in (1, 2, 4, 8, 16, 32, 64, 128, 256) for b in (1, 2, 4, 8, 16, 32, 64)
                     if a <= p0 and b <= p1 and 8 <= a * b <= min(maxwg, 1024)]
        else:
            l0 = min(64, p0)
            l1 = min(max(1, 64 // l0), p1)
            sizes = [(l0, l1), (16, 4), (32, 2), (8, 8), (64, 1), (32, 4), (4, 16)]
            sizes = [(min(a, p0), min(b, p1)) for a, b in sizes]
        if self.is_gpu and g0 * g1 < 65536 and ic4 >= 4 and len(mi) > 2:
            # too few outputs to fill a GPU: split the input channels over dim 2 (first when very few)
            pk = _pow2floor(ic4)
            split = [(min(32, p0), min(2, p1), min(8, pk)), (min(32, p0), 1, min(16, pk)),
                     (min(16, p0), min(2, p1), min(16, pk)), (min(64, p0), 1, min(4, pk)),
                     (min(32, p0), min(2, p1), min(4, pk)), (min(16, p0), 1, min(32, pk))]
            if self.tune == "full":
                split += [(a, b, k) for a in (8, 16, 32, 64) for b in (1, 2) for k in (2, 4, 8, 16, 32)
                          if a <= p0 and b <= p1 and k <= pk]
            split = [sz for sz in split if sz[0] * sz[1] * sz[2] * per_item <= local_floats
                     and sz[0] * sz[1] * sz[2] <= min(maxwg, 1024) and sz[2] <= mi[2] and sz[2] > 1]
            sizes = split + sizes if g0 * g1 < 16384 else sizes[:3] + split + sizes[3:]
        sizes = [sz for sz in dict.fromkeys(sizes) if sz[0] * sz[1] <= maxwg and sz[0] <= mi[0] and sz[1] <= mi[1]]
        if not self.is_gpu:
            sizes = [None] + sizes  # PoCL: its own choice is good and avoids a per-size compile
        return sizes or [None]

    def _onex1_candidates(self, layout, n, h, w):
        if self.forced_variant in MMA_VARIANTS:
            return [self._mma_candidate(self.forced_variant, layout, n, h, w, h, w)]
        a8 = self._a8_names(n * h * w)
        if a8:
            return [self._a8_candidate(v, layout) for v in a8]
        cands = self._with_row_quant(self._float_onex1_candidates(layout, n, h, w), layout, n, h, w)
        return self._with_mma(cands, layout, n, h, w, h, w)

    def _float_onex1_candidates(self, layout, n, h, w):
        wt = self.spec.weight
        hw, m = h * w, n * h * w
        ocp = _cdiv(wt.out_channels, 4) * 4
        kch = _cdiv(wt.q.shape[1], self.layout.ic_pack)
        variants = onex1_variants(self.image)
        gemm = self._gemm_names(layout, n, h, w, h, w)
        if self.forced_variant in GEMM_VARIANTS:
            return [self._gemm_candidate(self.forced_variant, layout, n, h, w, h, w)]
        if self.forced_variant in GEMV_MMA_VARIANTS:
            if m != 1:
                raise ValueError(f"variant {self.forced_variant!r} runs linear layers on one row (N = H = W = 1)")
            return [self._gemv_mma_candidate(self.forced_variant, layout)]
        gemv = self._gemv_names(m)
        if self.forced_variant in GEMV_VARIANTS and gemv:
            return [self._gemv_candidate(self.forced_variant, layout)]
        names = self._onex1_order(m, variants)
        if self.forced_variant in variants:
            names = [self.forced_variant]
        elif self.tune == "fast":
            names = names[:3]
        cands = []
        for name in names:
            nc, nb = variants[name]
            g0, g2 = ocp // nc, _cdiv(m, nb)
            opts = list(self._base_options) + [f"-DNC={nc}", f"-DNB={nb}"] + self._layout_options(layout, hw == 1)
            scalars = [m, hw, wt.q.shape[1], wt.out_channels]
            cands.append(self._candidate("conv_1x1", name, tuple(opts), (g0, g2), scalars,
                                         self._local_sizes_1x1(g0, g2, kch, nb * nc), nb * nc))
        if gemv and self.forced_variant is None:
            # tuned on a GPU right after the heuristic's favourite (the tuner keeps it only when faster,
            # and the fast level's time budget still reaches both); untuned, the 1x1 kernels stay first
            extra = [self._gemv_candidate(v, layout) for v in gemv]
            cands = cands[:1] + extra + cands[1:] if self.is_gpu and self.tune != "none" else cands + extra
        if m == 1 and self.forced_variant is None and self._mma_native() and not self._gemv_mma_unsupported():
            cands = cands[:1] + [self._gemv_mma_candidate(v, layout) for v in GEMV_MMA_VARIANTS] + cands[1:]
        return self._with_gemm(cands, gemm, layout, n, h, w, h, w)

    def _gemv_names(self, m):
        """gemv_1x1 variants for this problem ([] unless one row, buffer weights, 4-aligned scale blocks)."""
        if m != 1 or self.image or "-DLANE_SCALE" in self._base_options:
            return []
        if self.forced_variant is not None:
            return [self.forced_variant] if self.forced_variant in GEMV_VARIANTS else []
        return list(GEMV_VARIANTS) if self.tune == "full" else ["gemv_u4"]

    def _gemv_local_sizes(self, ocp, kch, ngr):
        if self.forced_lws is not None:
            return [self.forced_lws[:2]]
        maxwg = int(self.device.max_work_group_size)
        mi = self.device.max_work_item_sizes
        local_floats = int(self.device.local_mem_size) // 4 - 256 - ngr
        p0, pk = _pow2ceil(ocp), _pow2floor(kch)
        if self.tune == "full":
            sizes = [(a, b) for a in (16, 32, 64, 128, 256) for b in (1, 2, 4, 8, 16, 32, 64)]
        else:
            sizes = [(32, 16), (128, 4), (64, 8)]  # the H200's picks (8192->28672: 32x16)
        ok = []
        for a, b in sizes:
            a, b = min(a, p0), min(b, pk)
            if a * b <= min(maxwg, 1024) and a <= mi[0] and b <= mi[1] and a * b <= local_floats:
                ok.append((a, b))
        return list(dict.fromkeys(ok)) or [(1, 1)]

    def _gemv_candidate(self, name, layout):
        """gemv_1x1 (one row): NDRange (ceil(OCp / l0) * l0, SPLIT), local size (l0, SPLIT)."""
        wt = self.spec.weight
        ocp = _cdiv(wt.out_channels, 4) * 4
        kc = self.layout.ic_pack
        kch = _cdiv(wt.q.shape[1], kc)
        asym = wt.offsets is not None
        if wt.n_blocks == 1:
            ngr = kch
        else:
            sg = next(o for o in self._base_options if o.startswith("-DSG="))
            ngr = kch * (kc // int(sg[5:]))
        ngr = ngr if asym else 0
        opts = tuple(self._base_options) + (f"-DU={GEMV_VARIANTS[name]}",) + tuple(
            self._layout_options(layout, True))
        scal = [np.int32(wt.q.shape[1]), np.int32(wt.out_channels)]
        engine = self

        def steps(lws):
            cl = import_pyopencl()
            lws = (1, 1) if lws is None else lws  # sx lives after l0 * SPLIT floats: the size must be known
            split = lws[1]
            gws, local, nloc = (_roundup(ocp, lws[0]), split), tuple(lws), lws[0] * split
            args = (np.int32(ocp), X, engine._wq, engine._ws, engine._wo, engine._bias, Y,
                    cl.LocalMemory(4 * (nloc + ngr)), *scal)
            return [Step("conv_1x1", opts + (f"-DSPLIT={split}",), "gemv_1x1", args, gws, local)]

        return planned_candidate(self.ctx, name, "conv_1x1", opts, (ocp, 1, wt.q.shape[1], wt.out_channels),
                                 self._gemv_local_sizes(ocp, kch, ngr), steps)

    def _a8_scale_group(self):
        """gemv_a8's input channels per scale group inside a chunk (0: per-channel scales), or None when
        it cannot run (not act_quant="row", not the buffer 1x1 path, blocks not aligned to the chunks)."""
        w = self.spec.weight
        if not self.act_row or self.path != "1x1" or self.image:
            return None
        if w.n_blocks == 1:
            return 0
        kc, bc = self.layout.ic_pack, w.block_channels
        g = min(bc, kc)
        return g if (bc % kc == 0 or kc % bc == 0) and g % (32 // w.bits) == 0 else None

    def _a8_local_sizes(self, nc, fused=False):
        """(l0, SPLIT, g) to time: local size (l0, SPLIT), g work-groups per compute unit (the grid is at
        most g * compute units groups, each looping over tiles of l0 * nc output channels); the fused
        variants also hold x's int8 words and group sums in local memory."""
        if self.forced_lws is not None:
            sizes = [(*self.forced_lws[:2], 1)]
        elif self.tune == "full":
            sizes = [(a, b, g) for a in (16, 32, 64, 128, 256) for b in (2, 4, 8, 16, 32) for g in (1, 2)]
        elif self.is_gpu:
            sizes = [(128, 4, 2), (256, 4, 2), (64, 8, 2)]  # the H200's picks (scripts/a8_lab.py)
        else:
            sizes = [(16, 4, 1), (8, 2, 1)]
        ocp = _cdiv(self.spec.weight.out_channels, 4) * 4
        kch = _cdiv(self.spec.weight.q.shape[1], self.layout.ic_pack)
        maxwg = min(int(self.device.max_work_group_size), 1024)
        mi, lmem = self.device.max_work_item_sizes, int(self.device.local_mem_size)
        p0, pk = _pow2ceil(_cdiv(ocp, nc)), _pow2floor(kch)
        if self.forced_lws is None:  # powers of two (the prologue's reduction tree), clamped to the problem
            sizes = [(min(a, p0), min(b, pk), g) for a, b, g in sizes]
            if self.is_gpu and self._nv_ptx:
                sizes = self._a8_balanced_sizes(nc, pk) + sizes
        kc, gr = self.layout.ic_pack, self._a8_group
        held = kch * kc + 4 * kch * (kc // gr if gr else 1) if fused else 0  # bytes: xq words, group sums
        w = self.spec.weight
        if w.n_blocks == 1 and w.bits == 4 and w.q.shape[1] > A8_EXACT_MAX_IC[4]:
            return []  # never reached: A8_MAX_NV stops such rows first (A8_WIDE is int8 only)
        if not fused and _cdiv(kch * kc, 4 * self._a8_ql()) > A8_MAX_NV:
            return []  # quant_x_a8 would hold more than A8_MAX_NV float4 per item
        return [(a, b, g) for a, b, g in dict.fromkeys(sizes)
                if a * b <= maxwg and a <= mi[0] and b <= mi[1] and held + 4 * nc * a * b <= lmem
                and not (fused and not self._a8_reducible(a * b))
                and not (fused and _cdiv(kch * kc, 4 * a * b) > A8_MAX_NV)]

    def _a8_wide(self) -> bool:
        """Per-channel row past A8_EXACT_MAX_IC: gemv_a8 folds its lanes' int32 sums into float."""
        w = self.spec.weight
        return w.n_blocks == 1 and w.q.shape[1] > A8_EXACT_MAX_IC[w.bits]

    def _a8_ql(self) -> int:
        """quant_x_a8's work-group size (the unfused variants quantize x in one work-group)."""
        return min(1024, _pow2floor(int(self.device.max_work_group_size)))

    def _a8_reducible(self, n):
        """gemv_a8f's prologue reduces over its n items: a tree needs a power of two; -DNV_PTX's warp
        shuffles need whole warps (a multiple of 32, at most 32 warps)."""
        return not n & (n - 1) or (self._nv_ptx and n % 32 == 0 and n <= 1024)

    def _a8_balanced_sizes(self, nc, pk):
        """(l0, SPLIT, g) that spread the output channels evenly: g work-groups per compute unit, each one
        tile of l0 * nc channels, l0 about OCp / (nc * g * units), even, and raised until l0 * SPLIT is whole
        warps for the largest SPLIT <= min(32, pk) that keeps the group at most 1024 items. Power-of-two
        tiles leave units idle or doubly loaded: 4096->11008 in tiles of 64 is 172 tiles, so 40 of 132
        units stream two tiles while the rest stream one (H200: 13.8 us against 12.3 us for l0 = 42)."""
        ocp = _cdiv(self.spec.weight.out_channels, 4) * 4
        cus = int(self.device.max_compute_units)
        sizes = []
        for g in (2, 1):
            base = 2 * _cdiv(_cdiv(ocp, nc * g * cus), 2)
            for l0 in range(base, base + 32, 2):
                split = next((s for s in (32, 16, 8, 4, 2, 1)
                              if s <= pk and l0 * s <= 1024 and (l0 * s) % 32 == 0), None)
                if split is not None:
                    sizes.append((l0, split, g))
                    break
        return sizes

    def _a8_names(self, m):
        """gemv_a8 variants for this problem ([] when the float kernels run on quantized rows instead)."""
        if self._a8_group is None or (self.forced_variant is not None and self.forced_variant not in A8_VARIANTS):
            return []
        names = [self.forced_variant] if self.forced_variant is not None else list(A8_VARIANTS)
        names = [v for v in names if m == 1 and self._a8_local_sizes(*A8_VARIANTS[v])]
        if not names and self.forced_variant is not None:
            raise ValueError(f"variant {self.forced_variant!r} runs linear layers on one row (N = H = W = 1), "
                             f"with a local size the device accepts (fused: l0 * SPLIT a power of two, or whole "
                             f"warps on NVIDIA, and room for x's int8 words in local memory) and at most "
                             f"{A8_MAX_NV} float4 of x per quantizing item (fused: per item of l0 * SPLIT, "
                             f"unfused: of {self._a8_ql()})")
        return names

    def _a8_candidate(self, name, layout):
        """gemv_a8 (NDRange (G * l0, SPLIT), local (l0, SPLIT), G groups over ceil(OCp / (l0*NC)) tiles, see
        ``_a8_local_sizes``), after quant_x_a8 (one work-group) unless fused; ``launch`` returns gemv_a8's event and leaves (first, last) event in
        ``info["state"]["events"]``."""
        cl = import_pyopencl()
        wt = self.spec.weight
        nc, fused = A8_VARIANTS[name]
        ocp = _cdiv(wt.out_channels, 4) * 4
        kc = self.layout.ic_pack
        kch = _cdiv(wt.q.shape[1], kc)
        opts = [o for o in self._base_options if not o.startswith(("-DSG=", "-DLANE_SCALE"))]
        if self._a8_wide():  # past A8_EXACT_MAX_IC: lane sums folded into float
            opts.append("-DA8_WIDE")
        ql = self._a8_ql()
        opts += [f"-DNC={nc}", "-DU=4", f"-DQL={ql}", *ROW_QUANT_OPTIONS]
        if not any(o.startswith("-DG_IC=") for o in opts):  # quant_x_a8 sizes its registers by IC
            opts.append(f"-DG_IC={wt.q.shape[1]}")
        if self._a8_group:
            opts.append(f"-DGROUP_CH={self._a8_group}")
        if layout == "nchw":
            opts.append("-DOUT_NCHW")
        if self._nv_ptx:
            opts.append("-DNV_PTX")
        if fused:
            opts.append("-DFUSED")
        opts = tuple(opts)
        scal = [np.int32(wt.q.shape[1]), np.int32(wt.out_channels)]
        xq_bytes = 16 * kch * (2 if wt.bits == 4 else 1)
        gs_bytes = 4 * (1 + (1 if not self._a8_group else kch * kc // self._a8_group))  # dx, sums of xq
        engine, cus = self, int(self.device.max_compute_units)
        # unfused: x's int8 words and sums in scratch buffers of the plan's, one per queue (launches on one
        # queue run in order, so they never share them at the same time)
        xq, gs = Scratch(xq_bytes, "xq"), Scratch(gs_bytes, "group sums")

        def steps(lws):
            l0, split, g = lws
            gopts = opts + (f"-DL0={l0}", f"-DSPLIT={split}")
            ntiles = _cdiv(ocp, l0 * nc)
            waves = _cdiv(ntiles, g * cus)  # tiles per group, at most
            gws = (_cdiv(ntiles, waves) * l0, split)
            red = cl.LocalMemory(4 * nc * l0 * split)
            if fused:
                return [Step("gemv_a8", gopts, "gemv_a8",
                             (np.int32(ocp), X, engine._wq, engine._ws, engine._wo, engine._bias, Y, red, *scal),
                             gws, (l0, split))]
            return [Step("gemv_a8", opts, "quant_x_a8", (X, xq, gs, cl.LocalMemory(4 * ql), scal[0]), (ql,), (ql,)),
                    Step("gemv_a8", gopts, "gemv_a8",
                         (np.int32(ocp), xq, gs, engine._wq, engine._ws, engine._wo, engine._bias, Y, red, *scal),
                         gws, (l0, split))]

        return planned_candidate(self.ctx, name, "gemv_a8", opts, (ocp, 1, wt.q.shape[1], wt.out_channels),
                                 self._a8_local_sizes(nc, fused), steps, scratch=() if fused else (xq, gs))

    def _gemv_mma_unsupported(self) -> str:
        """Why gemv_mma cannot run this layer ("" when it can)."""
        w = self.spec.weight
        if self.spec.act_quant is not None:
            return "it needs float activations (act_quant=None)"
        if self.path != "1x1" or self.image:
            return "it needs a linear / 1x1 layer with buffer weights (image=False)"
        kt = OpenCLGemvMMALayout(w.bits).k_per_load
        if w.n_blocks > 1:
            bc = w.block_channels
            if bc % 16 or (kt % bc and bc % kt):
                return f"its scale blocks must be 16, 32{', 64' if w.bits == 4 else ''} or a multiple of {kt} " \
                       f"input channels, got {bc}"
        ks = _cdiv(w.q.shape[1], kt) * kt // 16
        need = 64 * ks + 4 * _cdiv(w.q.shape[1], 16) + 4 * 1024 + (0 if self._mma_native() else 4 * 32 * 288)
        if need > int(self.device.local_mem_size):
            return (f"x's f16 halves need {need} bytes of local memory for {w.q.shape[1]} input channels; "
                    f"{self.device.name} has {int(self.device.local_mem_size)}")
        return ""

    def _gemv_mma_weights(self):
        """The weights in :class:`OpenCLGemvMMALayout` (uploaded at the first gemv_mma candidate)."""
        if getattr(self, "_wgmma", None) is None:
            self.gemv_mma_layout = OpenCLGemvMMALayout(self.spec.weight.bits)
            self._wgmma = self._upload(self.gemv_mma_layout.pack_array(self.spec.weight.q))
        return self._wgmma

    def _gemv_mma_local_sizes(self):
        """(32, SPLIT, g) to time: SPLIT warps a work-group, at most g work-groups per compute unit."""
        maxwg = min(int(self.device.max_work_group_size), 1024)
        if self.forced_lws is not None:
            split = self.forced_lws[1]
            if self.forced_lws[0] != 32 or 32 * split > maxwg or not (self._mma_native() or not split & (split - 1)):
                raise ValueError(f"gemv_mma runs work-groups of (32, SPLIT) items: local_size must be (32, SPLIT, 1) "
                                 f"with 32 * SPLIT <= {maxwg} (and SPLIT a power of two off NVIDIA), got "
                                 f"{self.forced_lws!r}")
            return [(32, split, 1)]
        if self._mma_native():
            sizes = [(32, 16, 2), (32, 8, 4), (32, 16, 4)]  # the H200's best (scripts/gemv_mma_lab.py)
        else:
            sizes = [(32, 2, 1), (32, 1, 1)]
        return [sz for sz in sizes if sz[0] * sz[1] <= maxwg]

    def _gemv_mma_candidate(self, name, layout):
        """gemv_mma (local (32, SPLIT), at most g * compute units work-groups over ceil(O/16) tiles)."""
        cl = import_pyopencl()
        wt = self.spec.weight
        wq = self._gemv_mma_weights()
        opts = [o for o in self._base_options if not o.startswith(("-DSG=", "-DLANE_SCALE", "-DKC=", "-DQBITS="))]
        opts += list(self.gemv_mma_layout.build_options) + [f"-DU={GEMV_MMA_VARIANTS[name]}"]
        if not any(o.startswith("-DG_IC=") for o in opts):  # local memory sized by IC
            opts.append(f"-DG_IC={wt.q.shape[1]}")
        if layout == "nchw":
            opts.append("-DOUT_NCHW")
        if self._mma_native():
            opts.append("-DNV_PTX")
        opts = tuple(opts)
        scal = [np.int32(wt.q.shape[1]), np.int32(wt.out_channels)]
        engine, cus, tiles = self, int(self.device.max_compute_units), _cdiv(wt.out_channels, 16)

        def steps(lws):
            _, split, g = lws
            groups = min(tiles, g * cus)
            return [Step("gemv_mma", opts + (f"-DSPLIT={split}",), "gemv_mma",
                         (X, wq, engine._ws, engine._wo, engine._bias, Y, *scal), (32 * groups, split), (32, split))]

        return planned_candidate(self.ctx, name, "gemv_mma", opts,
                                 (_cdiv(wt.out_channels, 4) * 4, 1, wt.q.shape[1], wt.out_channels),
                                 self._gemv_mma_local_sizes(), steps)

    def _onex1_order(self, m, variants):
        nb = 1 if m == 1 else 2 if m < 8 else 4
        first = [f"{'img_c2' if self.image else 'buf_c4'}_r{nb}", f"{'img_c1' if self.image else 'buf_c2'}_r{nb}"]
        if nb > 1:
            first.append(f"{'img_c2' if self.image else 'buf_c4'}_r{nb // 2}")
        else:
            first.append(f"{'img_c1' if self.image else 'buf_c1'}_r1")
        rest = [v for v in variants if v not in first and (variants[v][1] <= max(1, m))]
        return first + rest

    def _local_sizes_1x1(self, g0, g2, kch, per_item):
        if self.forced_lws is not None:
            return [self.forced_lws[:2]]
        maxwg = int(self.device.max_work_group_size)
        mi = self.device.max_work_item_sizes
        local_floats = int(self.device.local_mem_size) // 4 - 256
        p0, pk = _pow2ceil(g0), _pow2floor(kch)
        few_rows = g0 * g2 < 16384
        if self.tune == "full":
            sizes = [(a, b) for a in (1, 2, 4, 8, 16, 32, 64, 128, 256) for b in (1, 2, 4, 8, 16, 32, 64, 128)
                     if a <= p0 and b <= pk and 8 <= a * b <= min(maxwg, 1024)]
        else:
            if few_rows:
                split = min(32, pk)
                guess = (max(1, min(256 // split, p0)), split)
                sizes = [guess, (16, min(16, pk)), (8, min(32, pk)), (32, min(8, pk)), (64, min(4, pk)),
                         (4, min(64, pk))]
            else:
                sizes = [(min(64, p0), 1), (min(32, p0), 1), (min(128, p0), 1), (min(16, p0), min(4, pk))]
        ok = []
        for a, b in dict.fromkeys(sizes):
            a, b = min(a, p0), min(b, pk)
            if a * b <= maxwg and a <= mi[0] and b <= mi[1] and a * b * per_item <= local_floats:
                ok.append((a, b))
        ok = list(dict.fromkeys(ok))
        if not self.is_gpu:
            ok = [None] + ok
        return ok or [None]

    def _gemm_names(self, layout, n, h, w, oh, ow):
        """GEMM tiles worth timing for this problem, best guess first ([] when the GEMM does not apply)."""
        wt = self.spec.weight
        p = n * oh * ow
        if (wt.groups != 1 or self.image or self.forced_lws is not None or self.forced_variant is not None
                or p < 8 or (self.path == "general" and self.layout.ic_pack != 4)):
            return []
        if p <= 8:
            names = ["gemm_64x8k4", "gemm_64x8", "gemm_128x8k2"]
        elif p <= 32:
            names = ["gemm_128x32k2", "gemm_64x8k4", "gemm_64x32k2"]
        else:
            names = ["gemm_128x32", "gemm_64x64", "gemm_128x64"]
            if self._gemm_groups(names[0], p) < 2 * int(self.device.max_compute_units):
                # under two waves of 128x32 tiles (batch-1 convs): smaller tiles, most work-groups first
                small = ["gemm_64x32", "gemm_64x16", "gemm_32x32", "gemm_32x32k2", "gemm_64x32k2"]
                names = sorted(small, key=lambda v: -self._gemm_groups(v, p)) + names
        if self.tune == "full":
            names += [v for v in GEMM_VARIANTS if v not in names and GEMM_VARIANTS[v][1] <= max(8, _pow2ceil(p))]
        return [v for v in names if self._gemm_fits(v)]

    def _gemm_groups(self, variant, p) -> float:
        """Work-groups x split-K slices of a GEMM tile over ``p`` pixels, scaled by the used share of a tile
        taller than OC."""
        tm, tn, _, _, ks = GEMM_VARIANTS[variant]
        oc = self.spec.weight.out_channels
        return _cdiv(p, tn) * _cdiv(oc, tm) * ks * min(1.0, oc / tm)

    def _gemm_fits(self, variant) -> bool:
        """The variant's local tiles fit the device (and its split-K sums fit its weight tiles)."""
        tm, tn, _, _, ks = GEMM_VARIANTS[variant]
        kt = 32 if self.path == "1x1" else 4 * self.spec.kernel_size[0] * self.spec.kernel_size[1]
        fits = ks * kt * (tm + tn + 8) <= int(self.device.local_mem_size) // 4
        return fits and (ks == 1 or tm * tn <= kt * (tm + 4))

    def _with_gemm(self, cands, gemm, layout, n, h, w, oh, ow):
        """``cands`` plus the GEMM candidates. On a GPU they come first when tuning (one local size each,
        so the time budget never skips them) and, untuned, for big problems (the heuristic's choice)."""
        if not gemm:
            return cands
        if self.tune == "fast":
            gemm = gemm[:2]
        extra = [self._gemm_candidate(v, layout, n, h, w, oh, ow) for v in gemm]
        big = n * oh * ow * self.spec.out_channels >= 262144
        return extra + cands if self.is_gpu and (self.tune != "none" or big) else cands + extra

    def _gemm_candidate(self, name, layout, n, h, w, oh, ow):
        s, wt = self.spec, self.spec.weight
        tm, tn, rm, rn, ks = GEMM_VARIANTS[name]
        opts = list(self._base_options) + [f"-DTM={tm}", f"-DTN={tn}", f"-DRM={rm}", f"-DRN={rn}", f"-DKS={ks}"]
        opts += self._layout_options(layout, h * w == 1)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = s.kernel_size, s.stride, s.padding, s.dilation
        geo = [("IC", wt.q.shape[1]), ("OC", wt.out_channels)]
        if self.path == "1x1":
            opts.append("-DWL_1X1")
            if layout == "nchw" and h * w == 1:
                opts.append("-DB_KFAST")
        else:
            geo += [("GROUPS", 1), ("KH", kh), ("KW", kw), ("SH", sh), ("SW", sw), ("PH", ph), ("PW", pw),
                    ("DH", dh), ("DW", dw)]
        opts += [f"-DG_{k}={v}" for k, v in geo if not any(o.startswith(f"-DG_{k}=") for o in opts)]
        if wt.n_blocks > 1 and wt.block_channels % 4 == 0 and "-DBLOCK_ALIGN4" not in opts:
            opts.append("-DBLOCK_ALIGN4")
        lws = (tn // rn, tm // rm, ks)
        gsize = (_cdiv(n * oh * ow, tn) * lws[0], _cdiv(wt.out_channels, tm) * lws[1], ks)
        return self._candidate("conv_gemm", name, tuple(opts), gsize, [n, h, w, oh, ow], [lws])

    def _candidate(self, program, name, opts, gsize, scalars, local_sizes, per_item=0):
        """A tuning candidate of one launch (:func:`.launch.planned_candidate`)."""
        engine = self
        scal = [np.int32(v) for v in scalars]

        def steps(lws):
            cl = import_pyopencl()
            if program == "conv_gemm":
                args = (X, engine._wq, engine._ws, engine._wo, engine._bias, Y, *scal)
                return [Step(program, opts, program, args, tuple(gsize), lws)]
            if program == "conv_general":
                split = 1 if lws is None or len(lws) < 3 else lws[2]
                kopts = opts + (f"-DSPLIT={split}",) if split > 1 else opts
            else:
                kopts = opts + (f"-DSPLIT={1 if lws is None else lws[1]}",)
            if program == "conv_general":
                g0, g1 = gsize
                if lws is None:
                    gws, local = (g0, g1, 1), None
                else:
                    gws = (_roundup(g0, lws[0]), _roundup(g1, lws[1]), split)
                    local = (lws[0], lws[1], split)
                nloc = 1 if lws is None else lws[0] * lws[1] * split * per_item if split > 1 else 1
                args = (np.int32(g0), np.int32(g1), X, engine._wq, engine._ws, engine._wo, engine._bias,
                        Y, cl.LocalMemory(4 * max(1, nloc)), *scal)
            else:
                g0, g2 = gsize
                if lws is None:
                    gws, local, nloc = (g0, 1, g2), None, 1
                else:
                    gws, local = (_roundup(g0, lws[0]), lws[1], g2), (lws[0], lws[1], 1)
                    nloc = lws[0] * lws[1] * per_item
                args = (np.int32(g0), np.int32(g2), X, engine._wq, engine._ws, engine._wo, engine._bias,
                        Y, cl.LocalMemory(4 * max(1, nloc)), *scal)
            return [Step(program, kopts, program, args, gws, local)]

        return planned_candidate(self.ctx, name, program, opts, tuple(gsize) + tuple(scalars), local_sizes, steps)

    # }}}

    # {{{ conv_mma: int8 tensor cores (act_quant="row")

    def _mma_unsupported(self) -> str:
        """Why conv_mma cannot run this conv ('' when it can)."""
        s, w = self.spec, self.spec.weight
        taps = s.kernel_size[0] * s.kernel_size[1]
        if not self.act_row:
            return "it needs act_quant='row' (int8 activations)"
        if w.groups != 1:
            return "it needs an ungrouped conv"
        if w.n_blocks > 1 and w.block_channels % OpenCLMMAWeightLayout.STEP_CHANNELS:
            return f"its scale blocks must be a multiple of 32 input channels, got {w.block_channels}"
        span = taps * (w.block_channels // 32 if w.n_blocks > 1 else 1)
        if span > 4096:  # int32 sums of one block: 4096 steps of 32 products of at most 128*127
            return f"a scale block spans {span} steps of 32 channels x 1 tap; at most 4096 keep int32 exact"
        return ""

    def _mma_native(self) -> bool:
        """The device runs conv_mma's PTX mma.sync (an NVIDIA GPU of compute capability 8.0 or newer)."""
        if not self.is_gpu or not self._nv_ptx:
            return False
        try:
            return int(self.device.compute_capability_major_nv) >= 8
        except Exception:  # no cl_nv_device_attribute_query
            return False

    def _mma_names(self, n, oh, ow):
        """conv_mma tiles worth timing ([] unless act_quant="row" on a device with int8 mma.sync, or forced)."""
        if self.forced_variant is not None or self._mma_unsupported() or not self._mma_native():
            return []
        p = n * oh * ow
        if p < 2:
            return []  # one row: gemv_a8 streams the weights faster
        # the H200's picks (scripts/mma_lab.py): small tiles keep more loads in flight per register
        names = ["mma_64x32", "mma_32x64", "mma_64x64"] if p < 4096 else ["mma_64x64", "mma_64x32", "mma_32x64"]
        names += [v for v in MMA_VARIANTS if v not in names]
        return names if self.tune == "full" else names[:2] if self.tune == "fast" else names[:1]

    def _with_mma(self, cands, layout, n, h, w, oh, ow):
        """``cands`` after the conv_mma candidates (first: on the devices that run them, they win)."""
        return [self._mma_candidate(v, layout, n, h, w, oh, ow) for v in self._mma_names(n, oh, ow)] + cands

    def _mma_weights(self):
        """The weights in :class:`OpenCLMMAWeightLayout` (uploaded at the first conv_mma candidate)."""
        if getattr(self, "_wmma", None) is None:
            self.mma_layout = OpenCLMMAWeightLayout(self.spec.weight.bits)
            self._wmma = self._upload(self.mma_layout.pack_array(self.spec.weight.q))
        return self._wmma

    def _mma_ksubs(self, name):
        """Layout steps per stage (conv_mma's KSUB) to time, most first: divisors of the steps that keep scale
        blocks whole, whose double-buffered tiles fit local memory and whose prefetch fits 16 uint4 an item."""
        s, wt = self.spec, self.spec.weight
        wm, wn, mt, nt = MMA_VARIANTS[name]
        nth, tm, tn = 32 * wm * wn, 16 * mt * wm, 8 * nt * wn
        taps = s.kernel_size[0] * s.kernel_size[1]
        ksteps = _cdiv(wt.q.shape[1], 32) * taps
        block = min(ksteps, 4096) if wt.n_blocks == 1 else wt.block_channels // 32 * taps
        sq = 2 if wt.bits == 8 else 1
        lmem = int(self.device.local_mem_size) - 1024
        ok = []
        for k in (4, 2, 6, 3, 8, 5, 7, 1):  # the H200's order (scripts/mma_lab.py): 4 or 2 won every case
            tile = 2 * k * (tm + tn) * 32 + (2 * k * tn * 8 if wt.offsets is not None else 0)
            loads = _cdiv(tm * sq * k, nth) + _cdiv(tn * 2 * k, nth)
            if ksteps % k == 0 and (block % k == 0 or k % block == 0) and tile <= lmem and (loads <= 16 or k == 1):
                ok.append(k)
        return ok

    def _mma_candidate(self, name, layout, n, h, w, oh, ow):
        """row_amax and quant_rows_i8 (act_quant.cl), then conv_mma (NDRange (ceil(P/TN) * NTH, ceil(O/TM)),
        local (NTH, 1)). Its "local sizes" are (NTH, KSUB): KSUB layout steps per stage is a build option the
        tuner picks. ``launch`` returns conv_mma's event, (first, last) in ``info["state"]["events"]``."""
        cl = import_pyopencl()
        s, wt = self.spec, self.spec.weight
        wm, wn, mt, nt = MMA_VARIANTS[name]
        nth, tm, tn = 32 * wm * wn, 16 * mt * wm, 8 * nt * wn
        wbuf = self._mma_weights()
        opts = list(self.mma_layout.build_options) + list(self.scale_layout.build_options)
        opts += ["-DASYM"] if wt.offsets is not None else []
        opts += ["-DNBLK1"] if wt.n_blocks == 1 else [f"-DBLOCK_CH={wt.block_channels}"]
        opts += ["-DHAS_BIAS"] if s.bias is not None else []
        if s.activation:
            opts.append(f"-DACT={1 if s.activation == 'relu' else 2}")
        if layout == "nchw":
            opts.append("-DOUT_NCHW")
        # the emulation elsewhere is a test vehicle, built unoptimised: PoCL 5's optimiser miscompiles it for
        # some tiles (mma_128x64 on int8: a segfault inside the work-group function)
        opts.append("-DNV_PTX" if self._mma_native() else "-cl-opt-disable")
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = s.kernel_size, s.stride, s.padding, s.dilation
        opts += [f"-DG_{k}={v}" for k, v in (("IC", wt.q.shape[1]), ("OC", wt.out_channels), ("KH", kh), ("KW", kw),
                                              ("SH", sh), ("SW", sw), ("PH", ph), ("PW", pw), ("DH", dh), ("DW", dw))]
        opts += [f"-DWM={wm}", f"-DWN={wn}", f"-DMT={mt}", f"-DNT={nt}"]
        opts = tuple(opts)
        qopts, qargs, g_amax, ql, amax_step = self._row_amax_launch(layout, n, h, w)
        c = self.spec.in_channels
        xq_bytes = _cdiv(c, 32) * 32 * n * h * w
        g_quant = max(1, min(4096, _cdiv(xq_bytes // (4 * n), 4 * ql)))  # quantizing groups per sample
        gsize = (_cdiv(n * oh * ow, tn) * nth, _cdiv(wt.out_channels, tm))
        scal = [np.int32(v) for v in (n, h, w, oh, ow)]
        engine = self
        ksubs = [(nth, k) for k in self._mma_ksubs(name)]
        if self.tune != "full":
            ksubs = ksubs[:2]

        # scratch per queue (launches on one queue run in order), in this order in info["state"]["scratch"]
        xq, dx, part = Scratch(xq_bytes, "xq words"), Scratch(4 * n, "dx"), Scratch(4 * n * g_amax, "partial amax")

        def steps(lws):
            ksub = (lws or ksubs[0])[1]
            return [amax_step(part),
                    Step("act_quant", qopts, "quant_rows_i8", (X, part, np.int32(g_amax), xq, dx, *qargs),
                         (g_quant * ql, n), (ql, 1)),
                    Step("conv_mma", opts + (f"-DKSUB={ksub}",), "conv_mma",
                         (xq, dx, wbuf, engine._ws, engine._wo, engine._bias, Y, *scal), gsize, (nth, 1))]

        return planned_candidate(self.ctx, name, "conv_mma", opts, tuple(gsize) + (n, h, w, oh, ow), ksubs, steps,
                                 scratch=(xq, dx, part))

    # }}}

    # {{{ forward

    def _shape_of(self, shape, layout):
        c = self.spec.in_channels
        if layout == "nchw":
            if len(shape) != 4 or shape[1] != c:
                raise ValueError(f"x must be NCHW (N, {c}, H, W), got shape {tuple(shape)}")
            n, h, w = shape[0], shape[2], shape[3]
        elif layout == "nc4hw4":
            if len(shape) != 5 or shape[0] != _cdiv(c, 4) or shape[4] != 4:
                raise ValueError(f"x must be NC4HW4 ({_cdiv(c, 4)}, N, H, W, 4) for {c} channels, got shape "
                                 f"{tuple(shape)}")
            n, h, w = shape[1], shape[2], shape[3]
        else:
            raise ValueError(f"layout must be 'nchw' or 'nc4hw4', got {layout!r}")
        if min(n, h, w) < 1:
            raise ValueError(f"x must not be empty, got shape {tuple(shape)}")
        return int(n), int(h), int(w)

    def _plan_for(self, layout, n, h, w):
        key = (layout, n, h, w)
        plan = self._plans.get(key)
        if plan is not None:
            return plan, False
        oh, ow = self.spec.out_hw(h, w)
        o = self.spec.out_channels
        if layout == "nchw":
            out_shape = (n, o, oh, ow)
            in_elems = n * self.spec.in_channels * h * w
        else:
            out_shape = (_cdiv(o, 4), n, oh, ow, 4)
            in_elems = _cdiv(self.spec.in_channels, 4) * 4 * n * h * w
        out_elems = int(np.prod(out_shape))
        if max(in_elems, out_elems) > _INT32_MAX // 4 or n * max(h * w, oh * ow) * 4 > _INT32_MAX:
            raise ValueError(f"input {n}x{h}x{w} / output {out_shape} are too large for the kernels' 32-bit "
                             f"indexing; split the batch")
        if self.path == "general":
            cands = self._general_candidates(layout, n, h, w, oh, ow)
        else:
            cands = self._onex1_candidates(layout, n, h, w)
        plan = _Plan(cands, None, None, out_shape, in_elems, out_elems)
        plan.key = key
        return plan, True

    def _check_buffers(self, plan, xbuf_bytes, ybuf_bytes):
        if xbuf_bytes < 4 * plan.in_elems:
            raise ValueError(f"input buffer holds {xbuf_bytes} bytes, the kernel reads {4 * plan.in_elems}")
        if ybuf_bytes < 4 * plan.out_elems:
            raise ValueError(f"output buffer holds {ybuf_bytes} bytes, the kernel writes {4 * plan.out_elems}")

    def _tune(self, plan, xbuf, ybuf, queue, wait_for):
        """Chooses ``plan``'s candidate and local size (timed on ``xbuf``/``ybuf`` unless ``tune="none"``) and
        keeps that candidate's :class:`~.launch.LaunchPlan` as ``plan.launch`` (the others are dropped)."""
        cl = import_pyopencl()
        cands = plan.cand
        for c in cands:
            c.info["state"]["bufs"] = (xbuf, ybuf)
        try:
            if self.tune != "none" and not (self.forced_lws is not None and len(cands) == 1):
                if queue is not None and queue is not self.queue:
                    queue.finish()
                elif wait_for:
                    cl.wait_for_events(wait_for)
                try:
                    cand, lws, ns = tuning.select(self.device, self.queue, cands, self.tune)
                finally:
                    self.queue.finish()
            else:
                cand, lws, ns = cands[0], cands[0].local_sizes[0], None
        finally:
            for c in cands:
                c.info["state"]["bufs"] = None
        for c in cands:
            if c is not cand:
                c.info["release"]()
        launch = cand.info["plan"](lws)
        cand.info["keep"](lws)
        plan.cand, plan.lws, plan.ns, plan.launch = cand, lws, ns, launch
        self._plans[plan.key] = plan

    def _parse_shape(self, shape, layout, linear):
        """``(N, H, W)`` of an input of ``shape``; ``linear``: ``shape`` is ``(N, K)`` (a 1x1 layer on 1x1)."""
        if not linear:
            return self._shape_of(shape, layout)
        c = self.spec.in_channels
        if layout != "nchw" or len(shape) != 2 or shape[1] != c or shape[0] < 1:
            raise ValueError(f"x must have shape (N, {c}) with N >= 1, got {tuple(shape)}")
        if self.spec.out_hw(1, 1) != (1, 1):
            raise ValueError("(N, K) inputs need a layer whose output is 1x1 on a 1x1 input")
        return int(shape[0]), 1, 1

    def prepare(self, shape, layout: str = "nchw", *, linear: bool = False, x=None, queue=None) -> "_Prepared":
        """The prepared launch for float32 inputs of ``shape`` (NCHW ``(N, C, H, W)``, NC4HW4 ``(ceil(C/4), N,
        H, W, 4)``, or with ``linear=True`` ``(N, C)`` -> ``(N, O)``), memoised per (shape, layout, linear).
        The first time a shape's (layout, N, H, W) is seen its kernel is chosen (:meth:`_tune`), timed on
        device array ``x``'s buffer when given (``x`` is only read), else on zero-filled temporaries."""
        key = (tuple(shape), layout, bool(linear))
        p = self._prepared.get(key)
        if p is not None:
            return p
        cl = import_pyopencl()
        with self._lock:
            p = self._prepared.get(key)
            if p is not None:
                return p
            n, h, w = self._parse_shape(shape, layout, linear)
            plan, is_new = self._plan_for(layout, n, h, w)
            if is_new:
                rw = cl.mem_flags.READ_WRITE
                try:
                    if x is None:
                        xbuf = cl.Buffer(self.ctx, rw, 4 * plan.in_elems)
                        cl.enqueue_fill_buffer(self.queue, xbuf, np.float32(0), 0, 4 * plan.in_elems)
                        wait_for = None
                    else:
                        xbuf, wait_for = x.base_data, (list(x.events) or None)
                        self._check_buffers(plan, xbuf.size, 4 * plan.out_elems)
                    ybuf = cl.Buffer(self.ctx, rw, 4 * plan.out_elems)
                    self._tune(plan, xbuf, ybuf, queue, wait_for)
                except cl.Error as exc:
                    raise wrap_cl_error(exc, f"preparing {self.describe()} for input {tuple(shape)}") from exc
            out_shape = (n, self.spec.out_channels) if linear else plan.out_shape
            p = _Prepared(plan, tuple(int(v) for v in shape), out_shape)
            self._prepared[key] = p
            return p

    def forward(self, x, layout: str = "nchw"):
        """float32 NCHW ``(N, C, H, W)`` or NC4HW4 ``(ceil(C/4), N, H, W, 4)`` -> the output in the same
        layout: a numpy array for numpy input, a ``pyopencl.array.Array`` (on ``x.queue``) for Array input."""
        cl = import_pyopencl()
        import pyopencl.array as cla

        if isinstance(x, cla.Array):
            return self.forward_array(x, layout)
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise TypeError(f"x must be float32, got dtype {x.dtype}")
        x = np.ascontiguousarray(x)
        n, h, w = self._shape_of(x.shape, layout)
        if self.check_finite:
            tail = self.spec.in_channels % 4
            parts = (x,) if layout == "nchw" or not tail else (x[:-1], x[-1, ..., :tail])
            self._refuse_nonfinite(sum(p.size - int(np.count_nonzero(np.isfinite(p))) for p in parts))
        q = self.queue
        try:
            xd = cla.to_device(q, x, allocator=self._pool)
        except cl.Error as exc:
            raise wrap_cl_error(exc, f"allocating {x.nbytes} bytes on {self.device.name}") from exc
        p = self.prepare(x.shape, layout, x=xd, queue=q)
        try:
            yd = cla.empty(q, p.out_shape, np.float32, allocator=self._pool)
        except cl.Error as exc:
            raise wrap_cl_error(exc, f"allocating {p.out_nbytes} bytes on {self.device.name}") from exc
        self._check_buffers(p.plan, xd.nbytes, yd.nbytes)
        try:
            _, evt = p.launch.enqueue(q, xd.data, yd.data, list(xd.events) or None)
        except cl.Error as exc:
            raise wrap_cl_error(exc, f"running {p.plan.describe()} on {self.device.name}") from exc
        self._last_plan = p.plan
        out = np.empty(p.out_shape, np.float32)
        if out.nbytes != yd.nbytes:
            raise AssertionError("host/device size mismatch")
        try:
            cl.enqueue_copy(q, out, yd.data, wait_for=[evt], is_blocking=True)
        except cl.Error as exc:
            raise wrap_cl_error(exc, "reading the output back") from exc
        return out

    def forward_array(self, x, layout: str = "nchw", out=None, linear: bool = False):
        """Device-array call: float32 ``pyopencl.array.Array`` ``x`` (NCHW, NC4HW4, or ``(N, C)`` with
        ``linear=True``) -> the output Array on ``x.queue`` (``(N, O, OH, OW)``, ``(ceil(O/4), N, OH, OW, 4)`` or
        ``(N, O)``), or written into ``out`` (a float32 C-contiguous Array of exactly that shape in this
        context, offset 0, not sharing ``x``'s buffer) and returned. Asynchronous: the launch waits for
        ``x.events`` (and ``out.events``); the result's ``events`` hold the last launch only (which ran after
        those), ``x.events`` are left as they are (pyopencl's own kernels do the same).

        A shape seen before takes the prepared path: one dict lookup, a few attribute checks, one Array made
        (none with ``out``), the changed buffer arguments bound and the plan's launches enqueued."""
        p = self._prepared.get((x.shape, layout, linear))
        if (p is None or self.check_finite or x.dtype != _F32 or x.offset or x.strides != p.in_strides
                or x.base_data is None or (x.context is not self.ctx and x.context != self.ctx)
                or x.base_data.size < p.in_nbytes):
            return self._forward_array_checked(x, layout, out, linear)
        return self._launch_prepared(p, x, out)

    def _forward_array_checked(self, x, layout, out, linear):
        check_device_input(x, self.ctx, "this layer's device")
        self._parse_shape(x.shape, layout, linear)
        queue = x.queue if x.queue is not None else self.queue
        if x.offset or x.base_data is None:
            if out is not None and x.base_data is not None and out.base_data is not None \
                    and _same_buffer(out.base_data, x.base_data):
                raise ValueError("out shares its buffer with x; pass a separate output array")
            x = x.copy(queue=queue)  # kernels take whole buffers; a device copy, no host round trip
        if x.base_data.size < x.nbytes:
            raise ValueError(f"x's buffer holds {x.base_data.size} bytes, its shape needs {x.nbytes}")
        if self.check_finite:
            self._refuse_nonfinite(self._count_nonfinite(x, layout, queue))
        p = self.prepare(x.shape, layout, linear=linear, x=x, queue=queue)
        return self._launch_prepared(p, x, out)

    def _check_out(self, p, x, out):
        """``out`` can take the result of ``p`` for input ``x`` (else TypeError / ValueError saying why)."""
        import pyopencl.array as cla

        if not isinstance(out, cla.Array):
            raise TypeError(f"out must be a pyopencl.array.Array for a device-array input, got {type(out).__name__}")
        if out.dtype != np.float32:
            raise TypeError(f"out must be float32, got dtype {out.dtype}")
        if tuple(out.shape) != p.out_shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, this call writes {p.out_shape}")
        if out.context != self.ctx:
            raise ValueError("out lives in another OpenCL context than this layer's device")
        if out.offset or out.base_data is None or out.strides != p.out_strides:
            raise ValueError("out must be C-contiguous and start at its buffer's beginning (offset 0)")
        if out.base_data.size < p.out_nbytes:
            raise ValueError(f"out's buffer holds {out.base_data.size} bytes, the kernel writes {p.out_nbytes}")
        if _same_buffer(out.base_data, x.base_data):
            raise ValueError("out shares its buffer with x (the kernels read x while writing out); pass a "
                             "separate output array")

    def _launch_prepared(self, p, x, out):
        cl = import_pyopencl()
        queue = x.queue if x.queue is not None else self.queue
        if out is None:
            try:
                y = _new_array(queue, self.ctx, x.allocator or self._pool, p)
            except cl.Error as exc:
                raise wrap_cl_error(exc, f"allocating {p.out_nbytes} bytes on {self.device.name}") from exc
            wait = x.events or None
        else:
            if (out.__class__ is not x.__class__ or out.shape != p.out_shape or out.dtype != _F32 or out.offset
                    or out.strides != p.out_strides or out.base_data is None
                    or (out.context is not self.ctx and out.context != self.ctx)
                    or out.base_data.size < p.out_nbytes or _same_buffer(out.base_data, x.base_data)):
                self._check_out(p, x, out)
            y = out
            wait = (x.events + out.events) or None
        launch = p.launch
        try:
            with launch.lock:
                _, ev = launch.enqueue_locked(queue, x.base_data, y.base_data, wait)
        except cl.Error as exc:
            raise wrap_cl_error(exc, f"running {p.plan.describe()} on {self.device.name}") from exc
        if out is not None:
            del y.events[:]  # the launch waited for them: its end implies theirs
        y.events.append(ev)
        self._last_plan = p.plan
        return y

    def _row_amax_launch(self, layout, n, h, w):
        """act_quant="row"'s first launch, shared by the float kernels' quant_rows and conv_mma's quant_rows_i8:
        ``(opts, args, G, L, step)`` where ``step(part)`` is the :class:`~.launch.Step` of row_amax (G partial
        maxima per sample into Scratch ``part``, 4*N*G bytes; local size L); ``args``: (E, N, C, HW)."""
        cl = import_pyopencl()
        c = self.spec.in_channels
        per_sample = (c if layout == "nchw" else _cdiv(c, 4) * 4) * h * w
        ql = min(256, _pow2floor(int(self.device.max_work_group_size)))
        g_amax = max(1, min(64, _cdiv(per_sample, 8 * ql)))
        opts = ROW_QUANT_OPTIONS + (("-DIN_NCHW",) if layout == "nchw" else ())
        args = (np.int32(per_sample), np.int32(n), np.int32(c), np.int32(h * w))

        def step(part):
            return Step("act_quant", opts, "row_amax", (X, part, cl.LocalMemory(4 * ql), *args), (g_amax * ql, n),
                        (ql, 1))

        return opts, args, g_amax, ql, step

    def _with_row_quant(self, cands, layout, n, h, w):
        """act_quant="row" for the float kernels: each candidate's launch first runs ``row_amax`` and
        ``quant_rows`` (x quantized and dequantized per sample) into a scratch buffer of its plan's, one per
        queue (launches on one queue run in order, so they never share it at the same time), then the float
        kernel on it. The tuner times all three launches."""
        if not self.act_row:
            return cands
        opts, qargs, g_amax, ql, amax_step = self._row_amax_launch(layout, n, h, w)
        in_elems = n * int(qargs[0])
        g_quant = max(1, min(4096, _cdiv(int(qargs[0]), 4 * ql)))

        def wrap(cand):
            inner = cand.info["steps"]
            xd, part = Scratch(4 * in_elems, "quantized x"), Scratch(4 * n * g_amax, "partial amax")

            def steps(lws):
                return [amax_step(part),
                        Step("act_quant", opts, "quant_rows", (X, part, np.int32(g_amax), xd, *qargs),
                             (g_quant * ql, n), (ql, 1))] + remap(inner(lws), {X: xd})

            return planned_candidate(self.ctx, cand.variant, cand.program,
                                     cand.options + ("act_quant=row: row_amax + quant_rows first",),  # own cache key
                                     cand.signature, cand.local_sizes, steps, scratch=(xd, part))

        return [cand if cand.program in ("gemv_a8", "conv_mma") else wrap(cand) for cand in cands]

    def _count_nonfinite(self, x, layout, queue) -> int:
        """NaN/inf values of device array ``x`` (NC4HW4 padding lanes left out): counted on the device, the
        count read back (blocking)."""
        cl = import_pyopencl()
        import pyopencl.array as cla

        n = int(x.size)
        tail = self.spec.in_channels % 4 if layout == "nc4hw4" else 0
        last = n - n // x.shape[0] if tail else n  # the last channel block's first element
        count = cla.zeros(queue, 1, np.int32)
        kernel = get_kernel(self.ctx, "util", (), "count_nonfinite")
        local = 64
        gsize = _roundup(min(_cdiv(n, 4), 1 << 16), local)
        with _launch_lock:
            kernel.set_args(x.base_data, np.int32(n), np.int32(last), np.int32(tail), count.data)
            ev = cl.enqueue_nd_range_kernel(queue, kernel, (gsize,), (local,), wait_for=list(x.events) or None)
        count.add_event(ev)
        return int(count.get(queue=queue)[0])

    @staticmethod
    def _refuse_nonfinite(bad: int):
        if bad:
            raise ValueError(f"x contains {bad} non-finite value(s) (NaN or inf); qconv refuses them")

    # }}}

    @property
    def plans(self) -> dict:
        """``(layout, N, H, W) -> plan`` chosen so far (``plan.variant``, ``plan.lws``, ``plan.ns``)."""
        return dict(self._plans)

    def describe(self) -> str:
        w = self.spec.weight
        store = "image" if self.image else "buffer"
        acts = "int8 activations per row" if self.act_row else "float activations"
        lay = f"{self.path} int{w.bits} {store}, scales {self.scale_layout.dtype}, {acts}"
        plan = self._last_plan.describe() if self._last_plan is not None else "kernel tuned at the first call"
        if self.act_row and self._last_plan is not None:
            first = {"gemv_a8": "", "conv_mma": "act_quant:row_amax+quant_rows_i8 + "}
            plan = first.get(self._last_plan.cand.program, "act_quant:quant_rows + ") + plan
        try:
            dev = describe_device(self.device)
        except Exception:  # pragma: no cover - descriptive only
            dev = str(self.device)
        return f"opencl [{dev}] {lay}; {plan} (tune={self.tune})"

