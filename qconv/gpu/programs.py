"""Building the kernel programs of ``qconv/gpu/kernels/*.cl``, memoised per context.

A program is ``common.cl`` + one kernel file, built with ``-D`` options that the layout specs of
:mod:`qconv.layouts.opencl` and the engine generate (one source of truth). Programs and kernels are
memoised per context the way pyopencl's own ``array.py``/``elementwise.py`` do
(``pyopencl.tools.first_arg_dependent_memoize``); pyopencl's on-disk binary cache makes a second
process skip the compiler. A failed build raises :class:`~qconv.gpu.errors.OpenCLBuildError` carrying
the build log.
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time
import warnings
from pathlib import Path

from .context import import_pyopencl
from .errors import OpenCLBuildError, wrap_cl_error

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
PROGRAMS = ("conv_general", "conv_1x1", "conv_gemm", "conv_mma", "gemv_a8", "gemv_mma", "act_quant", "util",
            "eltwise", "graph_ops")
BASE_OPTIONS = ("-cl-std=CL1.2",)


@functools.lru_cache(maxsize=None)
def source(program: str) -> str:
    """OpenCL C of ``program``: ``common.cl`` followed by ``<program>.cl``."""
    if program not in PROGRAMS:
        raise ValueError(f"unknown OpenCL program {program!r}; known: {PROGRAMS}")
    parts = [(KERNEL_DIR / "common.cl").read_text(), (KERNEL_DIR / f"{program}.cl").read_text()]
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def kernels_digest() -> str:
    """SHA-1 of every ``.cl`` file (the tuning cache keeps results per kernel sources)."""
    import hashlib

    h = hashlib.sha1()
    for path in sorted(KERNEL_DIR.glob("*.cl")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _memoize(func):
    cl = import_pyopencl()  # noqa: F841 (only to fail early with a clear message)
    from pyopencl.tools import first_arg_dependent_memoize
    return first_arg_dependent_memoize(func)


_built = None


def _get_program_impl(ctx, program: str, options: tuple):
    cl = import_pyopencl()
    opts = list(BASE_OPTIONS) + list(options)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            return cl.Program(ctx, source(program)).build(options=opts)
    except cl.RuntimeError as exc:
        raise OpenCLBuildError(program, opts, str(exc)) from exc
    except cl.Error as exc:
        raise wrap_cl_error(exc, f"building OpenCL program {program!r}") from exc


def get_program(ctx, program: str, options=()) -> "pyopencl.Program":  # noqa: F821
    """The built ``program`` for ``ctx`` with ``options`` (a sequence of ``-D...`` strings), memoised."""
    global _built
    if _built is None:
        _built = _memoize(_get_program_impl)
    return _built(ctx, program, tuple(options))


ENV_BUILD_PROCESSES = "QCONV_BUILD_PROCESSES"
_WORKER_TIMEOUT_S = 120.0   # a worker that does not answer a request within this is killed (its program is built here)
_WORKER_IDLE_S = 30.0       # workers exit this long after the last request


def build_processes(device) -> int:
    """Compile worker processes :func:`build_many` uses for ``device``: ``$QCONV_BUILD_PROCESSES`` if set, else up
    to 8 for NVIDIA's OpenCL (which compiles one program at a time in a process) and none elsewhere (threads build
    in parallel there, e.g. PoCL). Their programs come back through the driver's own cache of source builds
    (NVIDIA's ComputeCache, PoCL's kcache; pyopencl keeps no cache of its own for these two): none when NVIDIA's is
    off (``CUDA_CACHE_DISABLE=1``)."""
    env = os.environ.get(ENV_BUILD_PROCESSES)
    if env is not None and env.strip():
        try:
            return max(0, int(env))
        except ValueError:
            raise ValueError(f"{ENV_BUILD_PROCESSES} must be an integer, got {env!r}") from None
    nvidia = "NVIDIA" in device.platform.name.upper()
    if not nvidia or os.environ.get("CUDA_CACHE_DISABLE", "0") not in ("", "0"):
        return 0
    return min(8, os.cpu_count() or 1)


class _Workers:
    """Compile worker processes (``qconv.gpu._build_worker``) for one device, started on first use and stopped
    after :data:`_WORKER_IDLE_S` without requests, or when one fails."""

    def __init__(self, device, n: int):
        import subprocess
        import sys

        cl = import_pyopencl()
        index = next(((p, d) for p, plat in enumerate(cl.get_platforms())
                      for d, dev in enumerate(plat.get_devices()) if dev == device), None)
        if index is None:
            raise RuntimeError("the device is on no platform")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])   # the directory holding the qconv package
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.procs = [subprocess.Popen([sys.executable, "-m", "qconv.gpu._build_worker", *map(str, index)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True, bufsize=1, env=env) for _ in range(n)]
        self.ready = [False] * n
        self.timer = None

    def build(self, pairs) -> bool:
        """Builds ``pairs`` (``(program, options)``) in the workers; False when a worker failed (the pool is then
        stopped; the caller builds what is missing)."""
        import queue
        import threading

        todo = queue.SimpleQueue()
        for pair in pairs:
            todo.put(pair)
        failed = []

        def serve(i, proc):
            try:
                if not self.ready[i]:
                    if not proc.stdout.readline():
                        raise EOFError
                    self.ready[i] = True
                while True:
                    try:
                        program, options = todo.get_nowait()
                    except queue.Empty:
                        return
                    proc.stdin.write(json.dumps({"program": program, "options": list(options)}) + "\n")
                    proc.stdin.flush()
                    if not proc.stdout.readline():
                        raise EOFError
            except (OSError, EOFError, ValueError):
                failed.append(i)

        threads = [threading.Thread(target=serve, args=(i, p), daemon=True) for i, p in enumerate(self.procs)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + _WORKER_TIMEOUT_S * (1 + len(pairs) / max(1, len(self.procs)))
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if failed or any(t.is_alive() for t in threads):
            self.close()
            return False
        return True

    def close(self):
        for p in self.procs:
            try:
                p.kill()
                p.wait(5)
            except Exception:  # noqa: BLE001 (already gone)
                pass
        self.procs = []


_workers: dict = {}
_workers_lock = threading.Lock()


def _stop_idle(key, pool):
    with _workers_lock:
        if _workers.get(key) is pool:
            del _workers[key]
    pool.close()


def _build_in_workers(ctx, pairs) -> None:
    device = ctx.devices[0]
    n = min(build_processes(device), len(pairs))
    if n < 2:
        return
    key = device.int_ptr
    with _workers_lock:
        pool = _workers.get(key)
        if pool is not None and len(pool.procs) < n:
            pool.close()
            pool = None
        if pool is None:
            try:
                pool = _workers[key] = _Workers(device, n)
            except Exception:  # noqa: BLE001 (no workers: the programs build here)
                return
        if pool.timer is not None:
            pool.timer.cancel()
    ok = pool.build(pairs)
    with _workers_lock:
        if not ok:
            _workers.pop(key, None)
            return
        pool.timer = threading.Timer(_WORKER_IDLE_S, _stop_idle, (key, pool))
        pool.timer.daemon = True
        pool.timer.start()


def build_many(ctx, pairs) -> None:
    """Builds every ``(program, options)`` of ``pairs`` into :func:`get_program`'s memo at once: in compile worker
    processes first where :func:`build_processes` says (they leave the builds in the driver's cache), then on up
    to 16 threads (pyopencl releases the GIL while the driver compiles or loads a binary). The tuner hands it every
    candidate of a layer. A failed build is left for :func:`get_program` to raise where the program is used."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = sorted({(p, tuple(o)) for p, o in pairs})
    if len(pairs) < 2:
        return
    _build_in_workers(ctx, pairs)
    workers = min(len(pairs), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 16)

    def build(pair):
        try:
            get_program(ctx, *pair)
        except Exception:  # noqa: BLE001 (raised again, with its context, where the program is used)
            pass

    if workers < 2:
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="qconv-build") as pool:
        list(pool.map(build, pairs))


_kernels = None


def _get_kernel_impl(ctx, program: str, options: tuple, name: str):
    return getattr(get_program(ctx, program, options), name)


def get_kernel(ctx, program: str, options, name: str) -> "pyopencl.Kernel":  # noqa: F821
    """Kernel ``name`` of :func:`get_program` (the same object for the same arguments)."""
    global _kernels
    if _kernels is None:
        _kernels = _memoize(_get_kernel_impl)
    return _kernels(ctx, program, tuple(options), name)
