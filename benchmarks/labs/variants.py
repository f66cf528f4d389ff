"""Kernel-variant lab for the OpenCL engine: every variant (and forced local size) of a kernel family on the
benchmark's layers, through the engine's public options only (``variant=``, ``local_size=``, ``tune=``).

For each layer, scheme and variant it prints the kernel the engine ran (``describe()``; with a tuner, the
local size it picked, e.g. conv_mma's KSUB), the device time of one call (its last kernel's OpenCL event),
the time per call of calls queued back to back behind a user event (multi-launch calls included: the
``act_quant="row"`` quantization launches), %copy and the read floor for GEMV rows, and the largest error
against the numpy oracle. It replaced the H200 lab scripts of 0.2.0's development (git history:
``scripts/a8_lab.py``, ``mma_lab.py``, ``gemv_mma_lab.py``); sweeps that need build options or local sizes the
engine does not take publicly (``gemv_a8``'s work-groups per compute unit, ``gemv_mma``'s U, ptxas register
counts) are not here.

    python -m benchmarks.labs.variants --only "gemv 8192" --schemes int8+a8,int4+a8 --variants a8
    python -m benchmarks.labs.variants --only "b32 conv3x3" --schemes int8+a8 --variants mma --baselines
    python -m benchmarks.labs.variants --only "gemv 4096->11008" --schemes int4 --variants gemv_mma \\
        --local-sizes "32,8,1 32,16,1"
    python -m benchmarks.labs.variants --small     # a smoke run on small layers (PoCL)

Families for ``--variants``: general, 1x1, gemm, gemv, a8, mma (the engine's variant tables), or names.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from benchmarks import bench_gpu as bg
import qconv
from qconv import gpu
from qconv.geometry import ConvSpec

FAMILIES = {"general": gpu.GENERAL_VARIANTS, "1x1": gpu.onex1_variants(False), "gemm": gpu.GEMM_VARIANTS,
            "gemv": gpu.GEMV_VARIANTS, "a8": gpu.A8_VARIANTS, "mma": gpu.MMA_VARIANTS}
SMALL = [  # (name, kind, N, C, O, H, W, k, stride, pad, schemes) as in bench_gpu.suite
    ("gemv 256->300", "gemv", 1, 256, 300, 1, 1, 1, 1, 0, ["int8", "int4-b32-asym+a8"]),
    ("b4 conv3x3 32@14", "conv", 4, 32, 32, 14, 14, 3, 1, 1, ["int8+a8", "int4"]),
]


def time_calls(eng, x_dev, repeats):
    """(median event time of a call's last kernel, time per call back to back) in ns. The calls are queued
    behind a user event before any runs; each gets its own Array over x's buffer (an Array that collects
    events waits for old ones, which would wait for the gate)."""
    import pyopencl as cl
    import pyopencl.array as cla

    q = eng.tune_queue  # profiled: event times
    gate = cl.UserEvent(eng.ctx)
    xs = [cla.Array(q, x_dev.shape, x_dev.dtype, data=x_dev.base_data) for _ in range(repeats)]
    xs[0].add_event(gate)
    ys = [eng.forward(x, "nchw") for x in xs]
    gate.set_status(cl.command_execution_status.COMPLETE)
    q.finish()
    ev = [y.events[-1] for y in ys]
    alone = statistics.median(e.profile.end - e.profile.start for e in ev)
    return float(alone), (ev[-1].profile.end - ev[0].profile.end) / (len(ev) - 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--only", default=None, help="cases of benchmarks/bench_gpu.py whose name contains this")
    ap.add_argument("--small", action="store_true", help="small layers instead of the benchmark's (a smoke run)")
    ap.add_argument("--schemes", default=None, help="comma-separated schemes (default: each case's)")
    ap.add_argument("--variants", default="a8", help="comma-separated families or variant names")
    ap.add_argument("--local-sizes", default="", help='forced local sizes, e.g. "64,8,1 128,4,1" (default: tuned)')
    ap.add_argument("--tune", default="fast", help="tuning of the unforced local sizes: none|fast|full")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--baselines", action="store_true", help="torch on CUDA in the same process, when importable")
    ap.add_argument("--fp32-scales", action="store_true", help='scale_dtype="float32" weights (default: '
                    "quantize_weight's float16 scales, as bench_gpu.py)")
    args = ap.parse_args(argv)
    variants = [v for name in args.variants.split(",") for v in FAMILIES.get(name.strip(), [name.strip()])]
    sizes = [tuple(int(v) for v in t.split(",")) for t in args.local_sizes.split()] or [None]

    ctx, dev = gpu.resolve(args.device)
    queue = gpu.context.profiling_queue(ctx, dev)
    bw = bg.copy_bandwidth(ctx, dev, queue, (16 if args.small else 1024) << 20, 10)
    print(f"# {gpu.describe_device(args.device)}: copy {bw / 1e9:.0f} GB/s, empty kernel "
          f"{bg.null_kernel_ns(ctx, queue, 10) / 1e3:.2f} us", flush=True)
    rng = np.random.default_rng(0)
    for case in SMALL if args.small else bg.suite(False):
        name, kind, n, c, o, h, w, k, s, p, schemes = case
        if args.only and args.only not in name:
            continue
        for scheme in args.schemes.split(",") if args.schemes else schemes:
            qw = bg.make_weight(rng, o, c, k, scheme, args.fp32_scales)
            act_quant = "row" if scheme.endswith("+a8") else None
            spec = ConvSpec(qw, rng.standard_normal(o).astype(np.float32) * np.float32(0.1), s, p, 1, None, act_quant)
            x = rng.standard_normal((n, c, h, w)).astype(np.float32)
            ref = qconv.reference.conv2d(x, qw, spec.bias, s, p, 1, None, act_quant=act_quant)
            head = f"## {name} {scheme}"
            if args.baselines:
                base = bg.torch_baselines(case, scheme, (x, qw, spec), argparse.Namespace(repeat=args.repeat))
                head += "  torch: " + " ".join(f"{k_[6:-3]}={v:.1f}us" for k_, v in base.items() if k_.endswith("_us"))
            print(head, flush=True)
            floor = None
            for variant in variants:
                for lws in sizes:
                    try:
                        eng = gpu.OpenCLEngine(spec, device=args.device, tune=args.tune, variant=variant,
                                               local_size=lws, image=False)
                        import pyopencl.array as cla

                        xd = cla.to_device(eng.tune_queue, x)
                        y = eng.forward(xd, "nchw").get()
                        alone, b2b = time_calls(eng, xd, args.repeat)
                    except (ValueError, gpu.OpenCLError) as exc:  # a variant or local size this layer cannot run
                        print(f"  {variant} {lws or ''}: {str(exc)[:110]}", flush=True)
                        continue
                    err = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))
                    line = f"  {eng.describe().split('; ')[-1]:60s} {alone / 1e3:8.1f} us  b2b {b2b / 1e3:8.1f} us"
                    if kind == "gemv" and n == 1:
                        nbytes = (eng.layout.nbytes(qw.q.shape) + qw.scales.size * eng.scale_layout.itemsize
                                  * (1 if qw.offsets is None else 2) + 4 * (c + o))
                        floor = floor or bg.read_floor_ns(ctx, dev, queue, nbytes, 10)
                        line += (f"  {100 * nbytes / alone * 1e9 / bw:5.1f}% copy (read floor "
                                 f"{100 * nbytes / floor * 1e9 / bw:.0f}%)")
                    print(line + f"  err {err:.1e}{' BAD' if err > 1e-4 else ''}", flush=True)
                    del eng


if __name__ == "__main__":
    main()
