"""Wall-clock timing and peak memory, shared by the command-line tools and the benchmarks."""
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
