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
import os
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


def build_many(ctx, pairs) -> None:
    """Builds every ``(program, options)`` of ``pairs`` into :func:`get_program`'s memo, on up to 16 threads at
    once (pyopencl releases the GIL while the driver compiles: the tuner's candidates of one layer build
    together instead of one after another). A failed build is left for :func:`get_program` to raise where the
    program is used."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = sorted({(p, tuple(o)) for p, o in pairs})
    workers = min(len(pairs), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 16)
    if workers < 2:
        return

    def build(pair):
        try:
            get_program(ctx, *pair)
        except Exception:  # noqa: BLE001 (raised again, with its context, where the program is used)
            pass

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
