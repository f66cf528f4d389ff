"""Every OpenCL kernel under Oclgrind (an OpenCL simulator that checks each memory access): out-of-bounds and
otherwise invalid reads and writes of global, local and private memory, data races (OCLGRIND_DATA_RACES),
and barrier divergence, over every kernel family in both activation modes (float, act_quant="row"), on
small shapes (issue 19 item 6). The emulated tensor-core paths (conv_mma, gemv_mma without -DNV_PTX) run
here; the inline-PTX ones cannot (Oclgrind is no NVIDIA device).

Oclgrind comes from the Debian package ``oclgrind`` (scripts/setup.sh installs it; it registers no ICD, so it
never becomes a device of the other tests): the script runs in a subprocess whose ICD loader sees only
Oclgrind. Without Oclgrind the tests skip, except under CI (tests/conftest.py's rule), where they fail.
Control runs (a copy kernel told to read past its buffer; items storing different values to one word)
show that Oclgrind reports an invalid read and a data race here.
"""
import glob
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import opencl_required

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# what Oclgrind prints for an error it finds (each message starts with one of these)
REPORTS = ("Invalid read", "Invalid write", "data race", "divergence", "Oclgrind - OpenCL runtime error",
           "Uninitialized")


def oclgrind_icd():
    """Oclgrind's ICD library (``$QCONV_OCLGRIND_ICD``, the Debian package's, or the pip wheel's), or None."""
    env = os.environ.get("QCONV_OCLGRIND_ICD")
    candidates = [env] if env else []
    candidates += ["/usr/lib/oclgrind/liboclgrind-rt-icd.so", *glob.glob("/usr/lib/*/oclgrind/liboclgrind-rt-icd.so"),
                   *glob.glob("/usr/local/lib/**/liboclgrind-rt-icd.so", recursive=True)]
    for c in candidates:
        if c and os.path.exists(c):
            return c
    return None


@pytest.fixture(scope="module")
def oclgrind(tmp_path_factory):
    lib = oclgrind_icd()
    if lib is None:
        why = "Oclgrind not installed (apt-get install oclgrind; scripts/setup.sh does it as root)"
        if opencl_required():
            pytest.fail(f"CI: {why}")
        pytest.skip(why)
    vendors = tmp_path_factory.mktemp("oclgrind-icd")
    (vendors / "oclgrind.icd").write_text(lib + "\n")
    return str(vendors)


def _under_oclgrind(vendors, code):
    env = {k: v for k, v in os.environ.items() if k not in ("QCONV_OPENCL_DEVICE", "PYTEST_ADDOPTS")}
    env.update(OCL_ICD_VENDORS=vendors, OCL_ICD_FILENAMES="", OCLGRIND_DATA_RACES="1",
               OCLGRIND_LOCAL_MEM_SIZE=str(256 * 1024),  # gemv_mma's f16 halves of x (Oclgrind's default: 32 KB)
               QCONV_TUNE="none", PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)


def _reports(stderr):
    return [line for line in stderr.splitlines() if any(r in line for r in REPORTS)]


CONTROL = """
import numpy as np, pyopencl as cl
from qconv import gpu
from qconv.gpu import programs
ctx, dev = gpu.resolve("opencl")
print(dev.name)
q = cl.CommandQueue(ctx)
mf = cl.mem_flags
a = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.zeros(4 * 8, np.float32))
b = cl.Buffer(ctx, mf.READ_WRITE, 4 * 4 * 9)
programs.get_kernel(ctx, "util", (), "copy_float4")(q, (9,), None, a, b, np.int32(9))  # 9 float4 of 8
# 16 items store their (different, nonzero) xor folds to dst[0]: a write-write race
src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                hostbuf=np.random.default_rng(0).integers(1, 2**32, 4 * 64, dtype=np.uint32))
programs.get_kernel(ctx, "util", (), "read_uint4_gs")(q, (16,), (16,), src, b, np.int32(64))
q.finish()
print("done")
"""

MEMCHECK = """
import numpy as np, qconv, qconv.gpu as g
import qconv.gpu.engine as E
import qconv.gpu.launch as L
from qconv.geometry import ConvSpec
launched = set()
_get_kernel, _make_kernel = E.get_kernel, L.make_kernel
def get_kernel(ctx, program, options, name):
    launched.add(name)
    return _get_kernel(ctx, program, options, name)
def make_kernel(ctx, program, options, name):
    launched.add(name)
    return _make_kernel(ctx, program, options, name)
E.get_kernel, L.make_kernel = get_kernel, make_kernel
print(g.resolve("opencl")[1].name)
rng = np.random.default_rng(1)
P4 = qconv.layouts.NC4HW4(4)
B = {"image": False}
# (O, I, k, stride, pad, dil, bits, block, sym, groups, N, H, W, act_quant, engine options)
cases = [(13, 7, 3, 2, 1, 2, 8, 0, False, 1, 2, 9, 8, aq, {"variant": v})
         for v in ("c4h1w1", "c8h2w1", "c16h1w4", "c8h1w8") for aq in (None, "row")] + [
    (12, 12, 3, 1, 1, 1, 4, 3, False, 1, 1, 6, 5, None, {}), (12, 12, 3, 1, 1, 1, 8, 4, False, 1, 1, 6, 5, "row", {}),
    (6, 6, 3, 1, 1, 1, 8, 0, False, 3, 1, 5, 5, "row", {}), (6, 6, 3, 1, 1, 1, 4, 0, False, 6, 1, 5, 5, None, {}),
    (6, 6, 3, 1, 1, 1, 4, 0, True, 2, 1, 5, 5, "row", {"ic_pack": 1}),
    (13, 40, 1, 1, 0, 1, 4, 8, False, 1, 3, 1, 1, None, {"local_size": (2, 4, 1), **B}),
    (9, 70, 1, 1, 0, 1, 4, 0, True, 1, 5, 1, 1, "row", {"variant": "buf_c2_r4", "local_size": (2, 2, 1), **B}),
    (9, 64, 1, 1, 0, 1, 8, 32, False, 1, 2, 2, 2, None, {"image": True, "variant": "img_c2_r2"}),
    (9, 70, 1, 1, 0, 1, 4, 0, False, 1, 3, 1, 1, "row", {"image": True, "variant": "img_c1_r4", "local_size": (4, 2, 1)}),
    (20, 40, 3, 1, 1, 1, 8, 0, False, 1, 1, 4, 4, None, {"variant": "gemm_64x8", **B}),
    (20, 40, 1, 1, 0, 1, 4, 8, False, 1, 2, 3, 3, "row", {"variant": "gemm_32x32k2", **B}),
    (13, 72, 1, 1, 0, 1, 8, 0, False, 1, 1, 1, 1, None, {"variant": "gemv_u4", "local_size": (2, 4, 1), **B}),
    (13, 72, 1, 1, 0, 1, 4, 8, True, 1, 1, 1, 1, None, {"variant": "gemv_u8", **B}),
    (13, 80, 1, 1, 0, 1, 8, 0, False, 1, 1, 1, 1, "row", {"variant": "gemv_a8_c1", "local_size": (2, 4, 1), **B}),
    (13, 96, 1, 1, 0, 1, 4, 32, False, 1, 1, 1, 1, "row", {"variant": "gemv_a8_c2", "local_size": (4, 2, 1), **B}),
    (13, 96, 1, 1, 0, 1, 4, 0, True, 1, 1, 1, 1, "row", {"variant": "gemv_a8f_c1", "local_size": (4, 4, 1), **B}),
    (13, 80, 1, 1, 0, 1, 8, 16, False, 1, 1, 1, 1, "row", {"variant": "gemv_a8f_c2", "local_size": (2, 4, 1), **B}),
    (20, 64, 3, 1, 1, 1, 8, 0, False, 1, 2, 3, 3, "row", {"variant": "mma_64x32"}),
    (20, 64, 1, 1, 0, 1, 4, 32, False, 1, 1, 3, 2, "row", {"variant": "mma_64x32"}),
    (20, 128, 1, 1, 0, 1, 4, 64, False, 1, 1, 1, 1, None, {"variant": "gemv_mma", **B}),
    (20, 96, 1, 1, 0, 1, 8, 0, True, 1, 1, 1, 1, None, {"variant": "gemv_mma", "local_size": (32, 2, 1), **B}),
    (20, 40, 3, 1, 1, 1, 4, 0, False, 1, 2, 3, 3, None, {"variant": "mma_x3_64x32"}),
]
programs = set()


def run(o, i, k, s, p, d, bits, block, sym, groups, n, h, w, aq, opts):
    qw = qconv.quantize_weight(rng.standard_normal((o, i // groups, k, k)).astype(np.float32), bits=bits,
                               block_size=block, symmetric=sym, groups=groups)
    b = rng.standard_normal(o).astype(np.float32)
    x = rng.standard_normal((n, i, h, w)).astype(np.float32)
    ref = qconv.reference.conv2d(x, qw, b, s, p, d, "relu6", aq)
    for layout in ("nchw", "nc4hw4"):
        eng = g.OpenCLEngine(ConvSpec(qw, b, s, p, d, "relu6", aq), tune="none", **opts)
        y = eng.forward(x if layout == "nchw" else P4.pack_array(x), layout)
        y = y if layout == "nchw" else P4.unpack_array(y, o)
        plan = next(iter(eng.plans.values()))
        programs.add(f"{plan.cand.program}:{aq or 'float'}")
        assert np.abs(y - ref).max() <= 1e-3 * (np.abs(ref).max() + 1), (plan.cand.program, np.abs(y - ref).max())


for case in cases:
    run(*case)
# samples past act_quant.ONE_GROUP_MAX take row_amax's partial maxima first (forced here on small ones)
from qconv.gpu.families import act_quant
act_quant.ONE_GROUP_MAX = 0
for case in (cases[1], cases[-5], cases[-1]):   # conv_general and conv_mma with act_quant="row", mma_x3
    run(*case)
# past the int32 bound: gemv_a8's folded lane sums (A8_WIDE), 4 output channels (conv_mma's fold past 4096 steps
# takes minutes here: tests/test_gpu_bounds.py runs it on PoCL)
for ic, k, v, o in ((140_000, 1, "gemv_a8_c1", 4),):
    w = qconv.QuantizedWeight(np.full((o, ic, k, k), -128, np.int8), np.ones((o, 1), np.float32),
                              np.full((o, 1), -5.0, np.float32), 8)
    x = np.full((1, ic, k, k), -3.0, np.float32)
    eng = g.OpenCLEngine(ConvSpec(w, None, 1, 0, 1, None, "row"), tune="none", image=False, variant=v)
    y, ref = eng.forward(x), qconv.reference.conv2d(x, w, None, 1, 0, 1, None, "row")
    programs.add(f"{next(iter(eng.plans.values())).cand.program}:row")
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max(), (v, np.abs(y - ref).max())
# check_finite=True on a device array: util.cl's count_nonfinite (NC4HW4 with padding lanes)
import pyopencl.array as cla
qw = qconv.quantize_weight(rng.standard_normal((5, 6, 3, 3)).astype(np.float32), bits=8)
eng = g.OpenCLEngine(ConvSpec(qw, None, 1, 1, 1, None, None), tune="none", check_finite=True)
xd = cla.to_device(eng.queue, P4.pack_array(rng.standard_normal((2, 6, 5, 3)).astype(np.float32)))
eng.forward(xd, "nc4hw4").get()
# a pipeline with residual adds (eltwise.cl's add_act; NCHW with a tail of 1..3 elements, and NC4HW4)
c1 = qconv.Conv2d(qconv.quantize_weight(rng.standard_normal((6, 6, 3, 3)).astype(np.float32)), padding=1,
                  activation="relu", device="opencl", tune="none")
c2 = qconv.Conv2d(qconv.quantize_weight(rng.standard_normal((6, 6, 1, 1)).astype(np.float32)), device="opencl",
                  tune="none")
pipe = qconv.Pipeline([c1, qconv.Residual([c2, c1], activation="relu6")])
x = rng.standard_normal((1, 6, 3, 5)).astype(np.float32)
a = c1(x)
want = np.clip(c1(c2(a)) + a, 0, 6)
assert np.array_equal(pipe(x), want)
assert np.array_equal(P4.unpack_array(pipe(P4.pack_array(x), layout="nc4hw4"), 6), want)
print("programs:", " ".join(sorted(programs)))
print("kernels:", " ".join(sorted(launched)))
print("done")
"""

FAMILIES = {f"{p}:{m}" for p in ("conv_general", "conv_1x1", "conv_gemm") for m in ("float", "row")} | {
    "gemv_a8:row", "conv_mma:row", "gemv_mma:float", "conv_mma:float"}
KERNELS = {"conv_general", "conv_1x1", "gemv_1x1", "conv_gemm", "gemv_a8", "quant_x_a8", "conv_mma", "gemv_mma",
           "row_amax", "quant_rows", "quant_rows_i8", "quant_rows_digits", "count_nonfinite", "add_act"}


def test_oclgrind_reports_a_read_past_a_buffer_and_a_race(oclgrind):
    """The controls: the same set-up reports an out-of-bounds read and a data race (so the test below can
    fail)."""
    r = _under_oclgrind(oclgrind, CONTROL)
    assert r.returncode == 0 and "Oclgrind" in r.stdout and "done" in r.stdout, r.stdout + r.stderr[-3000:]
    assert any("Invalid read" in line for line in _reports(r.stderr)), r.stderr[-3000:]
    assert any("Write-write data race" in line for line in _reports(r.stderr)), r.stderr[-3000:]


def test_every_kernel_family_under_oclgrind(oclgrind):
    r = _under_oclgrind(oclgrind, MEMCHECK)
    assert r.returncode == 0 and "done" in r.stdout, r.stdout[-2000:] + r.stderr[-5000:]
    assert r.stdout.splitlines()[0] == "Oclgrind Simulator", r.stdout[:500]
    programs = set(next(line for line in r.stdout.splitlines() if line.startswith("programs:")).split()[1:])
    kernels = set(next(line for line in r.stdout.splitlines() if line.startswith("kernels:")).split()[1:])
    assert FAMILIES <= programs, FAMILIES - programs
    assert KERNELS <= kernels, KERNELS - kernels
    assert not _reports(r.stderr), "\n".join(_reports(r.stderr)[:20]) + "\n" + r.stderr[-3000:]


GRAPH = """
import warnings
import numpy as np, onnx, onnxruntime as ort, pyopencl as cl
from onnx import TensorProto, helper, numpy_helper
import qconv.onnx as qo
warnings.simplefilter("ignore")
from qconv import gpu
print(gpu.resolve("opencl")[1].name)
rng = np.random.default_rng(2)
F = TensorProto.FLOAT
c = 4
w = (rng.standard_normal((8, c, 1, 1)) * 0.5).astype(np.float32)
inits = {"s": rng.random(c, np.float32) + 0.5, "b": rng.standard_normal(c).astype(np.float32),
         "m": rng.standard_normal(c).astype(np.float32), "v": rng.random(c, np.float32) + 0.5,
         "cb": rng.standard_normal((1, c, 1, 1)).astype(np.float32), "w": w,
         "st": np.array([1], np.int64), "en": np.array([4], np.int64), "ax": np.array([3], np.int64),
         "pads": np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64), "sc": np.array([1, 1, 2, 2], np.float32)}
nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
         helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("Add", ["r", "cb"], ["a"]),
         helper.make_node("Conv", ["a", "w"], ["cv"]), helper.make_node("DepthToSpace", ["cv"], ["d2s"], blocksize=2,
                                                                       mode="CRD"),
         helper.make_node("Concat", ["a", "x"], ["cat"], axis=1), helper.make_node("Slice", ["cat", "st", "en", "ax"],
                                                                              ["sl"]),
         helper.make_node("Transpose", ["sl"], ["tr"], perm=[0, 1, 3, 2]), helper.make_node("Pad", ["tr", "pads"], ["pd"]),
         helper.make_node("MaxPool", ["pd"], ["mp"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
         helper.make_node("AveragePool", ["a"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("GlobalAveragePool", ["ap"], ["gap"]), helper.make_node("Softmax", ["a"], ["sm"], axis=-1),
         helper.make_node("Resize", ["a", "", "sc"], ["rl"], mode="linear"),
         helper.make_node("Resize", ["a", "", "sc"], ["rn"], mode="nearest"),
         helper.make_node("Sigmoid", ["rn"], ["sg"]), helper.make_node("Transpose", ["sm"], ["smt"], perm=[0, 1, 3, 2]),
         helper.make_node("MatMul", ["sm", "smt"], ["mm"])]
outs = ["d2s", "mp", "gap", "sg", "rl", "mm"]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, c, 3, 5])],
                      [helper.make_tensor_value_info(o, F, None) for o in outs],
                      [numpy_helper.from_array(v, k) for k, v in inits.items()])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
q = qo.quantize_model(m, "int8-ch-sym", min_weights=0)
x = rng.standard_normal((1, c, 3, 5)).astype(np.float32)
ref = qo.InferenceSession(q, device="cpu", act_quant="none").run(None, {"x": x})
sess = qo.InferenceSession(q, device="opencl", tune="none")
for _ in range(2):   # recorded, then replayed
    for y, r in zip(sess.run(None, {"x": x}), ref):
        assert np.abs(y - r).max() <= 1e-4 * (np.abs(r).max() + 1), np.abs(y - r).max()
rec = next(iter(sess.device_graph._recordings.values()))
print("kernels:", " ".join(sorted({k.function_name for k, _, _ in rec.launches if isinstance(k, cl.Kernel)})))
print("done")
"""
GRAPH_KERNELS = {"unary", "binary", "affine", "copy_nd", "fill", "pool2d", "mean_rows", "softmax_rows", "resize2d",
                 "matmul"}


def test_device_graph_kernels_under_oclgrind(oclgrind):
    """Every kernel of the device graph (graph_ops.cl), recorded and replayed, on a small graph of every
    operator it runs (and a qconv node with depth_to_space), against the CPU session."""
    r = _under_oclgrind(oclgrind, GRAPH)
    assert r.returncode == 0 and "done" in r.stdout, r.stdout[-2000:] + r.stderr[-5000:]
    assert r.stdout.splitlines()[0] == "Oclgrind Simulator", r.stdout[:500]
    kernels = set(next(line for line in r.stdout.splitlines() if line.startswith("kernels:")).split()[1:])
    assert GRAPH_KERNELS <= kernels, GRAPH_KERNELS - kernels
    assert not _reports(r.stderr), "\n".join(_reports(r.stderr)[:20]) + "\n" + r.stderr[-3000:]
