"""``python -m qconv convert INPUT OUTPUT``: one quantized weight between ``.npz``, ``.onnx``, ``.gguf``, ``.pt``.

Every file is read into a :class:`~qconv.QuantizedWeight` and written with the converters of
:mod:`qconv.interop`; both steps print their :class:`~qconv.interop.ConversionReport`. Formats:

* ``.npz``: :meth:`QuantizedWeight.save` files, or the multi-weight files of ``inspect --save`` (keys
  ``layer|scheme|field``, entries named ``layer|scheme``).
* ``.onnx``: reads DequantizeLinear-fed weights (named by the node output), MatMulNBits and QLinearConv weights
  (named by the node); writes a one-node model (DequantizeLinear-21, or MatMulNBits ``Y = A @ W.T``). The conv
  shape and groups go to the model's ``metadata_props`` (``qconv.shape:NAME``, ``qconv.groups:NAME``).
* ``.gguf``: Q4_0/Q4_1/Q8_0 tensors of ``ne = [K, rows]``; the shape and groups go to the keys
  ``qconv.NAME.shape`` / ``qconv.NAME.groups``.
* ``.pt``: a ``torch.ao`` quantized tensor, or nested dicts/lists of them (dotted names); written per channel.

Files are never unpickled: ``np.load(allow_pickle=False)``, ``torch.load(weights_only=True)``. User errors
raise :class:`ConvertError` (the CLI prints one line and exits 2).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
import warnings

import numpy as np

from .interop import ConversionReport
from .weights import QuantizedWeight

FORMATS = {".npz": "npz", ".onnx": "onnx", ".gguf": "gguf", ".pt": "pt", ".pth": "pt"}
GGUF_TYPES = ("Q4_0", "Q4_1", "Q8_0")
_EXACT = ConversionReport(True, 0.0)


class ConvertError(Exception):
    """A user error: bad file, name, format or option."""


def _need(module: str, pip: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConvertError(f"{what} files need the '{pip}' package: pip install {pip}") from None


@contextlib.contextmanager
def _parsing(path, kind, hint=None):
    """Turn any failure of a file parser into a one-line ConvertError (``hint`` replaces the parser's text)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except (ConvertError, OSError):
        raise
    except Exception as exc:
        msg = hint or (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConvertError(f"{path}: not a readable {kind} file ({type(exc).__name__}: {msg})") from None


def file_format(path, override=None) -> str:
    """``npz``/``onnx``/``gguf``/``pt`` from ``override`` or the extension of ``path``."""
    fmt = override or FORMATS.get(os.path.splitext(str(path))[1].lower())
    if fmt is None:
        raise ConvertError(f"cannot tell the format of {path!r} from its extension; use one of "
                           f"{', '.join(FORMATS)} or --from/--to ({', '.join(sorted(set(FORMATS.values())))})")
    return fmt


# --- readers: path -> {name: (description, thunk -> (QuantizedWeight, ConversionReport))} --------------
def _npz_entries(path):
    with _parsing(path, "npz", "not an .npz archive of plain arrays; pickled objects are never loaded"), \
            np.load(path, allow_pickle=False) as z:
        if "format_version" in z.files:
            qw = QuantizedWeight.load(path)
            return {"weight": (repr(qw), lambda: (qw, _EXACT))}
        arrays = {k: z[k] for k in z.files}
    groups = {}
    for key, a in arrays.items():
        parts = key.rsplit("|", 2)
        if len(parts) == 3:
            groups.setdefault(f"{parts[0]}|{parts[1]}", {})[parts[2]] = a
    if not groups:
        raise ConvertError(f"{path}: neither a qconv weight file nor an 'inspect --save' file "
                           "(keys layer|scheme|field)")

    def load(name, f):
        with _parsing(path, "npz"):
            bits, block, g = (int(v) for v in f["meta"])
            return QuantizedWeight(f["q"], f["scales"], f.get("offsets"), bits, block, g), _EXACT
    return {name: (f"int{f['meta'][0] if 'meta' in f else '?'} {f['q'].shape if 'q' in f else '?'}",
                   lambda n=name, f=f: load(n, f)) for name, f in groups.items()}


def _onnx_entries(path):
    onnx = _need("onnx", "onnx", ".onnx")
    from .interop import onnx_format as of

    with _parsing(path, "ONNX"):
        graph = (model := onnx.load(str(path))).graph
    inits = {t.name: t for t in graph.initializer}
    meta = {p.key: p.value for p in model.metadata_props}
    users = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node, i))
    T = onnx.TensorProto
    int_types = (T.INT8, T.UINT8, T.INT4, T.UINT4)
    entries, aliases = {}, {}

    def info(name):
        shape = tuple(int(v) for v in meta[f"qconv.shape:{name}"].split(",")) if f"qconv.shape:{name}" in meta else None
        return shape, int(meta.get(f"qconv.groups:{name}", 0))

    def desc(op, t):
        return f"{op} {T.DataType.Name(t.data_type).lower()} {tuple(t.dims)}"

    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            t, name = inits[node.input[0]], node.output[0]
            if len(t.dims) not in (2, 4) or t.data_type not in int_types:
                continue
            shape, groups = info(name)
            out_axis = None
            for user, i in users.get(name, []):
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in user.attribute}
                if user.op_type == "Conv" and i == 1:
                    groups = groups or attrs.get("group", 1)
                if user.op_type == "Gemm" and i == 1 and attrs.get("transB", 0):
                    out_axis = 0
            thunk = (lambda n=node, s=shape, g=groups, a=out_axis:
                     of.read_dequantize_linear_node(n, inits, out_axis=a, shape=s, groups=g or 1))
            entries[name] = (desc("DequantizeLinear", t), thunk)
            aliases[node.input[0]] = name
        elif node.op_type == "MatMulNBits" and len(node.input) > 2 and node.input[1] in inits:
            name = node.name or node.output[0]
            shape, groups = info(name)
            entries[name] = (desc("MatMulNBits", inits[node.input[1]]), lambda n=node, s=shape, g=groups:
                             of.read_matmul_nbits_node(n, inits, shape=s, groups=g or 1))
            aliases.update({node.output[0]: name, node.input[1]: name})
        elif node.op_type == "QLinearConv" and len(node.input) > 5 and node.input[3] in inits:
            name = node.name or node.input[3]
            entries[name] = (desc("QLinearConv", inits[node.input[3]]),
                             lambda n=node: of.read_qlinear_conv_node(n, inits))
            aliases[node.input[3]] = name
    return entries, aliases


def _gguf_entries(path):
    gguf = _need("gguf", "gguf", ".gguf")
    from .interop import read_gguf

    with _parsing(path, "GGUF"):
        reader = gguf.GGUFReader(str(path), "r")
        tensors = list(reader.tensors)
    field = lambda key: reader.fields[key].contents() if key in reader.fields else None  # noqa: E731

    def load(t):
        qtype = t.tensor_type.name
        if qtype not in GGUF_TYPES:
            raise ConvertError(f"{path}: tensor {t.name!r} is {qtype}; convert reads {', '.join(GGUF_TYPES)}")
        with _parsing(path, "GGUF"):
            data = np.array(t.data, dtype=np.uint8).reshape(int(t.n_elements) // int(t.shape[0]), -1)
        return read_gguf(data, qtype, shape=field(f"qconv.{t.name}.shape"), groups=field(f"qconv.{t.name}.groups") or 1)
    return {t.name: (f"{t.tensor_type.name} {tuple(int(d) for d in t.shape[::-1])}", lambda t=t: load(t))
            for t in tensors}


def _pt_entries(path):
    torch = _need("torch", "torch", ".pt")
    from .interop import read_torch

    with _parsing(path, "PyTorch", "not a torch.save file of tensors; it is loaded with weights_only=True"):
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    found = {}

    def walk(o, name):
        if isinstance(o, torch.Tensor):
            if o.is_quantized:
                found[name or "weight"] = o
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{name}.{i}" if name else str(i))
    walk(obj, "")
    return {n: (f"{t.dtype} {tuple(t.shape)} {t.qscheme()}", lambda t=t: read_torch(t)) for n, t in found.items()}


def entries(path, fmt):
    """``({name: (description, thunk)}, {alias: name})`` of the weights in a file."""
    if not os.path.isfile(path):
        raise ConvertError(f"{path}: no such file")
    got = {"npz": _npz_entries, "onnx": _onnx_entries, "gguf": _gguf_entries, "pt": _pt_entries}[fmt](path)
    return got if isinstance(got, tuple) else (got, {})


def read(path, fmt, tensor=None):
    """-> ``(name, QuantizedWeight, ConversionReport)`` of entry ``tensor`` (optional when there is one)."""
    found, aliases = entries(path, fmt)
    if not found:
        raise ConvertError(f"{path}: no quantized weight found that convert can read")
    names = list(found)
    shown = ", ".join(names[:20]) + (f", ... ({len(names) - 20} more; --list shows all)" if len(names) > 20 else "")
    if tensor is None:
        if len(found) > 1:
            raise ConvertError(f"{path} holds {len(found)} weights; choose one with --tensor: {shown}")
        tensor = names[0]
    name = tensor if tensor in found else aliases.get(tensor)
    if name is None:
        raise ConvertError(f"{path}: no tensor named {tensor!r}; available: {shown}")
    qw, report = found[name][1]()
    return name, qw, report


# --- writers: -> (ConversionReport, description, extra notes) -----------------------------------------
def _write_npz(qw, path, name, opts):
    with open(path, "wb") as fh:
        qw.save(fh)
    return _EXACT, "qconv QuantizedWeight", []


def _matmul_block(qw) -> int:
    if qw.n_blocks == 1:
        return 32
    p = qw.block_len & -qw.block_len  # largest power of two dividing the block
    if p < 16:
        raise ConvertError(f"MatMulNBits blocks are powers of two >= 16 that must divide this weight's blocks of "
                           f"{qw.block_len} elements; use the DequantizeLinear form (default --onnx-op)")
    return min(p, 128)


def _write_onnx(qw, path, name, opts):
    onnx = _need("onnx", "onnx", ".onnx")
    from .interop import onnx_format as of

    h = onnx.helper
    if opts.get("onnx_op", "dequantizelinear") == "matmulnbits":
        block = _matmul_block(qw)
        node, inits, report = of.matmul_nbits_node(qw, f"{name}_input", name, block_size=block)
        k, n = qw.q[0].size, qw.out_channels
        inputs = [h.make_tensor_value_info(f"{name}_input", onnx.TensorProto.FLOAT, ["M", k])]
        outputs = [h.make_tensor_value_info(name, onnx.TensorProto.FLOAT, ["M", n])]
        what = f"MatMulNBits {qw.bits}-bit block {block}"
    else:
        node, inits, report = of.dequantize_linear_node(qw, name)
        inputs, outputs = [], [h.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(qw.q.shape))]
        what = f"DequantizeLinear int{qw.bits}" + (f" block {qw.block_size}" if qw.block_size else " per channel")
    graph = h.make_graph([node], "qconv_weight", inputs, outputs, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)],
                         producer_name="qconv")
    model.ir_version = 10
    h.set_model_props(model, {f"qconv.shape:{name}": ",".join(map(str, qw.q.shape)),
                              f"qconv.groups:{name}": str(qw.groups)})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return report, what, []


def _write_gguf(qw, path, name, opts):
    gguf = _need("gguf", "gguf", ".gguf")
    from .interop import write_gguf

    qtype = opts.get("gguf_type")
    if qtype is None:
        plain = qw.offsets is None or not qw.offsets.any()
        qtype = "Q8_0" if qw.bits == 8 else ("Q4_0" if plain else "Q4_1")
    data, report = write_gguf(qw, qtype)
    writer = gguf.GGUFWriter(str(path), arch="qconv")
    writer.add_array(f"qconv.{name}.shape", [int(s) for s in qw.q.shape])
    writer.add_uint32(f"qconv.{name}.groups", qw.groups)
    writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return report, f"GGUF {qtype}", []


def _write_pt(qw, path, name, opts):
    torch = _need("torch", "torch", ".pt")
    from .interop import write_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            t, report = write_torch(qw)
        except ValueError:
            raise ConvertError(f".pt output is a per-channel torch.ao tensor; this weight has {qw.n_blocks} blocks "
                               "per channel (write .npz, .onnx or .gguf instead)") from None
        torch.save(t, str(path))
    notes = [f"groups={qw.groups} is not stored in .pt files: pass --groups {qw.groups} when reading it back"] \
        if qw.groups > 1 else []
    if qw.bits == 4:
        notes.append("int4 codes stored as qint8 (they read back as 8-bit weights, same values)")
    return report, "torch per_channel_affine qint8", notes


WRITERS = {"npz": _write_npz, "onnx": _write_onnx, "gguf": _write_gguf, "pt": _write_pt}


# --- the command --------------------------------------------------------------------------------------
def format_report(report: ConversionReport, bound: bool = False) -> str:
    """``lossless`` or ``lossy, max abs error E`` and one indented line per note."""
    text = "lossless" if report.lossless else f"lossy, max abs error {'<= ' if bound else ''}{report.max_abs_error:.6g}"
    return "\n".join([text] + [f"  - {n}" for n in report.notes])


def summary(qw: QuantizedWeight, path) -> str:
    """One line: shape, bits, blocks, bytes."""
    blk = f"block {qw.block_size} ({qw.n_blocks}/channel)" if qw.block_size else "per channel"
    return (f"{path}: shape {tuple(qw.q.shape)}, groups {qw.groups}, int{qw.bits} "
            f"{'sym' if qw.symmetric else 'asym'}, {blk}, {qw.nbytes:,} bytes packed (float {qw.nbytes_float:,}), "
            f"file {os.path.getsize(path):,} bytes")


def convert(src, dst, *, src_format=None, dst_format=None, tensor=None, name=None, groups=None, out=None,
            **opts) -> ConversionReport:
    """Convert one weight from ``src`` to ``dst``, print the reports and summary; returns the overall report
    (its error is the sum of both steps' errors, a bound when both are lossy)."""
    out = out or sys.stdout
    fin, fout = file_format(src, src_format), file_format(dst, dst_format)
    src_name, qw, r_read = read(src, fin, tensor)
    if groups:
        qw = dataclasses.replace(qw, groups=groups)
    label = f" [{src_name}]" if src_name != "weight" or tensor else ""
    print(f"read  {src}{label} ({fin}): {format_report(r_read)}", file=out)
    r_write, what, notes = WRITERS[fout](qw, dst, name or src_name.replace("|", "/"), opts)
    print(f"write {dst} ({what}): {format_report(r_write)}", file=out)
    for n in notes:
        print(f"  note: {n}", file=out)
    total = ConversionReport(r_read.lossless and r_write.lossless, r_read.max_abs_error + r_write.max_abs_error,
                             r_read.notes + r_write.notes)
    bound = bool(r_read.max_abs_error and r_write.max_abs_error)  # both lossy: the sum bounds the error
    print(f"ConversionReport: {format_report(dataclasses.replace(total, notes=()), bound)}", file=out)
    try:
        print(summary(read(dst, fout)[1], dst), file=out)
    except (ConvertError, ValueError) as exc:  # e.g. GGUF blocks of 32 across 3x3 taps: valid, not a QuantizedWeight
        print(f"{dst}: {what}, shape {tuple(qw.q.shape)}, file {os.path.getsize(dst):,} bytes "
              f"(qconv cannot read it back: {str(exc).splitlines()[0][:120]})", file=out)
    return total


def main(args) -> int:
    """The ``convert`` subcommand (``args`` from :func:`qconv.cli.main`): 0 on success, 2 on user errors."""
    try:
        if args.list:
            found, _ = entries(args.input, file_format(args.input, args.src_format))
            for n, (d, _) in found.items():
                print(f"{n}\t{d}")
            return 0
        if args.output is None:
            raise ConvertError("missing OUTPUT (or use --list)")
        if args.groups is not None and args.groups < 1:
            raise ConvertError(f"--groups must be >= 1, got {args.groups}")
        convert(args.input, args.output, src_format=args.src_format, dst_format=args.dst_format, tensor=args.tensor,
                name=args.name, groups=args.groups, onnx_op=args.onnx_op, gguf_type=args.gguf_type)
    except (ConvertError, ValueError, OSError) as exc:
        print(f"qconv convert: error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    return 0
