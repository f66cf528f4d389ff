"""GEMV lab (experiments on the H200, not the engine): times the kernels of scripts/gemv_lab.cl over a
sweep of U / SPLIT / L0 / NC / DB for int4 and int8 per-channel weights, next to the float4 copy and the
engine's own gemv. Prints GB/s and %copy; dumps PTX (and SASS when ptxas/cuobjdump are found) to $OUT.
docs/benchmarks_gpu.md ("Third pass") has its results.

    python3 scripts/gemv_lab.py                     # on the GPU machine (wheels + ICD as in scripts/h200.sh)
    LAB_SMALL=1 python scripts/gemv_lab.py          # a small smoke run on PoCL
"""
import itertools
import os
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.environ.get("OUT", "/tmp/lab")
os.makedirs(OUT, exist_ok=True)
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = (open(os.path.join(HERE, "..", "qconv", "gpu", "kernels", "common.cl")).read()
       + open(os.path.join(HERE, "gemv_lab.cl")).read())

plat = [p for p in cl.get_platforms() if p.get_devices()][0]
dev = plat.get_devices()[0]
ctx = cl.Context([dev])
q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
print(dev.name, dev.driver_version, flush=True)
ext = dev.extensions
print("dot product ext:", [e for e in ext.split() if "dot" in e or "integer" in e])
mf = cl.mem_flags


def med_ns(fn, reps=30):
    for _ in range(3):
        fn()
    q.finish()
    evs = [fn() for _ in range(reps)]
    q.finish()
    return statistics.median(e.profile.end - e.profile.start for e in evs)


# copy floor
n4 = ((8 if os.environ.get("LAB_SMALL") else 512) << 20) // 16
a = cl.Buffer(ctx, mf.READ_WRITE, n4 * 16)
b = cl.Buffer(ctx, mf.READ_WRITE, n4 * 16)
pc = cl.Program(ctx, SRC).build(options=["-DQB=4", "-DKIND=0", "-DU=1", "-DSPLIT=1", "-DL0=32", "-DNC=1", "-DDB=0"])
kc = pc.copy4
best = 0
for g in (132 * 2048, 132 * 1024, n4):
    t = med_ns(lambda: kc(q, (g,), (256,), a, b, np.int32(n4)), 10)
    best = max(best, 2 * n4 * 16 / t)
COPY = best
print(f"copy floor {COPY:.0f} GB/s", flush=True)
del a, b

rng = np.random.default_rng(0)
K, O = (1024, 1024) if os.environ.get("LAB_SMALL") else (8192, 28672)
results = []


def run_case(qb):
    kc_ = 32 if qb == 4 else 16
    kch = K // kc_
    ocp = O
    wbytes = kch * ocp * 16
    wraw = rng.integers(0, 2**32, size=wbytes // 4, dtype=np.uint64).astype(np.uint32)
    wbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=wraw)
    x = rng.standard_normal(K).astype(np.float32)
    xbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    xqi = np.clip(np.round(x / (np.abs(x).max() / 127)), -127, 127).astype(np.int8)
    xs = np.float32(np.abs(x).max() / 127)
    if qb == 4:  # chunk: words 0..3; per word even bytes then odd bytes -> (kch, 4 words, 2, 4)
        xr = xqi.reshape(kch, 4, 4, 2).transpose(0, 1, 3, 2).copy()
    else:
        xr = xqi.copy()
    xqbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=xr.view(np.uint8))
    sw = (rng.random(O).astype(np.float32) + 0.5) * 0.01
    swbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=sw)
    ybuf = cl.Buffer(ctx, mf.READ_WRITE, 4 * O)
    # oracle
    wb = wraw.view(np.uint8).reshape(kch, ocp, 16)
    if qb == 4:
        nib = np.stack([wb & 15, wb >> 4], -1).reshape(kch, ocp, 32).astype(np.int32) - 8
        qm = nib.transpose(1, 0, 2).reshape(ocp, K)
    else:
        qm = wb.view(np.int8).transpose(1, 0, 2).reshape(ocp, K).astype(np.int32)
    yref = (qm.astype(np.float64) @ x.astype(np.float64)) * sw
    yq = (qm.astype(np.int64) @ xqi.astype(np.int64)) * xs * sw
    nbytes = wbytes + O * 2 + K * 4 + O * 4
    sumxq = int(xqi.astype(np.int64).sum())
    configs = []
    for kind in (0, 1, 2, 3):
        for U, SPLIT, L0, NC, DB in itertools.product((4, 8), (4, 16), (32, 64), (1, 2), (0, 1)):
            if L0 * SPLIT > 1024 or (kind == 2 and (NC, DB) != (1, 0)):
                continue
            if kind == 0 and (NC, DB) != (1, 0):
                continue
            configs.append((kind, U, SPLIT, L0, NC, DB))
    if os.environ.get("LAB_SMALL"):
        configs = [c for c in configs if c[1:4] == (4, 4, 32)]
    for kind, U, SPLIT, L0, NC, DB in configs:
        opts = [f"-DQB={qb}", f"-DKIND={kind}", f"-DU={U}", f"-DSPLIT={SPLIT}", f"-DL0={L0}", f"-DNC={NC}",
                f"-DDB={DB}"]
        extra = ["-DNV_PTX"] if kind == 3 and "NVIDIA" in plat.name.upper() else []
        prg = cl.Program(ctx, SRC).build(options=opts + extra)
        kern = prg.gemv
        gws = (O // NC, SPLIT)
        if O % (L0 * NC):
            continue
        kern.set_args(wbuf, xbuf, xqbuf, np.int32(sumxq), xs, swbuf, ybuf, np.int32(kch), np.int32(ocp))
        fn = lambda: cl.enqueue_nd_range_kernel(q, kern, gws, (L0, SPLIT))  # noqa: E731
        fn()
        y = np.empty(O, np.float32)
        cl.enqueue_copy(q, y, ybuf)
        err = ""
        if kind in (1, 3):
            ref = yref if kind == 1 else yq
            e = np.abs(y - ref).max() / (np.abs(ref).max() + 1e-30)
            err = f"err {e:.1e}"
            if e > (1e-4 if kind == 1 else 1e-5):
                err += " BAD"
        t = med_ns(fn)
        gbs = nbytes / t
        name = f"q{qb} kind{kind} U{U} S{SPLIT} L{L0} NC{NC} DB{DB}"
        results.append((name, t / 1e3, gbs, 100 * gbs / COPY))
        print(f"{name:36s} {t / 1e3:7.1f} us {gbs:6.0f} GB/s {100 * gbs / COPY:5.1f}% {err}", flush=True)
        if (kind, U, SPLIT, L0, NC, DB) in ((1, 4, 16, 32, 1, 0), (3, 4, 16, 32, 1, 0), (1, 4, 16, 32, 2, 1)):
            ptx = prg.get_info(cl.program_info.BINARIES)[0]
            fn_ = os.path.join(OUT, f"q{qb}_k{kind}_U{U}_S{SPLIT}_NC{NC}_DB{DB}.ptx")
            open(fn_, "wb").write(ptx.rstrip(b"\0"))  # NVIDIA's binary is the PTX text, NUL-terminated
    return nbytes


for qb in (4, 8):
    run_case(qb)

# engine baseline, same run
import qconv  # noqa: E402
from qconv import gpu  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402

for bits in (4, 8):
    w = rng.standard_normal((O, K)).astype(np.float32)
    qw = qconv.quantize_weight(w.reshape(O, K, 1, 1), bits=bits, block_size=0, symmetric=True,
                               scale_dtype="float16")
    spec = ConvSpec(qw, None, act_quant=None)
    eng = gpu.OpenCLEngine(spec, "opencl", tune="fast")
    xx = rng.standard_normal((1, K, 1, 1)).astype(np.float32)
    eng.forward(xx)
    print("engine", bits, eng.describe(), flush=True)

ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
cuobj = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
for f in sorted(os.listdir(OUT)):
    if f.endswith(".ptx"):
        p = os.path.join(OUT, f)
        r = subprocess.run([ptxas, "-arch=sm_90", "-v", p, "-o", p[:-4] + ".cubin"], capture_output=True, text=True)
        print(f, r.stderr[-600:])
        if os.path.exists(p[:-4] + ".cubin"):
            r = subprocess.run([cuobj, "-sass", p[:-4] + ".cubin"], capture_output=True, text=True)
            open(p[:-4] + ".sass", "w").write(r.stdout)
            os.remove(p[:-4] + ".cubin")
