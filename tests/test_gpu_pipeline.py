"""qconv.Pipeline / qconv.Residual (qconv/pipeline.py) on every engine (``qconv_device``: cpu and every OpenCL
device): a pipeline equals its layers called one by one with the residual adds done in numpy, bitwise, for
numpy and (OpenCL) device-array inputs, both layouts, shapes changing between calls, ``out=``, threads; and
the OpenCL residual add kernel (``kernels/eltwise.cl``) equals numpy's float32 add + activation bitwise.
"""

import numpy as np
import pytest

import qconv
from threading_support import run_interleaved


def _w(rng, shape, bits=8, block=0):
    return qconv.quantize_weight(rng.standard_normal(shape).astype(np.float32), bits=bits, block_size=block)


def _opts(device):
    return {"tune": "none"} if device.startswith("opencl") else {}


def _conv_block(device, rng, act_quant="auto"):
    """stem conv -> basic residual block (identity) -> projection residual block (1x1 shortcut, stride 2)."""
    o = dict(device=device, act_quant=act_quant, **_opts(device))
    stem = qconv.Conv2d(_w(rng, (16, 6, 3, 3)), rng.standard_normal(16).astype(np.float32), padding=1,
                        activation="relu", **o)
    c1 = qconv.Conv2d(_w(rng, (16, 16, 3, 3), 4, 8), padding=1, activation="relu", **o)
    c2 = qconv.Conv2d(_w(rng, (16, 16, 3, 3)), padding=1, **o)
    c3 = qconv.Conv2d(_w(rng, (20, 16, 3, 3)), stride=2, padding=1, activation="relu6", **o)
    c4 = qconv.Conv2d(_w(rng, (20, 20, 1, 1)), **o)
    proj = qconv.Conv2d(_w(rng, (20, 16, 1, 1)), stride=2, **o)
    pipe = qconv.Pipeline([stem, qconv.Residual([c1, c2], activation="relu"),
                           qconv.Residual([c3, c4], shortcut=[proj])])

    def by_hand(x, call):
        a = call(stem, x)
        b = np.maximum(call(c2, call(c1, a)) + a, np.float32(0))
        return call(c4, call(c3, b)) + call(proj, b)

    return pipe, by_hand


def _linear_stack(device, rng, n=10, width=64):
    o = dict(device=device, **_opts(device))
    layers = [qconv.Linear(_w(rng, (width, width), 4 if i % 2 else 8, 32 if i % 3 == 0 else 0),
                           rng.standard_normal(width).astype(np.float32), activation="relu" if i % 2 else None, **o)
              for i in range(n)]
    steps = [layers[0], qconv.Residual(layers[1:3]), *layers[3:6], qconv.Residual(layers[6:9], activation="relu"),
             layers[9]]

    def by_hand(x, call):
        a = call(layers[0], x)
        a = call(layers[2], call(layers[1], a)) + a
        for layer in layers[3:6]:
            a = call(layer, a)
        a = np.maximum(call(layers[8], call(layers[7], call(layers[6], a))) + a, np.float32(0))
        return call(layers[9], a)

    return qconv.Pipeline(steps), by_hand, layers


def _host_call(layout):
    def call(layer, v):
        if v.ndim == 2:
            return layer(v)
        if layout == "nchw":
            return layer(v)
        return qconv.layer.Conv2d.__call__(layer, v, layout)
    return call


def _device_call(queue):
    import pyopencl.array as cla

    def call(layer, v):  # each layer on a device array, the result read back
        y = layer(cla.to_device(queue, np.ascontiguousarray(v)))
        return y.get()
    return call


def test_conv_pipeline_equals_its_layers(qconv_device):
    rng = np.random.default_rng(0)
    pipe, by_hand = _conv_block(qconv_device, rng)
    for shape in [(1, 6, 9, 10), (2, 6, 7, 7), (1, 6, 9, 10)]:
        x = rng.standard_normal(shape).astype(np.float32)
        want = by_hand(x, _host_call("nchw"))
        np.testing.assert_array_equal(pipe(x), want)
        if qconv_device.startswith("opencl"):
            q = pipe.layers[0].engine.queue
            np.testing.assert_array_equal(by_hand(x, _device_call(q)), want)
            import pyopencl.array as cla

            xd = cla.to_device(q, x)
            for _ in range(3):
                np.testing.assert_array_equal(pipe(xd).get(), want)
            out = cla.empty(q, want.shape, np.float32)
            assert pipe(xd, out=out) is out
            np.testing.assert_array_equal(out.get(), want)
            with pytest.raises(ValueError, match="out must be float32 of shape"):
                pipe(xd, out=xd)
        o = np.empty_like(want)
        assert pipe(x, out=o) is o
        np.testing.assert_array_equal(o, want)


def test_conv_pipeline_nc4hw4(qconv_device):
    from qconv.layouts import NC4HW4

    rng = np.random.default_rng(1)
    pipe, by_hand = _conv_block(qconv_device, rng)
    p4 = NC4HW4(4)
    x = rng.standard_normal((2, 6, 8, 9)).astype(np.float32)
    want = by_hand(x, _host_call("nchw"))
    y = pipe(p4.pack_array(x), layout="nc4hw4")
    np.testing.assert_array_equal(p4.unpack_array(y, 20), want)


def test_linear_pipeline_equals_its_layers(qconv_device):
    rng = np.random.default_rng(2)
    pipe, by_hand, layers = _linear_stack(qconv_device, rng)
    for n in (1, 3, 1):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        want = by_hand(x, _host_call("nchw"))
        np.testing.assert_array_equal(pipe(x), want)
        if qconv_device.startswith("opencl"):
            import pyopencl.array as cla

            q = layers[0].engine.queue
            np.testing.assert_array_equal(by_hand(x, _device_call(q)), want)
            xd = cla.to_device(q, x)
            np.testing.assert_array_equal(pipe(xd).get(), want)
            with pytest.raises(ValueError, match="shares its buffer with x"):
                pipe(xd, out=xd)
            out = cla.empty(q, want.shape, np.float32)
            assert pipe(xd, out=out) is out
            np.testing.assert_array_equal(out.get(), want)


def test_row_quant_pipeline_equals_its_layers(qconv_device):
    """act_quant="row": launch sequences of 2-3 kernels per layer inside a pipeline."""
    rng = np.random.default_rng(3)
    pipe, by_hand = _conv_block(qconv_device, rng, act_quant="row")
    x = rng.standard_normal((1, 6, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(pipe(x), by_hand(x, _host_call("nchw")))


def test_pipeline_threads(qconv_device):
    if not qconv_device.startswith("opencl"):
        pytest.skip("device queues: OpenCL only")
    import pyopencl as cl
    import pyopencl.array as cla

    rng = np.random.default_rng(4)
    pipe, by_hand, layers = _linear_stack(qconv_device, rng)
    q0 = layers[0].engine.queue
    xs = [rng.standard_normal((1 + i % 2, 64)).astype(np.float32) for i in range(8)]
    want = [by_hand(x, _host_call("nchw")) for x in xs]
    def work(i):
        q = q0 if i % 2 else cl.CommandQueue(q0.context, q0.device)
        xd = cla.to_device(q, xs[i])
        return [pipe(xd).get() for _ in range(15)]

    results = run_interleaved(work, 8)
    for i in range(8):
        for y in results[i]:
            np.testing.assert_array_equal(y, want[i], err_msg=f"thread {i}")


def test_add_kernel_is_numpy_bitwise(qconv_device):
    if not qconv_device.startswith("opencl"):
        pytest.skip("the add kernel is OpenCL's")
    import pyopencl.array as cla

    from qconv.gpu.context import profiling_queue, resolve
    from qconv.gpu.eltwise import add_plan

    ctx, dev = resolve(qconv_device)
    q = profiling_queue(ctx, dev)
    rng = np.random.default_rng(5)
    for n in (1, 3, 4, 7, 64, 1001):
        for act in (None, "relu", "relu6"):
            a = (rng.standard_normal(n) * 5).astype(np.float32)
            b = (rng.standard_normal(n) * 5).astype(np.float32)
            want = a + b
            if act:
                want = np.maximum(want, np.float32(0))
            if act == "relu6":
                want = np.minimum(want, np.float32(6))
            ad, bd = cla.to_device(q, a), cla.to_device(q, b)
            add_plan(ctx, n, act).enqueue(q, bd.base_data, ad.base_data)
            np.testing.assert_array_equal(ad.get(), want, err_msg=f"n={n} act={act}")
            np.testing.assert_array_equal(bd.get(), b)


def test_pipeline_refusals(qconv_device):
    rng = np.random.default_rng(6)
    o = dict(device=qconv_device, **_opts(qconv_device))
    a = qconv.Conv2d(_w(rng, (8, 4, 3, 3)), padding=1, **o)
    b = qconv.Conv2d(_w(rng, (8, 8, 3, 3)), **o)  # no padding: shrinks H, W
    with pytest.raises(ValueError, match="at least one step"):
        qconv.Pipeline([])
    with pytest.raises(ValueError, match="non-empty block"):
        qconv.Residual([])
    with pytest.raises(TypeError, match="a step must be"):
        qconv.Pipeline([a, np.zeros(3)])
    with pytest.raises(ValueError, match="activation"):
        qconv.Residual([a], activation="gelu")
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    with pytest.raises(ValueError):
        qconv.Pipeline([a, qconv.Residual([b])])(x)  # block (1, 8, 4, 4) + identity (1, 8, 6, 6)
    with pytest.raises(ValueError):
        qconv.Pipeline([b])(x)  # 4 channels into an 8-channel conv
    lin = qconv.Linear(_w(rng, (8, 4)), **o)
    with pytest.raises(ValueError):
        qconv.Pipeline([lin, a])(rng.standard_normal((1, 4)).astype(np.float32))
    other = "cpu" if qconv_device.startswith("opencl") else None
    if other:
        with pytest.raises(ValueError, match="one engine"):
            qconv.Pipeline([a, qconv.Conv2d(_w(rng, (8, 8, 1, 1)), device=other)])
