"""The CPU engine at its limits: integer accumulators at their overflow bound, refused native allocations.

Integer accumulators of the CPU engine and what bounds them (``L`` = the reduction values of one block,
padding lanes included: ``TiledWeightLayout.block_values``; ``u = xq - z`` in [-255, 255]):

* GEMM / GEMV block sums (``qc_gemm_*``, int32): int8 weights accumulate ``U*q`` with ``U = xq + 128`` in
  [0, 255], ``|acc| <= 255*128*L``; int4 weights accumulate ``xq*(q + 8)``, ``|acc| <= 128*15*L``; the exact
  ``sum u*q`` (after the zero-point corrections, taken modulo 2**32) is within ``255*128*L`` / ``255*8*L``.
  Floats take over between blocks, so only one block is ever summed in int32.
* input sums: ``PS`` per pixel and block (``<= 255*BCp``) and their per-column tap sums ``S`` (``<= 255*L``),
  ``8*S`` for int4 (``<= 2040*L``).
* weight sums ``wsx`` (``<= 128*L``, ``+ 8*L`` for int4).
All are covered by one refusal: ``CpuEngine`` rejects a layer whose ``L`` exceeds ``MAX_BLOCK_VALUES[bits]``
(65536 for int8: ``255*128*65536 < 2**31``; 524288 for int4). The tests below run each accumulator at its
extreme (every ``u = 255``, every weight at the most negative code) at the largest allowed ``L`` and check
the result bit for bit, and check that one step past ``L`` is refused.
"""
import numpy as np
import pytest

pytest.importorskip("qconv._ext._cpu")

from qconv import reference  # noqa: E402
from qconv._ext import _cpu, _cpu_probes, _cpu_testing  # noqa: E402
from qconv.cpu import KERNEL_NAMES, CpuEngine, serial_thresholds  # noqa: E402
from qconv.cpu.engine import MAX_BLOCK_VALUES  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts.nc4hw4 import NC4HW4  # noqa: E402
from qconv.weights import QuantizedWeight  # noqa: E402

KERNELS = [k for k in KERNEL_NAMES if _cpu.kernel_supported(k)]


def _extreme_weight(bits, c, k):
    """``(2, c, k, k)`` at the most negative code (an asymmetric weight); scale 1, offset 64 (the ``S`` term)."""
    q = np.full((2, c, k, k), -128 if bits == 8 else -8, np.int8)
    return QuantizedWeight(q, np.ones((2, 1), np.float32), np.full((2, 1), 64.0, np.float32), bits)


# (bits, channels, kernel): the largest L = k*k*round_up(c, 4) the engine takes, and one step (4 lanes) past
BOUNDS = [(8, 65536, 1), (8, 7280, 3), (4, 524288, 1)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits, c, k", BOUNDS)
@pytest.mark.parametrize("mode", ["tensor", "static", "block"])
def test_accumulators_exact_at_the_largest_allowed_block(kernel, bits, c, k, mode):
    """Every accumulator at its extreme for the largest allowed block: the result is the oracle's, bit for bit
    (the values are chosen so that every float step is exact too)."""
    w = _extreme_weight(bits, c, k)
    blen = k * k * -(-c // 4) * 4
    assert blen <= MAX_BLOCK_VALUES[bits] < blen + 4 * k * k
    spec = ConvSpec(w, act_quant="block" if mode == "block" else "tensor")
    if mode == "static":   # int8 127 with zero point -128: u = 255
        eng = CpuEngine(spec, kernel=kernel, threads=2, input_qparams=(1.0, -128))
        y = eng.forward(np.full((1, c, k, k), 127, np.int8))
    else:                  # tensor: range [0, 255] -> scale 1, z = -128, u = 255; block: scale 1, u = 127
        eng = CpuEngine(spec, kernel=kernel, threads=2)
        y = eng.forward(np.full((1, c, k, k), 127.0 if mode == "block" else 255.0, np.float32))
    assert eng.layout.block_values == blen
    u = 127 if mode == "block" else 255
    qmin = -128 if bits == 8 else -8
    want = np.float64(u) * c * k * k * (qmin + 64)   # scale * sum(u*q) + offset * sum(u)
    assert y.shape == (1, 2, 1, 1) and (y == np.float32(want)).all()
    if mode != "static":
        x = np.full((1, c, k, k), 127.0 if mode == "block" else 255.0, np.float32)
        ref = reference.conv2d(x, w, act_quant=spec.act_quant)
        assert np.array_equal(y, ref)


@pytest.mark.parametrize("bits, c, k", BOUNDS)
def test_one_step_past_the_block_bound_is_refused(bits, c, k):
    w = _extreme_weight(bits, c + 1, k)
    with pytest.raises(ValueError, match=rf"too long for exact int32 accumulation of int{bits} weights "
                                         rf"\(max {MAX_BLOCK_VALUES[bits]}\)"):
        CpuEngine(ConvSpec(w))


# --- refused native allocations -------------------------------------------------------------------------------
def _refusals(call):
    """Refuse the k-th native allocation of ``call()`` for k = 0, 1, ... until one call allocates fewer times:
    every refusal must be a MemoryError. Returns (number of refusals, the result of the undisturbed call)."""
    for k in range(64):
        _cpu_testing._test_refuse_allocation(k)
        try:
            out = call()
        except MemoryError:
            assert _cpu_testing._test_refuse_allocation(-1) == -1, "MemoryError without a refused allocation"
            continue
        assert _cpu_testing._test_refuse_allocation(-1) >= 0, "an allocation was refused, yet no MemoryError"
        return k, out
    raise AssertionError("more than 64 native allocations in one call")


@pytest.mark.parametrize("aq", ["tensor", "row"])
@pytest.mark.parametrize("layout", ["nchw", "nc4hw4"])
def test_refused_allocations_raise_memory_error(aq, layout):
    """Each native allocation of a forward call (range pass, threaded quantization buffers), refused in turn:
    a MemoryError each time, never a crash, and the engine still gives the right result afterwards."""
    rng = np.random.default_rng(3)
    w = QuantizedWeight(rng.integers(-7, 8, (9, 6, 3, 3)).astype(np.int8), np.ones((9, 1), np.float32), None, 4)
    x = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    xin = NC4HW4(4).pack_array(x) if layout == "nc4hw4" else x
    with serial_thresholds(macs=0, quant_values=0):
        # direct_int8=False: the tiled GEMM on every machine (the direct int8 conv allocates only in the range pass)
        eng = CpuEngine(ConvSpec(w, padding=1, act_quant=aq), threads=2, direct_int8=False)
        want = eng.forward(xin, layout)
        n, y = _refusals(lambda: eng.forward(xin, layout))
    assert n >= 3   # the range pass and at least two quantization work items
    np.testing.assert_array_equal(y, want)


def test_refused_allocations_in_the_native_helpers():
    x = np.ones(1000, np.float32)
    qs, dx, z = np.ones(2, np.float32), np.ones(2, np.float32), np.zeros(2, np.int32)
    xq = np.ones((2, 4, 3, 3), np.float32)
    calls = [lambda: _cpu.minmax(x, 2), lambda: _cpu.absmax_rows(x.reshape(1, 2, 500), 2),
             lambda: _cpu.fill_tensor_params(x, 2, "scalar", qs, z, dx),
             lambda: _cpu.fill_row_params(x.reshape(1, 2, 500), 2, "scalar", qs, z, dx),
             lambda: _cpu_probes.probe_read(np.zeros(512, np.uint8), 2, 1),
             lambda: _cpu_testing._test_quantize(xq, 1, 4, qs, z, -128, 127, np.arange(4, dtype=np.int32), 4, 1, 4,
                                         "scalar", 2)]
    for call in calls:
        n, _ = _refusals(call)
        assert n >= 1
