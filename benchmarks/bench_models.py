"""Whole models: qconv.onnx against onnxruntime (float, quantize_dynamic) and MNN's low-memory mode.

Models (both ship in the ``rapidocr-onnxruntime`` wheel, so nothing is downloaded):

* ``det``: PP-OCRv4 text detector (62 convs incl. depthwise 3x3/5x5) on ``examples/data/text_640.png`` at
  ``--size`` (640), fed the PP-OCR way (``(x/255 - 0.5) / 0.5``); output: the text probability map.
* ``rec``: PP-OCRv4 text recogniser (SVTR-LCNet: 38 convs + 9 constant-weight MatMuls of its attention and
  MLP blocks, a different architecture: conv backbone + transformer neck) on the first text line of the same
  picture, 48x320; output: per-step character probabilities.

Rows per model: ``ort-float``, ``ort-dynamic-int8`` (``onnxruntime.quantization.quantize_dynamic`` after moving
the Paddle export's Constant-node weights into initializers: on the file as shipped it refuses both models),
``mnn-int8`` / ``mnn-int4-b32`` (``mnnconvert --weightQuantBits`` [+ ``--weightQuantAsymmetric
--weightQuantBlock 32``], run with ``memory=low``), ``qconv-int8-ch`` (int8-ch-sym), ``qconv-plan25`` (the
plan ``inspect --target-sqnr 25`` picks on the same image from int4-b32/b64-asym-mse, int8-ch-sym and float),
``qconv-int4-b32-mse`` (int4-b32-asym-mse), ``qconv-int8-ch-min1k`` (int8-ch-sym with ``min_weights=1024``: the
layers of fewer than 1024 weights stay float), ``qconv-int8-ch-a8`` (int8-ch-sym run with ``act_quant="tensor"``:
per-tensor dynamic int8 activations on the integer GEMM; the other qconv rows run the session default, float
activations for convs), ``qconv-int8-gptq-bc`` (the int8 per-channel accuracy recipe:
int8-ch-sym-gptq-bc weights calibrated on one held-out picture of ``labs/accuracy.py``, default activations). Each row runs in its own process (peak RSS is that process's):
latency median / p90 over ``--repeat`` runs after one warm-up at ``--threads``, SQNR of the output against
``ort-float`` on the same input, file bytes / float file bytes, qconv's weight bytes ratio, peak RSS. A last
row measures the custom operator's own overhead per node: a chain of 16 tiny QConv nodes run by the session
against the same 16 qconv layers called directly (median per node).

Full run (quiet machine; the lead runs it)::

    .venv/bin/python benchmarks/bench_models.py --threads 2 --repeat 20 --json docs/results/bench_models.json

Quick check that it runs end to end (small sizes, 2 runs): ``--quick``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from qconv._timing import peak_rss_mb  # VmHWM: ru_maxrss carries the parent's peak through exec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.environ.get("QCONV_BENCH_IMAGE", os.path.join(ROOT, "examples", "data", "text_640.png"))
ROWS = ("ort-float", "ort-dynamic-int8", "mnn-int8", "mnn-int4-b32", "qconv-int8-ch", "qconv-int8-ch-min1k",
        "qconv-int8-ch-a8", "qconv-int8-gptq-bc", "qconv-plan25", "qconv-int4-b32-mse")
QCONV_SCHEMES = {"qconv-int8-ch": "int8-ch-sym", "qconv-int8-ch-min1k": "int8-ch-sym",
                 "qconv-int8-ch-a8": "int8-ch-sym", "qconv-int4-b32-mse": "int4-b32-asym-mse"}
MIN_WEIGHTS = {"qconv-int8-ch-min1k": 1024}   # quantize_model(min_weights=...): smaller layers stay float
SESSION_OPTIONS = {"qconv-int8-ch-a8": dict(act_quant="tensor")}   # int8 activations (the default: float)
PLAN_CANDIDATES = "int4-b32-asym-mse,int4-b64-asym-mse,int8-ch-sym,float"


# --- inputs -------------------------------------------------------------------------------------------------
def _ppocr(img) -> np.ndarray:
    x = np.asarray(img, np.float32).transpose(2, 0, 1)[None] / np.float32(255.0)
    return np.ascontiguousarray((x - np.float32(0.5)) / np.float32(0.5), np.float32)


def det_input(size: int) -> np.ndarray:
    """PP-OCRv4 det input: the picture resized to size x size, ``(1, 3, size, size)`` float32."""
    from PIL import Image

    return _ppocr(Image.open(IMAGE).convert("RGB").resize((size, size), Image.BILINEAR))


def rec_input(width: int = 320) -> np.ndarray:
    """PP-OCRv4 rec input: the picture's first text line, ``(1, 3, 48, width)`` float32."""
    from PIL import Image

    line = Image.open(IMAGE).convert("RGB").crop((28, 12, 420, 54))
    return _ppocr(line.resize((width, 48), Image.BILINEAR))


def models(size: int, quick: bool) -> dict:
    from qconv.onnx_model import rapidocr_model

    return {"det": (rapidocr_model("ch_PP-OCRv4_det_infer.onnx"), det_input(size)),
            "rec": (rapidocr_model("ch_PP-OCRv4_rec_infer.onnx"), rec_input(160 if quick else 320))}


# --- artifacts (made in the parent) ----------------------------------------------------------------------
def _plan(path, x, target=25.0):
    """The ``inspect --target-sqnr`` plan measured on the benchmark input itself."""
    from qconv import model_report as mr
    from qconv.onnx_model import capture, load_layers

    model, layers = load_layers(path)
    tensors = capture(model, layers, {model.graph.input[0].name: x})
    cands = [mr.Scheme.parse(c) for c in PLAN_CANDIDATES.split(",")]
    rows = [mr.measure_layer(la, tensors[la.input_name], c) for la in layers for c in cands if c.bits is not None]
    return mr.choose_plan(rows, cands, target, path, "tensor")


def constants_as_initializers(model):
    """The model with its ``Constant`` nodes' tensors moved into initializers (Paddle exports keep weights in
    Constant nodes, which ``quantize_dynamic`` cannot quantize)."""
    from onnx import numpy_helper

    keep = []
    for node in model.graph.node:
        value = [a for a in node.attribute if a.name == "value"]
        if node.op_type == "Constant" and value and len(node.attribute) == 1:
            t = numpy_helper.from_array(numpy_helper.to_array(value[0].t), node.output[0])
            model.graph.initializer.append(t)
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def make_artifact(row: str, path: str, x: np.ndarray, work: str):
    """The model file a row runs (None + reason when the tool refuses the model)."""
    import onnx

    name = os.path.splitext(os.path.basename(path))[0]
    if row == "ort-float":
        return path, None
    if row == "ort-dynamic-int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        out = os.path.join(work, f"{name}.dyn.onnx")
        src = os.path.join(work, f"{name}.inits.onnx")
        onnx.save(constants_as_initializers(onnx.load(path)), src)
        try:
            quantize_dynamic(src, out, weight_type=QuantType.QInt8)
        except Exception as exc:  # it refuses PP-OCRv4 det ("Expected ... to be an initializer")
            return None, f"refused: {type(exc).__name__}: {str(exc)[:100]}"
        return out, None
    if row.startswith("mnn-"):
        out = os.path.join(work, f"{name}.{row}.mnn")
        exe = os.path.join(os.path.dirname(sys.executable), "mnnconvert")
        args = [exe, "-f", "ONNX", "--modelFile", path, "--MNNModel", out, "--bizCode", "MNN"]
        args += ["--weightQuantBits", "8"] if row == "mnn-int8" else \
            ["--weightQuantBits", "4", "--weightQuantAsymmetric", "--weightQuantBlock", "32"]
        try:
            subprocess.run(args, check=True, capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"mnnconvert failed: {exc}"
        return out, None
    import qconv.onnx as qo

    out = os.path.join(work, f"{name}.{row}.onnx")
    if row == "qconv-plan25":
        q = qo.quantize_model(path, plan=_plan(path, x))
    elif row == "qconv-int8-gptq-bc":   # the accuracy recipe: calibrated on one held-out picture (labs/accuracy)
        from labs.accuracy import calibration
        calib = calibration("det" if x.shape[2] == x.shape[3] else "rec", [1], x.shape[2], x.shape[3])
        q = qo.quantize_model(path, "int8-ch-sym-gptq-bc", calibration=calib)
    else:
        q = qo.quantize_model(path, QCONV_SCHEMES[row], min_weights=MIN_WEIGHTS.get(row, 0))
    onnx.save(q, out)
    return out, None


# --- one row, in its own process -------------------------------------------------------------------------
def _runner(row: str, path: str, x: np.ndarray, threads: int):
    """``(run() -> output array, extra info)`` for one row."""
    if row.startswith("mnn-"):
        import MNN

        rt = MNN.nn.create_runtime_manager(({"backend": "CPU", "precision": "normal", "memory": "low",
                                             "numThread": threads},))
        net = MNN.nn.load_module_from_file(path, [], [], runtime_manager=rt)
        info = net.get_info() if hasattr(net, "get_info") else {}

        def run():
            inp = MNN.expr.const(x, list(x.shape), MNN.expr.NCHW)
            out = net.forward([inp])
            out = out[0] if isinstance(out, (list, tuple)) else out
            return np.array(MNN.expr.convert(out, MNN.expr.NCHW).read(), np.float32)
        return run, dict(mnn_info=str(info)[:200])
    if row.startswith("ort-"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return (lambda: sess.run(None, {name: x})[0]), {}
    import qconv.onnx as qo

    sess = qo.InferenceSession(path, threads=threads, **SESSION_OPTIONS.get(row, {}))
    name = sess.get_inputs()[0].name
    return (lambda: sess.run(None, {name: x})[0]), dict(qconv_nodes=len(sess.kernels))


def worker(row, path, x_path, ref_path, threads, repeat) -> dict:
    from qconv.testing.asserts import sqnr_db

    x = np.load(x_path)
    t0 = time.perf_counter()
    run, info = _runner(row, path, x, threads)
    load_s = time.perf_counter() - t0
    y = run()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        y = run()
        times.append(time.perf_counter() - t)
    ref = np.load(ref_path)
    ms = np.array(times) * 1e3
    return dict(row=row, median_ms=float(np.median(ms)), p90_ms=float(np.percentile(ms, 90)),
                sqnr_db=float(sqnr_db(y.reshape(ref.shape), ref)) if y.size == ref.size else None,
                peak_rss_mb=peak_rss_mb(), load_s=load_s, **info)


def custom_op_overhead(threads: int, repeat: int, nodes: int = 16) -> dict:
    """Median per-node overhead of a qconv custom node: session run of a chain of ``nodes`` tiny QConv nodes
    minus the same layers' CPU engine called one after the other (what a node's kernel runs: onnxruntime's
    tensors need none of the layer's input checks, see ``qconv.onnx.kernels``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import qconv
    import qconv.onnx as qo
    from qconv.onnx.kernels import SESSION_CONV_ACT_QUANT

    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32) for _ in range(nodes)]
    graph = helper.make_graph(
        [helper.make_node("Conv", [f"t{i}", f"w{i}"], [f"t{i + 1}"], name=f"c{i}") for i in range(nodes)], "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info(f"t{nodes}", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = qo.InferenceSession(qo.quantize_model(model), threads=threads)
    layers = [qconv.Conv2d(qconv.quantize_weight(w, 8), threads=threads, act_quant=SESSION_CONV_ACT_QUANT)
              for w in ws]
    x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)

    def direct():
        t = x
        for layer in layers:
            t = layer.engine.forward(t, "nchw")
        return t

    assert np.array_equal(sess.run(None, {"t0": x})[0], direct())
    del onnx
    per_node = []
    for _ in range(max(repeat, 20)):
        t = time.perf_counter()
        sess.run(None, {"t0": x})
        t1 = time.perf_counter()
        direct()
        t2 = time.perf_counter()
        per_node.append(((t1 - t) - (t2 - t1)) / nodes * 1e6)
    return dict(row="custom-op-overhead", nodes=nodes, median_us_per_node=float(np.median(per_node)),
                p90_us_per_node=float(np.percentile(per_node, 90)))


# --- parent ---------------------------------------------------------------------------------------------
def _file_ratio(path, float_path):
    return os.path.getsize(path) / os.path.getsize(float_path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="det,rec")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--size", type=int, default=640, help="PP-OCRv4 det input size")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="small inputs (det 96x96, rec 48x160), 2 runs")
    p.add_argument("--json", help="write all rows here")
    p.add_argument("--work", help="folder for the converted models (default: a temporary one)")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.repeat = min(args.size, 96), 2
    rows = args.rows.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or tmp
        os.makedirs(work, exist_ok=True)
        for mname, (path, x) in models(args.size, args.quick).items():
            if mname not in args.models.split(","):
                continue
            import onnxruntime as ort

            x_path, ref_path = os.path.join(work, f"{mname}.x.npy"), os.path.join(work, f"{mname}.ref.npy")
            np.save(x_path, x)
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(
                None, {"x": x})[0]
            np.save(ref_path, ref)
            for row in rows:
                art, why = make_artifact(row, path, x, work)
                res = dict(model=mname, row=row, input=list(x.shape), threads=args.threads)
                if art is None:
                    res["skipped"] = why
                else:
                    cmd = [sys.executable, os.path.abspath(__file__), "--worker", row, art, x_path, ref_path,
                           str(args.threads), str(args.repeat)]
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                    if proc.returncode or not lines:
                        res["error"] = (proc.stderr or proc.stdout)[-400:]
                    else:
                        res.update(json.loads(lines[-1]))
                    res["file_ratio"] = _file_ratio(art, path)
                    if row.startswith("qconv-"):
                        import onnx

                        import qconv.onnx as qo
                        res["weight_ratio"] = qo.weight_bytes(onnx.load(art))["ratio"]
                results.append(res)
                print(_format(res), flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker-overhead", str(args.threads), str(args.repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    ov = json.loads(lines[-1]) if lines else dict(row="custom-op-overhead", error=proc.stderr[-400:])
    results.append(ov)
    print(_format(ov))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


def _format(r) -> str:
    if r["row"] == "custom-op-overhead":
        if "error" in r:
            return f"custom-op overhead: error {r['error']}"
        return (f"custom-op overhead: {r['median_us_per_node']:.1f} us per node median "
                f"(p90 {r['p90_us_per_node']:.1f}, chain of {r['nodes']})")
    head = f"{r['model']:4} {r['row']:20}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if "error" in r:
        return f"{head} error: {r['error'][-200:]!r}"
    sq = "-" if r.get("sqnr_db") is None else f"{r['sqnr_db']:6.2f} dB"
    wr = f" weights {r['weight_ratio']:.3f}x" if "weight_ratio" in r else ""
    return (f"{head} median {r['median_ms']:8.2f} ms  p90 {r['p90_ms']:8.2f} ms  SQNR {sq}  "
            f"file {r['file_ratio']:.3f}x{wr}  peak RSS {r['peak_rss_mb']:.0f} MiB")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        row, art, xp, rp, th, rep = sys.argv[2:8]
        print(json.dumps(worker(row, art, xp, rp, int(th), int(rep))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker-overhead":
        print(json.dumps(custom_op_overhead(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        sys.exit(main())
