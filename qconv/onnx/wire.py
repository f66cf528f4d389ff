"""The part of ONNX's protobuf messages an :class:`~qconv.onnx.InferenceSession` reads and rewrites, without ``onnx``.

Importing the ``onnx`` package adds 16 MiB to a process (45 -> 61 MiB beside numpy and onnxruntime, measured on
2026-12-02), more than int8 weights save on a model like PP-OCRv4 rec; so a session reads its model's bytes here:
the protobuf wire format (https://protobuf.dev/programming-guides/encoding/: tagged varint, fixed32/64 and
length-delimited fields) and, of ONNX's messages (``onnx.proto``), only these fields:

==================  ==================================================================================
message             fields read (field number)
==================  ==================================================================================
ModelProto          graph (7), metadata_props (14: key 1, value 2)
GraphProto          node (1), initializer (5)
NodeProto           input (1), output (2), name (3), op_type (4), attribute (5), domain (7)
AttributeProto      name (1), f (2), i (3), s (4), floats (7), ints (8), strings (9), type (20)
TensorProto         dims (1), data_type (2), float_data (4), int32_data (5), int64_data (7), name (8),
                    raw_data (9), double_data (10), uint64_data (11), external_data (13),
                    data_location (14)
==================  ==================================================================================

:func:`rewrite_graph` copies every other field through byte for byte. Tensors decode as ``onnx.numpy_helper``
does for the types qconv's nodes use (the tests hold the two against each other).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# wire types
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
# AttributeProto.type
_A_FLOAT, _A_INT, _A_STRING, _A_FLOATS, _A_INTS, _A_STRINGS = 1, 2, 3, 6, 7, 8
# TensorProto.data_type -> numpy dtype (INT4 / UINT4: the unpacked codes)
INT4, UINT4 = 22, 21
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
           10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, UINT4: np.uint8, INT4: np.int8}


def _varint(buf, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated protobuf varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("protobuf varint longer than 10 bytes")


def fields(buf):
    """Yield ``(number, wire_type, value, start, end)`` for each field of the message ``buf`` (bytes or
    memoryview). ``value``: an int (varint), a memoryview (length-delimited), the 4 or 8 bytes (fixed32 /
    fixed64); ``buf[start:end]`` is the whole field, tag included. ValueError on malformed input."""
    buf = memoryview(buf)
    pos, n = 0, len(buf)
    while pos < n:
        start = pos
        tag, pos = _varint(buf, pos)
        number, wtype = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("protobuf field number 0")
        if wtype == VARINT:
            value, pos = _varint(buf, pos)
        elif wtype == LEN:
            size, pos = _varint(buf, pos)
            if pos + size > n:
                raise ValueError("truncated protobuf length-delimited field")
            value, pos = buf[pos:pos + size], pos + size
        elif wtype in (FIXED32, FIXED64):
            size = 4 if wtype == FIXED32 else 8
            if pos + size > n:
                raise ValueError("truncated protobuf fixed-size field")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wtype}")
        yield number, wtype, value, start, pos


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _packed_ints(wtype, value, signed: bool = True) -> list:
    """A repeated int64/int32 (``signed``) or uint64 field's values: one varint, or a packed run of them."""
    if wtype == VARINT:
        return [_signed(value) if signed else value]
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(_signed(v) if signed else v)
    return out


def _packed_floats(wtype, value, fmt: str = "f") -> list:
    """A repeated float (``fmt`` ``"f"``) or double (``"d"``) field's values: packed (LEN) or one fixed value."""
    size = struct.calcsize(fmt)
    return list(struct.unpack(f"<{len(value) // size}{fmt}", value))


@dataclass
class Node:
    """A NodeProto. Its attributes are decoded when :attr:`attrs` is first read (only qconv's nodes are)."""
    name: str = ""
    op_type: str = ""
    domain: str = ""
    input: list = field(default_factory=list)
    output: list = field(default_factory=list)
    attribute: list = field(default_factory=list)   # AttributeProto bytes

    @property
    def attrs(self) -> dict:
        """``{name: value}``: ints, floats, bytes or lists of them (ValueError for tensor / graph attributes)."""
        return dict(_read_attribute(a) for a in self.attribute)


def read_node(buf) -> Node:
    node = Node()
    for number, wtype, value, _, _ in fields(buf):
        if wtype != LEN:
            continue
        if number == 1:
            node.input.append(bytes(value).decode())
        elif number == 2:
            node.output.append(bytes(value).decode())
        elif number == 3:
            node.name = bytes(value).decode()
        elif number == 4:
            node.op_type = bytes(value).decode()
        elif number == 7:
            node.domain = bytes(value).decode()
        elif number == 5:
            node.attribute.append(value)
    return node


def _read_attribute(buf):
    name, kind, got = "", None, {}
    lists = {7: [], 8: [], 9: []}
    for number, wtype, value, _, _ in fields(buf):
        if number == 1 and wtype == LEN:
            name = bytes(value).decode()
        elif number == 20 and wtype == VARINT:
            kind = value
        elif number == 2 and wtype == FIXED32:
            got[_A_FLOAT] = struct.unpack("<f", value)[0]
        elif number == 3 and wtype == VARINT:
            got[_A_INT] = _signed(value)
        elif number == 4 and wtype == LEN:
            got[_A_STRING] = bytes(value)
        elif number == 7:
            lists[7] += _packed_floats(wtype, value) if wtype == LEN else list(struct.unpack("<f", value))
        elif number == 8:
            lists[8] += _packed_ints(wtype, value)
        elif number == 9 and wtype == LEN:
            lists[9].append(bytes(value))
    got.update({_A_FLOATS: lists[7], _A_INTS: lists[8], _A_STRINGS: lists[9]})
    if kind is None:   # files written without the type field: the one value present
        kind = next((k for k in (_A_FLOAT, _A_INT, _A_STRING) if k in got),
                    next((k for k, f in ((_A_FLOATS, 7), (_A_INTS, 8), (_A_STRINGS, 9)) if lists[f]), _A_INTS))
    if kind not in got:
        raise ValueError(f"attribute {name!r}: type {kind} is not one qconv's nodes use")
    return name, got[kind]


@dataclass
class Tensor:
    """A TensorProto's header and data fields (memoryviews into the model's bytes: nothing is copied)."""
    name: str = ""
    dims: list = field(default_factory=list)
    data_type: int = 0
    raw: memoryview | None = None
    typed: list = field(default_factory=list)   # (field, wire type, value) of the typed data fields
    external: bool = False

    def to_array(self) -> tuple[np.ndarray, int]:
        """``(array, bits)`` as :func:`qconv.interop.onnx_format.from_tensor_proto` gives them: INT4 / UINT4
        unpacked to int8 / uint8 with ``bits = 4``, other types with ``bits = 8``."""
        from ..layouts import ONNX_INT4, ONNX_UINT4

        if self.external:
            raise ValueError(f"tensor {self.name!r} keeps its data in an external file")
        if self.data_type not in _DTYPES:
            raise ValueError(f"tensor {self.name!r}: data type {self.data_type} is not one qconv's nodes use")
        dtype = _DTYPES[self.data_type]
        shape = tuple(self.dims)
        n = int(np.prod(shape)) if shape else 1
        if self.data_type in (INT4, UINT4):
            if self.raw is None or len(self.raw) != (n + 1) // 2:
                raise ValueError(f"tensor {self.name!r}: INT4 / UINT4 need raw_data of {(n + 1) // 2} bytes")
            packing = ONNX_INT4 if self.data_type == INT4 else ONNX_UINT4
            return packing.unpack_array(np.frombuffer(self.raw, np.uint8), n).astype(dtype).reshape(shape), 4
        if self.raw is not None:
            if len(self.raw) != n * np.dtype(dtype).itemsize:
                raise ValueError(f"tensor {self.name!r}: raw_data has {len(self.raw)} bytes for shape {shape}")
            return np.frombuffer(self.raw, np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape), 8
        values = []   # decoded here, not when the model is read: a float model's typed fields can be large
        for number, wtype, value in self.typed:
            if number in (4, 10):
                values += _packed_floats(wtype, value, "f" if number == 4 else "d")
            else:
                values += _packed_ints(wtype, value, signed=number != 11)
        if len(values) != n:
            raise ValueError(f"tensor {self.name!r}: {len(values)} values for shape {shape}")
        if self.data_type == 10:   # float16 bit patterns in int32_data
            return np.asarray(values, np.uint16).view(np.float16).reshape(shape), 8
        if self.data_type in (12, 13):   # uint64_data: Python ints up to 2**64 - 1, exact only as uint64
            return np.array(values, np.uint64).astype(dtype).reshape(shape), 8
        return np.asarray(values).astype(dtype).reshape(shape), 8


def read_tensor(buf) -> Tensor:
    t = Tensor()
    for number, wtype, value, _, _ in fields(buf):
        if number == 1:
            t.dims += _packed_ints(wtype, value)
        elif number == 2 and wtype == VARINT:
            t.data_type = value
        elif number == 8 and wtype == LEN:
            t.name = bytes(value).decode()
        elif number == 9 and wtype == LEN:
            t.raw = value
        elif number in (4, 5, 7, 10, 11):
            t.typed.append((number, wtype, value))
        elif number == 13:
            t.external = True
        elif number == 14 and wtype == VARINT and value == 1:
            t.external = True
    return t


def _graph_of(data) -> tuple[memoryview, int, int]:
    """(GraphProto bytes, start, end of the graph field) of a ModelProto; ValueError when it has none or is
    malformed (every top-level field is read)."""
    graph = None
    for number, wtype, value, start, end in fields(data):
        if number == 7 and wtype == LEN:
            graph = value, start, end
    if graph is None:
        raise ValueError("not an ONNX model (no graph)")
    return graph


def metadata(data) -> dict:
    """A ModelProto's ``metadata_props`` as ``{key: value}``."""
    out = {}
    for number, wtype, value, _, _ in fields(data):
        if number == 14 and wtype == LEN:
            kv = {n: bytes(v).decode() for n, w, v, _, _ in fields(value) if w == LEN}
            out[kv.get(1, "")] = kv.get(2, "")
    return out


def graph_parts(data) -> tuple[list, dict]:
    """``(nodes, initializers)`` of a ModelProto's graph: ``[Node]`` in graph order and ``{name: Tensor}``."""
    graph, _, _ = _graph_of(data)
    nodes, inits = [], {}
    for number, wtype, value, _, _ in fields(graph):
        if wtype != LEN:
            continue
        if number == 1:
            nodes.append(read_node(value))
        elif number == 5:
            t = read_tensor(value)
            inits[t.name] = t
    return nodes, inits


def graph_outputs(data) -> list:
    """The output names of a ModelProto's graph (GraphProto field 12, ValueInfoProto name 1)."""
    graph, _, _ = _graph_of(data)
    return [bytes(v).decode() for number, wtype, value, _, _ in fields(graph) if number == 12 and wtype == LEN
            for n, w, v, _, _ in fields(value) if n == 1 and w == LEN]


def rewrite_graph(data, nodes: dict, drop_initializers: set, drop_nodes: frozenset = frozenset()) -> bytes:
    """A copy of the ModelProto ``data`` whose graph has node ``i`` replaced by the NodeProto bytes
    ``nodes[i]``, the nodes of index in ``drop_nodes`` and the initializers named in ``drop_initializers`` left
    out; every other field is copied as it is."""
    graph, gstart, gend = _graph_of(data)
    parts, i = [], 0
    for number, wtype, value, start, end in fields(graph):
        if number == 1 and wtype == LEN:
            if i not in drop_nodes:
                parts.append(_len_field(1, nodes[i]) if i in nodes else graph[start:end])
            i += 1
        elif number == 5 and wtype == LEN and read_tensor(value).name in drop_initializers:
            continue
        else:
            parts.append(graph[start:end])
    data = memoryview(data)
    return b"".join([data[:gstart], _len_field(7, b"".join(parts)), data[gend:]])


def _encode_varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload) -> bytes:
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(payload)) + bytes(payload)


def make_node(op_type: str, inputs: list, outputs: list, name: str, domain: str, string_attrs: dict) -> bytes:
    """NodeProto bytes: ``string_attrs`` ``{name: str}`` become STRING attributes."""
    out = [_len_field(1, s.encode()) for s in inputs] + [_len_field(2, s.encode()) for s in outputs]
    out += [_len_field(3, name.encode()), _len_field(4, op_type.encode())]
    for key, value in string_attrs.items():
        attr = _len_field(1, key.encode()) + _len_field(4, value.encode()) + _encode_varint(20 << 3) \
            + _encode_varint(_A_STRING)
        out.append(_len_field(5, attr))
    out.append(_len_field(7, domain.encode()))
    return b"".join(out)
