"""Memory layouts as data.

Each layout is a frozen-dataclass spec with two methods that are exact inverses:
``spec.pack_array(x) -> packed`` and ``spec.unpack_array(packed, shape) -> x`` where ``shape`` is the
logical shape of ``x``. :func:`pack` and :func:`unpack` are the same as functions. Kernels read their
constants (tile sizes, strides, build options) from properties of these specs, never from copies.

=======================  ============================================  ==============================
spec                     layout                                        module
=======================  ============================================  ==============================
``NC4HW4(pack)``         activations ``[ceil(C/P)][N][H][W][P]``       :mod:`qconv.layouts.nc4hw4`
``DepthToSpace(block)``  a pixel shuffle (ONNX DepthToSpace, CRD)      :mod:`qconv.layouts.pixel_shuffle`
``Int4Packing``          two nibbles a byte (MNN / ONNX / GGUF)        :mod:`qconv.layouts.int4`
``TiledWeightLayout``    CPU int8 GEMM weight tiles                    :mod:`qconv.layouts.gemm_tiles`
``AmxWeightLayout``      CPU AMX-INT8 weight tiles (K/4 x 16 x 4)      :mod:`qconv.layouts.amx`
``AmxConvWeightLayout``  the direct AMX conv's A tiles (16 x kg x 4)   :mod:`qconv.layouts.amx`
OpenCL specs             ``SPECS`` of :mod:`qconv.layouts.opencl`:     :mod:`qconv.layouts.opencl`
                         general conv, 1x1 buffer, 1x1 Image2D,
                         scales, int8 tensor-core conv, f16
                         tensor-core GEMV
=======================  ============================================  ==============================

:func:`all_specs` lists every spec class; :func:`markdown_table` renders the layouts table of ``README.md``
and ``docs/DESIGN.md`` from them (``tests/test_docs.py`` checks that the committed tables match it).
"""
from .int4 import GGUF_Q4, MNN_INT4, ONNX_INT4, ONNX_UINT4, Int4Packing
from .nc4hw4 import NC4HW4
from .pixel_shuffle import DepthToSpace


def pack(spec, x):
    """Pack logical array ``x`` into ``spec``'s layout."""
    return spec.pack_array(x)


def unpack(spec, packed, shape):
    """Inverse of :func:`pack`: ``shape`` is the logical shape of the result."""
    return spec.unpack_array(packed, shape)


def all_specs():
    """Every layout spec class of qconv (for property tests and tools)."""
    specs = [NC4HW4, DepthToSpace, Int4Packing]
    try:
        from .gemm_tiles import TiledWeightLayout
        specs.append(TiledWeightLayout)
    except ImportError:
        pass
    try:
        from .amx import AmxConvWeightLayout, AmxWeightLayout
        specs.extend([AmxWeightLayout, AmxConvWeightLayout])
    except ImportError:
        pass
    try:
        from . import opencl
        specs.extend(getattr(opencl, "SPECS", ()))
    except ImportError:
        pass
    return specs


def _md(text: str) -> str:
    """reST inline literals and line breaks -> one markdown table cell."""
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


def markdown_table(link_root: str = "") -> str:
    """The layouts table of the docs, one row per class of :func:`all_specs`: the spec (with the module-level
    instances of it, e.g. ``MNN_INT4``), the file that defines it, and what it holds (the first paragraph of
    the class docstring). ``link_root``: the path from the markdown file to the repository root (``"../"``
    for ``docs/``)."""
    import importlib
    import inspect

    specs = all_specs()
    modules = [importlib.import_module(m) for m in dict.fromkeys(cls.__module__ for cls in specs)]
    rows = ["| spec | defined in | what it holds |", "|---|---|---|"]
    for cls in specs:
        names = [name for mod in modules for name, v in vars(mod).items()
                 if isinstance(v, cls) and not name.startswith("_")]
        spec = f"`{cls.__name__}`" + (" (" + ", ".join(f"`{n}`" for n in names) + ")" if names else "")
        path = "qconv/" + cls.__module__.removeprefix("qconv.").replace(".", "/") + ".py"
        summary = inspect.getdoc(cls).split("\n\n")[0]
        rows.append(f"| {spec} | [{path}]({link_root}{path}) | {_md(summary)} |")
    return "\n".join(rows)


__all__ = ["NC4HW4", "DepthToSpace", "Int4Packing", "MNN_INT4", "ONNX_INT4", "ONNX_UINT4", "GGUF_Q4", "pack", "unpack",
           "all_specs", "markdown_table"]
