"""Prepared launches of the OpenCL engine (qconv/gpu/launch.py): a device-array call of a shape seen before
binds only the changed buffers of kernels prepared at the first call and enqueues them.

* the prepared path gives results bitwise identical to the first (tuned) call, without building, looking
  up or re-planning anything, and makes one Array per call (none with ``out=``);
* shapes changing between calls (each shape keeps its own plan);
* 8 threads sharing one layer (one queue, and a queue each) give the single-thread results bitwise;
* ``layer(x, out=y)`` reuses ``y``; ``out`` aliasing ``x``, of the wrong shape / dtype / context / type or at an
  offset is refused with a clear error.

Runs on every visible OpenCL device (PoCL in CI); skipped with a reason when none is visible.
"""

import numpy as np
import pytest

import qconv
from threading_support import run_interleaved
from qconv import gpu
from qconv.testing import assert_matches_reference

DEVICES = gpu.devices()
NO_DEVICE = "no OpenCL device is visible (install one, e.g. `apt-get install pocl-opencl-icd`)"

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")


@pytest.fixture(scope="module", params=DEVICES or [None])
def cl_device(request):
    if request.param is None:
        pytest.skip(NO_DEVICE)
    return request.param


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QCONV_CACHE_DIR", str(tmp_path))


def _w(rng, shape, bits=8, block=0):
    return qconv.quantize_weight(rng.standard_normal(shape).astype(np.float32), bits=bits, block_size=block)


def _layers(device, tune="none"):
    """(name, layer, input shape, oracle kwargs): every launch shape of the engine (one launch, two and three)."""
    rng = np.random.default_rng(3)
    out = [("linear", qconv.Linear(_w(rng, (64, 64)), device=device, tune=tune), (1, 64), {}),
           ("linear_row", qconv.Linear(_w(rng, (40, 96), 4, 32), rng.standard_normal(40).astype(np.float32),
                                       device=device, act_quant="row", tune=tune), (1, 96), {"act_quant": "row"}),
           ("linear_row_unfused", qconv.Linear(_w(rng, (36, 64)), device=device, act_quant="row", tune=tune,
                                               variant="gemv_a8_c1"), (1, 64), {"act_quant": "row"}),
           ("conv", qconv.Conv2d(_w(rng, (12, 8, 3, 3)), padding=1, activation="relu", device=device, tune=tune),
            (2, 8, 7, 6), {"padding": 1, "activation": "relu"}),
           ("conv_row", qconv.Conv2d(_w(rng, (12, 8, 3, 3), 4, 8), stride=2, device=device, act_quant="row",
                                     tune=tune), (1, 8, 9, 9), {"stride": 2, "act_quant": "row"})]
    return out


def _oracle(name, layer, x, kw):
    xr = x.reshape(x.shape[0], x.shape[1], 1, 1) if x.ndim == 2 else x
    return layer.weight, layer.spec.bias, xr, kw


def _check_oracle(name, layer, x, y, kw):
    w, b, xr, kw = _oracle(name, layer, x, kw)
    yr = y.reshape(y.shape[0], y.shape[1], 1, 1) if y.ndim == 2 else y
    assert_matches_reference(yr, xr, w, b, act_quant=kw.pop("act_quant", None), **kw)


def test_prepared_calls_equal_the_first_tuned_call(cl_device, monkeypatch):
    import qconv.gpu.engine as E
    import qconv.gpu.launch as L

    rng = np.random.default_rng(0)
    cases = _layers(cl_device, tune="fast")
    firsts = []
    for name, layer, shape, kw in cases:
        x = cla.to_device(layer.engine.queue, rng.standard_normal(shape).astype(np.float32))
        y0 = layer(x)
        firsts.append((x, y0.get()))
        _check_oracle(name, layer, x.get(), firsts[-1][1], dict(kw))
        assert layer.engine.plans, name
        lp = next(iter(layer.engine._prepared.values())).launch
        assert len(lp.steps) == {"linear_row_unfused": 2, "conv_row": 2}.get(name, len(lp.steps)), name

    # from here on nothing may be planned, built, looked up or allocated with pyopencl.array.empty
    def refuse(*a, **k):
        raise AssertionError("the prepared path planned / built / allocated something")

    monkeypatch.setattr(E.OpenCLEngine, "_plan_for", refuse)
    monkeypatch.setattr(E.OpenCLEngine, "_forward_array_checked", refuse)
    monkeypatch.setattr(L, "get_program", refuse)
    monkeypatch.setattr(E, "get_kernel", refuse)
    monkeypatch.setattr(cla, "empty", refuse)
    made = []
    init = cla.Array.__init__

    def counting(self, *a, **k):
        made.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(cla.Array, "__init__", counting)
    for (name, layer, shape, kw), (x, y0) in zip(cases, firsts):
        for _ in range(5):
            del made[:]
            y = layer(x)
            assert len(made) == 1, (name, len(made))
            np.testing.assert_array_equal(y.get(), y0, err_msg=name)
        o = cla.zeros(layer.engine.queue, y0.shape, np.float32)
        made_before = len(made)
        for _ in range(3):
            assert layer(x, out=o) is o
        assert len(made) == made_before, f"{name}: out= made an Array"
        np.testing.assert_array_equal(o.get(), y0, err_msg=name)


def test_calls_run_on_a_queue_without_profiling(cl_device):
    """Calls go to ``engine.queue`` (no profiling: cheaper enqueues on NVIDIA), tuning to ``engine.tune_queue``
    (profiling); after tuning the kept plan holds no scratch of the tuner's queue; a caller's own profiling
    queue still works and gives the same bits."""
    rng = np.random.default_rng(5)
    profiling = cl.command_queue_properties.PROFILING_ENABLE
    for name, layer, shape, kw in _layers(cl_device, tune="fast"):
        eng = layer.engine
        assert not eng.queue.properties & profiling, name
        assert eng.tune_queue.properties & profiling, name
        xh = rng.standard_normal(shape).astype(np.float32)
        y = layer(cla.to_device(eng.queue, xh))
        assert y.queue is eng.queue, name
        lp = next(iter(eng._prepared.values())).launch
        assert eng.tune_queue.int_ptr not in lp._queues, f"{name}: the tuner's scratch is kept"
        y2 = layer(cla.to_device(eng.tune_queue, xh))
        assert y2.queue is eng.tune_queue, name
        np.testing.assert_array_equal(y2.get(), y.get(), err_msg=name)
        _check_oracle(name, layer, xh, y.get(), dict(kw))


def test_shapes_changing_between_calls(cl_device):
    rng = np.random.default_rng(1)
    for name, layer, shape, kw in _layers(cl_device):
        shapes = [shape, (3,) + shape[1:], shape, (2,) + shape[1:]]
        if name == "linear_row_unfused":  # a forced gemv_a8 runs one row only
            shapes = [shape, shape]
        if len(shape) == 4:
            shapes += [shape[:2] + (5, 11), shape]
        seen = {}
        for s in shapes:
            xh = rng.standard_normal(s).astype(np.float32) if s not in seen else seen[s][0]
            y = layer(cla.to_device(layer.engine.queue, xh)).get()
            if s in seen:
                np.testing.assert_array_equal(y, seen[s][1], err_msg=f"{name} {s}")
            else:
                seen[s] = (xh, y)
                _check_oracle(name, layer, xh, y, dict(kw))
        assert len(layer.engine._prepared) == len(set(shapes)), name


def test_eight_threads_share_one_layer(cl_device):
    rng = np.random.default_rng(2)
    for name, layer, shape, kw in _layers(cl_device):
        q0 = layer.engine.queue
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
        want = [layer(cla.to_device(q0, x)).get() for x in xs]
        def work(i):
            # each host thread on a queue of its own (NVIDIA's driver crashes or hangs when threads share one:
            # qconv.gpu.context.call_queue): the engine's call queue, which is per thread, or a new one
            q = layer.engine.queue if i % 2 else cl.CommandQueue(q0.context, q0.device)
            x = cla.to_device(q, xs[i])
            out = cla.empty(q, want[i].shape, np.float32)
            ys = [layer(x) if k % 2 else layer(x, out=out).copy() for k in range(40)]
            return [y.get() for y in ys] + [layer(xs[i]) for _ in range(4)], layer.engine.queue

        results = run_interleaved(work, 8)
        assert len({id(r[1]) for r in results} | {id(q0)}) == 9, "engine.queue must be one per thread"
        for i in range(8):
            for y in results[i][0]:
                np.testing.assert_array_equal(y, want[i], err_msg=f"{name} thread {i}")


def test_out_reuse_and_refusals(cl_device):
    rng = np.random.default_rng(4)
    layer = qconv.Linear(_w(rng, (16, 16)), device=cl_device, tune="none")
    q = layer.engine.queue
    xh = rng.standard_normal((2, 16)).astype(np.float32)
    x = cla.to_device(q, xh)
    want = layer(x).get()
    out = cla.empty(q, (2, 16), np.float32)
    for _ in range(3):  # reused: the same Array back, its events the last launch only
        assert layer(x, out=out) is out
        assert len(out.events) == 1
    np.testing.assert_array_equal(out.get(), want)
    with pytest.raises(ValueError, match="shares its buffer with x"):
        layer(x, out=x)
    with pytest.raises(ValueError, match="shares its buffer with x"):
        layer(x, out=x.reshape(2, 16))  # a different Array over the same buffer
    with pytest.raises(ValueError, match="out has shape"):
        layer(x, out=cla.empty(q, (2, 17), np.float32))
    with pytest.raises(TypeError, match="float32"):
        layer(x, out=cla.empty(q, (2, 16), np.float64))
    with pytest.raises(TypeError, match="pyopencl.array.Array"):
        layer(x, out=np.empty((2, 16), np.float32))
    with pytest.raises(ValueError, match="offset 0"):
        layer(x, out=cla.empty(q, (3, 16), np.float32)[1:])
    other = cl.CommandQueue(cl.Context([q.device]))
    with pytest.raises(ValueError, match="another OpenCL context"):
        layer(x, out=cla.empty(other, (2, 16), np.float32))
    # x aliasing out through an offset view: refused before the input copy
    big = cla.to_device(q, np.concatenate([xh, xh]))
    with pytest.raises(ValueError, match="shares its buffer with x"):
        layer(big[2:], out=big)
    np.testing.assert_array_equal(layer(x, out=out).get(), want)  # still fine afterwards
    # numpy inputs: out is a numpy array, filled and returned; aliasing refused
    o = np.empty((2, 16), np.float32)
    assert layer(xh, out=o) is o
    np.testing.assert_array_equal(o, want)
    with pytest.raises(ValueError, match="shares memory with x"):
        layer(xh, out=xh)
    conv = qconv.Conv2d(_w(rng, (8, 4, 3, 3)), padding=1, device=cl_device, tune="none")
    xc = cla.to_device(q, rng.standard_normal((1, 4, 5, 5)).astype(np.float32))
    oc = cla.empty(q, (1, 8, 5, 5), np.float32)
    assert conv(xc, out=oc) is oc
    np.testing.assert_array_equal(oc.get(), conv(xc).get())
    with pytest.raises(ValueError, match="out has shape"):
        conv(xc, out=cla.empty(q, (1, 8, 5, 4), np.float32))


def test_a_shared_kernel_object_is_never_clobbered(cl_device):
    """Two layers with the same build options and shapes own separate kernel objects: calls interleaved
    give each layer its own result (a memoised kernel with bound arguments would mix their weights)."""
    rng = np.random.default_rng(5)
    a = qconv.Linear(_w(rng, (32, 32)), device=cl_device, tune="none")
    b = qconv.Linear(_w(rng, (32, 32)), device=cl_device, tune="none")
    x = cla.to_device(a.engine.queue, rng.standard_normal((1, 32)).astype(np.float32))
    ya, yb = a(x).get(), b(x).get()
    assert not np.array_equal(ya, yb)
    for _ in range(3):
        np.testing.assert_array_equal(a(x).get(), ya)
        np.testing.assert_array_equal(b(x).get(), yb)


def test_out_of_order_queue(cl_device):
    """On an out-of-order queue every launch of a plan waits for the previous one, and a plan's scratch buffers
    wait for the previous call: 2-3 launch plans and a pipeline give the in-order results. (PoCL 5 runs an
    out-of-order queue's commands in order, so there this is a smoke test: dropping the waits is not caught.)"""
    from qconv.gpu.context import resolve

    ctx, dev = resolve(cl_device)
    ooo = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not dev.queue_properties & ooo:
        pytest.skip(f"{dev.name} has no out-of-order queues")
    q = cl.CommandQueue(ctx, dev, properties=ooo)
    rng = np.random.default_rng(6)
    for name, layer, shape, kw in _layers(cl_device):
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
        want = [layer(cla.to_device(layer.engine.queue, x)).get() for x in xs]
        got = [layer(cla.to_device(q, x)) for x in xs for _ in range(5)]
        for i, y in enumerate(got):
            np.testing.assert_array_equal(y.get(), want[i // 5], err_msg=name)
    lin = [qconv.Linear(_w(rng, (32, 32)), device=cl_device, tune="none", act_quant="row") for _ in range(4)]
    pipe = qconv.Pipeline([lin[0], qconv.Residual(lin[1:3], activation="relu"), lin[3]])
    xs = [rng.standard_normal((2, 32)).astype(np.float32) for _ in range(4)]
    want = [pipe(x) for x in xs]
    got = [pipe(cla.to_device(q, x)) for x in xs for _ in range(5)]
    for i, y in enumerate(got):
        np.testing.assert_array_equal(y.get(), want[i // 5])
