"""``OpenCLEngine``: weight-quantized conv on an OpenCL device (the engine protocol of ``docs/DESIGN.md``).

A thin engine over the kernel families of :mod:`qconv.gpu.families`, one module each: ``conv_general`` (any
conv), ``conv_1x1`` and ``gemv_1x1`` (1x1 / linear layers), ``conv_gemm`` (tiled implicit GEMM), ``gemv_a8``
(``act_quant="row"`` GEMV on int8 dot products), ``gemv_mma`` (f16 tensor-core GEMV), ``conv_mma`` (int8
tensor-core conv) and ``act_quant`` (x quantized per sample before the float kernels). Each owns its variants,
build options, local sizes and its one "can it run this layer, and if not why" check; the engine uploads the
weights, asks the families that can run the layer for candidates (:meth:`OpenCLEngine._candidates` orders them),
the tuner (:mod:`.tuning`) times them and the plan records the winner.

Activations and accumulation are float32 by default (``act_quant=None``); weights stay int8/int4 in device
memory and are dequantised in registers (``w = q*scale + offset``). ``act_quant="row"`` quantizes each
sample's activations to int8 exactly as the oracle does (``clip(round(x*127/amax), -127, 127)``): linear
layers then run ``gemv_a8``, other ungrouped shapes ``conv_mma`` where it runs, and the rest the float
kernels on the dequantized activations. Inputs and outputs are float32 NCHW ``(N, C, H, W)`` or NC4HW4
``(ceil(C/4), N, H, W, 4)`` (padding lanes written as zeros), numpy arrays (copied in and out) or
``pyopencl.array.Array`` (kept on the device: the result is an Array on the input's queue). The kernels read
and write both layouts directly: no conversion launches.

The (variant, local size) of each input shape is auto-tuned at its first call. Every family describes its
launches as :class:`~.launch.Step` lists (wrapped by :func:`~.launch.planned_candidate`); the chosen
candidate's :class:`~.launch.LaunchPlan` is kept per input shape (:meth:`OpenCLEngine.prepare`), so a later
device-array call (:meth:`OpenCLEngine.forward_array`) binds only the changed buffers and enqueues
(``qconv/gpu/README.md``, "Calling layers from Python").
"""
from __future__ import annotations

import threading

import numpy as np

from ..layouts.opencl import OpenCL1x1BufferLayout, OpenCL1x1ImageLayout, OpenCLConvWeightLayout, OpenCLScaleLayout
from . import families, tuning
from .context import call_queue, describe_device, import_pyopencl, memory_pool, profiling_queue, resolve
from .errors import OpenCLUnavailableError, wrap_cl_error
from .families import (act_quant, conv_1x1, conv_gemm, conv_general, conv_mma, gemv_1x1, gemv_a8, gemv_mma)
from .families.base import Problem, WeightBuffers, cdiv, layer_options, roundup
from .programs import get_kernel

_INT32_MAX = 2**31 - 1
_launch_lock = threading.Lock()


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
      ``"gemm_128x32"``, ``"gemm_64x8k4"``... for either path of an ungrouped conv, with a fixed local size;
      names: :func:`qconv.gpu.families.all_variants`); a variant its family cannot run for this layer (or, at
      a call, for the input's shape) raises ``ValueError`` with the family's reason (``unsupported``);
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
        if spec.post_affine is not None:
            raise ValueError("post_affine is not supported by the OpenCL engine (the CPU and reference engines "
                             "take it; qconv.onnx applies it on the host for OpenCL sessions)")
        self.spec = spec
        self.ctx, self.device = resolve(device)
        if not self.device.endian_little:
            raise OpenCLUnavailableError(f"{self.device.name}: big-endian OpenCL devices are not supported")
        self.act_row = spec.act_quant == "row"
        # Oclgrind (the memcheck job's simulator) does not set the flag but divides with the host's IEEE float
        # division, which is correctly rounded
        self.exact_division = bool(self.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
                                   or self.device.name == "Oclgrind Simulator")
        why = act_quant.unsupported(self) if self.act_row else None
        if why:
            raise OpenCLUnavailableError(f"act_quant='row' cannot run on {self.device.name}: {why}")
        self.tune_queue = profiling_queue(self.ctx, self.device)  # the tuner's timings
        self.tune = tuning.tune_level(tune)
        self.is_gpu = bool(self.device.type & cl.device_type.GPU)
        self.nv_ptx = "NVIDIA" in self.device.platform.name.upper()  # inline PTX (dp4a, shuffles) builds
        self.mma_native = self._mma_native()
        self.specialize = self.is_gpu if specialize is None else bool(specialize)
        w = spec.weight
        self.path = "1x1" if (spec.is_pointwise and w.groups == 1) else "general"
        self._plans: dict = {}
        self._prepared: dict = {}  # (input shape, layout, linear) -> _Prepared
        self._last_plan = None
        self._lock = threading.Lock()

        family = None if variant is None else families.family_of(variant)
        if variant is not None and family is None:
            raise ValueError(f"variant {variant!r} does not exist; choose from {families.all_variants()}")
        if family is not None and family.fixed_local_size and local_size is not None:
            raise ValueError(f"variant {variant!r} has a fixed local size; do not pass local_size")
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
        ws = self._upload(self.scale_layout.pack_array(w.scales))
        wo = ws if w.offsets is None else self._upload(self.scale_layout.pack_array(w.offsets))
        bias = np.zeros(cdiv(w.out_channels, 4) * 4, np.float32)
        if spec.bias is not None:
            bias[:w.out_channels] = spec.bias
        bias = self._upload(bias)

        # weights
        self.image = False
        if self.path == "general":
            self.layout = OpenCLConvWeightLayout(w.bits, ic_pack)
            wq = self._upload(self.layout.pack_array(w.q))
        else:
            self.layout = OpenCL1x1BufferLayout(w.bits)
            use_image = self._want_image(image, image_limits)
            if use_image:
                self.layout, self.image = use_image, True
                wq = self._upload_image(self.layout.pack_array(w.q))
            else:
                wq = self._upload(self.layout.pack_array(w.q))
            if family is conv_1x1 and variant.startswith("img") and not self.image:
                if image is False:
                    raise ValueError(f"variant {variant!r} needs image weights, but image=False")
                self.forced_variant = "buf" + variant[3:]  # image did not fit / no image support: buffer
        self.buffers = WeightBuffers(wq, ws, wo, bias)
        self._other_weights: dict = {}  # layout spec -> buffer (weights_in, scales_in)
        self.base_options = layer_options(self)
        why = None if family is None else family.unsupported(self, None, self.forced_variant)
        if why:
            raise ValueError(f"variant {variant!r} cannot run this layer: {why}")

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

    def weights_in(self, layout):
        """The weights packed in layout spec ``layout`` (``pack_array``), uploaded at the first request."""
        buf = self._other_weights.get(layout)
        if buf is None:
            buf = self._other_weights[layout] = self._upload(layout.pack_array(self.spec.weight.q))
        return buf

    def scales_in(self, layout):
        """The scales (with ``layout.asym``: stacked with the offsets, ``(2, O, n_blocks)``) packed in scale
        layout spec ``layout``, uploaded at the first request."""
        buf = self._other_weights.get(layout)
        if buf is None:
            w = self.spec.weight
            values = np.stack([w.scales, w.offsets]) if layout.asym else w.scales
            buf = self._other_weights[layout] = self._upload(layout.pack_array(values.astype(np.float32)))
        return buf

    def digit_scales_in(self, layout):
        """``(scales, offsets)`` buffers of the virtual chunks of ``layout`` (an
        :class:`~qconv.layouts.opencl.OpenCLMMAWeightLayout` with ``digits`` > 1: ``digit_scales`` in float32
        :class:`~qconv.layouts.opencl.OpenCLScaleLayout`; offsets: the scales' buffer when symmetric), uploaded
        at the first request."""
        key = ("digit scales", layout)
        bufs = self._other_weights.get(key)
        if bufs is None:
            w, flat = self.spec.weight, OpenCLScaleLayout("float32")

            def up(values):
                return self._upload(flat.pack_array(layout.digit_scales(values, w.block_channels, w.q.shape[1])))

            ws = up(w.scales)
            bufs = self._other_weights[key] = (ws, ws if w.offsets is None else up(w.offsets))
        return bufs

    def _mma_native(self) -> bool:
        """The device runs PTX mma.sync (an NVIDIA GPU of compute capability 8.0 or newer)."""
        if not self.is_gpu or not self.nv_ptx:
            return False
        try:
            return int(self.device.compute_capability_major_nv) >= 8
        except Exception:  # no cl_nv_device_attribute_query
            return False

    # }}}

    # {{{ candidates

    def _candidates(self, p: Problem) -> list:
        """The tuning candidates of problem ``p``, best guess first: the forced variant's alone (ValueError with
        its family's reason when it cannot run ``p``); else, for a linear layer on one row with
        act_quant="row", gemv_a8's when it runs; else the float kernels (conv_general, or conv_1x1 with
        gemv_1x1 after its favourite and gemv_mma before them where the tensor cores run), with conv_gemm's tiles
        first on a GPU when tuning (one local size each, so the time budget never skips them) and untuned for
        big problems, else last; with act_quant="row" wrapped by act_quant's launches and after conv_mma's tiles
        (first: on the devices that run them, they win)."""
        forced = self.forced_variant
        if forced is not None:
            family = families.family_of(forced)
            why = family.unsupported(self, p, forced)
            if why:
                raise ValueError(f"variant {forced!r} cannot run this layer: {why}")
            return act_quant.wrap(self, p, family.candidates(self, p))

        def offered(family):
            return [] if family.unsupported(self, p) else family.candidates(self, p)

        a8 = offered(gemv_a8)
        if a8:
            return a8
        if self.path == "general":
            cands = offered(conv_general)
        else:
            cands = offered(conv_1x1)
            gemv = offered(gemv_1x1)
            cands = cands[:1] + gemv + cands[1:] if self.is_gpu and self.tune != "none" else cands + gemv
            cands = cands[:1] + offered(gemv_mma) + cands[1:]
        gemm = offered(conv_gemm)
        big = p.pixels * self.spec.out_channels >= 262144
        cands = gemm + cands if self.is_gpu and (self.tune != "none" or big) else cands + gemm
        return offered(conv_mma) + act_quant.wrap(self, p, cands)

    # }}}

    # {{{ forward

    def _shape_of(self, shape, layout):
        c = self.spec.in_channels
        if layout == "nchw":
            if len(shape) != 4 or shape[1] != c:
                raise ValueError(f"x must be NCHW (N, {c}, H, W), got shape {tuple(shape)}")
            n, h, w = shape[0], shape[2], shape[3]
        elif layout == "nc4hw4":
            if len(shape) != 5 or shape[0] != cdiv(c, 4) or shape[4] != 4:
                raise ValueError(f"x must be NC4HW4 ({cdiv(c, 4)}, N, H, W, 4) for {c} channels, got shape "
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
            out_shape = (cdiv(o, 4), n, oh, ow, 4)
            in_elems = cdiv(self.spec.in_channels, 4) * 4 * n * h * w
        out_elems = int(np.prod(out_shape))
        if max(in_elems, out_elems) > _INT32_MAX // 4 or n * max(h * w, oh * ow) * 4 > _INT32_MAX:
            raise ValueError(f"input {n}x{h}x{w} / output {out_shape} are too large for the kernels' 32-bit "
                             f"indexing; split the batch")
        plan = _Plan(self._candidates(Problem(layout, n, h, w, oh, ow)), None, None, out_shape, in_elems, out_elems)
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
                if queue is not None and queue is not self.tune_queue:
                    queue.finish()
                elif wait_for:
                    cl.wait_for_events(wait_for)
                try:
                    cand, lws, ns = tuning.select(self.device, self.tune_queue, cands, self.tune)
                finally:
                    self.tune_queue.finish()
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

    @property
    def queue(self):
        """The calling thread's call queue (:func:`~qconv.gpu.context.call_queue`: no profiling, one per host
        thread): numpy inputs run on it, device arrays on their own queue."""
        return call_queue(self.ctx, self.device)

    @property
    def _pool(self):
        """The calling thread's memory pool (:func:`~qconv.gpu.context.memory_pool`) for outputs and copies."""
        return memory_pool(self.ctx, self.device)

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
                        cl.enqueue_fill_buffer(self.tune_queue, xbuf, np.float32(0), 0, 4 * plan.in_elems)
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
        gsize = roundup(min(cdiv(n, 4), 1 << 16), local)
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
        if self._last_plan is not None and self._last_plan.launch is not None:  # the launches before the kernel
            plan = "".join(f"{st.program}:{st.kernel} + " for st in self._last_plan.launch.steps[:-1]) + plan
        try:
            dev = describe_device(self.device)
        except Exception:  # pragma: no cover - descriptive only
            dev = str(self.device)
        return f"opencl [{dev}] {lay}; {plan} (tune={self.tune})"

