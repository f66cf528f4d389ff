"""Fuzz driver: call every public entry point, mostly with valid-but-extreme arguments that reach the kernels,
and some with malformed ones (run in a subprocess).

Usage: ``python tests/fuzz_driver.py EXAMPLES [DEVICE ...]``. Exits 0 when every call either succeeded (and,
for a valid case, matched the oracle) or raised a documented exception type; a crash (segfault, abort, a
sanitizer report) shows as a non-zero exit of the process, a wrong result as an ``AssertionError``.

Targets (``EXAMPLES`` examples each unless noted; on OpenCL devices the two conv targets draw
``max(5, EXAMPLES // 8)`` geometries, each a new program to compile):

* valid-but-extreme (the bulk): ``Conv2d`` on each device with drawn geometries (1..300 channels, groups up
  to depthwise, kernels up to 7, dilation up to 4, stride up to 5, padding beyond the kernel, 1-pixel and
  long images, batches 1..3), every weight scheme (int4/int8, sym/asym, every block size down to 1 channel,
  minmax/mse, float16 tables), every activation mode the device takes, both layouts, 1..3 threads, and values
  over 80 decades (1e-41 subnormal to 1e30, constant, sparse, outliers, all negative), each output checked
  against the oracle with the per-output tolerance of :mod:`qconv.testing`; ``Linear`` with long
  reductions (up to 12,288 inputs); ``quantize_weight`` on extreme weights (subnormal to 1e38, constant,
  zero, one outlier), checking the codes' range, finite tables and the rounding bound.
* near-valid inputs (NaN, inf, huge, empty axes, float16/64): documented exceptions or finite outputs.
* malformed arguments (``EXAMPLES // 4`` each): ``quantize_weight``, ``QuantizedWeight(...)``, ``from_mnn``,
  the layout specs, ``reference.conv2d`` / ``Conv2d``, ``QuantizedWeight.load`` on corrupted files.

Prints ``fuzz: N calls, M documented exceptions, K valid cases ran (J checked against the oracle)``.
"""
import os
import sys
import tempfile
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qconv
from qconv import reference
from qconv.layouts import NC4HW4, Int4Packing
from qconv.testing import assert_matches_reference

DOCUMENTED = (TypeError, ValueError, MemoryError)
COUNTS = Counter()
TARGETS = {}  # target name -> Counter(calls, raised)
CURRENT = ["-"]
REFUSED = Counter()  # valid cases an engine refused (documented limits), by message head

dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int32, np.uint8, np.bool_,
                          np.complex64, object])
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=5).map(tuple)
special = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e38, 1e-45, 127.0, -128.0])
P4 = NC4HW4(4)


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


# {{{ valid-but-extreme cases

CHANNELS = (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 255, 256, 300)
# (weight scale exponent, input scale exponent): |w| |x| K stays far below float32's max (3.4e38), and
# subnormal inputs go with unit weights
SCALES = ((0, 0), (0, -3), (0, 3), (-3, 0), (0, -30), (-20, 12), (15, 10), (0, 30), (-30, -5), (0, -41),
          (0, -39), (5, -38), (-38, 0))
KINDS = ("normal", "normal", "outliers", "sparse", "negative", "positive", "constant", "ties")


def _values(rng, shape, kind, scale):
    """float32 values of ``shape`` and ``kind`` around ``scale`` (may be subnormal)."""
    if kind == "constant":
        v = np.full(shape, rng.choice([0.0, 1.0, -2.5, 0.37]))
    elif kind == "ties":  # many equal values and exact halves of one step
        v = rng.integers(-8, 9, shape) * 0.5
    else:
        v = rng.standard_normal(shape)
        if kind == "outliers" and len(shape) > 1:
            v[:, rng.integers(0, shape[1])] *= 1000
        elif kind == "sparse":
            v *= rng.random(shape) < 0.1
        elif kind == "negative":
            v = -np.abs(v) - 0.1
        elif kind == "positive":
            v = np.abs(v)
    with np.errstate(under="ignore"):
        return (v * scale).astype(np.float32)


@st.composite
def valid_geometries(draw, max_macs=300_000):
    """``(n, c, o, h, w, kernel, stride, padding, dilation, groups)`` of a valid conv with at most ``max_macs``."""
    groups = draw(st.sampled_from([1, 1, 1, 2, 3, 4, "depthwise"]))
    cpg = draw(st.sampled_from(CHANNELS))
    if groups == "depthwise":
        groups, cpg = min(cpg, 48), 1
    opg = draw(st.sampled_from(CHANNELS[:14]))
    c, o = cpg * groups, opg * groups
    n = draw(st.integers(1, 3))
    dims = []
    for _ in range(2):
        k = draw(st.sampled_from([1, 1, 2, 3, 3, 5, 7]))
        s = draw(st.sampled_from([1, 1, 2, 3, 5]))
        d = draw(st.sampled_from([1, 1, 2, 4])) if k > 1 else 1
        p = draw(st.integers(0, k + 1))
        span = d * (k - 1) + 1
        lo = max(1, span - 2 * p)
        size = draw(st.sampled_from([lo, lo, lo + 1, lo + 4, lo + 13, 24, 40]))
        dims.append([k, s, p, d, max(lo, size)])
    (kh, sh, ph, dh, h), (kw, sw, pw, dw, w) = dims

    def macs(h, w):
        oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return n * oh * ow * o * cpg * kh * kw
    while macs(h, w) > max_macs and (h > 1 or w > 1):  # shrink the image, never below a valid size
        h2, w2 = max(max(1, dh * (kh - 1) + 1 - 2 * ph), h // 2), max(max(1, dw * (kw - 1) + 1 - 2 * pw), w // 2)
        if (h2, w2) == (h, w):
            break
        h, w = h2, w2
    if macs(h, w) > max_macs:
        o, opg = groups, 1
    return n, c, o, h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups


@st.composite
def valid_weights(draw, o, cpg, kernel, groups, w_exp):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "normal", "scaled_rows", "zero_row", "constant_row", "outlier"]))
    w = rng.standard_normal((o, cpg) + tuple(kernel))
    if kind == "scaled_rows":
        w *= 10.0 ** rng.uniform(-4, 1, (o, 1, 1, 1))
    elif kind == "zero_row":
        w[rng.integers(0, o)] = 0
    elif kind == "constant_row":
        w[rng.integers(0, o)] = 0.37
    elif kind == "outlier":
        w.reshape(-1)[rng.integers(0, w.size)] *= 1e4
    with np.errstate(under="ignore"):
        w = (w * 10.0 ** w_exp).astype(np.float32)
    divisors = [d for d in range(1, cpg) if cpg % d == 0]
    block = draw(st.sampled_from([0] + divisors))
    bits = draw(st.sampled_from([8, 4]))
    sym = draw(st.booleans())
    method = draw(st.sampled_from(["minmax", "minmax", "minmax", "mse"]))
    half = draw(st.integers(0, 3)) == 0
    try:
        return qconv.quantize_weight(w, bits, block, sym, groups, method, "float16" if half else "float32")
    except ValueError:  # float16 tables out of range
        return qconv.quantize_weight(w, bits, block, sym, groups, method)


def _act_modes(device):
    if device == "reference":
        return ["tensor", "row", "block", None]
    if device == "cpu":
        return ["tensor", "row", "block"]
    return [None, "row"]


def _check(device, y, x, qw, bias, conv, activation, act_quant, act_block):
    """``y`` against the oracle: per-output tolerance where the float32 reference is finite; the policy
    "finite input, finite output" unless the float32 result itself overflows."""
    ref = reference.conv2d(x, qw, bias, activation=activation, act_quant=act_quant, act_block=act_block, **conv)
    if device == "reference":  # the layer runs the oracle itself: bit for bit
        assert np.array_equal(y, ref, equal_nan=True)
    elif np.isfinite(ref).all():
        assert_matches_reference(y, x, qw, bias, activation=activation, act_quant=act_quant, act_block=act_block,
                                 **conv)
    else:  # a genuine float32 overflow of the result: never NaN where the reference is finite
        assert not np.isnan(y[np.isfinite(ref)]).any()
        COUNTS["overflowed"] += 1
    COUNTS["checked"] += 1


def _count(what):
    COUNTS[what] += 1
    TARGETS.setdefault(CURRENT[0], Counter())[what] += 1


def run_valid(fn):
    """A valid case: it must run (documented engine limits are counted, with their message) and check."""
    _count("calls")
    try:
        fn()
    except DOCUMENTED as exc:
        _count("raised")
        REFUSED[f"{type(exc).__name__}: {str(exc)[:70]}"] += 1
        return
    _count("ran")


def call(fn, *args, **kwargs):
    _count("calls")
    try:
        fn(*args, **kwargs)
    except DOCUMENTED:
        _count("raised")
    except RuntimeError as exc:  # documented for unusable devices only
        if "OpenCL" not in str(exc) and "engine" not in str(exc):
            raise
        _count("raised")


def run(examples, devices):
    cfg = settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))
    few = settings(cfg, max_examples=max(1, examples // 4))
    # OpenCL compiles a program per geometry (seconds each on PoCL): fewer drawn geometries there
    opencl = any(str(d).startswith("opencl") for d in devices)
    geometries = settings(cfg, max_examples=max(5, examples // 8)) if opencl else cfg

    @geometries
    @given(valid_geometries(), st.sampled_from(SCALES), st.sampled_from(KINDS), st.data())
    def fuzz_valid_conv(geo, scales, kind, data):
        n, c, o, h, w, kernel, stride, padding, dilation, groups = geo
        w_exp, x_exp = scales
        qw = data.draw(valid_weights(o, c // groups, kernel, groups, w_exp))
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        x = _values(rng, (n, c, h, w), kind, 10.0 ** x_exp)
        bias = None if data.draw(st.booleans()) else _values(rng, (o,), "normal", 10.0 ** (w_exp + x_exp))
        activation = data.draw(st.sampled_from([None, "relu", "relu6"]))
        layout = data.draw(st.sampled_from(["nchw", "nc4hw4"]))
        conv = dict(stride=stride, padding=padding, dilation=dilation)
        for dev in devices:
            act_quant = data.draw(st.sampled_from(_act_modes(dev)))
            ipg, wb = c // groups, qw.block_channels
            act_block = data.draw(st.sampled_from([0] + [a for a in range(1, ipg + 1) if ipg % a == 0
                                                         and (wb % a == 0 or a % wb == 0)]))
            threads = data.draw(st.sampled_from([None, 1, 2, 3])) if dev == "cpu" else None

            def one():
                layer = qconv.Conv2d(qw, bias, activation=activation, device=dev, act_quant=act_quant,
                                     threads=threads, act_block=act_block if act_quant == "block" else 0, **conv)
                y = layer(x if layout == "nchw" else P4.pack_array(x), layout)
                if layout == "nc4hw4":
                    y = P4.unpack_array(y, o)
                _check(dev, y, x, qw, bias, conv, activation, act_quant, act_block if act_quant == "block" else 0)
            run_valid(one)

    @geometries
    @given(st.sampled_from([1, 7, 64, 255, 1024, 4097, 12288]), st.sampled_from([1, 3, 16, 33, 100]),
           st.integers(1, 4), st.sampled_from(SCALES), st.sampled_from(KINDS), st.data())
    def fuzz_valid_linear(k, o, n, scales, kind, data):
        w_exp, x_exp = scales
        qw = data.draw(valid_weights(o, k, (1, 1), 1, w_exp))
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        x = _values(rng, (n, k), kind, 10.0 ** x_exp)
        bias = None if data.draw(st.booleans()) else _values(rng, (o,), "normal", 10.0 ** (w_exp + x_exp))
        for dev in devices:
            act_quant = data.draw(st.sampled_from(_act_modes(dev)))

            def one():
                y = qconv.Linear(qw, bias, device=dev, act_quant=act_quant)(x)
                assert y.shape == (n, o)
                _check(dev, y[:, :, None, None], x[:, :, None, None], qw, bias, {}, None, act_quant, 0)
            run_valid(one)

    @cfg
    @given(st.sampled_from([(1, 1), (3, 5), (16, 64), (7, 33), (2, 256)]), st.sampled_from([-44, -40, -38, -20, 0,
                                                                                            20, 37, 38]),
           st.sampled_from(["normal", "constant", "zero", "outlier", "tiny_block"]), st.sampled_from([4, 8]),
           st.booleans(), st.sampled_from(["minmax", "mse"]), st.integers(0, 2**32 - 1), st.data())
    def fuzz_valid_quantize(shape, exp, kind, bits, sym, method, seed, data):
        rng = np.random.default_rng(seed)
        w = rng.standard_normal(shape)
        if kind == "constant":
            w[:] = 0.37
        elif kind == "zero":
            w[:] = 0
        elif kind == "outlier":
            w.reshape(-1)[rng.integers(0, w.size)] *= 1e6
        elif kind == "tiny_block":
            w[:, : max(1, shape[1] // 2)] *= 1e-30
        with np.errstate(under="ignore", over="ignore"):
            w = np.clip(w * 10.0 ** exp, -3.4e38, 3.4e38).astype(np.float32)
        divisors = [d for d in range(1, shape[1]) if shape[1] % d == 0]
        block = data.draw(st.sampled_from([0] + divisors))

        def one():
            qw = qconv.quantize_weight(w, bits, block, sym, 1, method)
            qmin, qmax = (-(1 << (bits - 1)) + int(sym), (1 << (bits - 1)) - 1)
            assert qw.q.min() >= qmin and qw.q.max() <= qmax, (qw.q.min(), qw.q.max())
            assert np.isfinite(qw.scales).all() and (qw.scales >= 0).all()
            assert qw.offsets is None or np.isfinite(qw.offsets).all()
            with np.errstate(over="ignore"):
                deq = qw.dequantize(np.float64).reshape(shape)
            assert np.isfinite(deq).all()
            if method == "minmax":  # rounding error at most half a step (plus float32 rounding of the tables;
                # a range so small that its step underflows float32 quantizes to 0: 2^8 subnormal units)
                step = np.repeat(qw.scales.astype(np.float64), qw.block_len, axis=1).reshape(shape)
                err = np.abs(deq - w.astype(np.float64))
                bound = 0.5 * step * (1 + 1e-5) + 1e-6 * np.abs(w.astype(np.float64)) + 256 * 2.0 ** -149
                if qw.half_exact:  # float16 scale/offset (2^-11 relative) move the clipped ends and constant blocks
                    off = 0 if qw.offsets is None else np.repeat(np.abs(qw.offsets.astype(np.float64)), qw.block_len,
                                                                 axis=1).reshape(shape)
                    bound = bound + 2.0 ** -10 * (step * 2 ** bits + off)
                assert (err <= bound).all(), (float(err.max()), float(bound.reshape(-1)[err.argmax()]))
        run_valid(one)

    @few
    @given(st.one_of(st.sampled_from([4, 8]), small_int), st.one_of(st.sampled_from([0, 1, 2, 3]), small_int),
           st.one_of(st.booleans(), junk), st.one_of(st.just(1), small_int), junk)
    def fuzz_quantize(bits, block, sym, groups, w):
        call(qconv.quantize_weight, w, bits, block, sym, groups)

    @cfg
    @given(st.sampled_from([4, 8, 16, 32]), st.tuples(st.integers(0, 3), st.integers(1, 70), st.integers(0, 9),
                                                      st.integers(0, 9)),
           st.sampled_from(["high_first", "low_first", "split_halves"]),
           st.sampled_from(["offset8", "twos_complement", "unsigned"]), st.integers(0, 3), st.integers(0, 3000),
           st.integers(0, 2**32 - 1))
    def fuzz_valid_layouts(pack, shape, order, enc, rows, length, seed):
        """Round trips of valid arrays: empty axes, one element, odd channel counts, odd int4 lengths."""
        rng = np.random.default_rng(seed)

        def nc4hw4():
            x = _values(rng, shape, "normal", 1.0)
            spec = NC4HW4(pack)
            a = spec.pack_array(x)
            assert np.array_equal(spec.unpack_array(a, shape), x)

        def int4():
            packing = Int4Packing(order, enc)
            lo, hi = (0, 15) if enc == "unsigned" else (-8, 7)
            n = length - length % 64 if order == "split_halves" else length  # split halves: whole groups
            q = rng.integers(lo, hi + 1, (rows, n) if rows else n).astype(np.int8 if lo < 0 else np.uint8)
            b = packing.pack_array(q)
            assert np.array_equal(packing.unpack_array(b, q.shape), q)
        run_valid(nc4hw4)
        run_valid(int4)

    @few
    @given(junk, junk, junk, small_int, small_int, small_int)
    def fuzz_weight_ctor(q, scales, offsets, bits, block, groups):
        call(qconv.QuantizedWeight, q, scales, offsets, bits, block, groups)

    @few
    @given(junk, junk, small_int, small_int, junk, junk)
    def fuzz_from_mnn(wb, alpha, oc, bits, asym, shape):
        call(qconv.QuantizedWeight.from_mnn, wb, alpha, oc, bits, asym, shape)

    @few
    @given(small_int, junk, junk, st.sampled_from(["high_first", "low_first", "split_halves", "z"]),
           st.sampled_from(["offset8", "twos_complement", "unsigned", 3]))
    def fuzz_layouts(pack, x, shape, order, enc):
        call(lambda: NC4HW4(pack).pack_array(x))
        call(lambda: NC4HW4(4).unpack_array(x, shape))
        call(lambda: Int4Packing(order, enc).pack_array(x))
        call(lambda: Int4Packing(order, enc).unpack_array(x, shape))

    mostly = lambda good: st.one_of(good, good, good, small_int)  # noqa: E731

    @few
    @given(junk, mostly(st.sampled_from([0, 1])), mostly(st.integers(1, 3)), mostly(st.integers(0, 3)),
           mostly(st.integers(1, 2)), st.sampled_from([None, "relu", "relu6", "gelu"]),
           st.sampled_from(["tensor", "row", "block", None, "auto", "x"]))
    def fuzz_conv_junk(x, wi, stride, padding, dilation, activation, act_quant):
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
                _count("ran")
            call(run_one)

    @few
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

    for fuzz in (fuzz_valid_conv, fuzz_valid_linear, fuzz_valid_quantize, fuzz_valid_layouts, fuzz_conv_near_valid,
                 fuzz_quantize,
                 fuzz_weight_ctor, fuzz_from_mnn, fuzz_layouts, fuzz_conv_junk, fuzz_load):
        CURRENT[0] = fuzz.__name__
        fuzz()


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


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    devs = sys.argv[2:] or ["reference"]
    run(n, devs)
    for name, c in TARGETS.items():
        print(f"  {name}: {c['calls']} calls, {c['raised']} documented exceptions")
    for msg, count in REFUSED.most_common(8):
        print(f"  valid case refused x{count}: {msg}")
    print(f"fuzz: {COUNTS['calls']} calls, {COUNTS['raised']} documented exceptions, "
          f"{COUNTS['ran']} valid cases ran ({COUNTS['checked']} checked against the oracle), devices {devs}")
