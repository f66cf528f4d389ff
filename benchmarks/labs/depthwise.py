"""Depthwise convs on the CPU: qconv's depthwise path vs its general GEMM path vs onnxruntime's float Conv.

Layer shapes from PP-OCRv4 det (issue 21): 5x5 over 192 channels at 40x40 and 3x3 over 16 channels at 320x320
(stride 1, "same" padding, batch 1), int8 per-channel symmetric weights, act_quant="tensor". Every row is measured in
the same run: qconv.Conv2d(..., depthwise=True / False) (the depthwise option of the CPU engine) at 1 and 2 threads,
and onnxruntime (float32 Conv with group=C, intra-op threads 1 and 2, spinning off). Median of ``--repeat`` calls
after a warm-up; the general path is slow, so it gets ``--general-repeat`` calls. ``OPENBLAS_NUM_THREADS`` defaults
to 1 here (see below).

    .venv/bin/python benchmarks/labs/depthwise.py [--repeat 50] [--general-repeat 3] [--small]

``--small`` runs tiny shapes (a smoke test: checks the script, not the speed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

# numpy's OpenBLAS workers spin for a while after any BLAS call in the process and then hold the second core that
# 2-thread runs need (measured here: the 2-thread depthwise call 26 ms instead of 0.5 ms); nothing below uses BLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import qconv  # noqa: E402

SHAPES = [  # (channels, kernel, size)
    (192, 5, 40),
    (16, 3, 320),
]
SMALL = [(12, 5, 10), (4, 3, 16)]


def _median_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _ort_session(w, c, k, threads):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=[k // 2] * 4, kernel_shape=[k, k])
    graph = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(onnx._serialize(model) if hasattr(onnx, "_serialize") else model.SerializeToString(),
                                so, providers=["CPUExecutionProvider"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--general-repeat", type=int, default=3)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'layer':<22} {'thr':>3} {'depthwise ms':>13} {'general ms':>11} {'ort float ms':>13} "
          f"{'gen/dw':>7} {'dw/ort':>7}")
    for c, k, s in (SMALL if args.small else SHAPES):
        wf = rng.standard_normal((c, 1, k, k)).astype(np.float32)
        w = qconv.quantize_weight(wf, bits=8, groups=c)
        x = rng.standard_normal((1, c, s, s)).astype(np.float32)
        for threads in (1, 2):
            dw = qconv.Conv2d(w, None, padding=k // 2, device="cpu", threads=threads, depthwise=True)
            gen = qconv.Conv2d(w, None, padding=k // 2, device="cpu", threads=threads, depthwise=False)
            assert np.array_equal(dw(x), gen(x))
            sess = _ort_session(wf, c, k, threads)
            t_dw = _median_ms(lambda: dw(x), args.repeat)
            t_gen = _median_ms(lambda: gen(x), args.general_repeat)
            t_ort = _median_ms(lambda: sess.run(None, {"x": x}), args.repeat)
            print(f"{f'{k}x{k} dw {c}ch @{s}x{s}':<22} {threads:>3} {t_dw:>13.3f} {t_gen:>11.2f} {t_ort:>13.3f} "
                  f"{t_gen / t_dw:>7.1f} {t_dw / t_ort:>7.2f}")


if __name__ == "__main__":
    main()
