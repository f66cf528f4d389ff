"""gemv_a8 lab (H200 experiments, not the engine): times the fused int8-activation GEMV (gemv_a8f) over
build options and local sizes (l0, SPLIT, work-groups per compute unit: the engine's candidates, balanced
tiles first, plus LAB_LWS), next to the read floor (a kernel that only reads the same bytes) and the float4
copy. Every configuration's output is checked against the numpy oracle.

    OUT=... python3 scripts/a8_lab.py     # on the GPU machine (wheels + ICD as in scripts/h200.sh)
    LAB_SHAPES="4096x11008 8192x28672" LAB_LWS="64,8,2 128,4,2" python3 scripts/a8_lab.py
    LAB_SMALL=1 python scripts/a8_lab.py  # a small smoke run on PoCL
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

EXTRA = []  # build options appended to gemv_a8's (replacing -DU= when one is given)
_get_kernel = engine_mod.get_kernel


def patched_get_kernel(ctx, program, opts, name):
    if program == "gemv_a8" and name == "gemv_a8" and EXTRA:
        drop = tuple(e.split("=")[0] + "=" for e in EXTRA if "=" in e and " " not in e)
        opts = tuple(o for o in opts if not (drop and o.startswith(drop))) + tuple(EXTRA)
    return _get_kernel(ctx, program, opts, name)


engine_mod.get_kernel = patched_get_kernel
lab = bg.lab_setup((1024, 2048))
ctx, dev, queue, REP, bw, SHAPES, LAB_LWS, NV = (lab.ctx, lab.dev, lab.queue, lab.rep, lab.bw, lab.shapes, lab.lws,
                                                 lab.nv)  # NV: -cl-nv-verbose gives ptxas' registers
rng = np.random.default_rng(0)
EXTRAS = [()]  # e.g. ("-DU=6",): build options to compare
for (K, O), scheme in itertools.product(SHAPES, ("int4", "int4-b32-asym", "int8")):
    qw = bg.make_weight(rng, O, K, 1, scheme, True)
    spec = ConvSpec(qw, rng.standard_normal(O).astype(np.float32) * np.float32(0.1), 1, 0, 1, None, "row")
    eng = gpu.OpenCLEngine(spec, tune="none", variant="gemv_a8f_c1")
    x = rng.standard_normal((1, K, 1, 1)).astype(np.float32)
    xd = cla.to_device(eng.queue, x)
    yd = eng.forward(xd, "nchw")
    ref = qconv.reference.conv2d(x, qw, spec.bias, 1, 0, 1, None, act_quant="row")
    bufs = (xd.base_data, yd.base_data)
    wbytes = eng.layout.nbytes(qw.q.shape)
    nbytes = wbytes + qw.scales.size * eng.scale_layout.itemsize * (1 if qw.offsets is None else 2) + 4 * (K + O)
    floor = bg.read_floor_ns(ctx, dev, queue, nbytes, REP)
    print(f"## {scheme} {K}->{O}: {nbytes / 1e6:.1f} MB, read floor {floor / 1e3:.1f} us "
          f"({100 * nbytes / floor * 1e9 / bw:.1f}% of copy); 85% of copy = {nbytes / (0.85 * bw) * 1e6:.1f} us",
          flush=True)
    cands = {v: eng._a8_candidate(v, "nchw") for v in ("gemv_a8f_c1", "gemv_a8f_c2")}
    results = []

    def run(v, extra, lws):
        global EXTRA
        EXTRA = list(extra)
        c = cands[v]
        try:
            launch = lambda: c.launch(eng.queue, lws, bufs)  # noqa: E731
            ns = bg.profiled_median_ns(eng.queue, launch, REP)
        except Exception as exc:  # noqa: BLE001 (a local size the device refuses)
            print(f"{v} {' '.join(extra):24s} {lws}: {type(exc).__name__} {str(exc)[:80]}")
            return None
        err = float(np.abs(yd.get() - ref).max() / np.abs(ref).max())
        regs = ""
        if NV:  # the build's ptxas report
            opts = tuple(o for o in c.options if not o.startswith(tuple(e.split("=")[0] + "=" for e in EXTRA if "=" in e)))
            opts += tuple(EXTRA) + ("-cl-nv-verbose", f"-DL0={lws[0]}", f"-DSPLIT={lws[1]}")
            log = gpu.programs.get_program(ctx, "gemv_a8", opts).get_build_info(dev, 0x1183)  # BUILD_LOG
            regs = "regs " + ",".join(re.findall(r"Used (\d+) registers", log))
        bad = " BAD" if err > 1e-5 else ""
        results.append((ns, v, extra, lws))
        print(f"{v} {' '.join(extra):24s} {str(lws):10s} {ns / 1e3:7.1f} us {100 * nbytes / ns * 1e9 / bw:5.1f}% "
              f"err {err:.1e}{bad} {regs}", flush=True)
        return ns

    for v in cands:
        sizes = eng._a8_local_sizes(*engine_mod.A8_VARIANTS[v])
        for extra, lws in itertools.product(EXTRAS, list(dict.fromkeys(sizes + LAB_LWS))):
            run(v, extra, lws)
    results.sort()
    for ns, v, extra, lws in results[:3]:  # LAB_U="2 8": deeper / shallower weight prefetch on the best three
        for u in os.environ.get("LAB_U", "").split():
            run(v, extra + (f"-DU={u}",), lws)
    results.sort()
    print("best:", [(round(ns / 1e3, 1), v, " ".join(e), lws) for ns, v, e, lws in results[:5]], flush=True)
    del eng, cands
