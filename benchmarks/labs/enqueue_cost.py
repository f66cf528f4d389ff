"""Host cost of one kernel enqueue from Python: pyopencl's ``enqueue_nd_range_kernel`` (returns an Event) against
a direct ``clEnqueueNDRangeKernel`` through ctypes, with and without an event, on the first OpenCL device.

    python -m benchmarks.labs.enqueue_cost [--calls 2000]
"""
from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np


def opencl_library():
    """The ICD loader pyopencl loaded (ctypes handle), found in this process's memory map."""
    with open("/proc/self/maps") as fh:
        libs = sorted({ln.split()[-1] for ln in fh if "libOpenCL" in ln})
    return ctypes.CDLL(libs[0])


def costs_us(fn, queues, calls: int, warmup: int = 200):
    """(median us for ``fn()`` to return, wall us per call with one finish of ``queues`` at the end) over
    ``calls`` back-to-back calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    for q in queues:
        q.finish()
    ts = []
    t0 = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    for q in queues:
        q.finish()
    return float(np.median(ts)) * 1e6, (time.perf_counter() - t0) / calls * 1e6


def main(argv=None):
    import pyopencl as cl
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    ctx = cl.create_some_context(interactive=False)
    qp_ = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, "__kernel void k(__global float *a){ a[get_global_id(0)] += 1.0f; }").build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 64)
    k = cl.Kernel(prg, "k")
    k.set_arg(0, buf)
    lib = opencl_library()
    f = lib.clEnqueueNDRangeKernel
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    f.restype = ctypes.c_int
    rel = lib.clReleaseEvent
    rel.argtypes = [ctypes.c_void_p]
    g, lo = (ctypes.c_size_t * 1)(64), (ctypes.c_size_t * 1)(64)
    qp, kp = q.int_ptr, k.int_ptr
    ev = ctypes.c_void_p()

    def with_event():
        f(qp, kp, 1, None, g, lo, 0, None, ctypes.byref(ev))
        rel(ev)

    cases = [("pyopencl enqueue_nd_range_kernel", lambda: cl.enqueue_nd_range_kernel(q, k, (64,), (64,))),
             ("pyopencl, profiling queue", lambda: cl.enqueue_nd_range_kernel(qp_, k, (64,), (64,))),
             ("ctypes, no event", lambda: f(qp, kp, 1, None, g, lo, 0, None, None)),
             ("ctypes, event (released)", with_event)]
    print(f"# {ctx.devices[0].name.strip()} ({ctx.devices[0].platform.name})")
    for name, fn in cases * 2:
        host, wall = costs_us(fn, (q, qp_), args.calls)
        print(f"{name:36s} host median {host:6.2f} us   wall/call {wall:6.2f} us", flush=True)
    a = np.empty(64, np.float32)
    cl.enqueue_copy(q, a, buf)
    qp_.finish()
    print("check: the kernel ran", int(a[0]), "times")
    # the cost against the number of arguments (half buffers, half ints) and the global size
    for nargs in (1, 16, 32):
        params = ", ".join(f"__global float *b{i}" if i % 2 == 0 else f"const int n{i}" for i in range(nargs))
        src = f"__kernel void k({params}) {{ if (get_global_id(0) == 0) b0[0] += 1.0f; }}"
        kk = cl.Kernel(cl.Program(ctx, src).build(), "k")
        bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 64) for _ in range(nargs)]
        for i in range(nargs):
            kk.set_arg(i, bufs[i] if i % 2 == 0 else np.int32(i))
        for gs, ls in (((64,), (64,)), ((256, 64, 4), (128, 4, 1))):
            def rebind():   # re-binding two buffer arguments before the enqueue
                kk.set_arg(0, bufs[0])
                if nargs > 2:
                    kk.set_arg(2, bufs[2])
                cl.enqueue_nd_range_kernel(q, kk, gs, ls)
            enq, _ = costs_us(lambda: cl.enqueue_nd_range_kernel(q, kk, gs, ls), (q,), args.calls // 2)
            reb, _ = costs_us(rebind, (q,), args.calls // 2)
            print(f"args {nargs:2d} gsize {str(gs):14s} enqueue {enq:6.2f} us  rebind 2 + enqueue {reb:6.2f} us",
                  flush=True)


if __name__ == "__main__":
    main()
