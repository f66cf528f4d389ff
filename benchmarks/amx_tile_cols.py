"""AMX engine: median ms per tile_cols on the benchmark's conv cases (2 threads; run under taskset -c 0,1)."""
import time

import numpy as np

import qconv
from qconv.cpu import CpuEngine
from qconv.geometry import ConvSpec

rng = np.random.default_rng(0)
for name, o, i, k, h, s, p in [("3x3 64ch@56", 64, 64, 3, 56, 1, 1), ("3x3 128ch@28", 128, 128, 3, 28, 1, 1),
                               ("3x3 256ch@14", 256, 256, 3, 14, 1, 1), ("3x3 128ch@56 s2", 128, 128, 3, 56, 2, 1),
                               ("1x1 256->1024@14", 1024, 256, 1, 14, 1, 0)]:
    w = qconv.quantize_weight((rng.standard_normal((o, i, k, k)) * 0.1).astype(np.float32))
    x = rng.standard_normal((1, i, h, h)).astype(np.float32)
    res = []
    for kern, tc in [("avx512vnni", 16), ("amx", 16), ("amx", 32), ("amx", 64)]:
        eng = CpuEngine(ConvSpec(w, None, s, p), kernel=kern, threads=2, tile_cols=tc)
        for _ in range(20):
            eng.forward(x)
        ts = []
        for _ in range(200):
            t0 = time.perf_counter()
            eng.forward(x)
            ts.append(time.perf_counter() - t0)
        res.append(f"{kern}/{tc} {1e3 * np.median(ts):.3f}")
    print(f"{name:18s} " + "  ".join(res), flush=True)
