"""OpenCL device discovery and selection.

Device specs accepted everywhere (``device=`` of the layers, :func:`resolve`):

* ``"opencl"``: ``$QCONV_OPENCL_DEVICE`` when set, else the first GPU of any platform, else the first device;
* ``"opencl:P:D"``: device ``D`` of platform ``P`` (indices as listed by :func:`devices`);
* a ``pyopencl.Device`` (a context is created once per device and shared) or a ``pyopencl.Context``
  (its first device).

``QCONV_OPENCL_DEVICE`` holds ``P:D``, ``opencl:P:D`` or a case-insensitive substring of a device name.
Nothing here imports pyopencl at module import time, and nothing prints.
"""
from __future__ import annotations

import os
import threading

from .errors import OpenCLUnavailableError

ENV_DEVICE = "QCONV_OPENCL_DEVICE"

_HOW = ("install an OpenCL driver: for a CPU device `apt-get install pocl-opencl-icd` (Debian/Ubuntu) or "
        "`pip install pocl-binary-distribution`; for a GPU its vendor's driver with the OpenCL ICD")
_lock = threading.Lock()
_contexts: dict = {}
_queues: dict = {}
_local = threading.local()   # per host thread: {(ctx, dev): (call queue, memory pool)}


def import_pyopencl():
    """``pyopencl`` or :class:`OpenCLUnavailableError` saying how to get it."""
    try:
        import pyopencl as cl
    except ImportError as exc:
        raise OpenCLUnavailableError(f"the OpenCL engine needs pyopencl (`pip install pyopencl`): {exc}") from exc
    return cl


def _platforms():
    cl = import_pyopencl()
    try:
        return cl.get_platforms()
    except cl.Error:  # PLATFORM_NOT_FOUND_KHR from the ICD loader when nothing is installed
        return []


def _platform_devices(platform):
    cl = import_pyopencl()
    try:
        return platform.get_devices()
    except cl.Error:  # DEVICE_NOT_FOUND
        return []


def devices() -> list[str]:
    """``"opencl:P:D"`` for every visible device (empty without pyopencl or a platform)."""
    try:
        plats = _platforms()
    except OpenCLUnavailableError:
        return []
    return [f"opencl:{p}:{d}" for p, plat in enumerate(plats) for d, _ in enumerate(_platform_devices(plat))]


def available() -> bool:
    """Whether any OpenCL device is visible."""
    return bool(devices())


def describe_device(device) -> str:
    """``"<name> (<vendor>, <platform>, driver <version>)"`` of a device spec."""
    _, dev = resolve(device)
    return f"{dev.name.strip()} ({dev.vendor.strip()}, {dev.platform.name.strip()}, driver {dev.driver_version})"


def _no_device(msg: str):
    listed = devices()
    seen = ", ".join(listed) if listed else "none"
    return OpenCLUnavailableError(f"{msg}; visible OpenCL devices: {seen}. To get one, {_HOW}.")


def _by_index(p: int, d: int):
    plats = _platforms()
    if not 0 <= p < len(plats):
        raise _no_device(f"OpenCL platform {p} does not exist")
    devs = _platform_devices(plats[p])
    if not 0 <= d < len(devs):
        raise _no_device(f"OpenCL device {d} of platform {p} does not exist")
    return devs[d]


def _parse_index(text: str):
    parts = text.split(":")
    if len(parts) == 2 and all(s.strip().isdigit() for s in parts):
        return int(parts[0]), int(parts[1])
    return None


def _from_env(value: str):
    v = value.strip()
    if v.startswith("opencl:"):
        v = v[len("opencl:"):]
    idx = _parse_index(v)
    if idx is not None:
        return _by_index(*idx)
    for plat in _platforms():
        for dev in _platform_devices(plat):
            if v.lower() in dev.name.lower():
                return dev
    raise _no_device(f"{ENV_DEVICE}={value!r} matches no OpenCL device (use P:D or part of a device name)")


def _default_device():
    env = os.environ.get(ENV_DEVICE)
    if env:
        return _from_env(env)
    cl = import_pyopencl()
    plats = _platforms()
    if not plats:
        raise _no_device("no OpenCL platform is installed")
    every = [dev for plat in plats for dev in _platform_devices(plat)]
    if not every:
        raise _no_device("the OpenCL platforms have no devices")
    gpus = [dev for dev in every if dev.type & cl.device_type.GPU]
    return (gpus or every)[0]


def _context_for(dev):
    cl = import_pyopencl()
    key = dev.int_ptr
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = _contexts[key] = cl.Context([dev])
        return ctx


def resolve(device="opencl"):
    """``(context, device)`` for a device spec (see the module docstring)."""
    cl = import_pyopencl()
    if device is None or (isinstance(device, str) and device == "opencl"):
        dev = _default_device()
        return _context_for(dev), dev
    if isinstance(device, str):
        if not device.startswith("opencl:"):
            raise ValueError(f"OpenCL device must be 'opencl' or 'opencl:P:D', got {device!r}")
        idx = _parse_index(device[len("opencl:"):])
        if idx is None:
            raise ValueError(f"OpenCL device must be 'opencl:P:D' with integer P and D, got {device!r}")
        dev = _by_index(*idx)
        return _context_for(dev), dev
    if isinstance(device, cl.Context):
        return device, device.devices[0]
    if isinstance(device, cl.Device):
        return _context_for(device), device
    raise TypeError(f"device must be 'opencl', 'opencl:P:D', a pyopencl.Device or a pyopencl.Context, "
                    f"got {type(device).__name__}")


def _thread_state(ctx, dev):
    """The calling thread's ``[call queue, memory pool or None]`` for (context, device)."""
    cl = import_pyopencl()
    mine = getattr(_local, "state", None)
    if mine is None:
        mine = _local.state = {}
    key = (ctx.int_ptr, dev.int_ptr)
    st = mine.get(key)
    if st is None:
        st = mine[key] = [cl.CommandQueue(ctx, dev), None]
    return st


def call_queue(ctx, dev):
    """The calling host thread's in-order command queue **without** profiling for (context, device), shared by
    the engines: the queue of their calls (``engine.queue``). One per host thread: NVIDIA's OpenCL crashes or
    hangs when host threads enqueue on one queue at once (H200, driver 580.159.04: 8 threads calling one layer,
    8 processes at a time: 10 of 16 processes segfaulted or hung with one shared queue, none of 16 with a queue per
    thread). Profiling makes every enqueue dearer (NVIDIA's OpenCL on the H200: 11.7-14.2 us against 6.4 us an
    enqueue from Python, ``benchmarks/labs/enqueue_cost.py``), so only tuning and the benchmarks' event timings
    use :func:`profiling_queue`."""
    return _thread_state(ctx, dev)[0]


def profiling_queue(ctx, dev):
    """One in-order command queue with profiling per (context, device), shared by the engines' tuners (events
    with start/end times)."""
    return _shared_queue(ctx, dev, profiling=True)


def _shared_queue(ctx, dev, profiling: bool):
    cl = import_pyopencl()
    key = (ctx.int_ptr, dev.int_ptr, profiling)
    with _lock:
        q = _queues.get(key)
        if q is None:
            props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
            q = _queues[key] = cl.CommandQueue(ctx, dev, properties=props)
        return q


def memory_pool(ctx, dev):
    """The calling host thread's ``pyopencl.tools.MemoryPool`` for (context, device): the engines' temporary
    buffers. Per thread, like :func:`call_queue`, whose queue its allocator enqueues on."""
    import_pyopencl()
    from pyopencl.tools import ImmediateAllocator, MemoryPool

    st = _thread_state(ctx, dev)
    if st[1] is None:
        st[1] = MemoryPool(ImmediateAllocator(st[0]))
    return st[1]


def device_identity(dev) -> dict:
    """What a tuning result depends on: device name, vendor, driver version, platform."""
    return {"name": dev.name.strip(), "vendor": dev.vendor.strip(), "driver": dev.driver_version.strip(),
            "version": dev.version.strip(), "platform": dev.platform.name.strip(),
            "platform_version": dev.platform.version.strip()}
