"""Integer accumulators of the OpenCL kernels at their int32 bounds (issue 19 item 2).

Each test drives one kernel family with the largest products its integer sums can see (|q| and |x| at the
ends of their ranges, every product of one sign) over enough input channels to pass 2**31 in an unfolded
int32 sum, and compares with the oracle (float64 sums). Audit of the integer accumulators:

* ``gemv_a8`` (act_quant="row", one row): per-channel weights sum ``q * xq`` over all of K in int32 (dp4a),
  int8: at most 128 * 127 per product, int4: (q + 8) * xq, at most 15 * 127 (unsigned nibbles). The engine
  keeps int32 sums only up to ``gpu.families.gemv_a8.A8_EXACT_MAX_IC`` input channels; longer (int8) rows fold each
  lane's int32 sum into float before it can overflow and add the lanes in float (-DA8_WIDE). Blockwise weights sum one scale group of a
  chunk (<= 32 products) in int32. ``quant_x_a8``'s sum of all xq: 127 * K, exact below 16.9 M channels;
  gemv_a8 takes at most 4 * 1024 * A8_MAX_NV = 1,048,576 channels (x is held in registers), longer rows run
  the float kernels on quantized rows.
* ``conv_mma`` (act_quant="row", tensor-core GEMM; emulated with dp4a off NVIDIA): int32 sums over one
  scale block or, per-channel, at most 4096 steps of 32 channels (4096 * 32 * 128 * 127 < 2**31), then
  folded into float; blockwise layers whose block spans more than 4096 steps are refused.
* ``gemv_mma`` (float activations, one row; emulated with dp4a off NVIDIA): int32 sums per digit column of
  x (the base-256 digits of rint(x * 2^sh)) over all of K (per-channel, one warp: SPLIT = 1) or one scale
  block; each product 16 q d (int4) or q d is at most 128 * 128, so the engine takes at most
  ``gemv_mma.MAX_CHANNELS`` = 131071 channels; the warps' and columns' sums are int64.
* ``conv_general``, ``conv_1x1`` (incl. ``gemv_1x1``), ``conv_gemm`` and ``act_quant``'s ``quant_rows``:
  float (f32) accumulators only; no integer sum to overflow. Tested at large K with extreme values all the
  same, to show it.

The inline-PTX variants (-DNV_PTX) run only on NVIDIA; CI (PoCL) runs the portable dp4a and the emulated mma.
"""
import numpy as np
import pytest

import qconv
from qconv import gpu, reference
from qconv.geometry import ConvSpec
from qconv.gpu.families import gemv_a8
from qconv.gpu.families.gemv_a8 import A8_EXACT_MAX_IC

from test_gpu_engine import cl_device  # noqa: F401

INT32_MAX = 2**31 - 1


def _const_weight(o, i, q, bits, k=1, asym=False, block=0):
    """O x I x k x k weights all equal to ``q`` (scale 1, offsets 0 when asym: q = -2^(bits-1) needs them)."""
    nb = i // block if block else 1
    qa = np.full((o, i, k, k), q, np.int8)
    return qconv.QuantizedWeight(qa, np.ones((o, nb), np.float32), np.zeros((o, nb), np.float32) if asym else None,
                                 bits, block)


def _check(y, x, w, act_quant, stride=1, padding=0, rtol=2e-6):
    ref = reference.conv2d(x, w, None, stride, padding, 1, None, act_quant).astype(np.float64)
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all()
    # every output is one sum of products of one sign: a relative bound per output is meaningful
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=0)


def _row(w, device, **opts):
    return gpu.OpenCLEngine(ConvSpec(w, None, 1, 0, 1, None, "row"), device=device, tune="none", image=False,
                            **opts)


def test_a8_exact_bounds():
    """The engine's bounds are the largest K whose worst-case int32 sum fits."""
    for bits, prod in ((8, 128 * 127), (4, 15 * 127)):
        k = A8_EXACT_MAX_IC[bits]
        assert k * prod <= INT32_MAX < (k + 1) * prod


@pytest.mark.parametrize("ic,q,variant,lws", [
    (A8_EXACT_MAX_IC[8], -128, "gemv_a8_c1", None),   # the last K of exact int32 sums
    (140_000, -128, "gemv_a8_c1", None),              # the case
    (140_000, -128, "gemv_a8_c1", (4, 1, 1)),         # one lane per channel: it folds (8,750 chunks > 8,256)
    (140_000, -127, "gemv_a8_c2", (4, 8, 1)),         # symmetric, 2 channels per item, split-K 8
    (140_000, -128, "gemv_a8f_c2", (64, 4, 1)),       # fused
])
def test_gemv_a8_int8_past_int32(cl_device, ic, q, variant, lws):
    """int8 per-channel gemv_a8 with q = -128 (or -127), x = 3: sum q*xq = -16,256 K, past -2**31 for K = 140,000
    (the issue's case: the old kernel wrapped around, +4.77e7 for -5.38e7)."""
    w = _const_weight(4, ic, q, 8, asym=q == -128)
    x = np.full((1, ic, 1, 1), 3.0, np.float32)
    assert (ic * abs(q) * 127 > INT32_MAX) == (ic > A8_EXACT_MAX_IC[8] and q == -128 or ic * 127 * 127 > INT32_MAX)
    try:
        eng = _row(w, cl_device, variant=variant, local_size=lws)
    except ValueError as exc:   # the engine refuses a forced variant it cannot run, and says why
        if gpu.A8_VARIANTS[variant][1] and "local memory" in str(exc):
            pytest.skip(f"{cl_device}: x's int8 words do not fit in local memory for the fused variant")
        raise
    assert gemv_a8.local_sizes(eng, *gpu.A8_VARIANTS[variant])
    y = eng.forward(x)
    assert eng.plans[("nchw", 1, 1, 1)].cand.program == "gemv_a8"
    _check(y, x, w, "row")


def test_gemv_a8_int4_past_int32(cl_device):
    """int4 per-channel act_quant="row" row with sum q*xq = -8 * 127 * K < -2**31 (K = 2,113,696). gemv_a8 holds x
    in registers (at most A8_MAX_NV float4 per quantizing item, so at most 4 * 1024 * 256 channels, below the
    int4 bound of its unsigned-nibble sums): such rows run the float kernels on quantized rows instead, and a
    forced gemv_a8 variant says why. (The old engine ran gemv_a8 here: PoCL crashed with a segfault.)"""
    ic = 2_113_696
    assert ic * 8 * 127 > INT32_MAX
    w = _const_weight(1, ic, -8, 4, asym=True)
    x = np.full((1, ic, 1, 1), 3.0, np.float32)
    eng = _row(w, cl_device)
    _check(eng.forward(x), x, w, "row")
    assert eng.plans[("nchw", 1, 1, 1)].cand.program != "gemv_a8"
    with pytest.raises(ValueError, match="float4 of x per quantizing item"):
        _row(w, cl_device, variant="gemv_a8_c1").forward(x)


@pytest.mark.parametrize("asym", [True, False])
def test_conv_mma_past_4096_steps(cl_device, asym):
    """conv_mma (emulated off NVIDIA) per-channel over 456 chunks x 9 taps = 4104 steps: the int32 sums fold at
    4096 steps (unfolded they would reach 14,592 * 9 * 16,256 = 2.13e9, next to 2**31), the second fold covers
    8 steps. With offsets it read the offset row past the end of the offsets (blk * OCP4 for one scale row;
    found by this test), wrong by up to 8,190 products in some runs."""
    ic = 14_592
    o = 16
    q = -128 if asym else -127
    qa = np.full((o, ic, 3, 3), q, np.int8)
    offs = np.linspace(-100, -10, o).astype(np.float32)[:, None] if asym else None  # exact in fp16
    w = qconv.QuantizedWeight(qa, np.ones((o, 1), np.float32), offs, 8)
    x = np.full((1, ic, 3, 3), -3.0, np.float32)  # xq = -127: every product +16,256 (+ 127 * |offset|)
    eng = gpu.OpenCLEngine(ConvSpec(w, None, 1, 0, 1, None, "row"), device=cl_device, tune="none",
                           variant="mma_64x32")
    y = eng.forward(x)
    assert eng.plans[("nchw", 1, 3, 3)].cand.program == "conv_mma"
    _check(y, x, w, "row")


@pytest.mark.parametrize("aq,variant,shape", [
    (None, "c4h1w1", (1, 2100, 3, 3)), ("row", "c4h1w1", (1, 2100, 3, 3)),      # conv_general (3x3)
    (None, "buf_c4_r1", (3, 20_000, 1, 1)), ("row", "buf_c4_r1", (3, 20_000, 1, 1)),  # conv_1x1
    (None, "gemv_u4", (1, 20_000, 1, 1)),                                        # gemv_1x1
    (None, "gemm_64x8", (1, 20_000, 3, 3)), ("row", "gemm_64x8", (1, 20_000, 3, 3)),  # conv_gemm
    (None, "gemv_mma", (1, 8192, 1, 1)),                                         # gemv_mma (emulated off NVIDIA)
])
def test_float_kernels_long_k_extreme_values(cl_device, aq, variant, shape):
    """The kernels with float accumulators (and act_quant="row"'s quant_rows feeding them) over long K with
    q = -128 and x = 3 everywhere: no integer sum to wrap; every output one sum of products of one sign."""
    n, ic, h, wd = shape
    k = 3 if variant == "c4h1w1" else 1
    w = _const_weight(4 if variant != "gemm_64x8" else 8, ic, -128, 8, k=k, asym=True)
    x = np.full(shape, 3.0, np.float32)
    eng = gpu.OpenCLEngine(ConvSpec(w, None, 1, 0, 1, None, aq), device=cl_device, tune="none", image=False,
                           variant=variant)
    y = eng.forward(x)
    assert eng.plans[("nchw", n, h, wd)].variant == variant
    _check(y, x, w, aq, rtol=1e-5)


def test_gemv_mma_digit_sums_at_their_bound(cl_device):
    """gemv_mma at MAX_CHANNELS with one warp (SPLIT = 1): every int4 code -8 (16 q = -128) and every x equal
    to the value whose lower three digits are all -128 (X = 32 * 2^24 - 128 * (2^16 + 2^8 + 1)), so each of
    those columns sums 131071 products of +2^14, 16383 short of 2^31. Where the device's local memory cannot
    hold x's digits for that many channels the layer is refused, saying so."""
    from qconv.gpu.families import gemv_mma

    ic = gemv_mma.MAX_CHANNELS
    w = _const_weight(1, ic, -8, 4, asym=True)
    x = np.full((1, ic, 1, 1), np.float32((32 * 2**24 - 128 * (2**16 + 2**8 + 1)) / 2**28), np.float32)
    eng = gpu.OpenCLEngine(ConvSpec(w, None, 1, 0, 1, None, None), device=cl_device, tune="none", image=False)
    why = gemv_mma.unsupported(eng, None, "gemv_mma")
    if why is not None:
        assert "local memory" in why, why
        return
    eng = gpu.OpenCLEngine(ConvSpec(w, None, 1, 0, 1, None, None), device=cl_device, tune="none", image=False,
                           variant="gemv_mma", local_size=(32, 1, 1))
    _check(eng.forward(x), x, w, None)
    over = _const_weight(1, ic + 1, -8, 4, asym=True)
    assert "int32 sums" in gemv_mma.unsupported(
        gpu.OpenCLEngine(ConvSpec(over, None, 1, 0, 1, None, None), device=cl_device, tune="none", image=False),
        None, "gemv_mma")
