"""Models nobody tuned for: seeded torchvision architectures at 224x224 built with ``onnx.helper`` (torchvision does
not import beside the CPU torch wheel), as torchvision's ONNX export writes them (Conv + BatchNormalization, ReLU /
ReLU6 as Clip(0, 6) / SiLU as x * Sigmoid(x), residual Adds, squeeze-excitation as GlobalAveragePool -> 1x1 convs ->
Sigmoid -> Mul, a MatMul head), timed in onnxruntime float, OpenVINO float and qconv sessions, each runtime in its
own process, the same threads and input:

* ``resnet18``: 3x3 convs, a 7x7 stem, MaxPool;
* ``mobilenet_v2``: inverted residuals (1x1 expand, 3x3 depthwise, 1x1 project), ReLU6;
* ``efficientnet_b0``: MBConv blocks (3x3 and 5x5 depthwise, squeeze-excitation), SiLU;
* ``regnet_y_400mf``: grouped 3x3 convs (8 channels a group) in bottleneck blocks with squeeze-excitation;
* ``convnext_tiny``: 7x7 depthwise convs, LayerNormalization, the MLP as MatMuls on NHWC tensors with an erf GELU.

qconv rows: ``qconv-nocalib`` is ``quantize_model(path)`` (float activations); ``qconv-default`` is
``quantize_model(path, calibration=<4 seeded pictures>)`` (smoothing and the activation search). The input is
another seeded picture (blocky noise in an ImageNet-normalised range); the SQNR against onnxruntime float says
little about real accuracy (random weights), but the speed is the architecture's. Public API only::

    taskset -c 0,1 .venv/bin/python -m benchmarks.labs.seeded_zoo [--arch resnet18,mobilenet_v2,...]
        [--threads 2] [--repeat 20] [--rounds 3]
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


class _Graph:
    """Seeded nodes and initializers (each conv followed by its BatchNormalization, as torchvision exports)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0
        self.opset = 13

    def node(self, op, ins, **attrs):
        self.n += 1
        out = f"{op.lower()}{self.n}"
        from onnx import helper

        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def const(self, name, value):
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv(self, x, cin, cout, k, s=1, groups=1, act="relu", bn=True, pad=None):
        """Conv (+ BatchNormalization) (+ activation: relu, relu6, silu, sigmoid or None); ``pad``: k // 2 if None."""
        r = self.rng
        p = f"w{self.n + 1}"
        w = self.const(p + ".w", r.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / (cin // groups * k * k)))
        b = self.const(p + ".b", r.standard_normal(cout) * 0.05)
        y = self.node("Conv", [x, w, b], strides=[s, s], pads=[k // 2 if pad is None else pad] * 4, group=groups)
        if bn:
            y = self.node("BatchNormalization", [y] + [self.const(f"{p}.{n}", v) for n, v in (
                ("g", 1 + 0.1 * r.standard_normal(cout)), ("be", 0.1 * r.standard_normal(cout)),
                ("mu", 0.1 * r.standard_normal(cout)), ("var", 1 + 0.1 * r.random(cout)))])
        return self.act(y, act)

    def act(self, y, act):
        if act == "relu":
            return self.node("Relu", [y])
        if act == "relu6":
            return self.node("Clip", [y, self.const(f"c{self.n}.lo", 0.0), self.const(f"c{self.n}.hi", 6.0)])
        if act == "silu":
            return self.node("Mul", [y, self.node("Sigmoid", [y])])
        if act == "sigmoid":
            return self.node("Sigmoid", [y])
        return y

    def head(self, x, cin):
        f = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
        return self.node("MatMul", [f, self.const("fc.w", self.rng.standard_normal((cin, 1000)) * 0.03)])

    def save(self, path, y, name):
        import onnx
        from onnx import TensorProto, helper

        g = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8   # ONNX 1.12's: what opset 17 needs, and older onnxruntime wheels load it
        onnx.save(m, path)


def _resnet18(g: _Graph) -> str:
    x = g.conv("x", 3, 64, 7, 2)
    x, cin = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), 64
    for cout, s in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for blk in range(2):
            st = s if blk == 0 else 1
            y = g.conv(g.conv(x, cin, cout, 3, st), cout, cout, 3, act=None)
            sc = g.conv(x, cin, cout, 1, st, act=None) if (st != 1 or cin != cout) else x
            x, cin = g.node("Relu", [g.node("Add", [y, sc])]), cout
    return g.head(x, cin)


def _inverted_residuals(g: _Graph, stem: int, blocks, last: int, act: str, se: bool) -> str:
    """MobileNetV2 / EfficientNet blocks: ``blocks`` rows of (expansion t, kernel k, stride s, channels c, repeats n)."""
    x, cin = g.conv("x", 3, stem, 3, 2, act=act), stem
    for t, k, s, c, n in blocks:
        for i in range(n):
            st, hid = (s if i == 0 else 1), cin * t
            y = g.conv(x, cin, hid, 1, act=act) if t != 1 else x
            y = g.conv(y, hid, hid, k, st, groups=hid, act=act)
            if se:   # squeeze-excitation: a quarter of the block's input channels
                y = _squeeze_excite(g, y, hid, max(1, cin // 4), act)
            y = g.conv(y, hid, c, 1, act=None)
            x = g.node("Add", [y, x]) if st == 1 and cin == c else y
            cin = c
    return g.head(g.conv(x, cin, last, 1, act=act), last)


def _squeeze_excite(g: _Graph, y, hid: int, sq: int, act: str) -> str:
    """``y * Sigmoid(conv(act(conv(GlobalAveragePool(y)))))``, 1x1 convs with bias, no BatchNormalization."""
    z = g.conv(g.node("GlobalAveragePool", [y]), hid, sq, 1, act=act, bn=False)
    return g.node("Mul", [y, g.conv(z, sq, hid, 1, act="sigmoid", bn=False)])


def _regnet_y_400mf(g: _Graph) -> str:
    """RegNetY-400MF: bottleneck blocks of grouped 3x3 convs (8 channels a group) with squeeze-excitation."""
    x, cin = g.conv("x", 3, 32, 3, 2), 32
    for w, d in [(48, 1), (104, 3), (208, 6), (440, 6)]:
        for i in range(d):
            s = 2 if i == 0 else 1
            y = g.conv(x, cin, w, 1)
            y = g.conv(y, w, w, 3, s, groups=w // 8)
            y = g.conv(_squeeze_excite(g, y, w, int(round(0.25 * cin)), "relu"), w, w, 1, act=None)
            sc = g.conv(x, cin, w, 1, s, act=None) if (s != 1 or cin != w) else x
            x, cin = g.node("Relu", [g.node("Add", [y, sc])]), w
    return g.head(x, cin)


def _convnext_tiny(g: _Graph) -> str:
    """ConvNeXt-T: 7x7 depthwise convs, LayerNormalization over channels, the MLP as MatMuls on NHWC with an
    erf GELU, layer scale, patchify stem and 2x2 stride-2 downsampling (opset 17)."""
    g.opset = 17
    r = g.rng

    def norm(y, c, nchw=True):   # LayerNormalization over C: on NCHW tensors between two Transposes
        if nchw:
            y = g.node("Transpose", [y], perm=[0, 2, 3, 1])
        y = g.node("LayerNormalization", [y, g.const(f"ln{g.n}.g", 1 + 0.1 * r.standard_normal(c)),
                                          g.const(f"ln{g.n}.b", 0.1 * r.standard_normal(c))], axis=-1, epsilon=1e-6)
        return g.node("Transpose", [y], perm=[0, 3, 1, 2]) if nchw else y

    def linear(y, cin, cout):
        w = g.const(f"fc{g.n}.w", r.standard_normal((cin, cout)) * np.sqrt(1.0 / cin))
        return g.node("Add", [g.node("MatMul", [y, w]), g.const(f"fc{g.n}.b", 0.05 * r.standard_normal(cout))])

    x = norm(g.conv("x", 3, 96, 4, 4, act=None, bn=False, pad=0), 96)
    cin = 96
    for stage, (c, d) in enumerate([(96, 3), (192, 3), (384, 9), (768, 3)]):
        if stage:
            x = g.conv(norm(x, cin), cin, c, 2, 2, act=None, bn=False, pad=0)
        for _ in range(d):
            y = g.conv(x, c, c, 7, groups=c, act=None, bn=False)
            y = linear(norm(g.node("Transpose", [y], perm=[0, 2, 3, 1]), c, nchw=False), c, 4 * c)
            e = g.node("Erf", [g.node("Div", [y, g.const(f"gelu{g.n}.d", 1.4142135)])])
            y = g.node("Mul", [g.node("Mul", [y, g.node("Add", [e, g.const(f"gelu{g.n}.one", 1.0)])]),
                               g.const(f"gelu{g.n}.h", 0.5)])
            y = g.node("Transpose", [linear(y, 4 * c, c)], perm=[0, 3, 1, 2])
            y = g.node("Mul", [y, g.const(f"ls{g.n}", (0.3 + 0.1 * r.random(c)).reshape(c, 1, 1))])
            x = g.node("Add", [y, x])
        cin = c
    f = g.node("Flatten", [norm(g.node("GlobalAveragePool", [x]), cin)])
    return linear(f, cin, 1000)


ARCHS = {
    "resnet18": _resnet18,
    "mobilenet_v2": lambda g: _inverted_residuals(
        g, 32, [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 3, 2, 32, 3), (6, 3, 2, 64, 4), (6, 3, 1, 96, 3),
                (6, 3, 2, 160, 3), (6, 3, 1, 320, 1)], 1280, "relu6", se=False),
    "efficientnet_b0": lambda g: _inverted_residuals(
        g, 32, [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)], 1280, "silu", se=True),
    "regnet_y_400mf": _regnet_y_400mf,
    "convnext_tiny": _convnext_tiny,
}


def build(arch: str, path: str, seed: int = 0) -> None:
    """Write the seeded ``arch`` (a key of :data:`ARCHS`) to ``path``."""
    g = _Graph(seed)
    g.save(path, ARCHS[arch](g), arch)


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
    p.add_argument("--arch", default=",".join(ARCHS), help="comma-separated: " + ", ".join(ARCHS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1, help="every row this many times (new processes, rows "
                   "interleaved), the fastest kept: on the 2-core VMs whole processes run at one of two speeds")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.row:
        print(run_row(a.row, a.model, a.threads, a.repeat))
        return 0
    for arch in a.arch.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{arch}.onnx")
            build(arch, path)
            results = {}
            for _ in range(max(1, a.rounds)):
                for row in ROWS:
                    out = subprocess.run([sys.executable, "-m", "benchmarks.labs.seeded_zoo", "--row", row, "--model",
                                          path, "--threads", str(a.threads), "--repeat", str(a.repeat)],
                                         capture_output=True, text=True, check=True).stdout.split()
                    results[row] = min(results.get(row, (float("inf"), 0.0)), (float(out[-2]), float(out[-1])))
        fast = min(results["ort-float"][0], results["ov-float"][0])
        for row, (ms, db) in results.items():
            print(f"{arch:16s} {row:15s} {ms:8.2f} ms ({ms / fast:.2f}x the faster float runtime)  SQNR {db:.1f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
