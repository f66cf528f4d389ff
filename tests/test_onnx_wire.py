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
