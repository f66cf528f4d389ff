"""Torch on the same GPU for the same architecture: the peer of ``benchmarks.labs.device_graph``.

    python -m benchmarks.labs.torch_graph float_model.onnx [...] [--runs 50] [--hw 640] [--shape 1,3,48,320]

Each float ONNX model becomes a ``torch.nn.Module`` through ``onnx2torch`` (initializers that old exports also
list as graph inputs are dropped from the inputs, and Constant nodes become initializers, first: onnx2torch
cannot convert either). The input is the
device graph lab's: random in [0, 1) from seed 0, its dynamic dimensions 1 (batch) or ``--hw``. Timed per run,
median and p10 of ``--runs`` after warm-ups, with ``torch.backends.cudnn.benchmark = True`` and TF32 off:

* fp32 and fp16, eager and CUDA graph (the input copied into the graph's static input, then one replay);
* ``wall``: from a numpy input to numpy outputs (upload, run, download), as the device graph lab times qconv;
* ``resident``: input already on the device, outputs left there, then ``torch.cuda.synchronize()``.

The fp16 rows give their SQNR against fp32 torch. Needs torch with CUDA, onnx and onnx2torch (which imports
torchvision).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def load_module(path: str):
    """``path``'s float ONNX model as an ``onnx2torch`` module (eval mode, on the CPU)."""
    import onnx
    from onnx2torch import convert

    model = onnx.load(path)
    g = model.graph
    consts = [n for n in g.node if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"]
    for n in consts:  # Paddle exports hold weights as Constant nodes; onnx2torch reads convs' from initializers
        t = onnx.TensorProto()
        t.CopyFrom(n.attribute[0].t)
        t.name = n.output[0]
        g.initializer.append(t)
        g.node.remove(n)
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    return convert(model).eval(), inputs[0]


def _shape(inp, hw: int, override: str):
    if override:
        return [int(v) for v in override.split(",")]
    dims = inp.type.tensor_type.shape.dim
    return [d.dim_value if d.dim_value > 0 else (1 if i == 0 else hw) for i, d in enumerate(dims)]


def _outputs(y):
    return list(y) if isinstance(y, (list, tuple)) else [y]


def _timed(fn, runs: int):
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times) * 1e3, times[len(times) // 10] * 1e3


def _capture(m, xd):
    """(CUDA graph, its static input, its static outputs) of one call of ``m`` on a copy of ``xd``."""
    import torch

    static_x = xd.clone()
    for _ in range(3):  # warm-up before capture, as torch's CUDA graph docs ask
        m(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _outputs(m(static_x))
    return graph, static_x, static_y


def run_model(path: str, args) -> None:
    import torch

    from qconv.metrics import sqnr_db

    module, inp = load_module(path)
    shape = _shape(inp, args.hw, args.shape)
    x = np.random.default_rng(0).random(shape).astype(np.float32)
    ref = None
    for dtype in (torch.float32, torch.float16):
        m = module.to("cuda", dtype)
        xd = torch.from_numpy(x).to("cuda", dtype)
        with torch.inference_mode():
            ys = [y.float().cpu().numpy() for y in _outputs(m(xd))]
            if ref is None:
                ref = ys
            err = "" if dtype == torch.float32 else f"  SQNR vs fp32 {min(sqnr_db(r, y) for r, y in zip(ref, ys)):.1f} dB"

            def eager_wall():
                for y in _outputs(m(torch.from_numpy(x).to("cuda", dtype))):
                    y.float().cpu().numpy()

            def eager_res():
                m(xd)

            def row(name, wall, res):
                w, wp = _timed(wall, args.runs)
                r, rp = _timed(res, args.runs)
                print(f"{path.split('/')[-1]:28s} {tuple(shape)}  torch {str(dtype)[6:]:8s} {name:10s}  "
                      f"wall median {w:7.3f} ms  p10 {wp:7.3f}  resident median {r:7.3f} ms  p10 {rp:7.3f}{err}",
                      flush=True)

            row("eager", eager_wall, eager_res)
            try:
                graph, static_x, static_y = _capture(m, xd)
            except RuntimeError as exc:  # e.g. a converted op that copies a host tensor during capture
                print(f"{path.split('/')[-1]:28s} {tuple(shape)}  torch {str(dtype)[6:]:8s} CUDA graph: not "
                      f"capturable: {str(exc)[:160]}", flush=True)
                continue

            def graph_wall():
                static_x.copy_(torch.from_numpy(x).to("cuda", dtype))
                graph.replay()
                for y in static_y:
                    y.float().cpu().numpy()

            def graph_res():
                graph.replay()

            row("CUDA graph", graph_wall, graph_res)
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--hw", type=int, default=640)
    ap.add_argument("--shape", default="")
    ap.add_argument("--device", default="cuda", help="ignored: torch runs on CUDA device 0 (gpu_machine.sh passes it)")
    args = ap.parse_args(argv)
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for path in args.models:
        try:
            run_model(path, args)
        except Exception as exc:  # one model's failure does not stop the others
            print(f"{path}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


if __name__ == "__main__":
    main()
