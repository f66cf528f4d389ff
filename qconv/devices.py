"""Which engines can run here: ``"reference"`` (numpy), ``"cpu"`` (Cython), ``"opencl:P:D"`` (pyopencl)."""
from __future__ import annotations


def cpu_available() -> bool:
    """True when the compiled CPU engine imports."""
    try:
        from .cpu import CpuEngine  # noqa: F401
    except ImportError:
        return False
    return True


def opencl_devices() -> list[str]:
    """``"opencl:P:D"`` for every visible OpenCL device; empty without pyopencl or a platform."""
    try:
        from . import gpu
    except ImportError:
        return []
    try:
        return [str(d) for d in gpu.devices()]
    except Exception:  # a broken ICD must not break device listing
        return []


def available_devices() -> list[str]:
    """Every engine usable in this process, the reference first."""
    devs = ["reference"]
    if cpu_available():
        devs.append("cpu")
    return devs + opencl_devices()
