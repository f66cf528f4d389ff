"""qconv's OpenCL engine (pyopencl): weight-quantized conv kernels, device selection, program cache, tuning.

Importing this package never imports pyopencl, never prints, and never fails for a missing driver;
:func:`available` says whether a device is visible and ``OpenCLEngine(spec, device="opencl")`` raises
:class:`OpenCLUnavailableError` (with how to install one) when none is.

* :func:`devices` -> ``["opencl:P:D", ...]``; :func:`available` -> bool.
* :class:`OpenCLEngine` -> the engine protocol of ``docs/DESIGN.md`` (``forward``, ``describe``).
* :mod:`.tuning` -> ``QCONV_TUNE``, ``QCONV_CACHE_DIR``; :mod:`.programs` -> kernel sources and builds.
"""
from .context import available, describe_device, devices, resolve
from .engine import (A8_VARIANTS, GEMM_VARIANTS, GEMV_VARIANTS, GENERAL_VARIANTS, MMA_VARIANTS, OpenCLEngine,
                     onex1_variants)
from .errors import OpenCLBuildError, OpenCLError, OpenCLUnavailableError

__all__ = ["devices", "available", "describe_device", "resolve", "OpenCLEngine", "GENERAL_VARIANTS", "GEMM_VARIANTS",
           "GEMV_VARIANTS", "A8_VARIANTS", "MMA_VARIANTS", "onex1_variants", "OpenCLError", "OpenCLBuildError", "OpenCLUnavailableError"]
