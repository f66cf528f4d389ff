"""The fused-chain row kernel (qconv/_ext/_fused.pyx + qconv_fused.h) against numpy, float32 one operation at a
time: every leaf kind (full, nearest-repeated, per channel, scalar), every operation, odd sizes, batches and
threads. Also run by the sanitizer job (tests/test_cpu_*.py): the row loop's reads and writes stay in bounds."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_fused = pytest.importorskip("qconv._ext._fused")

OPS = ["Add", "Sub", "Mul", "Div", "Relu", "HardSigmoid", "Clip", "HardSwish"]


def _numpy(op, a, b, p0, p1):
    f32 = np.float32
    if op in ("Add", "Sub", "Mul", "Div"):
        return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op](a, b)
    if op == "Relu":
        return np.maximum(a, f32(0))
    if op == "Clip":
        return np.minimum(np.maximum(a, f32(p0)), f32(p1))
    v = np.clip(a * f32(p0) + f32(p1), f32(0), f32(1))   # two roundings, as the kernel
    return a * v if op == "HardSwish" else v


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 5), h=st.integers(1, 4), w=st.integers(1, 9),
       fh=st.integers(1, 3), fw=st.integers(1, 4), threads=st.integers(1, 3),
       ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6), seed=st.integers(0, 999))
def test_program_matches_numpy_bitwise(n, c, h, w, fh, fw, threads, ops, seed):
    rng = np.random.default_rng(seed)
    H, W = h * fh, w * fw
    leaves = [rng.standard_normal((n, c, H, W)).astype(np.float32),          # full
              rng.standard_normal((n, c, h, w)).astype(np.float32),          # repeated fh x fw
              rng.standard_normal((1, c, 1, 1)).astype(np.float32) + 2.0,    # per channel, batch 1
              np.array([1.5], np.float32)]                                    # scalar
    kinds, fhs, fws = [0, 0, 1, 2], [1, fh, 1, 1], [1, fw, 1, 1]
    full = [leaves[0], np.repeat(np.repeat(leaves[1], fh, 2), fw, 3), np.broadcast_to(leaves[2], (n, c, H, W)),
            np.broadcast_to(leaves[3].reshape(1, 1, 1, 1), (n, c, H, W))]
    slots = list(full)
    ins, par = [], []
    for i, op in enumerate(ops):
        a, b = rng.integers(0, len(slots), 2)
        p0, p1 = (-0.5, 1.25) if op == "Clip" else (0.2, 0.5)
        with np.errstate(all="ignore"):   # Div of a slot by itself minus itself: inf / nan, compared as bits
            slots.append(_numpy(op, slots[a], slots[b], p0, p1).astype(np.float32))
        ins.append((_fused.OP_CODES[op], len(slots) - 1, a, b if op in ("Add", "Sub", "Mul", "Div") else -1))
        par.append((p0, p1))
    y = np.full((n, c, H, W), np.nan, np.float32)
    with np.errstate(all="ignore"):
        _fused.Program(fhs, fws, ins, par, len(slots)).run(leaves, kinds, y, threads)
    want = np.ascontiguousarray(slots[-1])
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


def test_bad_programs_and_leaves_are_refused():
    one = [1]
    with pytest.raises(ValueError, match="slots"):
        _fused.Program(one, one, np.zeros((0, 4)), np.zeros((0, 2)), 1)
    with pytest.raises(ValueError, match="slots"):
        _fused.Program(one, one, [[0, 65, 0, 0]], [[0, 0]], 65)
    for ins in ([[0, 5, 0, 0]], [[7, 1, 0, 0]], [[0, 0, 0, 0]], [[0, 1, 0, 2], [0, 2, 0, 0]]):
        with pytest.raises(ValueError, match="slot|operation"):
            _fused.Program(one, one, ins, np.zeros((len(ins), 2)), 3)
    prog = _fused.Program([1, 2], [1, 2], [[0, 2, 0, 1]], [[0, 0]], 3)
    y = np.zeros((1, 2, 4, 4), np.float32)
    full, half = np.ones((1, 2, 4, 4), np.float32), np.ones((1, 2, 2, 2), np.float32)
    prog.run([full, half], [0, 0], y, 2)
    assert (y == 2).all()
    bad = [([full, full], [0, 0]), ([full, half[:, :1]], [0, 0]), ([full, np.ones(3, np.float32)], [0, 1]),
           ([full, half.astype(np.float64)], [0, 0]), ([full, half], [0, 3]), ([full], [0])]
    for leaves, kinds in bad:   # an input the kinds do not describe would read past it
        with pytest.raises(ValueError, match="leaf|leaves"):
            prog.run(leaves, kinds, y, 2)
