"""A 1x1 conv and the depthwise conv of its output as one native call (qconv/_ext/_pair.pyx): fused (channel groups
through a thread buffer), banded (bands of rows, every channel) and sequential, against the two layers' own native calls and their checked paths, bit for
bit, over channel counts (odd and uneven groups), plane sizes, kernels, strides, activations, batches, threads and the
AMX and VNNI kernels; "auto"'s rule; errors and fallbacks. The session's pairs: tests/test_onnx_pair.py."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qconv
from qconv._ext import _ortops

_pair = pytest.importorskip("qconv._ext._pair")
from qconv.cpu.engine import select_kernel  # noqa: E402

# the direct int8 conv's kernels on this CPU (AMX CPUs run the VNNI one too)
INT8_KERNELS = {"amx": ["amx", "avx512vnni"], "avx512vnni": ["avx512vnni"]}.get(select_kernel(), [])


def _layers(rng, c, o, k, s, act_pw, act_dw, kernel, threads, symmetric=True):
    """(1x1 int8 layer C -> O, depthwise float layer of its O channels; float activations fold asymmetric
    depthwise weights' offsets into the weights)."""
    wp = qconv.quantize_weight((rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32))
    wd = qconv.quantize_weight(rng.standard_normal((o, 1, k, k)).astype(np.float32) / k, groups=o,
                               symmetric=symmetric)
    pw = qconv.Conv2d(wp, rng.standard_normal(o).astype(np.float32), activation=act_pw, act_quant="tensor",
                      threads=threads, kernel=kernel)
    dw = qconv.Conv2d(wd, rng.standard_normal(o).astype(np.float32), s, k // 2, activation=act_dw, act_quant=None,
                      threads=threads, kernel=kernel)
    return pw, dw


def _calls(pw, dw, x):
    """The two layers' native calls for x (made by a checked call each) and the checked results."""
    mid = pw(x)
    y = dw(mid)
    a = pw.engine.native_call(x.shape, mid.shape)
    b = dw.engine.native_call(mid.shape, y.shape)
    return a, b, mid, y


def _run(call, x, shape):
    y = np.full(shape, np.nan, np.float32)
    assert _ortops.run_native(call, x, y), "the native call did not run"
    return y


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.skipif(not INT8_KERNELS, reason="no AVX-512 VNNI / AMX on this CPU: tested below that fused refuses")
@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 40), o=st.sampled_from([16, 24, 32, 40, 48, 64, 96]), hw=st.tuples(st.integers(1, 30),
       st.integers(1, 40)), k=st.sampled_from([3, 5]), s=st.sampled_from([1, 2]),
       act_pw=st.sampled_from([None, "relu6", "hardswish", "silu"]),
       act_dw=st.sampled_from([None, "relu", "hardswish"]),
       n=st.integers(1, 2), threads=st.sampled_from([1, 2]), groups=st.sampled_from([16, 32]),
       band=st.integers(0, 9), symmetric=st.booleans(), kernel=st.sampled_from(INT8_KERNELS or ["amx"]),
       seed=st.integers(0, 2**31))
def test_pair_call_gives_the_layers_bits(c, o, hw, k, s, act_pw, act_dw, n, threads, groups, band, symmetric, kernel,
                                         seed):
    rng = np.random.default_rng(seed)
    pw, dw = _layers(rng, c, o, k, s, act_pw, act_dw, kernel, threads, symmetric)
    x = (rng.standard_normal((n, c) + hw) * 2).astype(np.float32)
    a, b, mid, want = _calls(pw, dw, x)
    assert a is not None and b is not None
    assert _same(_run(b, _run(a, x, mid.shape), want.shape), want), "the layers' native calls differ from them"
    assert b.kind == "depthwise"
    if a.kind != "direct int8":   # too few pixels for the direct int8 conv: the tiled GEMM's call
        assert n * hw[0] * hw[1] < pw.engine.amx_min_cols
        with pytest.raises(ValueError, match="cannot run fused"):
            _pair.pair_call(a, b, "fused")
        with pytest.raises(ValueError, match="cannot run fused"):
            _pair.pair_call(a, b, "banded")
    for mode, g in (("fused", groups), ("banded", band), ("sequential", 0), ("auto", 0)):
        if mode in ("fused", "banded") and a.kind != "direct int8":
            continue
        try:
            call = _pair.pair_call(a, b, mode, *((g, 0) if mode != "banded" else (0, g)))
        except ValueError as exc:   # a depthwise conv off the flat planes (the channel blocks)
            assert mode == "banded" and "flat planes" in str(exc)
            continue
        assert call.shapes == (x.shape, want.shape)
        if mode != "auto":
            assert _pair.call_mode(call) == mode
        if _pair.call_mode(call) == "banded":
            bo = _pair.band_rows(call)
            assert 1 <= bo <= want.shape[2] and (mode == "auto" or g == 0 or bo >= min(g, want.shape[2]))
        got = _run(call, x, want.shape)
        assert _same(got, want), f"{mode} (groups / band {g}) differs: max {np.nanmax(np.abs(got - want))}"


@pytest.mark.skipif(not INT8_KERNELS, reason="no AVX-512 VNNI / AMX on this CPU")
def test_auto_fuses_even_groups_of_small_planes_and_bands_large_outputs():
    rng = np.random.default_rng(1)
    cases = [(64, (40, 40), 1, 2, True, "fused"),        # 2 groups of 32: one a thread
             (96, (40, 40), 1, 2, True, "sequential"),   # 3 groups on 2 threads, 614 KB of 1x1 outputs
             (96, (40, 40), 1, 1, True, "fused"),
             (40, (40, 40), 1, 1, False, "sequential"),  # not groups of 32, 256 KB
             (64, (100, 100), 1, 2, True, "banded"),     # 32 planes of 40 KB: over GROUP_BYTES; 2.6 MB
             (32, (112, 112), 2, 2, False, "banded"),    # one group on 2 threads; 1.6 MB
             (48, (112, 112), 2, 2, True, "banded")]
    for o, hw, s, threads, sym, mode in cases:   # (layers large enough for the engine to give them 2 threads)
        pw, dw = _layers(rng, 16, o, 3, s, "relu6", None, INT8_KERNELS[0], threads, sym)
        x = rng.standard_normal((1, 16) + hw).astype(np.float32)
        a, b, _, want = _calls(pw, dw, x)
        call = _pair.pair_call(a, b)
        assert _pair.call_mode(call) == mode, (o, hw, threads)
        assert _same(_run(call, x, want.shape), want)
        if mode == "banded":   # bands of whole 16-pixel vectors, two a thread, 1x1 rows within GROUP_BYTES
            bo, ow = _pair.band_rows(call), want.shape[3]
            assert bo * ow % 16 == 0 and -(-want.shape[2] // bo) >= 2 * threads
            assert 4 * o * min(hw[0], (bo - 1) * s + 3) * hw[1] <= _pair.GROUP_BYTES
    assert _pair.even_groups(128, 1, 2) and _pair.even_groups(32, 2, 2) and not _pair.even_groups(32, 1, 2)
    with pytest.raises(ValueError, match="band_rows"):
        _pair.pair_call(a, b, "banded", 0, -1)


def test_sequential_any_paths_and_refusals():
    """Float-activation 1x1 convs (the direct float path) pair sequentially on every CPU, with the same bits; fused
    refuses them, as it refuses every pair on CPUs without the direct int8 conv."""
    rng = np.random.default_rng(2)
    wp = qconv.quantize_weight(rng.standard_normal((32, 12, 1, 1)).astype(np.float32))
    wd = qconv.quantize_weight(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), groups=32)
    pw = qconv.Conv2d(wp, None, act_quant=None, threads=2)
    dw = qconv.Conv2d(wd, None, 1, 1, activation="relu6", act_quant=None, threads=2)
    x = rng.standard_normal((1, 12, 40, 40)).astype(np.float32)
    a, b, mid, want = _calls(pw, dw, x)
    call = _pair.pair_call(a, b)
    assert _pair.call_mode(call) == "sequential"
    assert _same(_run(call, x, want.shape), want)
    with pytest.raises(ValueError, match="cannot run fused"):
        _pair.pair_call(a, b, "fused")
    with pytest.raises(ValueError, match="mode"):
        _pair.pair_call(a, b, "both")
    with pytest.raises(ValueError, match="group_channels"):
        _pair.pair_call(a, b, "sequential", 8)
    with pytest.raises(ValueError, match="takes"):   # the depthwise call of another shape
        _pair.pair_call(a, dw.engine.native_call((1, 32, 20, 40), (1, 32, 20, 40)))
    if not INT8_KERNELS:
        pw8 = qconv.Conv2d(wp, None, act_quant="tensor", threads=2)
        m8 = pw8(x)
        a8 = pw8.engine.native_call(x.shape, m8.shape)
        if a8 is not None:
            with pytest.raises(ValueError, match="cannot run fused"):
                _pair.pair_call(a8, b, "fused")


@pytest.mark.parametrize("mode", ["fused", "sequential"])
def test_nonfinite_input_and_disabled_children_fall_back(mode):
    """A NaN / inf input, or a child's call disabled (its node's mode changed), makes the pair's call refuse (the
    caller then takes the checked path, which raises or runs the new mode)."""
    if mode == "fused" and not INT8_KERNELS:
        pytest.skip("fused needs the direct int8 conv")
    rng = np.random.default_rng(3)
    pw, dw = _layers(rng, 16, 64, 3, 1, "relu6", None, INT8_KERNELS[0] if INT8_KERNELS else None, 2)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    a, b, mid, want = _calls(pw, dw, x)
    call = _pair.pair_call(a, b, mode)
    y = np.zeros(want.shape, np.float32)
    for bad in (np.nan, np.inf):
        xb = x.copy()
        xb[0, 3, 7, 11] = bad
        assert not _ortops.run_native(call, xb, y)
    assert _ortops.run_native(call, x, y) and _same(y, want)
    for child in (a, b):
        child.disable()
        assert not _ortops.run_native(call, x, y)
