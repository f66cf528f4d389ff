"""Wall-clock timing and peak memory, shared by the command-line tools and the benchmarks."""
from __future__ import annotations

import resource
import sys
import time

import numpy as np


def median_ms(fn, repeat: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeat`` runs, after one warm-up call."""
    fn()
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def best_ms(fn, repeat: int, min_s: float = 0.05) -> float:
    """Fastest wall time of ``fn()`` in milliseconds, after one warm-up call: at least ``repeat`` timed runs,
    and more until ``min_s`` seconds have passed. The minimum, as :mod:`timeit` advises, because on a busy
    machine a run's extra time is other processes': a multi-threaded call (the CPU engine's OpenMP team) waits
    a whole scheduler slice, ~16 ms, for a core another process holds, and consecutive sub-millisecond runs all
    fall inside that one slice, so they are spread over ``min_s`` to reach a run that got its cores."""
    fn()
    best = float("inf")
    start = time.perf_counter()
    n = 0
    while n < max(1, repeat) or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return best * 1e3


def cpu_pressure(path: str = "/proc/pressure/cpu") -> float | None:
    """Share of the last minute (%) in which some runnable task waited for a core (Linux PSI ``some avg60``), or
    None where the kernel does not report it: above a few percent, other processes' load inflated the timings."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("some "):
                    return float(dict(f.split("=") for f in line.split()[1:])["avg60"])
    except (OSError, KeyError, ValueError):
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MiB): ``VmHWM`` of ``/proc/self/status`` where there is one
    (``ru_maxrss`` survives ``exec``, so it can report the peak of the process that started this one)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20
