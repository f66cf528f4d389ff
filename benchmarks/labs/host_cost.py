"""Where a GPU layer call's host time goes: back-to-back calls of one layer on a device-resident input (public API:
``qconv.quantize_weight`` defaults, ``qconv.Conv2d``/``qconv.Linear`` on an OpenCL device, a
``pyopencl.array.Array`` input on the layer's call queue), per scheme: the median time for a call to return
(no ``finish``), with and without ``out=``, the wall time per call (one ``finish`` at the end), and cProfile's
top functions by own time over the ``out=`` calls.

    python -m benchmarks.labs.host_cost [--device opencl] [--case "conv3x3 256@14"] [--calls 300] [--top 8]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

CASES = {  # name -> (N, C, O, H, W, k, stride, pad)
    "conv3x3 256@14": (1, 256, 256, 14, 14, 3, 1, 1),
    "conv3x3 128@28": (1, 128, 128, 28, 28, 3, 1, 1),
    "conv3x3 64@56": (1, 64, 64, 56, 56, 3, 1, 1),
    "conv1x1 256->1024@14": (1, 256, 1024, 14, 14, 1, 1, 0),
    "gemv 4096->4096": (1, 4096, 4096, 1, 1, 1, 1, 0),
    "linear 64->64": (1, 64, 64, 1, 1, 1, 1, 0),
}
SCHEMES = {"int8": (8, None), "int4": (4, None), "int8+a8": (8, "row"), "int4+a8": (4, "row")}


def layer_for(case: str, scheme: str, device: str, rng):
    import qconv

    n, c, o, h, w, k, s, p = CASES[case]
    bits, act_quant = SCHEMES[scheme]
    wf = rng.standard_normal((o, c, k, k)).astype(np.float32) * 0.05
    bias = rng.standard_normal(o).astype(np.float32)
    if h == w == 1:
        return (qconv.Linear(qconv.quantize_weight(wf.reshape(o, c), bits=bits), bias, device=device,
                             act_quant=act_quant), rng.standard_normal((n, c)).astype(np.float32))
    return (qconv.Conv2d(qconv.quantize_weight(wf, bits=bits), bias, s, p, device=device, act_quant=act_quant),
            rng.standard_normal((n, c, h, w)).astype(np.float32))


def returns_us(fn, calls: int) -> float:
    """Median us for ``fn()`` to return over ``calls`` back-to-back calls."""
    ts = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t
    return float(np.median(ts)) * 1e6


def main(argv=None):
    import pyopencl.array as cla

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--case", action="append", choices=list(CASES))
    ap.add_argument("--scheme", action="append", choices=list(SCHEMES))
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    for case in args.case or ["conv3x3 256@14", "conv1x1 256->1024@14", "linear 64->64"]:
        for scheme in args.scheme or list(SCHEMES):
            layer, x = layer_for(case, scheme, args.device, rng)
            q = layer.engine.queue
            xd = cla.to_device(q, x)
            y = layer(xd)  # tunes, plans
            for _ in range(50):
                layer(xd, out=y)
            q.finish()
            new = returns_us(lambda: layer(xd), args.calls)
            q.finish()
            t0 = time.perf_counter()
            reuse = returns_us(lambda: layer(xd, out=y), args.calls)
            q.finish()
            wall = (time.perf_counter() - t0) / args.calls * 1e6
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                layer(xd, out=y)
            prof.disable()
            q.finish()
            print(f"\n== {case} {scheme}: returns {new:.1f} us (new output) / {reuse:.1f} us (out=), wall "
                  f"{wall:.1f} us per call; {layer.engine.describe()}")
            st = pstats.Stats(prof)
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
            for (fname, line, func), (cc, nc, tt, ct, _) in rows:
                print(f"   {tt / args.calls * 1e6:7.2f} us own {ct / args.calls * 1e6:7.2f} us cum "
                      f"{nc / args.calls:5.1f}x  {func} ({fname.rsplit('/', 1)[-1]}:{line})")


if __name__ == "__main__":
    main()
