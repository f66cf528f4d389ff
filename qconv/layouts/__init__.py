"""Memory layouts as data.

Each layout is a frozen-dataclass spec with two methods that are exact inverses:
``spec.pack_array(x) -> packed`` and ``spec.unpack_array(packed, shape) -> x`` where ``shape`` is the
logical shape of ``x``. :func:`pack` and :func:`unpack` are the same as functions. Kernels read their
constants (tile sizes, strides, build options) from properties of these specs, never from copies.

=====================  ==========================================  ==============================
spec                   layout                                      module
=====================  ==========================================  ==============================
``NC4HW4(pack)``       activations ``[ceil(C/P)][N][H][W][P]``     :mod:`qconv.layouts.nc4hw4`
``Int4Packing``        two nibbles a byte (MNN / ONNX / GGUF)      :mod:`qconv.layouts.int4`
``TiledWeightLayout``  CPU int8 GEMM weight tiles                  :mod:`qconv.layouts.gemm_tiles`
OpenCL weight specs    general conv, 1x1 buffer, 1x1 Image2D       :mod:`qconv.layouts.opencl`
=====================  ==========================================  ==============================
"""
from .int4 import GGUF_Q4, MNN_INT4, ONNX_INT4, ONNX_UINT4, Int4Packing
from .nc4hw4 import NC4HW4


def pack(spec, x):
    """Pack logical array ``x`` into ``spec``'s layout."""
    return spec.pack_array(x)


def unpack(spec, packed, shape):
    """Inverse of :func:`pack`: ``shape`` is the logical shape of the result."""
    return spec.unpack_array(packed, shape)


def all_specs():
    """Every layout spec class of qconv (for property tests and tools)."""
    specs = [NC4HW4, Int4Packing]
    try:
        from .gemm_tiles import TiledWeightLayout
        specs.append(TiledWeightLayout)
    except ImportError:
        pass
    try:
        from . import opencl
        specs.extend(getattr(opencl, "SPECS", ()))
    except ImportError:
        pass
    return specs


__all__ = ["NC4HW4", "Int4Packing", "MNN_INT4", "ONNX_INT4", "ONNX_UINT4", "GGUF_Q4", "pack", "unpack",
           "all_specs"]
