"""A model nobody tuned for: a seeded ResNet-18 (Conv + BatchNormalization + Relu, residual Adds, MaxPool, a 1000-way
MatMul head) at 224x224, built with ``onnx.helper`` (torchvision does not import beside the CPU torch wheel), timed in
onnxruntime float, OpenVINO float and qconv sessions, each runtime in its own process, the same threads and input.

qconv rows: ``qconv-nocalib`` is ``quantize_model(path)`` (float activations); ``qconv-default`` is
``quantize_model(path, calibration=<4 seeded pictures>)`` (smoothing and the activation search). The input is
another seeded picture (blocky noise in an ImageNet-normalised range); the SQNR against onnxruntime float says
little about real accuracy (random weights), but the speed is the architecture's. Public API only::

    taskset -c 0,1 .venv/bin/python -m benchmarks.labs.seeded_resnet [--threads 2] [--repeat 20]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROWS = ("ort-float", "ov-float", "qconv-nocalib", "qconv-default")


def build(path: str, seed: int = 0) -> None:
    """Write the seeded ResNet-18 to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def conv(x, cin, cout, k, s, name, relu=True):
        arrays = dict(w=rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)),
                      b=rng.standard_normal(cout) * 0.05, g=1 + 0.1 * rng.standard_normal(cout),
                      be=0.1 * rng.standard_normal(cout), mu=0.1 * rng.standard_normal(cout),
                      var=1 + 0.1 * rng.random(cout))
        inits.extend(numpy_helper.from_array(v.astype(np.float32), f"{name}.{k_}") for k_, v in arrays.items())
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.c"], name=name,
                                      strides=[s, s], pads=[k // 2] * 4))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.c"] + [f"{name}.{k_}" for k_ in
                                                                           ("g", "be", "mu", "var")], [f"{name}.n"]))
        if not relu:
            return f"{name}.n"
        nodes.append(helper.make_node("Relu", [f"{name}.n"], [f"{name}.r"]))
        return f"{name}.r"

    x = conv("x", 3, 64, 7, 2, "stem")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, (cout, s) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)]):
        for blk in range(2):
            st, nm = (s if blk == 0 else 1), f"l{stage}b{blk}"
            y = conv(conv(x, cin, cout, 3, st, nm + "c1"), cout, cout, 3, 1, nm + "c2", relu=False)
            sc = conv(x, cin, cout, 1, st, nm + "ds", relu=False) if (st != 1 or cin != cout) else x
            nodes += [helper.make_node("Add", [y, sc], [nm + ".a"]), helper.make_node("Relu", [nm + ".a"], [nm + ".o"])]
            x, cin = nm + ".o", cout
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["f"]),
              helper.make_node("MatMul", ["f", "fc.w"], ["y"], name="fc")]
    inits.append(numpy_helper.from_array((rng.standard_normal((512, 1000)) * 0.03).astype(np.float32), "fc.w"))
    g = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def picture(seed: int) -> np.ndarray:
    """A seeded (1, 3, 224, 224) float32 input: 8x8 blocks of uniform colour plus noise, normalised."""
    r = np.random.default_rng(seed)
    x = np.kron(r.random((1, 3, 28, 28)), np.ones((1, 1, 8, 8))) + 0.1 * r.standard_normal((1, 3, 224, 224))
    return ((x - 0.45) / 0.25).astype(np.float32)


def run_row(row: str, path: str, threads: int, repeat: int) -> str:
    """One row in this process: ``"row median_ms sqnr_db"``."""
    import onnxruntime as ort

    x = picture(100)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if row == "ort-float":
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

        def fn():
            return sess.run(None, {"x": x})[0]
    elif row == "ov-float":
        import openvino as ov

        req = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
                                                    "INFERENCE_NUM_THREADS": threads}).create_infer_request()

        def fn():
            return list(req.infer({0: x}).values())[0]
    else:
        import qconv.onnx as qo

        kw = dict(calibration=[picture(i) for i in range(4)]) if row == "qconv-default" else {}
        sess = qo.InferenceSession(qo.quantize_model(path, measure=False, **kw), threads=threads)

        def fn():
            return sess.run(None, {"x": x})[0]
    for _ in range(3):
        y = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    y = np.asarray(y, np.float64).reshape(ref.shape)
    db = 10 * np.log10((ref.astype(np.float64) ** 2).sum() / max(((y - ref) ** 2).sum(), 1e-30))
    return f"{row} {np.median(times) * 1e3:.2f} {db:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.row:
        print(run_row(a.row, a.model, a.threads, a.repeat))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resnet18.onnx")
        build(path)
        results = {}
        for row in ROWS:
            out = subprocess.run([sys.executable, "-m", "benchmarks.labs.seeded_resnet", "--row", row, "--model", path,
                                  "--threads", str(a.threads), "--repeat", str(a.repeat)],
                                 capture_output=True, text=True, check=True).stdout.split()
            results[row] = float(out[-2]), float(out[-1])
    fast = min(results["ort-float"][0], results["ov-float"][0])
    for row, (ms, db) in results.items():
        print(f"{row:15s} {ms:8.2f} ms ({ms / fast:.2f}x the faster float runtime)  SQNR {db:.1f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
