"""qconv's OpenCL engine (pyopencl): weight-quantized conv kernels, device selection, program cache, tuning.

Importing this package never imports pyopencl, never prints, and never fails for a missing driver;
:func:`available` says whether a device is visible and ``OpenCLEngine(spec, device="opencl")`` raises
:class:`OpenCLUnavailableError` (with how to install one) when none is.

* :func:`devices` -> ``["opencl:P:D", ...]``; :func:`available` -> bool.
* :class:`OpenCLEngine` -> the engine protocol of ``docs/DESIGN.md`` (``forward``, ``describe``).
* :mod:`.families` -> the kernel families (one module each: variants, build options, local sizes, the
  "can it run" check).
* :mod:`.tuning` -> ``QCONV_TUNE``, ``QCONV_CACHE_DIR``; :mod:`.programs` -> kernel sources and builds.
"""
from .context import available, describe_device, devices, resolve
from .engine import OpenCLEngine
from .families.conv_1x1 import onex1_variants
from .families.conv_gemm import GEMM_VARIANTS
from .families.conv_general import GENERAL_VARIANTS
from .families.conv_mma import MMA_VARIANTS
from .families.gemv_1x1 import GEMV_VARIANTS
from .families.gemv_a8 import A8_VARIANTS
from .families.gemv_mma import GEMV_MMA_VARIANTS
from .errors import OpenCLBuildError, OpenCLError, OpenCLUnavailableError

__all__ = ["devices", "available", "describe_device", "resolve", "OpenCLEngine", "GENERAL_VARIANTS", "GEMM_VARIANTS",
           "GEMV_VARIANTS", "A8_VARIANTS", "MMA_VARIANTS", "GEMV_MMA_VARIANTS", "onex1_variants", "OpenCLError", "OpenCLBuildError", "OpenCLUnavailableError"]
