"""Benchmark of qconv's OpenCL engine: the CPU benchmark's suite on one OpenCL device.

Every time is the median of profiled kernel launches (OpenCL events, start to end: device time; torch: CUDA
events around replays of a CUDA graph of 10 calls, per call, so neither side counts Python's dispatch), after the
engine has tuned itself (``--tune``, default ``fast``; results persist in the tuning cache, so a second
run skips tuning: the "setup" column shows it). Weight-streaming cases (1x1 on 1x1 spatial) also report
GB/s = bytes the kernel must read and write (packed weights + scales/offsets as stored + activations +
outputs) / time, next to the float4 copy bandwidth measured in the same run (read + write) and the read floor:
the time of a kernel that only reads as many bytes (``read_floor_us``; its %copy is the most any GEMV of that
size can show: small, L2-resident weights are launch-bound). Schemes
"<scheme>+a8" run with act_quant="row" (int8 activations); when the tuner picks a two-launch variant
(``gemv_a8_c*``), the time spans both (quant_x_a8's start to gemv_a8's end, all launches queued before the
first runs; ``us_host_paced`` in the JSON is the same span with each call running as Python submits it).

User-side columns (the public API, ``qconv.Linear``/``qconv.Conv2d(device=...)`` on an input already on the device
as a ``pyopencl.array.Array``, ``--calls`` calls back to back): ``wall`` = per call over the calls and one
``finish`` at the end (what a Python loop gets), ``host`` = median time for a call to return to Python (no
finish), both also with ``out=`` (a reused output: no Array made). ``--pipeline`` adds pipelines
(``qconv.Pipeline``): 10 linear layers (``--pipeline-width``) and a small conv block with a residual add: wall and
host per forward, the same layers called one by one from Python, and the sum of their kernels' event times.
``--tiny`` (PoCL / CI): a 64->64 Linear (int8, int8+a8) and 64-wide pipelines, small copy, then exits.

    python benchmarks/bench_gpu.py [--device opencl:0:0] [--quick|--tiny] [--pipeline] [--baselines] [--check]
                                   [--json out.json]
    python benchmarks/bench_gpu.py --merge a.json b.json ... --json all.json  # runs of parts of the suite -> one
    python benchmarks/bench_gpu.py --table docs/results/bench_gpu_h200.json     # the markdown table of a result

``--baselines`` adds torch on CUDA when importable: ``F.conv2d`` in float32 with TF32 off (cuDNN) and in fp16
(tensor cores; the faster of NCHW and channels-last), a bf16
``x @ w.T`` (cuBLAS) and ``torch.ops.aten._weight_int4pack_mm`` (int4, group 128), with
``torch.backends.cudnn.benchmark = True`` (what users set): CUDA-graph time per call (``torch_*_us``) and eager
wall per call (``torch_*_wall_us``: ``--calls`` calls back to back, one synchronize).
Weights are ``quantize_weight``'s default stored form (float16 scales/offsets chosen before the codes: the
engine keeps them as fp16); ``--fp32-scales`` times ``scale_dtype="float32"`` weights instead.
Kernel times come from the engines' profiling queue (``engine.tune_queue``); the user-side columns run on the
engines' call queue (``engine.queue``, no profiling), where the input Array lives.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import qconv  # noqa: E402
from qconv import gpu  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402

SCHEMES = {  # name -> (bits, block_size, symmetric); "<name>+a8": the same weights, act_quant="row" (int8 x)
    "int8": (8, 0, True),
    "int4": (4, 0, True),
    "int4-b32-asym": (4, 32, False),
    "int4-b128": (4, 128, True),
}


def suite(quick: bool, tiny: bool = False):
    """(name, kind, N, C, O, H, W, k, stride, pad, schemes)."""
    if tiny:
        return [("linear 64->64", "gemv", 1, 64, 64, 1, 1, 1, 1, 0, ["int8", "int8+a8"])]
    conv_s = ["int8", "int4"] if not quick else ["int8"]
    gemv_s = ["int8", "int4", "int4-b32-asym"] if not quick else ["int4-b32-asym"]
    gemv1_s = gemv_s + [f"{v}+a8" for v in gemv_s]  # float and int8 activations
    conv8_s = conv_s + [f"{v}+a8" for v in conv_s]
    cases = [
        ("conv3x3 64@56", "conv", 1, 64, 64, 56, 56, 3, 1, 1, conv8_s),
        ("conv3x3 128@28", "conv", 1, 128, 128, 28, 28, 3, 1, 1, conv8_s),
        ("conv3x3 256@14", "conv", 1, 256, 256, 14, 14, 3, 1, 1, conv8_s),
        ("conv3x3 128@56 s2", "conv", 1, 128, 128, 56, 56, 3, 2, 1, conv8_s),
        ("conv1x1 256->1024@14", "conv", 1, 256, 1024, 14, 14, 1, 1, 0, conv8_s),
        ("gemv 4096->4096", "gemv", 1, 4096, 4096, 1, 1, 1, 1, 0, gemv1_s),
        ("gemv 4096->11008", "gemv", 1, 4096, 11008, 1, 1, 1, 1, 0, gemv1_s),
    ]
    if not quick:
        cases += [
            ("gemv 8192->28672", "gemv", 1, 8192, 28672, 1, 1, 1, 1, 0, gemv1_s),
            ("gemm b8 4096->4096", "gemv", 8, 4096, 4096, 1, 1, 1, 1, 0, gemv1_s),
            ("gemm b32 4096->4096", "gemv", 32, 4096, 4096, 1, 1, 1, 1, 0, gemv1_s),
            ("gemm b8 8192->28672", "gemv", 8, 8192, 28672, 1, 1, 1, 1, 0, ["int4-b32-asym", "int4-b32-asym+a8"]),
            ("gemm b32 8192->28672", "gemv", 32, 8192, 28672, 1, 1, 1, 1, 0, ["int4-b32-asym", "int4-b32-asym+a8"]),
            ("b32 conv3x3 256@14", "conv", 32, 256, 256, 14, 14, 3, 1, 1, conv8_s),
            ("b32 conv1x1 256->1024@14", "conv", 32, 256, 1024, 14, 14, 1, 1, 0, conv8_s),
        ]
    return cases


def make_weight(rng, o, c, k, scheme, fp32_scales=False):
    """``quantize_weight``'s result as users get it (default stored form: float16 scales/offsets chosen before
    the codes); ``fp32_scales``: ``scale_dtype="float32"`` (the 0.2 default) instead."""
    bits, block, sym = SCHEMES[scheme.removesuffix("+a8")]
    if block and c % block:
        block = 0
    w = rng.standard_normal((o, c, k, k)).astype(np.float32) * np.float32(1 / np.sqrt(c * k * k))
    return qconv.quantize_weight(w, bits=bits, block_size=block, symmetric=sym,
                                 scale_dtype="float32" if fp32_scales else "auto")


def profiled_median_ns(queue, launch, repeats):
    launch().wait()
    events = [launch() for _ in range(repeats)]
    queue.finish()
    return float(statistics.median(e.profile.end - e.profile.start for e in events))


def grid_stride_best_ns(ctx, dev, queue, kernel, n4, bufs, repeats):
    """Fastest event time of the grid-stride ``util`` kernel ``kernel(*bufs, n4)`` over 3 depths (UNR) x
    5 grid sizes (more bytes in flight per item than one-item-per-element kernels)."""
    units, best = int(dev.max_compute_units), float("inf")
    for unr in (2, 4, 8):
        k = gpu.programs.get_kernel(ctx, "util", (f"-DUNR={unr}",), kernel)
        for lws, per_cu in ((256, 8), (512, 4), (1024, 2), (256, 16), (1024, 4)):
            gws = min(units * per_cu * lws, -(-n4 // lws) * lws)
            try:
                ns = profiled_median_ns(queue, lambda: k(queue, (gws,), (lws,), *bufs, np.int32(n4)), repeats)
            except Exception:  # local size too large for this device
                continue
            best = min(best, ns)
    return best


def copy_bandwidth(ctx, dev, queue, nbytes, repeats):
    """Read+write bytes per second of the float4 copy kernel (the best of the plain and grid-stride ones)."""
    import pyopencl as cl

    n4 = nbytes // 16
    a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n4 * 16)
    b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n4 * 16)
    cl.enqueue_fill_buffer(queue, a, np.float32(1), 0, n4 * 16)
    k = gpu.programs.get_kernel(ctx, "util", (), "copy_float4")
    lws = 256 if n4 >= 256 else None
    gws = ((n4 + 255) // 256 * 256,) if lws else (n4,)
    best = profiled_median_ns(queue, lambda: k(queue, gws, (lws,) if lws else None, a, b, np.int32(n4)), repeats)
    best = min(best, grid_stride_best_ns(ctx, dev, queue, "copy_float4_gs", n4, (a, b), repeats))
    return 2 * n4 * 16 / (best * 1e-9)


_read_floors = {}  # (context, bytes) -> ns


def read_floor_ns(ctx, dev, queue, nbytes, repeats):
    """Fastest event time of a read-only stream over ``nbytes`` (``read_uint4_gs``): no kernel that must
    read those bytes can be faster, so bytes / this time is the highest %copy a weight-streaming case can
    show (below the copy for small, launch-bound sizes)."""
    import pyopencl as cl

    key = (ctx.int_ptr, nbytes)
    if key not in _read_floors:
        n4 = -(-nbytes // 16)
        src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, n4 * 16)
        dst = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, 4)
        cl.enqueue_fill_buffer(queue, src, np.uint32(0), 0, n4 * 16)
        _read_floors[key] = grid_stride_best_ns(ctx, dev, queue, "read_uint4_gs", n4, (src, dst), repeats)
    return _read_floors[key]


def gated_times_ns(ctx, queue, plan, bufs, repeats):
    """``repeats`` calls queued behind a user event before any runs. Returns (per call: median of each
    call's span from its first kernel's start to its last kernel's end; back to back: first start to last
    end over ``repeats``), in ns. One-kernel plans: the span is that kernel's event duration."""
    import pyopencl as cl

    gate = cl.UserEvent(ctx)
    spans = [gpu.tuning.launch_span(plan.cand, queue, plan.lws, bufs, wait_for=[gate] if i == 0 else None)
             for i in range(repeats)]
    gate.set_status(cl.command_execution_status.COMPLETE)
    queue.finish()
    per_call = float(statistics.median(b.profile.end - a.profile.start for a, b in spans))
    return per_call, (spans[-1][1].profile.end - spans[0][0].profile.start) / repeats


def host_paced_span_ns(queue, plan, bufs, repeats):
    """gemv_a8's two launches as Python submits them to an idle GPU: median span per call (the gap between
    the kernels then holds the host's submit time)."""
    spans = []
    for _ in range(repeats):
        spans.append(gpu.tuning.launch_span(plan.cand, queue, plan.lws, bufs))
        queue.finish()
    return float(statistics.median(b.profile.end - a.profile.start for a, b in spans))


def null_kernel_ns(ctx, queue, repeats):
    """Event duration of an empty one-item kernel: the per-launch floor under every kernel's time."""
    import pyopencl as cl

    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4)
    k = gpu.programs.get_kernel(ctx, "util", (), "null_kernel")
    return profiled_median_ns(queue, lambda: k(queue, (1,), (1,), buf), repeats)


def _git_commit() -> str:
    """The checkout's commit (+ "-dirty" with local changes), or "" outside a git work tree."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("-dirty" if head and dirty else "")


def call_costs(call, queue, calls):
    """(host us, wall us) of ``calls`` back-to-back ``call()``: host = median time for a call to return (no
    finish), wall = (time of all calls + one ``queue.finish()``) / calls. Two warm-up calls first."""
    call()
    call()
    queue.finish()
    ts = []
    t0 = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    queue.finish()
    wall = (time.perf_counter() - t0) / calls
    return statistics.median(ts) * 1e6, wall * 1e6


def user_costs(layer, xd, queue, calls):
    """The public API's costs on device input ``xd``: host/wall per call, and with ``out=`` a reused output."""
    y = layer(xd)
    host, wall = call_costs(lambda: layer(xd), queue, calls)
    host_out, wall_out = call_costs(lambda: layer(xd, out=y), queue, calls)
    return {"host_us": host, "wall_us": wall, "host_out_us": host_out, "wall_out_us": wall_out}


def bench_ours(case, scheme, device, args, rng, variant=None):
    import pyopencl.array as cla

    name, kind, n, c, o, h, w, k, s, p, _ = case
    qw = make_weight(rng, o, c, k, scheme, args.fp32_scales)
    act_quant = "row" if scheme.endswith("+a8") else None
    spec = ConvSpec(qw, rng.standard_normal(o).astype(np.float32) * np.float32(0.1), s, p, 1, None, act_quant)
    t0 = time.perf_counter()
    eng = gpu.OpenCLEngine(spec, device=device, tune=args.tune if variant is None else "none", variant=variant)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    q = eng.tune_queue  # profiled: event times
    xd = cla.to_device(q, x)
    yd = eng.forward(xd, "nchw")
    q.finish()
    setup_s = time.perf_counter() - t0
    plan = eng.plans[("nchw", n, h, w)]
    bufs = (xd.base_data, yd.base_data)
    plan.cand.launch(q, plan.lws, bufs).wait()
    ns, b2b = gated_times_ns(eng.ctx, q, plan, bufs, args.repeat)
    extra = {"us_b2b": b2b / 1e3}
    if plan.cand.program == "gemv_a8" and not gpu.A8_VARIANTS[plan.variant][1]:  # two launches
        extra["us_gemv_only"] = profiled_median_ns(q, lambda: plan.cand.launch(q, plan.lws, bufs), args.repeat) / 1e3
        extra["us_host_paced"] = host_paced_span_ns(q, plan, bufs, args.repeat) / 1e3
    row = {"case": name, "scheme": scheme, "N": n, "us": ns / 1e3, "variant": plan.variant,
           "lws": plan.lws, "setup_s": setup_s, "scales": eng.scale_layout.dtype, "image": eng.image, **extra}
    wbytes = eng.layout.nbytes(qw.q.shape) if hasattr(eng.layout, "nbytes") else qw.nbytes_q
    sbytes = qw.scales.size * eng.scale_layout.itemsize * (1 if qw.offsets is None else 2)
    moved = wbytes + sbytes + 4 * (x.size + int(np.prod(yd.shape)))
    row["bytes"] = int(moved)
    row["GBps"] = moved / ns
    flops = 2.0 * n * o * c * k * k * yd.shape[2] * yd.shape[3]
    row["GFLOPs"] = flops / ns
    # the public API on a device array (a second engine of the same layer: the tuning cache gives it the same
    # kernel without timing anything)
    opts = dict(device=device, act_quant=act_quant, tune=args.tune if variant is None else "none", variant=variant)
    if kind == "gemv" and h == w == 1:
        layer, xu = qconv.Linear(qw, spec.bias, **opts), x.reshape(n, c)
    else:
        layer, xu = qconv.Conv2d(qw, spec.bias, s, p, **opts), x
    xu = cla.to_device(layer.engine.queue, xu)  # the input on the engines' call queue, as a user makes it
    row.update(user_costs(layer, xu, layer.engine.queue, args.calls))
    if args.check:
        ref = qconv.reference.conv2d(x, qw, spec.bias, s, p, 1, None, act_quant=act_quant)
        err = float(np.abs(yd.get() - ref).max() / max(np.abs(ref).max(), 1e-30))
        row["max_rel_err"] = err
    return row, (x, qw, spec)


def torch_baselines(case, scheme, data, args):
    """Medians (us) of torch on CUDA for the same case, or {} when unavailable."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    x, qw, spec = data
    name, kind, n, c, o, h, w, k, s, p, _ = case
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # what users set: cuDNN times its algorithms per shape
    dev = torch.device("cuda")

    def eager_wall_us(fn):
        """Wall per call of ``args.calls`` eager calls back to back from Python, one synchronize at the end."""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.calls * 1e6

    def cuda_median_us(fn, calls=10):
        """Device time per call: medians over replays of a CUDA graph of ``calls`` back-to-back calls, so the
        host's dispatch cost is left out as it is for our kernels (OpenCL event start to end)."""
        fn()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()  # warm up on the capture stream (cuBLAS workspaces)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
        times = []
        for _ in range(args.repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / calls)
        return float(statistics.median(times))

    out = {}
    wf = torch.from_numpy(qw.dequantize()).to(dev)
    xt = torch.from_numpy(x).to(dev)
    if kind == "conv":
        bias = torch.from_numpy(spec.bias.copy()).to(dev)
        out["torch_conv_fp32_us"] = cuda_median_us(lambda: F.conv2d(xt, wf, bias, s, p))
        out["torch_conv_fp32_wall_us"] = eager_wall_us(lambda: F.conv2d(xt, wf, bias, s, p))
        # fp16 (tensor cores): the faster of NCHW and channels-last operands
        xh, wh, bh = xt.half(), wf.half(), bias.half()
        xl, wl = xh.to(memory_format=torch.channels_last), wh.to(memory_format=torch.channels_last)
        out["torch_conv_fp16_us"] = min(cuda_median_us(lambda: F.conv2d(xh, wh, bh, s, p)),
                                        cuda_median_us(lambda: F.conv2d(xl, wl, bh, s, p)))
        out["torch_conv_fp16_wall_us"] = min(eager_wall_us(lambda: F.conv2d(xh, wh, bh, s, p)),
                                             eager_wall_us(lambda: F.conv2d(xl, wl, bh, s, p)))
    else:
        x2 = xt.reshape(n, c).to(torch.bfloat16)
        w2 = wf.reshape(o, c).to(torch.bfloat16)
        out["torch_bf16_mm_us"] = cuda_median_us(lambda: x2 @ w2.T)
        out["torch_bf16_mm_wall_us"] = eager_wall_us(lambda: x2 @ w2.T)
        try:
            group = 128
            wq = torch.randint(0, 16, (o, c), dtype=torch.int32, device=dev)
            packed_u8 = (wq[:, ::2] << 4 | wq[:, 1::2]).to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
            sz = torch.ones((c // group, o, 2), dtype=torch.bfloat16, device=dev)
            out["torch_int4pack_mm_us"] = cuda_median_us(
                lambda: torch.ops.aten._weight_int4pack_mm(x2, packed, group, sz))
            out["torch_int4pack_mm_wall_us"] = eager_wall_us(
                lambda: torch.ops.aten._weight_int4pack_mm(x2, packed, group, sz))
        except Exception as exc:  # API differs between torch versions
            out["torch_int4pack_mm_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="opencl", help="opencl, opencl:P:D (default: $QCONV_OPENCL_DEVICE or first GPU)")
    ap.add_argument("--quick", action="store_true", help="a small subset with few repeats")
    ap.add_argument("--tiny", action="store_true", help="a 64->64 Linear and 64-wide pipelines (PoCL, CI)")
    ap.add_argument("--calls", type=int, default=None, help="back-to-back calls of the user-side columns")
    ap.add_argument("--pipeline", action="store_true", help="add the pipeline cases")
    ap.add_argument("--pipeline-width", type=int, default=None, help="width of the 10-linear pipeline (4096)")
    ap.add_argument("--repeat", type=int, default=None, help="profiled launches per case (median)")
    ap.add_argument("--tune", default=None, help="none|fast|full (default $QCONV_TUNE or fast)")
    ap.add_argument("--baselines", action="store_true", help="add torch/CUDA baselines when importable")
    ap.add_argument("--check", action="store_true", help="compare every output with the numpy oracle")
    ap.add_argument("--fp32-scales", action="store_true", help="float32 scales (scale_dtype='float32') instead of quantize_weight's default")
    ap.add_argument("--only", default=None, help="run cases whose name contains this text")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--variants", default=None,
                    help="comma-separated kernel variants to time one by one (forced, untuned) instead of the "
                         "tuner's choice; 'gemm' = every GEMM tile; variants a case cannot run are skipped")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge these results into --json (no benchmarking)")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a result (no benchmarking)")
    args = ap.parse_args(argv)
    if args.merge or args.table:
        if args.merge:
            write_json(args.json, merge(args.merge))
        if args.table:
            table(args.table)
        return []
    args.repeat = args.repeat or (3 if args.quick else 20)
    args.calls = args.calls or (2000 if args.tiny else 200)
    args.pipeline = args.pipeline or args.tiny
    args.pipeline_width = args.pipeline_width or (64 if args.tiny else 4096)
    args.tune = gpu.tuning.tune_level(args.tune)

    ctx, dev = gpu.resolve(args.device)
    queue = gpu.context.profiling_queue(ctx, dev)
    copy_bytes = min(1 << 30, int(dev.max_mem_alloc_size) // 4) if not args.quick else 256 << 20
    copy_bytes = 16 << 20 if args.tiny else copy_bytes
    bw = copy_bandwidth(ctx, dev, queue, copy_bytes, args.repeat)
    info = {"device": gpu.describe_device(args.device), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "host": platform.node(), "tune": args.tune, "copy_GBps": bw / 1e9, "command": " ".join(sys.argv),
            "qconv": qconv.__version__, "commit": _git_commit(),
            "null_kernel_us": null_kernel_ns(ctx, queue, args.repeat) / 1e3}
    print(f"# {info['device']}  tune={args.tune}  float4 copy: {bw / 1e9:.1f} GB/s (read+write)  "
          f"empty kernel: {info['null_kernel_us']:.2f} us")
    print(f"{'case':26s} {'scheme':18s} {'us':>8s} {'b2b us':>8s} {'%copy':>6s} {'b2b':>6s} {'GFLOP/s':>8s} "
          f"{'setup s':>7s} {'wall':>7s} {'host':>6s} {'wall o':>7s} {'host o':>6s}  variant  (wall/host: user "
          f"per call, back to back / to return; o: with out=)")
    variants = [None]
    if args.variants:
        variants = [v for name in args.variants.split(",")
                    for v in (gpu.GEMM_VARIANTS if name.strip() == "gemm" else [name.strip()])]
    rows = []
    rng = np.random.default_rng(0)
    for case in suite(args.quick, args.tiny):
        if args.only and args.only not in case[0]:
            continue
        for scheme in case[-1]:
            base = None
            for variant in variants:
                try:
                    row, data = bench_ours(case, scheme, args.device, args, rng, variant)
                except ValueError as exc:  # a forced variant this case cannot run
                    print(f"{case[0]:26s} {scheme:14s} {variant}: {exc}"[:160])
                    continue
                if args.baselines and base is None:
                    base = torch_baselines(case, scheme, data, args)
                if case[1] == "gemv" and case[2] == 1:
                    row["read_floor_us"] = read_floor_ns(ctx, dev, queue, row["bytes"], args.repeat) / 1e3
                rows.append(report(case, row, base or {}, bw))
    if args.pipeline:
        rows += bench_pipelines(args, rng)
    if args.json:
        write_json(args.json, {"info": info, "results": rows})
    return rows


def bench_pipelines(args, rng):
    """10 x W->W int4 linear layers (two residual adds) and a conv block with a residual add, as one
    ``qconv.Pipeline`` call and as the same layers called one by one from Python: wall / host per forward
    (``--calls`` forwards back to back, one finish) against the sum of the kernels' event times."""
    import pyopencl.array as cla

    wd = args.pipeline_width
    opts = dict(device=args.device, tune=args.tune)
    lin = [qconv.Linear(make_weight(rng, wd, wd, 1, "int4", args.fp32_scales),
                        rng.standard_normal(wd).astype(np.float32) * np.float32(0.1), **opts) for _ in range(10)]
    lin_steps = [lin[0], qconv.Residual(lin[1:3]), *lin[3:6], qconv.Residual(lin[6:9]), lin[9]]
    ch, hw = (16, 14) if args.tiny else (64, 56)
    convs = [qconv.Conv2d(make_weight(rng, ch, ch, 3, "int8", args.fp32_scales), None, 1, 1, activation="relu",
                          **opts) for _ in range(3)]
    conv_steps = [convs[0], qconv.Residual(convs[1:3], activation="relu")]
    cases = [(f"pipeline 10x linear {wd}->{wd} int4", lin_steps, lin, (1, wd), 2),
             (f"pipeline conv3x3 block {ch}@{hw} int8", conv_steps, convs, (1, ch, hw, hw), 1)]
    rows = []
    for name, steps, layers, shape, adds in cases:
        pipe = qconv.Pipeline(steps)
        q = layers[0].engine.queue
        xd = cla.to_device(q, rng.standard_normal(shape).astype(np.float32))
        t0 = time.perf_counter()
        y = pipe(xd)
        q.finish()
        setup_s = time.perf_counter() - t0
        kernels = pipe.kernel_times_ns(xd, repeats=args.repeat)
        ksum = sum(ns for _, ns in kernels) / 1e3
        host, wall = call_costs(lambda: pipe(xd), q, args.calls)
        host_o, wall_o = call_costs(lambda: pipe(xd, out=y), q, args.calls)

        def by_hand():  # the same layers from Python, one call each (the adds as pyopencl expressions)
            if adds == 2:
                a = lin[0](xd)
                a = lin[2](lin[1](a)) + a
                for layer in lin[3:6]:
                    a = layer(a)
                a = lin[8](lin[7](lin[6](a))) + a
                return lin[9](a)
            a = convs[0](xd)
            b = convs[2](convs[1](a)) + a
            return b  # (relu of the add left out: one pyopencl kernel fewer than the pipeline)

        host_h, wall_h = call_costs(by_hand, q, max(20, args.calls // 4))
        row = {"case": name, "scheme": "pipeline", "launches": len(kernels), "kernel_sum_us": ksum,
               "wall_us": wall, "host_us": host, "wall_out_us": wall_o, "host_out_us": host_o,
               "layers_one_by_one_wall_us": wall_h, "layers_one_by_one_host_us": host_h, "setup_s": setup_s,
               "target_us": 1.1 * ksum + 50}
        print(f"{name:40s} kernels {ksum:8.1f} us ({len(kernels)} launches)  wall {wall:8.1f}  host {host:7.1f}"
              f"  out= wall {wall_o:8.1f} host {host_o:7.1f}  layers one by one: wall {wall_h:8.1f} host {host_h:7.1f}"
              f"  (target wall <= 1.1 x kernels + 50 = {row['target_us']:.1f})", flush=True)
        rows.append(row)
    return rows


def write_json(path, result):
    """``{"info": ..., "results": [...]}`` with one row per line."""
    with open(path, "w") as fh:
        fh.write('{"info": ' + json.dumps(result["info"]) + ',\n "results": [\n  '
                 + ",\n  ".join(json.dumps(r) for r in result["results"]) + "\n ]}\n")


def merge(paths):
    """Results of runs over parts of the suite (``--only``) -> one result in suite order; a later file's row
    replaces an earlier one's for the same (case, scheme); ``info.parts`` keeps each run's info."""
    rows, parts = {}, []
    for p in paths:
        with open(p) as fh:
            d = json.load(fh)
        parts += d["info"].get("parts", [d["info"]])
        for r in d["results"]:
            rows[(r["case"], r["scheme"])] = r
    order = {(c[0], s): i for i, c in enumerate(suite(False)) for s in c[-1]}
    info = {"device": parts[-1]["device"], "date": max(p["date"] for p in parts), "parts": parts}
    return {"info": info, "results": sorted(rows.values(), key=lambda r: order.get((r["case"], r["scheme"]), 1e9))}


def table(path):
    """The markdown table of a ``--json`` result: one call's device time, %copy (and that of a read-only kernel of
    the same bytes), torch in the same run, the tuner's kernel and the error against the oracle."""
    with open(path) as fh:
        d = json.load(fh)
    out = ["| case | scheme | us | wall us | host us | wall / host us, out= | %copy | read floor %copy "
           "| torch us (same run) | kernel, local size | max rel err |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    names = {"torch_conv_fp32_us": "cuDNN fp32", "torch_conv_fp16_us": "fp16", "torch_bf16_mm_us": "bf16",
             "torch_int4pack_mm_us": "int4pack"}
    num = lambda r, k: f"{r[k]:.1f}" if r.get(k) is not None else ""  # noqa: E731
    pipes = [r for r in d["results"] if r.get("scheme") == "pipeline"]
    for r in d["results"]:
        if r.get("scheme") == "pipeline":
            continue
        torch = " / ".join(f"{n} {r[k]:.1f}" + (f" (eager wall {r[k[:-3] + '_wall_us']:.1f})"
                                                if k[:-3] + "_wall_us" in r else "")
                           for k, n in names.items() if k in r)
        pct = lambda k: f"{r[k]:.0f}" if r.get(k) is not None else ""  # noqa: E731
        lws = "driver" if r["lws"] is None else "x".join(map(str, r["lws"]))
        err = f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else ""
        out.append(f"| {r['case']} | {r['scheme']} | {r['us']:.1f} | {num(r, 'wall_us')} | {num(r, 'host_us')} "
                   f"| {num(r, 'wall_out_us')} / {num(r, 'host_out_us')} | {pct('pct_copy')} "
                   f"| {pct('pct_copy_read_floor')} | {torch} | {r['variant']} {lws} | {err} |")
    if pipes:
        out += ["", "| pipeline | kernels us (sum) | wall us | host us | wall / host us, out= "
                "| layers one by one: wall / host us | target: 1.1 x kernels + 50 |", "|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['case']} | {r['kernel_sum_us']:.1f} | {r['wall_us']:.1f} | {r['host_us']:.1f} "
                f"| {r['wall_out_us']:.1f} / {r['host_out_us']:.1f} | {r['layers_one_by_one_wall_us']:.1f} / "
                f"{r['layers_one_by_one_host_us']:.1f} | {r['target_us']:.1f} |" for r in pipes]
    print("\n".join(out))


def report(case, row, baselines, bw):
    """Adds the baselines and %copy to ``row``, prints it, returns it (``us``: one call's device time;
    ``b2b``: per call over calls queued back to back, the way torch's baselines are timed)."""
    row.update(baselines)
    gemv = case[1] == "gemv"
    row["pct_copy"] = 100.0 * row["GBps"] * 1e9 / bw if gemv else None
    row["pct_copy_b2b"] = 100.0 * row["bytes"] / (row["us_b2b"] * 1e3) * 1e9 / bw if gemv else None
    lws = "driver" if row["lws"] is None else "x".join(map(str, row["lws"]))
    extra = "  ".join(f"{k[:-3]}={v:.1f}us" for k, v in row.items() if k.startswith("torch") and k.endswith("_us"))
    pct = f"{row['pct_copy']:6.1f} {row['pct_copy_b2b']:6.1f}" if gemv else f"{'':13s}"
    if "read_floor_us" in row:  # the %copy of a kernel that only reads these bytes
        row["pct_copy_read_floor"] = 100.0 * row["bytes"] / (row["read_floor_us"] * 1e3) * 1e9 / bw
        extra = f"read floor={row['read_floor_us']:.1f}us ({row['pct_copy_read_floor']:.0f}%)  " + extra
    chk = f" err={row['max_rel_err']:.1e}" if "max_rel_err" in row else ""
    if "us_gemv_only" in row:
        chk += f" (gemv_a8 alone {row['us_gemv_only']:.1f}us, host-paced {row['us_host_paced']:.1f}us)"
    user = "".join(f" {row[k]:{w}.1f}" if k in row else f" {'':{w}s}"
                   for k, w in (("wall_us", 7), ("host_us", 6), ("wall_out_us", 7), ("host_out_us", 6)))
    print(f"{case[0]:26s} {row['scheme']:18s} {row['us']:8.1f} {row['us_b2b']:8.1f} {pct} {row['GFLOPs']:8.1f} "
          f"{row['setup_s']:7.2f}{user}  {row['variant']} lws={lws} scales={row['scales']}{chk}  {extra}", flush=True)
    row["lws"] = None if row["lws"] is None else list(row["lws"])
    return row


if __name__ == "__main__":
    main()
