"""Wall-clock timing shared by the command-line tools."""
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
