"""The native onnxruntime custom operators of qconv (``qconv._ext._ortops`` + ``qconv_ort.h``).

These drive the bridge itself with stand-in kernels registered under keys of their own: shapes and data reach
the kernel as views of onnxruntime's tensors (input read-only), the output is what the kernel wrote, errors fail
the node with the kernel's message (never the process), and kernel references are released with the session.
"""
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


def _session(key, op=QCONV, dims=("n", 3, 4, 5)):
    node = helper.make_node(op, ["x"], ["y"], name="n0", domain=DOMAIN, **{_ortops.KEY_ATTR: key})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
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
