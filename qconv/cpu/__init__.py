"""The qconv CPU engine (Cython + SIMD micro-kernels). See :mod:`qconv.cpu.engine`."""
from .engine import (CpuEngine, KERNEL_NAMES, default_threads, row_qparams, select_kernel,  # noqa: F401
                     serial_thresholds, tensor_qparams)

__all__ = ["CpuEngine", "KERNEL_NAMES", "default_threads", "select_kernel", "serial_thresholds", "tensor_qparams",
           "row_qparams"]
