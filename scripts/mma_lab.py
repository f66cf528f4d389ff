"""conv_mma lab (H200 experiments, not the engine): every tile of the int8 tensor-core conv on the batched
suite cases, forced one by one: conv_mma's own event time, the span with quant_rows_i8, ptxas' registers,
the max error against the oracle; beside torch's cuDNN fp32 / fp16 conv or bf16 matmul when importable.

    python3 scripts/mma_lab.py            # on the GPU machine (wheels + ICD as in scripts/h200.sh)
    LAB_SMALL=1 python scripts/mma_lab.py # a small smoke run on PoCL
"""
import os
import re
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import pyopencl.array as cla  # noqa: E402

import bench_gpu as bg  # noqa: E402
import qconv  # noqa: E402
from qconv import gpu  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402

SMALL = bool(os.environ.get("LAB_SMALL"))
REP = 5 if SMALL else 20
ctx, dev = gpu.resolve("opencl")
NV = "NVIDIA" in dev.platform.name.upper()
CASES = [  # (name, kind, N, C, O, H, W, k, stride, pad, schemes)
    ("b32 conv3x3 256@14", "conv", 32, 256, 256, 14, 14, 3, 1, 1, ["int8+a8", "int4+a8"]),
    ("b32 conv1x1 256->1024@14", "conv", 32, 256, 1024, 14, 14, 1, 1, 0, ["int8+a8"]),
    ("conv3x3 256@14", "conv", 1, 256, 256, 14, 14, 3, 1, 1, ["int8+a8"]),
    ("conv3x3 64@56", "conv", 1, 64, 64, 56, 56, 3, 1, 1, ["int8+a8"]),
    ("gemm b8 4096->4096", "gemv", 8, 4096, 4096, 1, 1, 1, 1, 0, ["int4+a8"]),
    ("gemm b32 4096->4096", "gemv", 32, 4096, 4096, 1, 1, 1, 1, 0, ["int4+a8"]),
    ("gemm b32 8192->28672", "gemv", 32, 8192, 28672, 1, 1, 1, 1, 0, ["int4-b32-asym+a8"]),
]
if SMALL:
    CASES = [("b4 conv3x3 64@14", "conv", 4, 64, 64, 14, 14, 3, 1, 1, ["int8+a8", "int4-b32-asym+a8"])]


class Args:
    repeat = REP


rng = np.random.default_rng(0)
for case in CASES:
    name, kind, n, c, o, h, w, k, s, p, schemes = case
    for scheme in schemes:
        qw = bg.make_weight(rng, o, c, k, scheme, True)
        spec = ConvSpec(qw, rng.standard_normal(o).astype(np.float32) * np.float32(0.1), s, p, 1, None, "row")
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        ref = qconv.reference.conv2d(x, qw, spec.bias, s, p, 1, None, act_quant="row")
        base = bg.torch_baselines(case, scheme, (x, qw, spec), Args) if not SMALL else {}
        torch_s = "  ".join(f"{k_[6:-3]}={v:.1f}" for k_, v in base.items() if k_.endswith("_us"))
        print(f"## {name} {scheme}  torch: {torch_s}", flush=True)
        for variant in gpu.MMA_VARIANTS:
            eng = gpu.OpenCLEngine(spec, tune="none", variant=variant)
            xd = cla.to_device(eng.queue, x)
            yd = eng.forward(xd, "nchw")
            plan = eng.plans[("nchw", n, h, w)]
            bufs = (xd.base_data, yd.base_data)
            q = eng.queue
            nth = 32 * gpu.MMA_VARIANTS[variant][0] * gpu.MMA_VARIANTS[variant][1]
            for ksub in eng._mma_ksubs(variant):
                lws = (nth, ksub)
                yd.fill(np.float32(np.nan))
                plan.cand.launch(q, lws, bufs).wait()
                err = float(np.abs(yd.get() - ref).max() / np.abs(ref).max())
                spans, alone = [], []
                for _ in range(REP):
                    ev = plan.cand.launch(q, lws, bufs)
                    ev.wait()
                    a, b = plan.cand.info["state"]["events"]
                    spans.append(b.profile.end - a.profile.start)
                    alone.append(b.profile.end - b.profile.start)
                regs = ""
                if NV:
                    from qconv.gpu.programs import get_program
                    prog = get_program(eng.ctx, "conv_mma", plan.cand.options + (f"-DKSUB={ksub}", "-cl-nv-verbose"))
                    log = prog.get_build_info(dev, __import__("pyopencl").program_build_info.LOG)
                    m = re.findall(r"Used (\d+) registers", log)
                    regs = f" regs={m[0] if m else '?'}"
                flops = 2.0 * n * o * c * k * k * yd.shape[2] * yd.shape[3]
                t = statistics.median(alone)
                print(f"  {variant:12s} ksub={ksub} mma {t / 1e3:7.1f} us  with quant {statistics.median(spans) / 1e3:7.1f} us"
                      f"  {flops / t / 1e3:6.1f} TOP/s  err={err:.1e}{regs}", flush=True)
