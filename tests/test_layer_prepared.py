"""The CPU layers' prepared calls: after a checked call on a numpy float32 NCHW input, later calls of that shape run
the engine's native call (``CpuEngine.native_call`` through ``_ortops.run_native``) without the Python path. They
must give the Python path's bits, fall back to it for anything it checks (NaN / inf, ``out`` rules), and stay
correct from two Python threads."""
import numpy as np
import pytest

import qconv
from qconv import layer as layer_mod
from qconv._ext import _ortops

from threading_support import run_interleaved


def _conv(kind, rng):
    """(layer, input) of one CPU path."""
    if kind == "depthwise":
        w = qconv.quantize_weight(rng.standard_normal((24, 1, 3, 3)).astype(np.float32), groups=24)
        return qconv.Conv2d(w, rng.standard_normal(24).astype(np.float32), 2, 1, act_quant=None,
                            activation="relu6", threads=2), rng.standard_normal((1, 24, 33, 40))
    if kind == "direct float":
        w = qconv.quantize_weight(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
        return qconv.Conv2d(w, None, 1, 1, act_quant=None, activation="hardswish", threads=2), \
            rng.standard_normal((2, 8, 30, 29))
    if kind == "direct int8":
        w = qconv.quantize_weight(rng.standard_normal((64, 64, 3, 3)).astype(np.float32))
        return qconv.Conv2d(w, rng.standard_normal(64).astype(np.float32), 1, 1, threads=2), \
            rng.standard_normal((1, 64, 28, 28))
    if kind == "gemm 1x1":
        w = qconv.quantize_weight(rng.standard_normal((40, 64, 1, 1)).astype(np.float32), bits=4, block_size=32)
        return qconv.Conv2d(w, None, threads=2), rng.standard_normal((1, 64, 9, 11))
    if kind == "linear":
        w = qconv.quantize_weight(rng.standard_normal((96, 160)).astype(np.float32))
        return qconv.Linear(w, rng.standard_normal(96).astype(np.float32), threads=2), rng.standard_normal((1, 160))
    if kind == "linear batch":
        w = qconv.quantize_weight(rng.standard_normal((70, 64)).astype(np.float32), bits=4)
        return qconv.Linear(w, None, threads=2), rng.standard_normal((8, 64))
    raise AssertionError(kind)


KINDS = ["depthwise", "direct float", "direct int8", "gemm 1x1", "linear", "linear batch"]


def _prepared(layer, x):
    """The layer's prepared call for x's shape (as the engine's 4-D input), or None."""
    key = x.shape if x.ndim == 4 else (x.shape[0], x.shape[1], 1, 1)
    return (layer._native_calls or {}).get(key)


@pytest.mark.parametrize("kind", KINDS)
def test_prepared_calls_keep_the_bits(kind, monkeypatch):
    rng = np.random.default_rng(len(kind))
    layer, x = _conv(kind, rng)
    x = x.astype(np.float32)
    first = layer(x)                     # the checked path, which prepares the call
    assert _prepared(layer, x) is not None, f"no prepared call for {kind}"
    _ortops.set_native(False)
    try:
        python = layer(x)                # the checked path again
    finally:
        _ortops.set_native(True)
    np.testing.assert_array_equal(first.view(np.uint32), python.view(np.uint32))

    def no_python(*a, **k):
        raise AssertionError("the checked path ran")
    monkeypatch.setattr(layer.engine, "forward", no_python)
    fast = layer(x)
    assert fast.shape == first.shape and fast.dtype == np.float32
    np.testing.assert_array_equal(fast.view(np.uint32), first.view(np.uint32))
    out = np.full(first.shape, np.nan, np.float32)
    assert layer(x, out=out) is out
    np.testing.assert_array_equal(out.view(np.uint32), first.view(np.uint32))
    # another input of the same shape: the prepared call computes it (not a stored result)
    x2 = (x[::-1] * 0.5 + 1).astype(np.float32)
    monkeypatch.undo()
    _ortops.set_native(False)
    try:
        want = layer(x2)
    finally:
        _ortops.set_native(True)
    np.testing.assert_array_equal(layer(x2).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", ["depthwise", "direct int8", "linear"])
def test_prepared_calls_leave_errors_to_the_checked_path(kind):
    rng = np.random.default_rng(5)
    layer, x = _conv(kind, rng)
    x = x.astype(np.float32)
    want = layer(x)
    assert _prepared(layer, x) is not None
    for bad in (np.nan, np.inf):
        xb = x.copy()
        xb.reshape(-1)[x.size // 2] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            layer(xb)
    with pytest.raises(ValueError, match="out has shape"):
        layer(x, out=np.empty(want.shape, np.float64))
    with pytest.raises(TypeError, match="numpy array"):
        layer(x, out=[0.0])
    if x.ndim == 4:
        big = np.zeros(x.size + want.size, np.float32)
        xs = big[:x.size].reshape(x.shape)
        xs[...] = x
        with pytest.raises(ValueError, match="shares memory"):
            layer(xs, out=big[x.size - 1:-1].reshape(want.shape))
    strided = np.full(want.shape + (2,), np.nan, np.float32)[..., 0]   # not contiguous: the copy path
    assert layer(x, out=strided) is strided
    np.testing.assert_array_equal(strided, want)
    np.testing.assert_array_equal(layer(x.astype(np.float64)), want)   # other dtypes: converted, checked path


def test_prepared_calls_from_two_python_threads():
    rng = np.random.default_rng(9)
    layer, _ = _conv("direct int8", rng)
    xs = [rng.standard_normal((1, 64, 28, 28)).astype(np.float32) for _ in range(4)]
    _ortops.set_native(False)
    try:
        want = [layer(x) for x in xs]
    finally:
        _ortops.set_native(True)
    layer(xs[0])
    assert _prepared(layer, xs[0]) is not None

    def work(t):   # the indices of the calls whose result differs from the serial one
        ks = [(i + t) % len(xs) for i in range(40)]
        return [i for i, k in enumerate(ks) if not np.array_equal(layer(xs[k]), want[k])]
    assert run_interleaved(work, 2) == [[], []]


def test_prepared_shapes_are_bounded():
    rng = np.random.default_rng(2)
    layer, _ = _conv("gemm 1x1", rng)
    for h in range(1, 2 * layer_mod.NATIVE_SHAPES + 2):
        x = rng.standard_normal((1, 64, h, 5)).astype(np.float32)
        np.testing.assert_array_equal(layer(x), layer(x))
        assert len(layer._native_calls) <= layer_mod.NATIVE_SHAPES
    assert qconv.Conv2d(layer.spec.weight, device="reference")._native_calls is None
