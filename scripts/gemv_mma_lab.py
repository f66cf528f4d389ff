"""gemv_mma lab (H200 experiments, not the engine): times the f16 tensor-core GEMV (float activations) over
local sizes (32, SPLIT, g: work-groups per compute unit) and U (loads in flight per lane), next to the read
floor, the float4 copy and the engine's tuned float-activation choice. Every output is checked against the
numpy oracle.

    OUT=... python3 scripts/gemv_mma_lab.py     # on the GPU machine (wheels + ICD as in scripts/h200.sh)
    LAB_SHAPES="4096x11008" LAB_LWS="32,8,2" LAB_U="2 4 6" python3 scripts/gemv_mma_lab.py
    LAB_SMALL=1 python scripts/gemv_mma_lab.py  # a small smoke run on PoCL
"""
import itertools
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import pyopencl.array as cla  # noqa: E402

import bench_gpu as bg  # noqa: E402
import qconv  # noqa: E402
from qconv import gpu  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.gpu import engine as engine_mod  # noqa: E402

lab = bg.lab_setup((256, 300))
ctx, dev, queue, REP, bw, SHAPES, LAB_LWS, NV = (lab.ctx, lab.dev, lab.queue, lab.rep, lab.bw, lab.shapes, lab.lws,
                                                 lab.nv)  # NV: -cl-nv-verbose gives ptxas' registers
U0 = engine_mod.GEMV_MMA_VARIANTS["gemv_mma"]  # the engine's loads in flight per lane
US = [int(u) for u in os.environ.get("LAB_U", str(U0)).split()]
rng = np.random.default_rng(0)
for (K, O), scheme in itertools.product(SHAPES, ("int4", "int4-b32-asym", "int8")):
    qw = bg.make_weight(rng, O, K, 1, scheme, True)
    bias = rng.standard_normal(O).astype(np.float32) * np.float32(0.1)
    spec = ConvSpec(qw, bias, 1, 0, 1, None, None)
    x = rng.standard_normal((1, K, 1, 1)).astype(np.float32)
    ref = qconv.reference.conv2d(x, qw, bias, 1, 0, 1, None, act_quant=None)
    tuned = gpu.OpenCLEngine(spec, tune="fast", image=False)
    xd = cla.to_device(tuned.queue, x)
    yd = tuned.forward(xd, "nchw")
    plan = tuned.plans[("nchw", 1, 1, 1)]
    bufs = (xd.base_data, yd.base_data)
    base_ns = bg.profiled_median_ns(tuned.queue, lambda: plan.cand.launch(tuned.queue, plan.lws, bufs), REP)
    nbytes = (tuned.layout.nbytes(qw.q.shape) + qw.scales.size * tuned.scale_layout.itemsize
              * (1 if qw.offsets is None else 2) + 4 * (K + O))
    floor = bg.read_floor_ns(ctx, dev, queue, nbytes, REP)
    print(f"## {scheme} {K}->{O}: {nbytes / 1e6:.1f} MB, read floor {floor / 1e3:.1f} us "
          f"({100 * nbytes / floor * 1e9 / bw:.1f}% of copy); 85% of copy = {nbytes / (0.85 * bw) * 1e6:.1f} us; "
          f"tuned {plan.describe()}: {base_ns / 1e3:.1f} us ({100 * nbytes / base_ns * 1e9 / bw:.1f}%)", flush=True)
    results = []
    for u in US:
        eng = gpu.OpenCLEngine(spec, tune="none", image=False, variant="gemv_mma")
        engine_mod.GEMV_MMA_VARIANTS["gemv_mma"] = u  # the candidate's -DU=
        cand = eng._gemv_mma_candidate("gemv_mma", "nchw")
        xe = cla.to_device(eng.queue, x)
        ye = cla.zeros(eng.queue, (1, O, 1, 1), np.float32)
        for lws in list(dict.fromkeys(cand.local_sizes + LAB_LWS)):
            try:
                launch = lambda: cand.launch(eng.queue, lws, (xe.base_data, ye.base_data))  # noqa: E731
                ns = bg.profiled_median_ns(eng.queue, launch, REP)
            except Exception as exc:  # noqa: BLE001 (a local size the device refuses)
                print(f"U={u} {lws}: {type(exc).__name__} {str(exc)[:100]}")
                continue
            err = float(np.abs(ye.get() - ref).max() / np.abs(ref).max())
            regs = ""
            if NV:
                opts = cand.options + ("-cl-nv-verbose", f"-DSPLIT={lws[1]}")
                log = gpu.programs.get_program(eng.ctx, "gemv_mma", opts).get_build_info(dev, 0x1183)
                regs = "regs " + ",".join(re.findall(r"Used (\d+) registers", log))
            results.append((ns, u, lws))
            print(f"gemv_mma U={u} {str(lws):12s} {ns / 1e3:7.1f} us {100 * nbytes / ns * 1e9 / bw:5.1f}% "
                  f"err {err:.1e}{' BAD' if err > 1e-5 else ''} {regs}", flush=True)
        engine_mod.GEMV_MMA_VARIANTS["gemv_mma"] = U0
        del eng
    results.sort()
    print("best:", [(round(ns / 1e3, 1), u, lws) for ns, u, lws in results[:3]], flush=True)
