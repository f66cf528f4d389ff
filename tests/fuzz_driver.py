"""Fuzz driver: call every public entry point with malformed arguments (run in a subprocess).

Usage: ``python tests/fuzz_driver.py EXAMPLES [DEVICE ...]``. Exits 0 when every call either succeeded or
raised a documented exception type; a crash (segfault, abort) shows as a non-zero exit of the process.
Prints ``fuzz: N calls, M documented exceptions`` at the end.
"""
import os
import sys
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qconv
from qconv import reference
from qconv.layouts import NC4HW4, Int4Packing

DOCUMENTED = (TypeError, ValueError, MemoryError)
COUNTS = {"calls": 0, "raised": 0}

dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int32, np.uint8, np.bool_,
                          np.complex64, object])
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=5).map(tuple)
special = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e38, 1e-45, 127.0, -128.0])


@st.composite
def arrays(draw):
    dt = draw(dtypes)
    shape = draw(shapes)
    n = int(np.prod(shape)) if shape else 1
    if dt is object:
        return np.array([object()] * n, dtype=object).reshape(shape)
    vals = draw(st.lists(st.one_of(special, st.integers(-300, 300).map(float)), min_size=n, max_size=n))
    with np.errstate(all="ignore"):
        a = np.array(vals, dtype=np.float64).reshape(shape)
        return a.astype(dt) if dt is not np.bool_ else a > 0


junk = st.one_of(st.none(), st.integers(-2**40, 2**40), st.floats(allow_nan=True), st.text(max_size=5),
                 st.booleans(), arrays(), st.lists(st.integers(-3, 9), max_size=4),
                 st.tuples(st.integers(-3, 9), st.integers(-3, 9)))
small_int = st.one_of(st.integers(-3, 40), junk)


@st.composite
def near_valid_inputs(draw):
    """float arrays close to a valid conv input (6 channels): odd sizes, now and then an empty axis, a
    special value (NaN, inf, huge, subnormal) or another float dtype."""
    shape = (draw(st.integers(1, 3)), draw(st.sampled_from([6, 6, 6, 5])), draw(st.integers(1, 9)),
             draw(st.integers(1, 9)))
    if draw(st.integers(0, 9)) == 0:
        shape = shape[:2] + (0,) + shape[3:]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape) * draw(st.sampled_from([1.0, 1e-30, 1e30, 1.0]))
    if x.size and draw(st.integers(0, 3)) == 0:
        x.reshape(-1)[draw(st.integers(0, x.size - 1))] = draw(special)
    dt = draw(st.sampled_from([np.float32, np.float32, np.float64, np.float16]))
    with np.errstate(all="ignore"):
        return x.astype(dt)


def valid_weight(seed=0, o=4, i=6, k=3, bits=8, block=0, sym=True):
    w = np.random.default_rng(seed).standard_normal((o, i, k, k)).astype(np.float32)
    return qconv.quantize_weight(w, bits, block, sym)


def call(fn, *args, **kwargs):
    COUNTS["calls"] += 1
    try:
        fn(*args, **kwargs)
    except DOCUMENTED:
        COUNTS["raised"] += 1
    except RuntimeError as exc:  # documented for unusable devices only
        if "OpenCL" not in str(exc) and "engine" not in str(exc):
            raise
        COUNTS["raised"] += 1


def run(examples, devices):
    cfg = settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))

    @cfg
    @given(st.one_of(near_valid_inputs(), junk), st.one_of(st.sampled_from([4, 8]), small_int),
           st.one_of(st.sampled_from([0, 1, 2, 3]), small_int), st.one_of(st.booleans(), junk),
           st.one_of(st.just(1), small_int), st.sampled_from(["minmax", "mse", "x", None]))
    def fuzz_quantize(w, bits, block, sym, groups, method):
        call(qconv.quantize_weight, w, bits, block, sym, groups, method)

    @cfg
    @given(junk, junk, junk, small_int, small_int, small_int)
    def fuzz_weight_ctor(q, scales, offsets, bits, block, groups):
        call(qconv.QuantizedWeight, q, scales, offsets, bits, block, groups)

    @cfg
    @given(junk, junk, small_int, small_int, junk, junk)
    def fuzz_from_mnn(wb, alpha, oc, bits, asym, shape):
        call(qconv.QuantizedWeight.from_mnn, wb, alpha, oc, bits, asym, shape)

    @cfg
    @given(small_int, junk, junk, st.sampled_from(["high_first", "low_first", "split_halves", "z"]),
           st.sampled_from(["offset8", "twos_complement", "unsigned", 3]))
    def fuzz_layouts(pack, x, shape, order, enc):
        call(lambda: NC4HW4(pack).pack_array(x))
        call(lambda: NC4HW4(4).unpack_array(x, shape))
        call(lambda: Int4Packing(order, enc).pack_array(x))
        call(lambda: Int4Packing(order, enc).unpack_array(x, shape))

    mostly = lambda good: st.one_of(good, good, good, small_int)  # noqa: E731

    @cfg
    @given(st.one_of(near_valid_inputs(), near_valid_inputs(), junk), mostly(st.sampled_from([0, 1])),
           mostly(st.integers(1, 3)), mostly(st.integers(0, 3)), mostly(st.integers(1, 2)),
           st.sampled_from([None, "relu", "relu6", "gelu"]),
           st.sampled_from(["tensor", "row", "block", None, "auto", "x"]))
    def fuzz_conv(x, wi, stride, padding, dilation, activation, act_quant):
        weights = [valid_weight(), valid_weight(bits=4, block=2, sym=False), np.ones((2, 2)), None]
        weight = weights[wi] if isinstance(wi, int) and 0 <= wi < 4 else wi
        call(reference.conv2d, x, weight, None, stride, padding, dilation, activation,
             act_quant if act_quant != "auto" else "tensor")
        for dev in devices:
            call(lambda: qconv.Conv2d(weight, None, stride, padding, dilation, activation, dev, act_quant)(x))

    @cfg
    @given(near_valid_inputs(), st.integers(0, 1), st.integers(1, 3), st.integers(0, 3), st.integers(1, 2),
           st.sampled_from([None, "relu", "relu6"]), st.sampled_from(["tensor", "row", "block", None, "auto"]),
           st.sampled_from(["nchw", "nc4hw4"]))
    def fuzz_conv_near_valid(x, wi, stride, padding, dilation, activation, act_quant, layout):
        weight = [valid_weight(), valid_weight(bits=4, block=2, sym=False)][wi]
        if layout == "nc4hw4" and x.ndim == 4:
            x = qconv.layouts.NC4HW4(4).pack_array(x)
        for dev in devices:
            def run_one():
                y = qconv.Conv2d(weight, None, stride, padding, dilation, activation, dev, act_quant)(x, layout)
                # documented policy: finite input never gives NaN/inf, unless the float32 result itself
                # overflows (possible with float activations, act_quant=None, for |x| near float32 max)
                if np.isfinite(x).all() and np.abs(x).max(initial=0) < 1e30 and not np.isfinite(y).all():
                    raise AssertionError(f"non-finite output from finite input on {dev}")
                COUNTS["ran"] = COUNTS.get("ran", 0) + 1
            call(run_one)

    @cfg
    @given(st.binary(max_size=400), st.integers(0, 3))
    def fuzz_load(data, mode):
        w = valid_weight(bits=4, block=3, sym=False)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "w.npz")
            w.save(path)
            raw = open(path, "rb").read()
            blob = [data, raw[: len(data) % max(len(raw), 1)], raw[:64] + data, data + raw[len(data):]][mode]
            with open(path, "wb") as fh:
                fh.write(blob)
            call(qconv.QuantizedWeight.load, path)

    for fuzz in (fuzz_quantize, fuzz_weight_ctor, fuzz_from_mnn, fuzz_layouts, fuzz_conv, fuzz_conv_near_valid,
                 fuzz_load):
        fuzz()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    devs = sys.argv[2:] or ["reference"]
    run(n, devs)
    print(f"fuzz: {COUNTS['calls']} calls, {COUNTS['raised']} documented exceptions, "
          f"{COUNTS.get('ran', 0)} conv runs completed, devices {devs}")
