"""The qconv CPU engine (Cython + SIMD micro-kernels). See :mod:`qconv.cpu.engine`."""
from .engine import (CpuEngine, KERNEL_NAMES, default_threads, row_qparams, select_kernel,  # noqa: F401
                     tensor_qparams)

__all__ = ["CpuEngine", "KERNEL_NAMES", "default_threads", "select_kernel", "tensor_qparams", "row_qparams"]
