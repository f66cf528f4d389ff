"""What the kernel families share: the :class:`Family` protocol, the :class:`Layer` they read, the
:class:`Problem` a candidate list is made for, the layer's common build options, and integer helpers.

A family (one module of this package, the way pyopencl splits ``reduction.py`` and ``elementwise.py``) owns
its variants, build options, local sizes and one check, ``unsupported(layer, problem=None, variant=None)``:
``None`` when it can run the layer (for that input shape and variant, when given), else the reason, a
sentence fragment such as ``"it needs an ungrouped conv"`` that the engine puts after ``variant 'x' cannot
run this layer: ``. ``problem=None`` asks about every input shape (the checks made when the engine is built);
``variant=None`` about the family as a whole. A reason says what the layer would need: a family never
refuses because of the scales' storage (float32 scales that are not fp16-exact run every kernel; fp16 ones
are only read faster).
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ... import _validate as V

def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2ceil(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def pow2floor(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)


def roundup(n: int, m: int) -> int:
    return cdiv(n, m) * m


class Problem(NamedTuple):
    """One input shape of a layer: activation ``layout`` (``"nchw"`` | ``"nc4hw4"``), ``n, h, w`` and the
    output's ``oh, ow``."""

    layout: str
    n: int
    h: int
    w: int
    oh: int
    ow: int

    @property
    def rows(self) -> int:
        """Input pixels ``N * H * W`` (a 1x1 layer's GEMM rows; 1 for a linear layer on one row)."""
        return self.n * self.h * self.w

    @property
    def pixels(self) -> int:
        """Output pixels ``N * OH * OW``."""
        return self.n * self.oh * self.ow


class WeightBuffers(NamedTuple):
    """The layer's device buffers every kernel reads: ``q`` (weights in the layer's :attr:`Layer.layout`:
    a buffer, or an Image2D), ``scales``, ``offsets`` (the scales' buffer when symmetric), ``bias`` (float32,
    ``ceil(O/4)*4``, zeros without bias)."""

    q: object
    scales: object
    offsets: object
    bias: object


class Layer(Protocol):
    """What a family reads of the layer it plans for (:class:`~qconv.gpu.engine.OpenCLEngine` is one).

    ``spec`` (:class:`~qconv.geometry.ConvSpec`), ``ctx``/``device`` (pyopencl), ``path`` (``"1x1"``:
    ungrouped 1x1 stride-1 unpadded, weights in a 1x1 layout; else ``"general"``), ``layout`` (the weight
    layout spec of :attr:`buffers` ``.q``), ``scale_layout``, ``image`` (1x1 weights in an Image2D),
    ``act_row`` (``act_quant="row"``), ``tune`` (level), ``forced_variant``/``forced_lws`` (the user's, or
    None), ``specialize``, ``is_gpu``, ``nv_ptx`` (NVIDIA: inline PTX builds), ``mma_native`` (PTX
    ``mma.sync``: NVIDIA sm_80+), ``exact_division`` (correctly rounded float32 division),
    ``base_options`` (:func:`layer_options`), ``buffers`` (:class:`WeightBuffers`), ``weights_in(layout)``
    (the weights packed in another layout spec, uploaded at the first request) and ``scales_in(layout)``
    (the same for the scales, with the offsets where the spec holds them), ``digit_scales_in(layout)`` (the
    scales and offsets of an :class:`~qconv.layouts.opencl.OpenCLMMAWeightLayout` with digits)."""

    spec: object
    ctx: object
    device: object
    path: str
    layout: object
    scale_layout: object
    image: bool
    act_row: bool
    tune: str
    forced_variant: str | None
    forced_lws: tuple | None
    specialize: bool
    is_gpu: bool
    nv_ptx: bool
    mma_native: bool
    exact_division: bool
    base_options: tuple
    buffers: WeightBuffers

    def weights_in(self, layout): ...

    def scales_in(self, layout): ...

    def digit_scales_in(self, layout): ...


class Family(Protocol):
    """A kernel family module: ``program`` (``kernels/<program>.cl``), ``variants`` (name -> parameters),
    ``fixed_local_size`` (the variant fixes its local size: ``local_size=`` is refused), ``unsupported``
    (see the module docstring) and ``candidates(layer, problem)``: its :class:`~qconv.gpu.tuning.Candidate` s
    for a problem it supports, best guess first (the forced variant alone when ``layer.forced_variant`` is
    one of its variants; ``[]`` when it has nothing worth timing there)."""

    program: str
    variants: dict
    fixed_local_size: bool

    def unsupported(self, layer: Layer, problem: Problem | None = None, variant: str | None = None) -> str | None: ...

    def candidates(self, layer: Layer, problem: Problem) -> list: ...


def device_limits(layer: Layer) -> tuple:
    """``(max work-group size, max work-item sizes per dimension, local memory bytes)`` of the layer's device."""
    dev = layer.device
    return int(dev.max_work_group_size), dev.max_work_item_sizes, int(dev.local_mem_size)


def scalars(*values) -> list:
    """int32 kernel arguments."""
    return [np.int32(v) for v in values]


def layer_options(layer: Layer) -> tuple:
    """The ``-D`` options of the layer's weights, epilogue and geometry shared by the kernels that read
    ``layer.layout`` (conv_general, conv_1x1, gemv_1x1, conv_gemm; gemv_a8 and gemv_mma take parts of them, see
    :func:`common_options`): the layout's :attr:`build_options` first, then :func:`common_options`."""
    return tuple(layer.layout.build_options) + common_options(layer)


def common_options(layer: Layer, scale_groups: bool = True) -> tuple:
    """Everything of :func:`layer_options` but the weight layout's own ``build_options``: the scale layout's
    options for the weight's blocks, the layout's scale-group options (``scale_groups``), ``HAS_BIAS``,
    ``ACT``, ``OC_LANE_LEAVE``, the layout's edge options, ``GROUPED``/``DEPTHWISE`` and, specialised, the
    geometry as ``G_<NAME>`` constants."""
    s, w = layer.spec, layer.spec.weight
    opts = list(layer.scale_layout.options_for(w.n_blocks, w.block_channels, w.offsets is not None))
    if w.n_blocks > 1 and scale_groups:
        opts += layer.layout.scale_group_options(w.block_channels)
    if s.bias is not None:
        opts.append("-DHAS_BIAS")
    if s.activation:
        opts.append(f"-DACT={V.ACTIVATION_CODES[s.activation]}")
    ipg, o = w.q.shape[1], w.out_channels
    if o % 4:
        opts.append("-DOC_LANE_LEAVE")
    opts += layer.layout.edge_options(ipg)
    if layer.path == "general":
        if w.groups > 1:
            opts.append("-DGROUPED")
            if ipg == 1 and o == w.groups:
                opts.append("-DDEPTHWISE")
        if layer.specialize:
            opts += [f"-DG_{k}={v}" for k, v in geometry(s, groups=True)]
    elif layer.specialize:
        opts += [f"-DG_IC={ipg}", f"-DG_OC={o}"]
    return tuple(opts)


def geometry(spec, groups: bool = False) -> list:
    """``[(NAME, value)]`` of the conv's geometry as the kernels' ``G_<NAME>`` options take them: IC (per
    group), OC, (GROUPS,) KH, KW, SH, SW, PH, PW, DH, DW."""
    w = spec.weight
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel_size, spec.stride, spec.padding, spec.dilation
    return ([("IC", w.q.shape[1]), ("OC", w.out_channels)] + ([("GROUPS", w.groups)] if groups else [])
            + [("KH", kh), ("KW", kw), ("SH", sh), ("SW", sw), ("PH", ph), ("PW", pw), ("DH", dh), ("DW", dw)])


def io_options(layer: Layer, problem: Problem) -> tuple:
    """Activation layout options: ``IN_NCHW``/``OUT_NCHW`` for NCHW, and ``HW1`` for 1x1 layers on 1x1 inputs."""
    opts = () if problem.layout == "nc4hw4" else ("-DIN_NCHW", "-DOUT_NCHW")
    return opts + (("-DHW1",) if problem.h * problem.w == 1 and layer.path == "1x1" else ())
