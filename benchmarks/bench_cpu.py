#!/usr/bin/env python
"""Benchmark of the qconv CPU engine against baselines measured in the same process (not a test).

Fixed suite: 3x3 convs 64ch@56x56, 128ch@28x28, 256ch@14x14, 128ch@56x56 stride 2; a 1x1 256->1024@14x14;
GEMV (1x1 conv on 1x1) 4096->4096 and 4096->11008; batch-8 4096->4096. Weight schemes: int8 per-channel
symmetric, int4 block-32 asymmetric, int4 per-channel symmetric. Baselines: numpy float32 im2col + BLAS
matmul (always); onnxruntime float Conv/MatMul, ConvInteger/MatMulInteger (dynamic quantization) and
MatMulNBits (int4 block 32); torch float conv2d/linear and torch.ao dynamic quantized conv/linear -- each
when importable. Threads are fixed to 2 everywhere.

Reported per engine: median ms, GOP/s (2*MACs), relative L2 error against the float64 conv with the
original float weights, and peak RSS of the process during that engine's run (VmHWM, reset per row).
A second table gives qconv's speed-up against each baseline of the same case.

    python benchmarks/bench_cpu.py [--quick] [--json out.json] [--cases SUB[,SUB...]] [--block]
                                   [--kernels avx512vnni[,...]] [--skip SUB[,SUB...]] [--sweeps N]
                                   [--torch-qengine onednn]
    python benchmarks/bench_cpu.py --summarize run1.json run2.json ... [--json all.json]  # median table over runs
    python benchmarks/bench_cpu.py --summarize docs/results/bench_cpu.json --headline  # the README's table

``--summarize`` takes single runs or files it wrote (``--json`` there writes one file holding every run:
``docs/results/bench_cpu.json`` is the current one, see docs/benchmarks_cpu.md).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
import warnings

THREADS = 2
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = str(THREADS)
# every library runs with its own default thread-pool policy (qconv's pool: a 1 ms spin, then sleep;
# libgomp's brief spin for torch; onnxruntime's spinning pool)

import numpy as np  # noqa: E402

import qconv  # noqa: E402
from qconv._timing import peak_rss_mb  # noqa: E402

warnings.filterwarnings("ignore")

CONVS = [  # name, O, I, k, H(=W), stride, padding
    ("3x3 64ch@56", 64, 64, 3, 56, 1, 1),
    ("3x3 128ch@28", 128, 128, 3, 28, 1, 1),
    ("3x3 256ch@14", 256, 256, 3, 14, 1, 1),
    ("3x3 128ch@56 s2", 128, 128, 3, 56, 2, 1),
    ("1x1 256->1024@14", 1024, 256, 1, 14, 1, 0),
]
LINEARS = [  # name, O, K, N
    ("GEMV 4096->4096", 4096, 4096, 1),
    ("GEMV 4096->11008", 11008, 4096, 1),
    ("batch-8 4096->4096", 4096, 4096, 8),
    ("GEMV 8192->28672", 28672, 8192, 1),   # weights larger than the L3 cache: DRAM streaming
]
BIG = 1 << 26   # linears with more weights than this skip the float and int8-per-tensor baselines (GBs of floats)
SCHEMES = [  # name, bits, block_size, symmetric, scale dtype ("auto": quantize_weight's default stored form)
    ("int8 per-channel sym", 8, 0, True, "auto"),
    ("int4 block-32 asym", 4, 32, False, "auto"),
    ("int4 block-32 asym f32", 4, 32, False, "float32"),
    ("int4 per-channel sym", 4, 0, True, "auto"),
]
STATIC = "int8 static (per-channel)"
# same weight scheme, dynamically quantized activations: the peers each qconv scheme must beat (engine prefixes);
# the static scheme's peer is onnxruntime's QLinearConv (the Q/DQ float graph and the bare uint8 node)
PEERS = {
    STATIC: ("onnxruntime QLinearConv",),
    "int8 per-channel sym": ("torch.ao dynamic", "onnxruntime ConvInteger", "onnxruntime MatMulInteger"),
    "int4 block-32 asym": ("onnxruntime MatMulNBits b32",),
    "int4 block-32 asym f32": ("onnxruntime MatMulNBits b32",),
    "int4 per-channel sym": ("onnxruntime MatMulNBits per-channel",),
}


# --- measurement helpers -----------------------------------------------------------------------------------
def _reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _time(fn, min_time, max_reps, warmup_s=0.3):
    # time-based warm-up: thread pools, page faults and clocks settle over the first ~0.2 s
    start = time.perf_counter()
    calls = 0
    while calls < 2 or (time.perf_counter() - start < warmup_s and calls < 200):
        fn()
        calls += 1
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 3 or time.perf_counter() - start < min_time):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def _rel_err(y, ref) -> float:
    y = np.asarray(y, np.float64).reshape(ref.shape)
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))


# --- float references and the numpy baseline ------------------------------------------------------------------
def _im2col(x, k, stride, pad):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    oh, ow = win.shape[2], win.shape[3]
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k), oh, ow


def numpy_conv(x, w, b, stride, pad):
    n = x.shape[0]
    o, k = w.shape[0], w.shape[2]
    cols, oh, ow = _im2col(x, k, stride, pad)
    y = cols @ w.reshape(o, -1).T
    y += b
    return np.ascontiguousarray(y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2))


def float64_conv(x, w, b, stride, pad):
    return numpy_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), stride, pad)


# --- optional baselines -----------------------------------------------------------------------------------------
def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(THREADS)
    return torch


def _ort():
    try:
        import onnx  # noqa: F401  (the models are built with it)
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def _ort_session(model, ort):
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _onnx_model(kind, w, b, stride=1, pad=0, xshape=None, yshape=None):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    if kind == "conv":
        o, _, k, _ = w.shape
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride, stride],
                                pads=[pad] * 4)
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
        xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))
        yout = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(yshape))
        graph = helper.make_graph([node], "conv", [xin], [yout], inits)
    else:
        nodes = [helper.make_node("MatMul", ["x", "wt"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
        inits = [numpy_helper.from_array(np.ascontiguousarray(w.T), "wt"), numpy_helper.from_array(b, "b")]
        xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))
        yout = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(yshape))
        graph = helper.make_graph(nodes, "linear", [xin], [yout], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _ort_dynamic(model, ort, per_channel=False):
    """onnxruntime's dynamic int8 quantization (ConvInteger / MatMulInteger), per-tensor or per-channel weights."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "f.onnx"), os.path.join(tmp, "q.onnx")
        onnx.save(model, src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=per_channel)
        return _ort_session(onnx.load(dst), ort)


def _ort_static(model, x, ort):
    """onnxruntime's static int8 conv (QLinearConv, QOperator format, per-channel int8 weights, uint8 activations
    calibrated on this very input: the most favourable static scales)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _One(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": x}])

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "f.onnx"), os.path.join(tmp, "q.onnx")
        onnx.save(model, src)
        quantize_static(src, dst, _One(), quant_format=QuantFormat.QOperator, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        return _ort_session(onnx.load(dst), ort)


class _StaticQuant:
    """Static int8 quantization of one conv case, calibrated on its own input and float output (the most
    favourable static scales, as for ORT's QLinearConv): per-channel symmetric int8 weights ``qw`` (scales as
    stored by default); int8 activations ``xi8 = round(x / sx)`` (zero point 0) for qconv, uint8 ``xu8`` with a
    zero point for onnxruntime (its QLinearConv's activation type); outputs likewise, decoded to float."""

    def __init__(self, x, wf, bf, ref):
        from qconv.weights import round_half_away
        self.qw, self.bias = qconv.quantize_weight(wf, bits=8), bf
        self.sx = float(np.abs(x).max()) / 127
        self.sy = float(np.abs(ref).max()) / 127
        self.xi8 = np.clip(round_half_away(x / np.float32(self.sx)), -127, 127).astype(np.int8)
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        self.sxu, self.zxu = (hi - lo) / 255, int(round(-lo / ((hi - lo) / 255)))
        self.xu8 = np.clip(np.round(x / self.sxu) + self.zxu, 0, 255).astype(np.uint8)
        lo, hi = min(float(ref.min()), 0.0), max(float(ref.max()), 0.0)
        self.syu, self.zyu = (hi - lo) / 255, int(round(-lo / ((hi - lo) / 255)))

    def decode_i8(self, y):
        return y.astype(np.float64) * self.sy

    def decode_u8(self, y):
        return (y.astype(np.float64) - self.zyu) * self.syu


def _ort_qlinearconv_node(sq, stride, pad, yshape):
    """One QLinearConv node with uint8 input and output (no Quantize/DequantizeLinear around it), the same int8
    per-channel weights as qconv's, bias as int32 in the accumulator's scale."""
    from onnx import TensorProto, helper, numpy_helper
    o, _, k, _ = sq.qw.q.shape
    ws = sq.qw.scales.reshape(o).astype(np.float32)
    bias = np.round(sq.bias / (np.float32(sq.sxu) * ws)).astype(np.int32)
    f32 = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    inits = [f32(sq.sxu, "xs"), numpy_helper.from_array(np.asarray(sq.zxu, np.uint8), "xz"),
             numpy_helper.from_array(sq.qw.q, "w"), f32(ws, "ws"), numpy_helper.from_array(np.zeros(o, np.int8), "wz"),
             f32(sq.syu, "ys"), numpy_helper.from_array(np.asarray(sq.zyu, np.uint8), "yz"),
             numpy_helper.from_array(bias, "b")]
    node = helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                            kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    graph = helper.make_graph([node], "qlinearconv", [helper.make_tensor_value_info("xq", TensorProto.UINT8,
                                                                                  list(sq.xu8.shape))],
                              [helper.make_tensor_value_info("yq", TensorProto.UINT8, list(yshape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ort_nbits(w, b, xshape, yshape, ort, block=32):
    """onnxruntime MatMulNBits (com.microsoft): int4, ``block`` values per scale (``block = K``: per channel),
    asymmetric RTN with 4-bit zero points, ``accuracy_level=4`` (int8 activations, its fastest CPU path)."""
    from onnx import TensorProto, helper, numpy_helper
    n_out, k = w.shape
    kb = -(-k // block)
    wp = np.zeros((n_out, kb * block), np.float32)
    wp[:, :k] = w
    blocks = wp.reshape(n_out, kb, block)
    lo = np.minimum(blocks.min(-1), 0)
    hi = np.maximum(blocks.max(-1), 0)
    scale = ((hi - lo) / 15).astype(np.float32)
    safe = np.where(scale > 0, scale, 1)
    zp = np.clip(np.round(-lo / safe), 0, 15).astype(np.uint8)
    u = np.clip(np.round(blocks / safe[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    packed = (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)          # low nibble first
    zpp = np.zeros((n_out, -(-kb // 2) * 2), np.uint8)
    zpp[:, :kb] = zp
    zpp = (zpp[:, 0::2] | (zpp[:, 1::2] << 4)).astype(np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "B", "scales", "zp"], ["m"], domain="com.microsoft",
                            K=k, N=n_out, bits=4, block_size=block, accuracy_level=4)
    add = helper.make_node("Add", ["m", "b"], ["y"])
    inits = [numpy_helper.from_array(packed.reshape(n_out, kb, block // 2), "B"),
             numpy_helper.from_array(scale.reshape(-1), "scales"),
             numpy_helper.from_array(zpp.reshape(-1), "zp"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph([node, add], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(yshape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return _ort_session(model, ort)


# --- the suite ----------------------------------------------------------------------------------------------------
def run(args):
    torch, ort = _torch(), _ort()
    rng = np.random.default_rng(0)
    rows = []
    min_time, max_reps = (0.2, 15) if args.quick else (1.0, 100)
    cases = [("conv",) + c for c in CONVS] + [("linear",) + c for c in LINEARS]
    if args.cases:
        subs = [c.strip().lower() for c in args.cases.split(",") if c.strip()]
        cases = [c for c in cases if any(sub in c[1].lower() for sub in subs)]
    skip = [e.strip() for e in (args.skip or "").split(",") if e.strip()]
    if torch is not None and args.torch_qengine:
        torch.backends.quantized.engine = args.torch_qengine

    def record(case, scheme, engine, fn, ref, ops, build=None, decode=None):
        """Time ``fn`` (or ``build()``'s function) and check its output against ``ref`` (``decode``: int8/uint8
        outputs -> float, outside the timed calls)."""
        if any(sk in engine for sk in skip):
            return
        gc.collect()   # frees the previous engine (and joins its threads) before this one is timed
        _reset_peak_rss()
        try:
            if build is not None:
                fn = build()
            y = fn()
            ms = _time(fn, min_time, max_reps)
        except Exception as exc:  # a baseline that cannot run here is reported, not fatal
            rows.append(dict(case=case, scheme=scheme, engine=engine, error=f"{type(exc).__name__}: {exc}"[:120]))
            return
        rows.append(dict(case=case, scheme=scheme, engine=engine, ms=ms, gops=ops / ms / 1e6,
                         rel_err=_rel_err(y if decode is None else decode(y), ref), peak_rss_mb=peak_rss_mb()))
        print(f"  {case:20s} {scheme:22s} {engine:28s} {ms:9.3f} ms", file=sys.stderr, flush=True)

    for kind, name, o, i, k, h, stride, pad in [(c[0], c[1], c[2], c[3], c[4] if c[0] == "conv" else 1,
                                                  c[5] if c[0] == "conv" else 1, c[6] if c[0] == "conv" else 1,
                                                  c[7] if c[0] == "conv" else 0) for c in cases]:
        if kind == "conv":
            n = 1
            wf = (rng.standard_normal((o, i, k, k)) / np.sqrt(i * k * k)).astype(np.float32)
            x = rng.standard_normal((n, i, h, h)).astype(np.float32)
            bf = (rng.standard_normal(o) * 0.1).astype(np.float32)
            ref = float64_conv(x, wf, bf, stride, pad)
            oh = ref.shape[2]
            ops = 2.0 * n * o * i * k * k * oh * oh
        else:
            n = [c for c in LINEARS if c[0] == name][0][3]
            wf = (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
            x = rng.standard_normal((n, i)).astype(np.float32)
            bf = (rng.standard_normal(o) * 0.1).astype(np.float32)
            ref = x.astype(np.float64) @ wf.T.astype(np.float64) + bf
            ops = 2.0 * n * o * i

        # float baselines (once per case)
        big = kind == "linear" and o * i > BIG
        if kind == "conv":
            record(name, "float32", "numpy im2col+BLAS", lambda: numpy_conv(x, wf, bf, stride, pad), ref, ops)
        elif not big:
            wt = np.ascontiguousarray(wf.T)
            record(name, "float32", "numpy BLAS", lambda: x @ wt + bf, ref, ops)
        if torch is not None and not big:
            tx, tw, tb = torch.from_numpy(x), torch.from_numpy(wf), torch.from_numpy(bf)
            with torch.inference_mode():
                if kind == "conv":
                    record(name, "float32", "torch conv2d",
                           lambda: torch.nn.functional.conv2d(tx, tw, tb, stride, pad).numpy(), ref, ops)
                else:
                    record(name, "float32", "torch linear", lambda: torch.nn.functional.linear(tx, tw, tb).numpy(),
                           ref, ops)
        if ort is not None:
            model = None if big else _onnx_model(kind, wf, bf, stride, pad, x.shape, ref.shape)
            def ort_run(key, make):
                # the session lives only in the timed closure: it (and its spinning thread pool) is gone before
                # the next engine is timed -- otherwise onnxruntime's idle workers steal the cores from it
                def build():
                    s = make()
                    return lambda: s.run(None, {"x": x})[0]
                return build

            if not big:
                record(name, "float32", "onnxruntime " + ("Conv" if kind == "conv" else "MatMul"), None, ref, ops,
                       build=ort_run("f", lambda: _ort_session(model, ort)))
                oname = "onnxruntime " + ("ConvInteger" if kind == "conv" else "MatMulInteger")
                record(name, "int8 dyn (per-tensor)", oname, None, ref, ops,
                       build=ort_run("q", lambda: _ort_dynamic(model, ort)))
                record(name, "int8 dyn (per-channel)", oname + " per-channel", None, ref, ops,
                       build=ort_run("qc", lambda: _ort_dynamic(model, ort, per_channel=True)))
            if kind == "conv":
                record(name, STATIC, "onnxruntime QLinearConv static", None, ref, ops,
                       build=ort_run("s", lambda: _ort_static(model, x, ort)))
                sq = _StaticQuant(x, wf, bf, ref)
                ort_node = _ort_qlinearconv_node(sq, stride, pad, ref.shape)
                record(name, STATIC, "onnxruntime QLinearConv node (u8 in/out)", None, ref, ops,
                       build=lambda: (lambda s=_ort_session(ort_node, ort): lambda: s.run(None, {"xq": sq.xu8})[0])(),
                       decode=sq.decode_u8)
            if kind == "linear":
                record(name, "int4 block-32 asym", "onnxruntime MatMulNBits b32", None, ref, ops,
                       build=ort_run("n", lambda: _ort_nbits(wf, bf, x.shape, ref.shape, ort)))
                record(name, "int4 per-channel asym", "onnxruntime MatMulNBits per-channel", None, ref, ops,
                       build=ort_run("nc", lambda: _ort_nbits(wf, bf, x.shape, ref.shape, ort, block=i)))
        if torch is not None:
            def torch_dyn(per_channel=False):
                import torch.ao.nn.quantized.dynamic as nnqd
                from torch.ao.quantization import (default_dynamic_qconfig, per_channel_dynamic_qconfig,
                                                   quantize_dynamic)
                qc = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
                if kind == "conv":
                    m = torch.nn.Conv2d(i, o, k, stride, pad)
                    spec, mapping = {torch.nn.Conv2d: qc}, {torch.nn.Conv2d: nnqd.Conv2d}
                else:
                    m = torch.nn.Linear(i, o)
                    spec, mapping = {torch.nn.Linear: qc}, {torch.nn.Linear: nnqd.Linear}
                with torch.no_grad():
                    m.weight.copy_(torch.from_numpy(wf.reshape(m.weight.shape)))
                    m.bias.copy_(torch.from_numpy(bf))
                qm = quantize_dynamic(torch.nn.Sequential(m), qconfig_spec=spec, mapping=mapping)
                tx = torch.from_numpy(x)

                def f():
                    with torch.inference_mode():
                        return qm(tx).numpy()
                return f
            tname = "torch.ao dynamic " + ("conv" if kind == "conv" else "linear")
            if not big:
                record(name, "int8 dyn (torch.ao)", tname, None, ref, ops, build=torch_dyn)
            if kind == "linear":   # fbgemm's dynamic conv has no per-channel weights
                record(name, "int8 dyn per-channel (torch.ao)", tname + " per-channel", None, ref, ops,
                       build=lambda: torch_dyn(per_channel=True))

        # qconv, every scheme
        for sname, bits, bs, sym, sdt in SCHEMES:
            def build(bits=bits, bs=bs, sym=sym, sdt=sdt, threads=THREADS):
                w = qconv.quantize_weight(wf, bits=bits, block_size=bs, symmetric=sym, scale_dtype=sdt)
                if kind == "conv":
                    layer = qconv.Conv2d(w, bf, stride, pad, device="cpu", threads=threads)
                else:
                    layer = qconv.Linear(w, bf, device="cpu", threads=threads)
                build.layer = layer
                return lambda: layer(x)
            record(name, sname, "qconv cpu", None, ref, ops, build=build)
            if rows[-1].get("engine") == "qconv cpu" and "ms" in rows[-1]:
                rows[-1]["describe"] = build.layer.engine.describe()
                rows[-1]["weight_bytes"] = build.layer.engine.streamed_bytes
            for kname in [k.strip() for k in (args.kernels or "").split(",") if k.strip()]:
                def build_k(b=build, kname=kname):   # the same layer with a forced micro-kernel
                    old = os.environ.get("QCONV_CPU_KERNEL")
                    os.environ["QCONV_CPU_KERNEL"] = kname
                    try:
                        return b()
                    finally:
                        if old is None:
                            del os.environ["QCONV_CPU_KERNEL"]
                        else:
                            os.environ["QCONV_CPU_KERNEL"] = old
                record(name, sname, f"qconv cpu kernel={kname}", None, ref, ops, build=build_k)
            if kind == "conv" and not args.quick:   # 1 -> 2 thread scaling
                record(name, sname, "qconv cpu 1 thread", None, ref, ops, build=lambda b=build: b(threads=1))
            if args.block:  # act_quant="block" (per pixel x 32-channel blocks) and, for linears, "tensor"
                modes = [("block", 32)] + ([("tensor", 0)] if kind == "linear" else [])
                for aq, ab in modes:
                    def build_b(bits=bits, bs=bs, sym=sym, sdt=sdt, aq=aq, ab=ab):
                        w = qconv.quantize_weight(wf, bits=bits, block_size=bs, symmetric=sym, scale_dtype=sdt)
                        if kind == "conv":
                            layer = qconv.Conv2d(w, bf, stride, pad, device="cpu", threads=THREADS, act_quant=aq,
                                                 act_block=ab)
                        else:
                            layer = qconv.Linear(w, bf, device="cpu", threads=THREADS, act_quant=aq, act_block=ab)
                        return lambda: layer(x)
                    record(name, sname, f"qconv cpu act_quant={aq}", None, ref, ops, build=build_b)
        if kind == "conv":   # the static int8 path: int8 in (input_qparams), int8 out (output_qparams)
            sq = _StaticQuant(x, wf, bf, ref)

            def build_s():
                layer = qconv.Conv2d(sq.qw, bf, stride, pad, device="cpu", threads=THREADS,
                                     input_qparams=(sq.sx, 0), output_qparams=(sq.sy, 0))
                return lambda: layer(sq.xi8)
            record(name, STATIC, "qconv cpu", None, ref, ops, build=build_s, decode=sq.decode_i8)
    return rows


# --- machine ceilings ----------------------------------------------------------------------------------------------
def ceilings():
    """Peak int8 multiply-add rate (1 and THREADS threads) and read bandwidth (a 12 MiB buffer that caches can
    hold, a 512 MiB one that only DRAM can), measured now: the reference for the "% of peak" columns."""
    from qconv._ext import _cpu_probes as _cpu
    c = dict(simd=_cpu.probe_simd(), vnni_gops_1t=_cpu.probe_vnni_gops(1), vnni_gops=_cpu.probe_vnni_gops(THREADS),
             amx_gops_1t=_cpu.probe_amx_gops(1), amx_gops=_cpu.probe_amx_gops(THREADS))
    for key, size in (("read_gbs_cache", 12 << 20), ("read_gbs_dram", 512 << 20)):
        buf = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
        gbs, chk = _cpu.probe_read(buf, THREADS, reps=5)
        if chk != int(np.bitwise_xor.reduce(buf.view(np.uint64))):
            raise RuntimeError("read probe checksum mismatch")
        c[key] = gbs
        del buf
    return c


# --- report -------------------------------------------------------------------------------------------------------
def _peer_rows(rows, r):
    """Same-scheme peers (dynamic activations) of the qconv row ``r``, fastest first."""
    peers = [b for b in rows if b["case"] == r["case"] and "ms" in b and b["engine"] != "qconv cpu"
             and any(b["engine"].startswith(p) for p in PEERS.get(r["scheme"], ()))
             and not b["engine"].startswith("qconv")]
    return sorted(peers, key=lambda b: b["ms"])


def report(rows, ceil, args):
    out = []
    out.append(f"qconv CPU benchmark: {platform.processor() or platform.machine()}, {THREADS} threads, "
               f"kernel {qconv.cpu.select_kernel()}, numpy {np.__version__}"
               + (" (quick)" if args.quick else ""))
    out.append("")
    out.append(f"Ceilings measured in this run: int8 multiply-add peak {ceil['vnni_gops_1t']:.0f} GOP/s on 1 thread, "
               f"{ceil['vnni_gops']:.0f} GOP/s on {THREADS} ({'vpdpbusd' if ceil['simd'] else 'scalar'}); "
               f"read bandwidth {ceil['read_gbs_cache']:.0f} GB/s (12 MiB, cache-resident), "
               f"{ceil['read_gbs_dram']:.0f} GB/s (512 MiB, DRAM)."
               + (f" AMX-INT8 peak (tdpbusd, 2x2 tiles): {ceil['amx_gops_1t']:.0f} GOP/s on 1 thread, "
                  f"{ceil['amx_gops']:.0f} GOP/s on {THREADS}." if ceil.get("amx_gops") else " No AMX."))
    out.append("")
    out.append("| case | scheme | engine | median ms | GOP/s | rel. err vs float | peak RSS MB |")
    out.append("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            out.append(f"| {r['case']} | {r['scheme']} | {r['engine']} | n/a | | | ({r['error']}) |")
        else:
            rng_ms = f" ({r['ms']:.3f}-{r['ms_max']:.3f})" if r.get("ms_max", r["ms"]) != r["ms"] else ""
            out.append(f"| {r['case']} | {r['scheme']} | {r['engine']} | {r['ms']:.3f}{rng_ms} | {r['gops']:.1f} | "
                       f"{r['rel_err']:.2e} | {r['peak_rss_mb']:.0f} |")
    out.append("")
    convs = {c[0] for c in CONVS}
    out.append("qconv against the fastest peer with the same weight scheme and dynamically quantized activations "
               "(ratio = peer ms / qconv ms, > 1: qconv is faster); convs: GOP/s as % of the int8 peak and the "
               "1 -> 2 thread speed-up; linears: weight bytes streamed per second:")
    out.append("")
    out.append("| case | scheme | qconv ms | rel. err | best same-scheme peer | peer ms | peer rel. err | ratio "
               "| % peak / GB/s | 1->2 threads |")
    out.append("|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if not (r["engine"] == "qconv cpu" or r["engine"].startswith("qconv cpu kernel=")) or "ms" not in r:
            continue
        peers = _peer_rows(rows, r)
        p = peers[0] if peers else None
        if r["case"] in convs:
            # the peak probe is vpdpbusd's; without VNNI it is a scalar loop, no ceiling of the AVX2 kernel
            eff = f"{100 * r['gops'] / ceil['vnni_gops']:.0f}%" if ceil["simd"] else "n/a (no VNNI)"
            if ceil.get("amx_gops"):   # and of the AMX peak
                eff += f" / {100 * r['gops'] / ceil['amx_gops']:.0f}% AMX"
            one = [b for b in rows if b["case"] == r["case"] and b["scheme"] == r["scheme"]
                   and b["engine"] == "qconv cpu 1 thread" and "ms" in b]
            scal = f"{one[0]['ms'] / r['ms']:.2f}x" if one else "-"
        else:
            eff = f"{r.get('weight_bytes', 0) / r['ms'] / 1e6:.0f} GB/s"
            scal = "-"
        label = r["scheme"] + (f" [{r['engine'].split('=')[1]}]" if "kernel=" in r["engine"] else "")
        out.append(f"| {r['case']} | {label} | {r['ms']:.3f} | {r['rel_err']:.1e} | "
                   + (f"{p['engine']} | {p['ms']:.3f} | {p['rel_err']:.1e} | {p['ms'] / r['ms']:.2f} | "
                      if p else "(none) | | | | ")
                   + f"{eff} | {scal} |")
    out.append("")
    out.append("qconv speed-up against every baseline (baseline ms / qconv ms; > 1 means qconv is faster):")
    out.append("")
    cols = ["numpy", "torch float", "torch.ao dyn", "ORT float", "ORT int8", "ORT QLinear static", "ORT NBits b32"]
    match = {"numpy": ("numpy im2col+BLAS", "numpy BLAS"), "torch float": ("torch conv2d", "torch linear"),
             "torch.ao dyn": ("torch.ao dynamic conv", "torch.ao dynamic linear"),
             "ORT float": ("onnxruntime Conv", "onnxruntime MatMul"),
             "ORT int8": ("onnxruntime ConvInteger", "onnxruntime MatMulInteger"),
             "ORT QLinear static": ("onnxruntime QLinearConv static",),
             "ORT NBits b32": ("onnxruntime MatMulNBits b32",)}
    out.append("| case | scheme | qconv ms | " + " | ".join(f"x {c}" for c in cols) + " |")
    out.append("|---|---|---:|" + "---:|" * len(cols))
    for r in rows:
        if r["engine"] != "qconv cpu" or "ms" not in r:
            continue
        cells = []
        for c in cols:
            base = [b for b in rows if b["case"] == r["case"] and "ms" in b and b["engine"] in match[c]]
            cells.append(f"{base[0]['ms'] / r['ms']:.2f}" if base else "-")
        out.append(f"| {r['case']} | {r['scheme']} | {r['ms']:.3f} | " + " | ".join(cells) + " |")
    blk = [r for r in rows if r["engine"] == "qconv cpu act_quant=block" and "ms" in r]
    if blk:
        out.append("")
        out.append('act_quant="block" (act_block=32) cost: block ms / ms of the other mode, same weights:')
        out.append("")
        out.append("| case | scheme | block ms | x default mode | x tensor |")
        out.append("|---|---|---:|---:|---:|")
        for r in blk:
            same = [b for b in rows if b["case"] == r["case"] and b["scheme"] == r["scheme"] and "ms" in b]
            dflt = [b["ms"] for b in same if b["engine"] == "qconv cpu"]
            tens = [b["ms"] for b in same if b["engine"] == "qconv cpu act_quant=tensor"] or (
                dflt if r["case"] in convs else [])
            out.append(f"| {r['case']} | {r['scheme']} | {r['ms']:.3f} | "
                       + (f"{r['ms'] / dflt[0]:.2f}" if dflt else "-") + " | "
                       + (f"{r['ms'] / tens[0]:.2f}" if tens else "-") + " |")
    text = "\n".join(out)
    print(text)
    if args.json:
        info = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), machine=_cpu_model(), kernel=qconv.cpu.select_kernel(),
                    numpy=np.__version__, qconv=qconv.__version__, command=" ".join(sys.argv))
        _write_json(args.json, dict(info=info, threads=THREADS, quick=args.quick, ceilings=ceil, rows=rows))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        model = ""
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs"


def _write_json(path, obj):
    """JSON with one row per line (diffable, a tenth of indent=1's lines)."""
    def dump(o, ind):
        if isinstance(o, dict) and any(isinstance(v, (dict, list)) for v in o.values()):
            items = [f'{ind} {json.dumps(k)}: {dump(v, ind + " ")}' for k, v in o.items()]
            return "{\n" + ",\n".join(items) + "\n" + ind + "}"
        if isinstance(o, list) and any(isinstance(v, (dict, list)) for v in o):
            return "[\n" + ",\n".join(f"{ind} {dump(v, ind + ' ')}" for v in o) + "\n" + ind + "]"
        return json.dumps(o)

    with open(path, "w") as fh:
        fh.write(dump(obj, "") + "\n")


def load_runs(paths):
    """Single ``--json`` runs and files of several runs (``{"runs": [...]}``) -> a list of runs."""
    runs = []
    for p in paths:
        with open(p) as fh:
            d = json.load(fh)
        runs += d["runs"] if "runs" in d else [d]
    return runs


def headline(runs):
    """The README's table: per case and scheme the median qconv ms and, in brackets, the median ratio against the
    fastest same-scheme dynamic peer (> 1: qconv is faster)."""
    schemes = [s[0] for s in SCHEMES]
    out = ["| case | " + " | ".join(schemes) + " |", "|---|" + "---:|" * len(schemes)]
    for case in [c[0] for c in CONVS + LINEARS]:
        cells = []
        for scheme in schemes:
            ms, ratio = [], []
            for run in runs:
                q = [b for b in run["rows"] if b["case"] == case and b["scheme"] == scheme
                     and b["engine"] == "qconv cpu" and "ms" in b]
                if q:
                    ms.append(q[0]["ms"])
                    peers = _peer_rows(run["rows"], q[0])
                    if peers:
                        ratio.append(peers[0]["ms"] / q[0]["ms"])
            cells.append((f"{np.median(ms):.3f}" + (f" ({np.median(ratio):.2f}x)" if ratio else "")) if ms else "-")
        out.append(f"| {case} | " + " | ".join(cells) + " |")
    print("\n".join(out))


def summarize(paths):
    """Markdown table over several ``--json`` runs: per qconv row the median ms, the ratio against the fastest
    same-scheme dynamic peer of each run (median, and min-max over the runs), % of the int8 peak (convs) or
    GB/s (linears), and the 1 -> 2 thread speed-up (median)."""
    runs = load_runs(paths)
    med = lambda v: float(np.median(v)) if v else None  # noqa: E731
    out = [f"{len(runs)} runs; ratio = fastest same-scheme dynamic peer ms / qconv ms (> 1: qconv is faster), "
           "median [min-max] over the runs that hold the row", "",
           "| case | scheme | qconv ms | fastest same-scheme peer | ratio | x ORT QLinearConv static "
           "| % int8 peak / GB/s | 1->2 threads |",
           "|---|---|---:|---|---:|---:|---:|---:|"]
    seen, first = set(), []   # every qconv row of any run (partial runs: --cases), in first-seen order
    for run in runs:
        for r in run["rows"]:
            if r["engine"] == "qconv cpu" and "ms" in r and (r["case"], r["scheme"]) not in seen:
                seen.add((r["case"], r["scheme"]))
                first.append(r)
    for r in first:
        ms, ratio, eff, scal, names, static = [], [], [], [], [], []
        for run in runs:
            rows = run["rows"]
            q = [b for b in rows if b["case"] == r["case"] and b["scheme"] == r["scheme"]
                 and b["engine"] == "qconv cpu" and "ms" in b]
            if not q:
                continue
            q = q[0]
            ms.append(q["ms"])
            peers = _peer_rows(rows, q)
            if peers:
                ratio.append(peers[0]["ms"] / q["ms"])
                names.append(peers[0]["engine"])
            static += [b["ms"] / q["ms"] for b in rows if b["case"] == q["case"] and "ms" in b
                       and b["engine"] == "onnxruntime QLinearConv static"]
            if r["case"] in {c[0] for c in CONVS}:
                if run["ceilings"]["simd"]:
                    eff.append(100 * q["gops"] / run["ceilings"]["vnni_gops"])
                one = [b for b in rows if b["case"] == q["case"] and b["scheme"] == q["scheme"]
                       and b["engine"] == "qconv cpu 1 thread" and "ms" in b]
                if one:
                    scal.append(one[0]["ms"] / q["ms"])
            else:
                eff.append(q.get("weight_bytes", 0) / q["ms"] / 1e6)
        conv = r["case"] in {c[0] for c in CONVS}
        peer = max(set(names), key=names.count) if names else "none (no int4 conv peer)"
        rat = f"{med(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]" if ratio else ""
        effs = (f"{med(eff):.0f}%" if conv else f"{med(eff):.0f} GB/s") if eff else ""
        out.append(f"| {r['case']} | {r['scheme']} | {med(ms):.3f} | {peer} | {rat} | "
                   + (f"{med(static):.2f}" if static else "-") + f" | {effs} | "
                   + (f"{med(scal):.2f}x" if scal else "-") + " |")
    c = [run["ceilings"] for run in runs]
    out.append("")
    out.append("Ceilings (median over the runs): int8 multiply-add peak "
               f"{med([x['vnni_gops_1t'] for x in c]):.0f} GOP/s (1 thread) / {med([x['vnni_gops'] for x in c]):.0f} "
               f"GOP/s ({THREADS}); read {med([x['read_gbs_cache'] for x in c]):.0f} GB/s (12 MiB) / "
               f"{med([x['read_gbs_dram'] for x in c]):.0f} GB/s (512 MiB) [DRAM min-max "
               f"{min(x['read_gbs_dram'] for x in c):.0f}-{max(x['read_gbs_dram'] for x in c):.0f}].")
    print("\n".join(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--block", action="store_true",
                   help='also time act_quant="block" (act_block=32), and "tensor" for the linears')
    p.add_argument("--cases", metavar="SUBSTRING", help="only cases whose name contains one of these (comma-separated)")
    p.add_argument("--kernels", metavar="NAMES", help="also time qconv with these micro-kernels forced "
                   "(comma-separated, e.g. avx512vnni; rows 'qconv cpu kernel=NAME')")
    p.add_argument("--skip", metavar="SUBSTRINGS", help="skip engines whose name contains one of these "
                   "(comma-separated, e.g. 'numpy,torch conv2d,onnxruntime Conv')")
    p.add_argument("--sweeps", type=int, default=1, help="run the suite N times; each row keeps its best median "
                   "(and the slowest, shown as a range)")
    p.add_argument("--torch-qengine", metavar="NAME", help="torch.backends.quantized.engine for torch.ao (e.g. "
                   "onednn, x86, fbgemm; default: torch's)")
    p.add_argument("--summarize", nargs="+", metavar="JSON",
                   help="print the same-scheme summary over these --json runs (no benchmarking); with --json, "
                        "also write them into one file")
    p.add_argument("--headline", action="store_true", help="with --summarize: the README's short table instead")
    args = p.parse_args(argv)
    if args.summarize:
        if args.headline:
            headline(load_runs(args.summarize))
        else:
            summarize(args.summarize)
        if args.json:
            runs = load_runs(args.summarize)
            _write_json(args.json, dict(info=runs[-1].get("info", {}), runs=runs))
        return
    import qconv.cpu  # noqa: F401,F811  (fail early when the extension is not built)
    ceil = ceilings()
    rows = run(args)
    for _ in range(max(args.sweeps, 1) - 1):    # best median per row over the sweeps, with the slowest kept
        best = {(r["case"], r["scheme"], r["engine"]): r for r in rows}
        for r in run(args):
            b = best.get((r["case"], r["scheme"], r["engine"]))
            if b is None or "ms" not in r or "ms" not in b:
                continue
            hi = max(b.get("ms_max", b["ms"]), r["ms"])
            if r["ms"] < b["ms"]:
                b.update(r)
            b["ms_max"] = hi
    report(rows, ceil, args)


if __name__ == "__main__":
    main()
