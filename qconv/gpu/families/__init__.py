"""The OpenCL kernel families, one module each (pyopencl's ``reduction.py`` / ``elementwise.py`` split):

==================  ======================  ==========================================================
module              kernels                 runs
==================  ======================  ==========================================================
:mod:`.conv_general` ``conv_general.cl``     any conv (kernel, stride, padding, dilation, groups)
:mod:`.conv_1x1`     ``conv_1x1.cl``         ungrouped 1x1 stride-1 unpadded convs, buffer or image weights
:mod:`.gemv_1x1`     ``conv_1x1.cl``         linear layers on one row (float activations)
:mod:`.conv_gemm`    ``conv_gemm.cl``        ungrouped convs of either path as a tiled implicit GEMM
:mod:`.gemv_a8`      ``gemv_a8.cl``          ``act_quant="row"`` linear layers on one row (int8 dot products)
:mod:`.gemv_mma`     ``gemv_mma.cl``         float linear layers on one row on f16 tensor cores
:mod:`.conv_mma`     ``conv_mma.cl``         ``act_quant="row"`` ungrouped convs on int8 tensor cores
:mod:`.act_quant`    ``act_quant.cl``        ``act_quant="row"``: x quantized per sample before the float kernels
==================  ======================  ==========================================================

Each kernel family module follows :class:`.base.Family` (``program``, ``variants``, ``fixed_local_size``,
``unsupported``, ``candidates``); :mod:`.act_quant` has the same ``unsupported`` and wraps the others'
candidates instead. The engine (:mod:`qconv.gpu.engine`) asks them for candidates, the tuner times them and
the plan records the winner.
"""
from . import act_quant, conv_1x1, conv_gemm, conv_general, conv_mma, gemv_1x1, gemv_a8, gemv_mma
from .base import Family, Layer, Problem, WeightBuffers

KERNEL_FAMILIES = (conv_general, conv_1x1, gemv_1x1, conv_gemm, gemv_a8, gemv_mma, conv_mma)
"""Every family that offers candidates (its variants' names are unique across families)."""


def family_of(variant: str):
    """The family module whose ``variants`` hold ``variant`` (None when none does)."""
    return next((f for f in KERNEL_FAMILIES if variant in f.variants), None)


def all_variants() -> list:
    """Every variant name of every family, sorted."""
    return sorted(v for f in KERNEL_FAMILIES for v in f.variants)


__all__ = ["KERNEL_FAMILIES", "family_of", "all_variants", "Family", "Layer", "Problem", "WeightBuffers",
           "act_quant", "conv_1x1", "conv_gemm", "conv_general", "conv_mma", "gemv_1x1", "gemv_a8", "gemv_mma"]
