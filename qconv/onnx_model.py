"""Read the conv and constant-weight matmul layers of an ONNX model, and capture their real inputs.

Needs the optional packages ``onnx`` and ``onnxruntime`` (``pip install qconv[onnx]``).

A :class:`ModelLayer` holds what qconv needs to run one layer on its own: the float weight as a conv
weight ``(O, I/groups, kh, kw)`` (a ``MatMul``/``Gemm`` weight ``(K, N)`` becomes ``(N, K, 1, 1)``),
bias, stride, padding, dilation and groups, and the names of its input and output tensors.
"""
from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass

import numpy as np


def _need(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(f"this needs the optional package {module!r}: pip install {module}") from None


@dataclass
class ModelLayer:
    """One layer of a model, in qconv's terms (see the module docstring)."""

    name: str
    op: str
    weight: np.ndarray
    bias: np.ndarray | None
    stride: tuple[int, int]
    padding: tuple[int, int]
    extra_pad: tuple[int, int, int, int]  # (top, bottom, left, right) beyond the symmetric padding
    dilation: tuple[int, int]
    groups: int
    input_name: str
    output_name: str
    node_index: int = -1  # position of the node in ``model.graph.node``

    @property
    def is_linear(self) -> bool:
        return self.op in ("MatMul", "Gemm")

    def describe_shape(self) -> str:
        o, i, kh, kw = self.weight.shape
        if self.is_linear:
            return f"{i}->{o}"
        extra = f" s{self.stride[0]}" if self.stride != (1, 1) else ""
        return f"{kh}x{kw} {i * self.groups}->{o}{extra}"

    def conv_input(self, x: np.ndarray) -> np.ndarray:
        """The captured tensor ``x`` as the NCHW input of the conv (linear: ``(rows, K, 1, 1)``; asymmetric
        padding applied explicitly with zeros, which equals the conv's own zero padding)."""
        if self.is_linear:
            return np.ascontiguousarray(x.reshape(-1, x.shape[-1])[:, :, None, None], np.float32)
        t, b, l, r = self.extra_pad
        if any(self.extra_pad):
            x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
        return np.ascontiguousarray(x, np.float32)


def _constants(model) -> dict:
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(attr.t)
    return consts


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class UnsupportedLayer(ValueError):
    """A Conv/MatMul/Gemm with a constant weight that qconv cannot take (the reason is the message)."""


def _conv_layer(node, consts) -> ModelLayer | str:
    if node.input[1] not in consts:
        return "its weight is not a constant (computed in the graph)"
    w = consts[node.input[1]]
    if w.dtype != np.float32:
        return f"its weight is {w.dtype}, not float32"
    if w.ndim != 4:
        return f"a {w.ndim - 2}-D conv (qconv takes 2-D convs)"
    a = _attrs(node)
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "", "VALID"):
        raise UnsupportedLayer(f"{node.name}: auto_pad={auto_pad!r} is not supported; export with explicit pads")
    if len(node.input) > 2 and node.input[2] and node.input[2] not in consts:
        raise UnsupportedLayer(f"{node.name}: the bias {node.input[2]!r} is not a constant")
    pads = list(a.get("pads", [0, 0, 0, 0])) if auto_pad != "VALID" else [0, 0, 0, 0]
    top, left, bottom, right = pads
    ph, pw = min(top, bottom), min(left, right)
    bias = np.asarray(consts[node.input[2]], np.float32) if len(node.input) > 2 and node.input[2] else None
    return ModelLayer(node.name or node.output[0], "Conv", w, bias, tuple(a.get("strides", [1, 1])), (ph, pw),
                      (top - ph, bottom - ph, left - pw, right - pw), tuple(a.get("dilations", [1, 1])),
                      int(a.get("group", 1)), node.input[0], node.output[0])


def _linear_layer(node, consts) -> ModelLayer | str | None:
    a = _attrs(node)
    if node.op_type == "MatMul":
        if node.input[1] not in consts or node.input[0] in consts:
            return None   # a product of two activations (attention): no weight to quantize
        b = consts[node.input[1]]
        if b.dtype != np.float32:
            return f"its weight is {b.dtype}, not float32"
        if b.ndim != 2:
            return f"its weight has rank {b.ndim} (qconv takes a 2-D MatMul weight)"
        w, bias = b.T, None
    else:  # Gemm: y = alpha * A' B' + beta * C
        if node.input[1] not in consts:
            return "its weight is not a constant (computed in the graph)"
        if a.get("transA", 0):
            return "Gemm with transA=1"
        b = np.asarray(consts[node.input[1]], np.float32)
        w = b if a.get("transB", 0) else b.T
        w = w * np.float32(a.get("alpha", 1.0))
        bias = None
        if len(node.input) > 2 and node.input[2]:
            if node.input[2] not in consts:
                return "its bias C is not a constant"
            c = np.asarray(consts[node.input[2]], np.float32) * np.float32(a.get("beta", 1.0))
            if c.size not in (1, w.shape[0]):
                return f"its bias C of shape {c.shape} is not per output column"
            bias = np.broadcast_to(c.reshape(-1), (w.shape[0],)).astype(np.float32)
    return ModelLayer(node.name or node.output[0], node.op_type, np.ascontiguousarray(w)[:, :, None, None], bias,
                      (1, 1), (0, 0), (0, 0, 0, 0), (1, 1), 1, node.input[0], node.output[0])


def transposed_block(node, consts) -> int:
    """The stride ``s`` of a ``ConvTranspose`` that is a 1x1 conv and a pixel shuffle -- one group, kernel (s, s) =
    stride, s >= 2, no padding, dilation 1, no ``output_padding`` / ``output_shape``, a constant float32 weight
    ``(C, O, s, s)`` and a constant ``(O,)`` bias or none -- which ``quantize_model`` rewrites as a 1x1 conv and a
    DepthToSpace; else 0."""
    if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return 0
    w, a = consts.get(node.input[1]), _attrs(node)
    if w is None or w.dtype != np.float32 or w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[2] < 2:
        return 0
    s = int(w.shape[2])
    pad = a.get("auto_pad", b"NOTSET")
    if (int(a.get("group", 1)) != 1 or list(a.get("strides", [1, 1])) != [s, s]
            or list(a.get("kernel_shape", [s, s])) != [s, s] or any(a.get("pads", [0]))
            or list(a.get("dilations", [1, 1])) != [1, 1] or any(a.get("output_padding", [0]))
            or "output_shape" in a or (pad.decode() if isinstance(pad, bytes) else pad) != "NOTSET"):
        return 0
    if len(node.input) > 2 and node.input[2]:
        b = consts.get(node.input[2])
        if b is None or b.dtype != np.float32 or b.shape != (w.shape[1],):
            return 0
    return s


def load_model(path):
    """``onnx.ModelProto`` of the file at ``path`` (ValueError for a file that is not ONNX)."""
    onnx = _need("onnx")
    try:
        return onnx.load(str(path))
    except FileNotFoundError:
        raise
    except Exception as exc:  # onnx raises DecodeError and friends on corrupt files
        raise ValueError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from None


def model_layers(model, skipped: dict | None = None) -> list[ModelLayer]:
    """``[ModelLayer]`` for every Conv and constant-weight MatMul/Gemm of an ``onnx.ModelProto``, in graph order.

    A constant-weight layer qconv cannot take (``auto_pad=SAME_*``, a non-constant bias) raises
    :class:`UnsupportedLayer`, or, when ``skipped`` is a dict, is recorded there as ``{name: reason}``; so are, in
    ``skipped`` only, the layers that stay float for another reason (a ConvTranspose, a weight computed in the
    graph, a 1-D/3-D conv, a weight that is not float32)."""
    consts = _constants(model)
    layers = []
    for index, node in enumerate(model.graph.node):
        try:
            if node.op_type == "Conv":
                layer = _conv_layer(node, consts)
            elif node.op_type in ("MatMul", "Gemm"):
                layer = _linear_layer(node, consts)
            elif node.op_type == "ConvTranspose":
                layer = ("quantize_model rewrites it as a 1x1 conv and a DepthToSpace (opset >= 11)"
                         if transposed_block(node, consts)
                         else "stays an onnxruntime float op (quantize_model takes those whose kernel equals their "
                              "stride, without padding or groups)")
            else:
                continue
        except UnsupportedLayer as exc:
            if skipped is None:
                raise
            skipped[node.name or node.output[0]] = str(exc)
            continue
        if isinstance(layer, str):
            if skipped is not None:
                skipped[node.name or node.output[0]] = f"{node.op_type}: {layer}"
        elif layer is not None:
            layer.node_index = index
            layers.append(layer)
    return layers


def load_layers(path) -> tuple[object, list[ModelLayer]]:
    """``(onnx model, [ModelLayer])`` for every Conv and constant-weight MatMul/Gemm of the model."""
    model = load_model(path)
    return model, model_layers(model)


def first_input(model) -> tuple[str, list]:
    """``(name, dims)`` of the first input of an ``onnx.ModelProto`` or of a session (``get_inputs()``: an
    onnxruntime or :class:`qconv.onnx.InferenceSession`, which has no ``onnx`` import behind it); dynamic
    dims are 0."""
    if hasattr(model, "graph"):
        inp = model.graph.input[0]
        return inp.name, [max(d.dim_value, 0) for d in inp.type.tensor_type.shape.dim]
    inp = model.get_inputs()[0]
    return inp.name, [d if isinstance(d, int) and d > 0 else 0 for d in inp.shape]


def default_input(model, shape=None, seed: int = 0, uniform: bool = False) -> dict:
    """A seeded random feed for the first input of ``model`` (see :func:`first_input`): standard normal, or
    uniform [0, 1) with ``uniform``; dynamic dims become 1 (batch) and 256."""
    name, dims = first_input(model)
    dims = list(shape) if shape is not None else [d or (1 if i == 0 else 256) for i, d in enumerate(dims)]
    rng = np.random.default_rng(seed)
    return {name: rng.random(dims, dtype=np.float32) if uniform else rng.standard_normal(dims).astype(np.float32)}


def load_input(model, path, shape=None, mean=None, std=None) -> dict:
    """Feed from a ``.npy`` tensor or an image (PNG/JPEG through Pillow: RGB in [0, 1], NCHW float32
    ``(1, 3, H, W)``, resized to the model's spatial size or ``shape``; then ``(x - mean) / std`` when given,
    scalars or one value per channel, e.g. PP-OCR's ``mean=0.5, std=0.5``). ``model``: see :func:`first_input`."""
    name, model_dims = first_input(model)
    if str(path).endswith(".npy"):
        x = np.load(path, allow_pickle=False)
        return {name: np.asarray(x, np.float32)}
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("reading an image needs Pillow: pip install pillow (or pass a .npy tensor)") from None
    dims = list(shape) if shape else model_dims
    h, w = (dims[2] or 256, dims[3] or 256) if len(dims) == 4 else (256, 256)
    img = Image.open(path).convert("RGB").resize((w, h))
    x = np.asarray(img, np.float32).transpose(2, 0, 1)[None] / np.float32(255.0)
    if mean is not None or std is not None:
        m = np.asarray(0.0 if mean is None else mean, np.float32).reshape(1, -1, 1, 1)
        sd = np.asarray(1.0 if std is None else std, np.float32).reshape(1, -1, 1, 1)
        x = (x - m) / sd
    return {name: np.ascontiguousarray(x, np.float32)}


def capture(model, layers, feed: dict, threads: int = 2) -> dict:
    """Run the float model through onnxruntime and return ``{tensor name: array}`` for every layer's
    input and output."""
    onnx = _need("onnx")
    ort = _need("onnxruntime")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in dict.fromkeys(n for layer in layers for n in (layer.input_name, layer.output_name)):
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 4   # a model that does not run raises; no error log beside it
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed)))


def time_float_layer(layer: ModelLayer, x: np.ndarray, repeat: int = 5, threads: int = 2) -> float:
    """Median ms of the layer alone in float32 through onnxruntime (a one-node model)."""
    _need("onnx")
    ort = _need("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from ._timing import median_ms

    xin = layer.conv_input(x)
    inits = [numpy_helper.from_array(layer.weight, "W")]
    inputs = ["X", "W"]
    if layer.bias is not None:
        inits.append(numpy_helper.from_array(layer.bias, "B"))
        inputs.append("B")
    node = helper.make_node("Conv", inputs, ["Y"], strides=list(layer.stride),
                            pads=[layer.padding[0], layer.padding[1]] * 2, dilations=list(layer.dilation),
                            group=layer.groups)
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("X", TensorProto.FLOAT, xin.shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return median_ms(lambda: sess.run(None, {"X": xin}), repeat)


def rapidocr_model(name: str = "ch_PP-OCRv4_det_infer.onnx") -> str:
    """Path of a model shipped in the ``rapidocr-onnxruntime`` wheel (install it with ``--no-deps``)."""
    import sys

    # scripts/setup.sh extracts the models from the downloaded wheel here (installing the wheel without its
    # dependencies made pip report them missing)
    local = os.path.join(sys.prefix, "share", "qconv", "models", name)
    if os.path.isfile(local):
        return local
    try:
        dist = importlib.metadata.distribution("rapidocr-onnxruntime")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError("pip install --no-deps rapidocr-onnxruntime (it ships the PP-OCR models)") from None
    for f in dist.files or ():
        if f.name == name:
            return os.fspath(dist.locate_file(f))
    raise FileNotFoundError(f"{name} is not in the rapidocr-onnxruntime wheel")
