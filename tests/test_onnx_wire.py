"""qconv.onnx.wire (the ONNX protobuf subset a session reads and rewrites without the onnx package) against onnx
itself: tensors, attributes, the graph rewrite, malformed bytes, and a session that never imports onnx."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qconv.onnx as qo  # noqa: E402
from qconv.interop import onnx_format as of  # noqa: E402
from qconv.onnx import wire  # noqa: E402

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.bool_]


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()   # bitwise: NaN payloads, -0.0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=3), st.booleans(), st.integers(0, 2**32 - 1))
def test_tensors_decode_as_numpy_helper(dtype, shape, raw, seed):
    """raw_data and the typed fields (float_data / int32_data / int64_data), every dtype, scalars and empty
    tensors: the same array as onnx.numpy_helper.to_array, bit for bit."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        a = rng.standard_normal(shape).astype(dtype) * 1000
        a.reshape(-1)[:1] = -0.0
    elif dtype == np.bool_:
        a = rng.integers(0, 2, shape).astype(np.bool_)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype)
    if raw or dtype == np.float64:   # make_tensor keeps float64 in double_data, which sessions never read
        t = numpy_helper.from_array(a, "t")
    else:
        kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        vals = a.view(np.uint16).reshape(-1) if dtype == np.float16 else a.reshape(-1)
        t = helper.make_tensor("t", kind, a.shape, vals.tolist())
    got, bits = wire.read_tensor(t.SerializeToString()).to_array()
    assert bits == 8
    _same(got, numpy_helper.to_array(t))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([np.int8, np.uint8]), st.lists(st.integers(1, 5), min_size=1, max_size=3),
       st.integers(0, 2**32 - 1))
def test_int4_tensors_decode_as_from_tensor_proto(dtype, shape, seed):
    lo, hi = (-8, 7) if dtype == np.int8 else (0, 15)
    a = np.random.default_rng(seed).integers(lo, hi + 1, shape).astype(dtype)   # odd counts: a spare nibble
    t = of.to_tensor_proto("q", a, 4)
    got, bits = wire.read_tensor(t.SerializeToString()).to_array()
    want, wbits = of.from_tensor_proto(t)
    assert bits == wbits == 4
    _same(got, want)


def test_attributes_decode_as_onnx_helper():
    node = helper.make_node("QConv", ["x", "q"], ["y"], name="n", domain="ai.qconv", i=-3, big=2**40, f=0.1,
                            s="hard", ints=[1, -2, 3], floats=[0.5, -1.25], strings=["a", "bc"])
    node.attribute.append(helper.make_attribute("empty_ints", [], attr_type=onnx.AttributeProto.INTS))
    got = wire.read_node(node.SerializeToString())
    assert (got.name, got.op_type, got.domain, got.input, got.output) == ("n", "QConv", "ai.qconv", ["x", "q"], ["y"])
    want = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert got.attrs.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, float):
            assert np.float32(got.attrs[k]) == np.float32(v)
        elif k == "floats":
            assert np.array_equal(np.float32(got.attrs[k]), np.float32(v))
        else:
            assert got.attrs[k] == v, k
    tensor_attr = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(2, np.float32)))
    with pytest.raises(ValueError, match="type 4"):
        _ = wire.read_node(tensor_attr.SerializeToString()).attrs


def _small_model():
    w = np.arange(8, dtype=np.float32).reshape(2, 4)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu", doc_string="kept")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(3, np.float32), "k")],
                          value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="test")
    m.metadata_props.add(key="a", value="1")
    m.metadata_props.add(key="qconv.summary", value='{"layers": {}}')
    return m


def test_rewrite_graph_replaces_nodes_drops_initializers_keeps_the_rest():
    m = _small_model()
    data = m.SerializeToString()
    nodes, inits = wire.graph_parts(data)
    assert [n.name for n in nodes] == ["mm", "relu"] and set(inits) == {"w", "k"}
    assert wire.metadata(data) == {"a": "1", "qconv.summary": '{"layers": {}}'}
    assert qo.model_summary(data) == qo.model_summary(m) == {"layers": {}}
    new = wire.make_node("Custom", ["x"], ["h"], "mm", "ai.qconv", {"key": "s1/mm"})
    out = onnx.load_from_string(wire.rewrite_graph(data, {0: new}, {"w"}))
    want = onnx.ModelProto()
    want.CopyFrom(m)
    want.graph.node[0].CopyFrom(helper.make_node("Custom", ["x"], ["h"], name="mm", domain="ai.qconv", key="s1/mm"))
    del want.graph.initializer[0]
    assert out == want   # every other field (value_info, doc_string, opsets, metadata) as it was


def test_malformed_bytes_raise_value_error(tmp_path):
    data = _small_model().SerializeToString()
    for bad in (data[:len(data) // 2], data[:-1], b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x07"):
        with pytest.raises(ValueError):
            wire.graph_parts(bad)
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"not an onnx model at all")
    with pytest.raises(ValueError, match="not a readable ONNX model"):
        qo.InferenceSession(str(path))
    with pytest.raises(TypeError, match="a path, the bytes of a model or an onnx.ModelProto"):
        qo.InferenceSession(42)
    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "t")
    t.raw_data = t.raw_data[:-4]
    with pytest.raises(ValueError, match="raw_data has 20 bytes"):
        wire.read_tensor(t.SerializeToString()).to_array()


def _quantized(tmp_path):
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="c", pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    q = qo.quantize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), "int4-b4-asym")
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    return q, x


def test_external_data_models_load(tmp_path):
    q, x = _quantized(tmp_path)
    want, = qo.InferenceSession(q, threads=1).run(None, {"x": x})
    path = tmp_path / "ext.onnx"
    onnx.save(q, path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
              size_threshold=0)
    assert any(t.external for t in wire.graph_parts(path.read_bytes())[1].values())
    got, = qo.InferenceSession(str(path), threads=1).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_a_session_from_a_file_does_not_import_onnx(tmp_path):
    """The reason for qconv.onnx.wire: ``import onnx`` alone adds 16 MiB to the session's process."""
    q, x = _quantized(tmp_path)
    onnx.save(q, tmp_path / "q.onnx")
    np.save(tmp_path / "x.npy", x)
    want, = qo.InferenceSession(q, threads=1).run(None, {"x": x})
    np.save(tmp_path / "want.npy", want)
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        import qconv.onnx as qo
        s = qo.InferenceSession({str(tmp_path / "q.onnx")!r}, threads=1)
        y, = s.run(None, {{"x": np.load({str(tmp_path / "x.npy")!r})}})
        assert np.array_equal(y, np.load({str(tmp_path / "want.npy")!r}))
        assert "onnx" not in sys.modules and "google.protobuf" not in sys.modules, "onnx was imported"
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


# Deterministic cases of the typed fields (issue #35): make_tensor(raw=False) puts the values in float_data /
# int32_data / int64_data, which protobuf writes packed (one length-delimited run); the hypothesis test above draws
# a typed float32 tensor only now and then, and a packed float_data decode error once passed CI.
_F32 = [0.0, -0.0, 1.0, -1.5, 0.1, 3.4028235e38, -3.4028235e38, 1e-45, -1.1754944e-38, np.inf, -np.inf, np.nan,
        -12345.678]
_F16 = [0.0, -0.0, 1.0, -2.5, 65504.0, -65504.0, 6e-08, np.inf, -np.inf, np.nan, 0.333]
PACKED = {   # name: (data_type, shape, values, the TensorProto field they go to)
    "float": (TensorProto.FLOAT, (13,), _F32, 4),
    "float-2x3": (TensorProto.FLOAT, (2, 3), [1.25, -2.5, 3.75, -1e-3, 7e6, -0.0], 4),
    "float-scalar": (TensorProto.FLOAT, (), [-2.75], 4),
    "int32": (TensorProto.INT32, (7,), [-1, -2**31, 2**31 - 1, 0, 1, -300, 70000], 5),
    "int64": (TensorProto.INT64, (2, 4), [-1, -2**63, 2**63 - 1, 0, 1, -2**40, 2**40 + 3, -128], 7),
    "int8": (TensorProto.INT8, (2, 3), [-128, 127, -1, 0, 1, -77], 5),
    "uint8": (TensorProto.UINT8, (5,), [0, 255, 128, 1, 127], 5),
    "int16": (TensorProto.INT16, (5,), [-32768, 32767, -1, 0, 300], 5),
    "bool": (TensorProto.BOOL, (4,), [True, False, False, True], 5),
    "float16": (TensorProto.FLOAT16, (11,), _F16, 5),   # bit patterns in int32_data
}


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_typed_fields_decode_as_numpy_helper(name):
    """Packed float_data / int32_data / int64_data (every dtype using them) decode bitwise as numpy_helper."""
    data_type, shape, values, number = PACKED[name]
    t = helper.make_tensor("t", data_type, shape, values, raw=False)
    data = t.SerializeToString()
    runs = [(n, w) for n, w, _, _, _ in wire.fields(data) if n in (4, 5, 7, 9, 10)]
    assert runs == [(number, wire.LEN)]   # one packed run in the field expected, no raw_data
    want = numpy_helper.to_array(t)
    assert want.size == len(values)
    got, bits = wire.read_tensor(data).to_array()
    assert bits == 8
    _same(got, want)


def _key(number, wtype):
    return _uvarint(number << 3 | wtype)


def _uvarint(v):
    v &= (1 << 64) - 1   # negative int32 / int64: ten bytes, two's complement (as protobuf writes them)
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _len(number, payload):
    return _key(number, wire.LEN) + _uvarint(len(payload)) + payload


def _header(data_type, dims):
    return b"".join(_key(1, wire.VARINT) + _uvarint(d) for d in dims) + _key(2, wire.VARINT) + _uvarint(data_type) \
        + _len(8, b"t")


def _f32(values):
    return np.asarray(values, "<f4").tobytes()


def _ints(values):
    return b"".join(_uvarint(v) for v in values)


HAND = {   # name: TensorProto bytes that are valid protobuf but not what onnx writes
    "float-unpacked": _header(TensorProto.FLOAT, [4]) + b"".join(_key(4, wire.FIXED32) + _f32([v])
                                                                  for v in (1.5, -0.0, -3.25, 1e-45)),
    "float-two-runs": _header(TensorProto.FLOAT, [2, 3]) + _len(4, _f32([1, -2, 3.5])) + _len(4, _f32([-4, 0.1, 6])),
    "float-run-then-one": _len(4, _f32([7.0, -8.5])) + _key(4, wire.FIXED32) + _f32([9.75])
    + _header(TensorProto.FLOAT, [3]),   # header last: field order is free
    "int32-unpacked": _header(TensorProto.INT32, [4]) + b"".join(_key(5, wire.VARINT) + _uvarint(v)
                                                                  for v in (-1, 2**31 - 1, -2**31, 5)),
    "int8-two-runs": _header(TensorProto.INT8, [5]) + _len(5, _ints([-128, 127])) + _len(5, _ints([-1, 0, 3])),
    "int64-run-then-one": _header(TensorProto.INT64, [3]) + _len(7, _ints([-2**63, 2**62])) + _key(7, wire.VARINT)
    + _uvarint(-5),
    "float16-unpacked": _header(TensorProto.FLOAT16, [3]) + b"".join(
        _key(5, wire.VARINT) + _uvarint(int(v)) for v in np.array([1.0, -2.0, np.inf], np.float16).view(np.uint16)),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_unpacked_and_split_typed_fields_decode_as_onnx_parses_them(name):
    """Typed fields unpacked, split in runs, or mixed decode as onnx parses the same bytes."""
    data = HAND[name]
    want = numpy_helper.to_array(TensorProto.FromString(data))
    got, _ = wire.read_tensor(data).to_array()
    _same(got, want)


def test_double_and_uint64_data_decode_as_onnx():
    """double_data (packed doubles) and uint64_data (unsigned varints, UINT32 / UINT64) decode as onnx does."""
    cases = [(TensorProto.DOUBLE, [1.0, -2.0, 3.5, 1e300, -0.0, 5e-324]),
             (TensorProto.UINT64, [0, 2**64 - 1, 7, 2**63, 1, 300]),
             (TensorProto.UINT32, [0, 2**32 - 1, 7, 2**31, 1, 300])]
    for data_type, values in cases:
        t = helper.make_tensor("t", data_type, (2, 3), values, raw=False)
        want = numpy_helper.to_array(t)
        got, bits = wire.read_tensor(t.SerializeToString()).to_array()
        assert bits == 8 and got.dtype == want.dtype and got.shape == (2, 3)
        assert got.tobytes() == want.tobytes(), data_type


def test_int4_in_int32_data_is_refused_with_the_reason():
    """INT4 codes in int32_data (valid ONNX that qconv never writes) raise ValueError rather than decode wrongly."""
    t = helper.make_tensor("t", TensorProto.INT4, (3,), [1, -2, 3], raw=False)
    assert numpy_helper.to_array(t).tolist() == [1, -2, 3]
    with pytest.raises(ValueError, match="need raw_data"):
        wire.read_tensor(t.SerializeToString()).to_array()


def test_packed_attribute_floats_and_ints_decode_as_onnx():
    """Packed AttributeProto floats / ints (negatives, -0.0, mixed runs) decode as onnx parses them."""
    floats = [0.5, -1.25, -0.0, 3.4028235e38, 1e-45, -7.0]
    ints = [1, -2, 2**40, -2**63, 0]
    attrs = [_len(1, b"fs") + _len(7, _f32(floats)) + _key(20, wire.VARINT) + _uvarint(6),
             _key(20, wire.VARINT) + _uvarint(7) + _len(1, b"is") + _len(8, _ints(ints)),
             _len(1, b"fs2") + _len(7, _f32(floats[:2])) + _key(7, wire.FIXED32) + _f32([9.5])
             + _len(7, _f32(floats[2:])) + _key(20, wire.VARINT) + _uvarint(6)]
    data = _len(1, b"x") + _len(2, b"y") + _len(3, b"n") + _len(4, b"QConv") + b"".join(_len(5, a) for a in attrs) \
        + _len(7, b"ai.qconv")
    node = onnx.NodeProto.FromString(data)
    want = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    got = wire.read_node(data).attrs
    assert got.keys() == want.keys() == {"fs", "is", "fs2"}
    assert got["is"] == want["is"] == ints
    for k in ("fs", "fs2"):
        assert np.float32(got[k]).tobytes() == np.float32(want[k]).tobytes(), k
    assert np.float32(got["fs"]).tobytes() == _f32(floats)
