"""The native onnxruntime custom operators of qconv (``qconv._ext._ortops`` + ``qconv_ort.h``).

These drive the bridge itself with stand-in kernels registered under keys of their own: shapes and data reach
the kernel as views of onnxruntime's tensors (input read-only), the output is what the kernel wrote, errors fail
the node with the kernel's message (never the process), and kernel references are released with the session.
"""
import ctypes
import sys
import threading

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (interop extra)")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (interop extra)")

from onnx import TensorProto, helper  # noqa: E402

from qconv._ext import _ortops  # noqa: E402
from qconv.onnx import kernels as qk  # noqa: E402
from qconv.onnx.nodes import DOMAIN, QCONV, QMATMUL  # noqa: E402


class Stretch:
    """Stand-in kernel: ``y[..., :W] = 2 * x``, ``y[..., W:] = x + 1`` (the last axis doubled)."""

    def __init__(self):
        self.seen = []

    def out_shape(self, shape):
        return tuple(shape[:-1]) + (2 * shape[-1],)

    def __call__(self, x, y):
        self.seen.append((x.shape, x.flags.writeable, y.shape, y.flags.writeable))
        w = x.shape[-1]
        np.multiply(x, 2, out=y[..., :w])
        np.add(x, 1, out=y[..., w:])
        return y


class Fails:
    def out_shape(self, shape):
        return tuple(shape)

    def __call__(self, x, y):
        raise ZeroDivisionError("stand-in failure")


def _session(key, op=QCONV, dims=("n", 3, 4, 5), inputs=("x",), outputs=("y",)):
    """A session of one ``op`` node ``inputs -> outputs`` whose attribute ``qconv_key`` is ``key`` (None: none)."""
    node = helper.make_node(op, list(inputs), list(outputs), name="n0", domain=DOMAIN,
                            **({} if key is None else {_ortops.KEY_ATTR: key}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, list(dims))
                                            for i in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    so = ort.SessionOptions()
    so.register_custom_ops_library(qk.register())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.fixture
def registered():
    keys = []

    def put(key, kernel):
        qk.KERNELS[key] = kernel
        keys.append(key)
        return kernel

    yield put
    for k in keys:
        qk.KERNELS.pop(k, None)


@pytest.mark.parametrize("op", [QCONV, QMATMUL])
def test_kernel_sees_views_and_writes_the_output(registered, op):
    kernel = registered(f"native-test/{op}", Stretch())
    sess = _session(f"native-test/{op}", op)
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    y, = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.concatenate([2 * x, x + 1], axis=-1))
    assert kernel.seen == [((2, 3, 4, 5), False, (2, 3, 4, 10), True)]   # the input view is read-only
    y0, = sess.run(None, {"x": x[:0]})   # an empty batch goes through the same path
    assert y0.shape == (0, 3, 4, 10)


def test_kernel_exception_fails_the_node_with_its_message(registered):
    registered("native-test/fails", Fails())
    sess = _session("native-test/fails")
    qk.take_error()
    with pytest.raises(Exception, match="ZeroDivisionError: stand-in failure"):
        sess.run(None, {"x": np.zeros((1, 3, 4, 5), np.float32)})
    assert isinstance(qk.take_error(), ZeroDivisionError)   # kept for InferenceSession.run to raise as it is


def test_bad_output_shape_is_an_error_not_a_crash(registered):
    class BadShape(Stretch):
        def out_shape(self, shape):
            return (1,) * 9

    registered("native-test/badshape", BadShape())
    with pytest.raises(Exception, match="9 dimensions"):
        _session("native-test/badshape").run(None, {"x": np.zeros((1, 3, 4, 5), np.float32)})


def test_unknown_key_fails_session_creation():
    with pytest.raises(Exception, match="no prepared kernel for 'native-test/missing'"):
        _session("native-test/missing").run(None, {"x": np.zeros((1, 3, 4, 5), np.float32)})


def test_kernel_reference_is_released_with_the_session(registered):
    kernel = registered("native-test/ref", Stretch())
    before = sys.getrefcount(kernel)
    sess = _session("native-test/ref")
    sess.run(None, {"x": np.ones((1, 3, 4, 5), np.float32)})
    assert sys.getrefcount(kernel) == before + 1   # the onnxruntime kernel holds one reference
    del sess
    assert sys.getrefcount(kernel) == before


def test_sessions_run_concurrently_from_threads(registered):
    registered("native-test/threads", Stretch())
    sessions = [_session("native-test/threads") for _ in range(4)]
    errors, rng = [], np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 4, 5)).astype(np.float32) for _ in sessions]

    def work(sess, x):
        try:
            for _ in range(50):
                y, = sess.run(None, {"x": x})
                np.testing.assert_array_equal(y, np.concatenate([2 * x, x + 1], axis=-1))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=a) for a in zip(sessions, xs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("key", [None, 7])
def test_a_node_without_a_string_key_fails_naming_the_attribute(key):
    with pytest.raises(Exception, match=r"needs the string attribute 'qconv_key'.*through "
                                        r"qconv.onnx.InferenceSession \(onnxruntime: "):
        _session(key)


@pytest.mark.parametrize("inputs, outputs, what", [(("x", "z"), ("y",), "input size 2"),
                                                    (("x",), ("y", "w"), "output size 2")])
def test_a_node_with_other_input_or_output_counts_is_refused(registered, inputs, outputs, what):
    """The operators declare one required input and output: onnxruntime refuses the graph, naming the node."""
    registered("native-test/counts", Stretch())
    with pytest.raises(Exception, match=rf"Node\(n0\) with schema\(ai.qconv::QConv:1\) has {what} not in range "
                                        r"\[min=1, max=1\]"):
        _session("native-test/counts", inputs=inputs, outputs=outputs)


def test_registering_without_api_16_returns_an_error_naming_the_versions():
    """An onnxruntime without C API version 16 (< 1.16): RegisterCustomOps returns an error status made with the
    newest table it has, naming both versions, instead of registering nothing. A stand-in OrtApiBase whose
    ``GetApi`` knows versions 1..15 and whose ``CreateStatus`` (entry 0 of every table) records the message."""
    create_status_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
    get_api_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
    version_t = ctypes.CFUNCTYPE(ctypes.c_void_p)   # const char *: the address of a buffer kept here
    version = ctypes.create_string_buffer(b"1.15.1")
    made, asked = [], []

    @create_status_t
    def create_status(code, msg):
        made.append((code, msg.decode()))
        return 0x5151

    tables = {v: (ctypes.c_void_p * 1)(ctypes.cast(create_status, ctypes.c_void_p)) for v in range(1, 16)}

    @get_api_t
    def get_api(version):
        asked.append(version)
        return ctypes.addressof(tables[version]) if version in tables else None

    @version_t
    def get_version_string():
        return ctypes.addressof(version)

    class ApiBase(ctypes.Structure):
        _fields_ = [("GetApi", get_api_t), ("GetVersionString", version_t)]

    register = ctypes.CDLL(_ortops.library_path()).RegisterCustomOps
    register.restype, register.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ApiBase)]
    base = ApiBase(get_api, get_version_string)
    assert register(None, ctypes.byref(base)) == 0x5151
    assert asked == [16, 15]
    assert made == [(1, "qconv: onnxruntime 1.15.1 gives its C API up to version 15; qconv's native operators need "
                        "version 16 (onnxruntime >= 1.16): upgrade onnxruntime")]
