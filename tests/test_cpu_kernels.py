"""The CPU engine's native pieces, each alone against numpy: reductions, quantization, im2col blit,
the GEMM micro-kernels (every variant this CPU runs), the output store and the depth-to-space copy."""
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._cpu")

from qconv import reference  # noqa: E402
from qconv._ext import _cpu, _cpu_probes, _cpu_testing  # noqa: E402
from qconv.cpu import KERNEL_NAMES, row_qparams, tensor_qparams  # noqa: E402
from qconv.layouts import DepthToSpace  # noqa: E402
from qconv.weights import round_half_away  # noqa: E402

KERNELS = [k for k in KERNEL_NAMES if _cpu.kernel_supported(k)]


def test_kernel_selection_reports_something():
    assert "scalar" in KERNELS
    assert _cpu.best_kernel() in KERNELS
    assert KERNELS[-1] == _cpu.best_kernel()


# --- reductions and quantization parameters ------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 200_000), st.integers(0, 2**31), st.sampled_from([1, 2, 3]))
def test_minmax(kernel, n, seed, threads):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    assert _cpu.minmax(x, threads, kernel) == (float(x.min()), float(x.max()))


@pytest.mark.parametrize("kernel", KERNELS)
def test_reductions_report_nan(kernel):
    for n in (1, 17, 70_000, 200_000):
        for pos in (0, n // 2, n - 1):
            x = np.zeros(n, np.float32)
            x[pos] = np.nan
            lo, hi = _cpu.minmax(x, 2, kernel)
            assert np.isnan(lo) and np.isnan(hi)
            a = _cpu.absmax_rows(np.ascontiguousarray(np.stack([np.ones(n, np.float32), x])[None]), 2, kernel)
            assert a[0] == 1 and np.isnan(a[1])


@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 70_000), st.integers(0, 2**31))
def test_absmax_rows(kernel, a, n, m, seed):
    x = np.random.default_rng(seed).standard_normal((a, n, m)).astype(np.float32)
    np.testing.assert_array_equal(_cpu.absmax_rows(x, 2, kernel), np.abs(x).max(axis=(0, 2)))


@given(st.floats(-1e6, 1e6, width=32), st.floats(-1e6, 1e6, width=32))
def test_tensor_qparams_match_oracle(a, b):
    x = np.array([[a, b]], np.float32)
    rng = np.float32(max(a, b, 0.0)) - np.float32(min(a, b, 0.0))
    assume(rng == 0 or np.isfinite(np.float32(255) / np.float32(rng)))  # the oracle overflows below
    aq = reference.quantize_activation(x, "tensor")
    qs, dx, z = tensor_qparams(min(a, b), max(a, b))
    assert np.float32(dx) == aq.scale[0] and z == aq.zero[0]
    xq = np.clip(round_half_away(x * qs) + z, -128, 127)
    np.testing.assert_array_equal(xq, aq.xq)


def test_tiny_ranges_degenerate_to_zero():
    """Ranges so small that 255/range overflows behave like an all-zero input (scale 1, zero 0)."""
    assert tensor_qparams(0.0, 1e-38) == (1, 1, 0)
    qs, dx = row_qparams(np.array([1e-39, 2.0], np.float32))
    assert qs[0] == 1 and dx[0] == 1 and dx[1] == np.float32(2.0) / np.float32(127)


def test_row_qparams_match_oracle():
    x = np.array([[0, 0], [1e-30, -3.0], [7.5, 2.0]], np.float32)
    aq = reference.quantize_activation(x, "row")
    qs, dx = row_qparams(np.abs(x).max(axis=1))
    np.testing.assert_array_equal(dx, aq.scale)


# --- quantization into Q / PS ----------------------------------------------------------------------------
def _chpos(c, groups, nb):
    icg = c // groups
    bc = icg // nb
    bcp = -(-bc // 4) * 4
    ch = np.arange(c)
    blk = (ch // icg) * nb + (ch % icg) // bc
    return (blk * bcp + (ch % icg) % bc).astype(np.int32), blk, bcp


@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 2), st.sampled_from([(1, 1), (3, 1), (8, 2), (6, 3), (32, 1), (17, 1), (48, 3)]),
       st.integers(1, 5), st.integers(1, 21), st.sampled_from(["tensor", "row", "int8"]),
       st.booleans(), st.integers(0, 2**31))
def test_quantize(kernel, n, cg, h, w, mode, nc4hw4, seed):
    c, nb = cg
    groups = 1
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, h, w)) * 3).astype(np.float32)
    chpos, blk, bcp = _chpos(c, groups, nb)
    gnb = groups * nb
    if mode == "int8":
        xi = rng.integers(-128, 128, x.shape).astype(np.int8)
        zp = int(rng.integers(-128, 128))
        xq, z = xi.astype(np.int64), np.full(n, zp, np.int32)
        qs = np.ones(n, np.float32)
        xin = xi
    else:
        aq = reference.quantize_activation(x, mode)
        xq = aq.xq.astype(np.int64)
        z = np.broadcast_to(aq.zero, (n,)).astype(np.int32)
        if mode == "tensor":
            qs = np.full(n, tensor_qparams(x.min(), x.max())[0], np.float32)
        else:
            qs = row_qparams(np.abs(x.reshape(n, -1)).max(axis=1))[0]
        xin = x
    qlo = -127 if mode == "row" else -128
    if nc4hw4:
        from qconv.layouts.nc4hw4 import NC4HW4
        xin = NC4HW4(4).pack_array(xin)
        xin[-1, ..., c % 4 or 4:] = 100 if mode == "int8" else np.nan   # padding lanes: garbage, never read
    abias = 0 if seed % 2 else 128
    Q, PS, used = _cpu_testing._test_quantize(xin, int(not nc4hw4), c, qs, z, qlo, 127, chpos, gnb * bcp, gnb, bcp, kernel,
                                      2, abias)
    assert used == min(2, n * h)   # the threaded pass whenever there are two rows of work
    want_q = np.repeat(((z + abias) & 255).astype(np.uint8)[:, None], h * w, axis=0)[:, :, None].repeat(gnb * bcp, 2)
    want_q = want_q.reshape(n * h * w, gnb * bcp)
    u = (xq - z.reshape(n, 1, 1, 1)).transpose(0, 2, 3, 1).reshape(n * h * w, c)
    want_q[:, chpos] = ((xq + abias) & 255).transpose(0, 2, 3, 1).reshape(n * h * w, c)
    want_ps = np.zeros((n * h * w, gnb), np.int64)
    np.add.at(want_ps.T, blk, u.T)
    np.testing.assert_array_equal(Q, want_q)
    np.testing.assert_array_equal(PS, want_ps)


# --- im2col indirection table ------------------------------------------------------------------------------
def _geometry(gnb, bcp, kh, kw, s, p, d):
    """A layer geometry with ``gnb`` blocks of ``bcp`` channels (one group) and the given kernel / stride / pad."""
    return _cpu.ConvGeometry(in_channels=gnb * bcp, out_channels=32, groups=1, n_blocks=gnb, block_channels=bcp,
                             block_icl=bcp, kernel_h=kh, kernel_w=kw, stride_h=s, stride_w=s, pad_h=p, pad_w=p,
                             dilation_h=d, dilation_w=d, oc_tiles=1, bits=8, tile_cols=16, w_tile_stride=0,
                             w_block_stride=0, w_group_stride=0, lo=-np.inf, hi=np.inf)


@given(st.integers(1, 2), st.integers(1, 3), st.sampled_from([4, 8, 16, 36]), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.integers(0, 2), st.integers(1, 2), st.integers(1, 9), st.integers(0, 2**31))
def test_indirect(n, gnb, bcp, kh, kw, s, p, d, size, seed):
    rng = np.random.default_rng(seed)
    h = w = max(size, d * (max(kh, kw) - 1) + 1 - 2 * p)
    oh = (h + 2 * p - d * (kh - 1) - 1) // s + 1
    ow = (w + 2 * p - d * (kw - 1) - 1) // s + 1
    Q = rng.integers(0, 256, (n * h * w, gnb * bcp)).astype(np.uint8)
    PS = rng.integers(-1000, 1000, (n * h * w, gnb)).astype(np.int32)
    geo = _geometry(gnb, bcp, kh, kw, s, p, d)
    assert geo.out_hw(h, w) == (oh, ow)
    total = n * oh * ow
    p0 = int(rng.integers(0, total))
    ncols = int(rng.integers(1, total - p0 + 1))
    rows, S = _cpu_testing._test_indirect(Q, PS, geo, n, h, w, p0, ncols)
    cols = np.arange(p0, p0 + ncols)
    nn, oy, ox = cols // (oh * ow), (cols // ow) % oh, cols % ow
    want = np.empty((ncols, kh * kw), np.int64)
    wantS = np.zeros((ncols, gnb), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            iy, ix = oy * s - p + ky * d, ox * s - p + kx * d
            inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
            row = (nn * h + iy) * w + ix
            want[:, ky * kw + kx] = np.where(inside, row, -1)
            wantS += np.where(inside[:, None], PS[np.where(inside, row, 0)], 0)
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(S, wantS)


def test_indirect_rejects_bad_geometry():
    Q = np.zeros((4, 2), np.uint8)
    geo = _geometry(2, 4, 1, 1, 1, 0, 1)
    with pytest.raises(ValueError):
        _cpu_testing._test_indirect(Q, np.zeros((4, 2), np.int32), geo, 1, 2, 2, 0, 4)
    with pytest.raises(ValueError):
        _cpu_testing._test_indirect(np.zeros((4, 8), np.uint8), np.zeros((4, 2), np.int32), geo, 1, 2, 2, 3, 4)
    with pytest.raises(ValueError, match="block_icl"):   # the typed record checks its own consistency
        _cpu.ConvGeometry(**{**{n: getattr(geo, n) for n in _FIELDS}, "block_icl": 6})
    with pytest.raises(TypeError):
        _cpu.ConvGeometry(**{**{n: getattr(geo, n) for n in _FIELDS}, "bits": "8"})


_FIELDS = ("in_channels", "out_channels", "groups", "n_blocks", "block_channels", "block_icl", "kernel_h", "kernel_w",
           "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "oc_tiles", "bits", "tile_cols",
           "w_tile_stride", "w_block_stride", "w_group_stride", "lo", "hi", "block_mode", "act_block")


# --- GEMM micro-kernels -------------------------------------------------------------------------------------
def _gemm_case(rng, ncols, nblocks, blq, bits, asym, asigned=False):
    """A random micro-kernel call and its float64 reference. ``asigned``: int8 weights without -128 reading A
    as signed bytes (the AVX2 sign form); A and q are then drawn with extra weight on the extremes (-128 / 127
    inputs against -127 / 127 weights: the largest vpmaddubsw pair sums, 2*128*127)."""
    lb = blq * 4   # block = taps runs of 4*bq bytes: the L order is the same flat order either way
    A = rng.integers(0, 256, (ncols, nblocks * lb)).astype(np.uint8)
    if asigned:
        A = np.where(rng.random(A.shape) < 0.3, rng.choice(np.array([0x80, 0x7F], np.uint8), A.shape), A)
    # int8 weights read A as unsigned (xq + 128) unless asigned, int4 weights as signed (xq)
    Ai = A.view(np.int8).astype(np.int64) if bits == 4 or asigned else A.astype(np.int64)
    qlo, qhi = (-8, 7) if bits == 4 else (-127, 127) if asigned else (-128, 127)
    q = rng.integers(qlo, qhi + 1, (32, nblocks, lb)).astype(np.int8)
    if asigned:
        q = np.where(rng.random(q.shape) < 0.3, rng.choice(np.array([-127, 127], np.int8), q.shape), q)
    from qconv.layouts.gemm_tiles import TiledWeightLayout
    lay = TiledWeightLayout(32, nblocks * lb, 1, nblocks, bits)
    w = lay.pack_array(q.reshape(32, -1)).reshape(-1).view(np.uint8)
    zpu = int(rng.integers(-128, 128)) if bits == 4 or asigned else int(rng.integers(0, 256))
    if rng.integers(0, 4) == 0:
        zpu = 0
    u = Ai.reshape(ncols, nblocks, lb) - zpu
    S = u.sum(-1).astype(np.int32)
    ws = q.astype(np.int64).sum(-1).T  # (nblocks, 32)
    wsx = np.ascontiguousarray(ws + (8 * lb if bits == 4 else 0), dtype=np.int32)
    scale = rng.uniform(0.001, 0.1, (nblocks, 32)).astype(np.float32)
    off = rng.uniform(-0.5, 0.5, (nblocks, 32)).astype(np.float32) if asym else None
    dx = rng.uniform(0.01, 0.1, ncols).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)
    I = np.einsum("ekl,okl->eko", u, q.astype(np.int64))   # exact integer parts (ncols, nblocks, 32)
    ref = (I * scale.astype(np.float64)).sum(1)
    if asym:
        ref = ref + (S[:, :, None].astype(np.float64) * off.astype(np.float64)).sum(1)
    ref = ref * dx[:, None].astype(np.float64) + bias
    return A, w, lay.block_stride, S, wsx, scale, off, dx, bias, zpu, ref


# weight forms: int8 read unsigned (xq + 128), int8 in the sign form (signed xq), int4
FORMS = {"i8": (8, False), "i8-sign": (8, True), "i4": (4, False)}


@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 17), st.integers(1, 3), st.integers(1, 4), st.integers(1, 12), st.sampled_from(list(FORMS)),
       st.booleans(), st.sampled_from([None, "relu", "relu6"]), st.integers(0, 2**31))
def test_gemm_kernel(kernel, ncols, nblocks, taps, bq, form, asym, act, seed):
    rng = np.random.default_rng(seed)
    bits, asigned = FORMS[form]
    A, w, bstride, S, wsx, scale, off, dx, bias, zpu, ref = _gemm_case(rng, ncols, nblocks, taps * bq, bits, asym,
                                                                       asigned)
    lo, hi = {None: (-np.inf, np.inf), "relu": (0, np.inf), "relu6": (0, 6)}[act]
    out = _cpu_testing._test_gemm(A, w, bstride, S, wsx, scale, off, dx, bias, nblocks, taps, bq, bits, zpu, lo, hi, kernel,
                                  asigned=asigned)
    # float rounding scales with the magnitude before the clamp (relu6 can clamp values in the thousands)
    tol = 1e-5 * max(1.0, float(np.abs(ref).max()))
    ref = np.clip(ref, lo, hi)
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol)
    if nblocks > 1:
        # the blocks split over calls (first / last flags) give the same bits
        lb = taps * bq * 4
        part = np.zeros_like(out)
        for k in range(nblocks):
            _cpu_testing._test_gemm(np.ascontiguousarray(A[:, k * lb:(k + 1) * lb]), w[k * bstride:], bstride,
                            np.ascontiguousarray(S[:, k:k + 1]), wsx[k:k + 1], scale[k:k + 1],
                            None if off is None else off[k:k + 1], dx, bias, 1, taps, bq, bits, zpu, lo, hi, kernel,
                            first=int(k == 0), last=int(k == nblocks - 1), out=part, asigned=asigned)
        assert np.array_equal(part, out)


@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 5), st.integers(1, 3), st.integers(1, 6),
       st.sampled_from(list(FORMS)), st.booleans(), st.integers(0, 2**31))
def test_gemm_kernel_many_tiles(kernel, ncols, ntiles, nblocks, taps, bq, form, asym, seed):
    """Several channel tiles per call (the one- and two-column paths pair tiles up)."""
    rng = np.random.default_rng(seed)
    bits, asigned = FORMS[form]
    cases = [_gemm_case(np.random.default_rng(seed + t), ncols, nblocks, taps * bq, bits, asym, asigned)
             for t in range(ntiles)]
    A, zpu = cases[0][0], cases[0][9]
    refs = []
    for t, c in enumerate(cases):       # same A and zero point for every tile: recompute the reference
        _, w, bstride, _, wsx, scale, off, dx, bias, _, _ = c
        refs.append(_cpu_testing._test_gemm(A, w, bstride, cases[0][3], wsx, scale, off, cases[0][7], bias, nblocks, taps, bq,
                                    bits, zpu, -np.inf, np.inf, "scalar", asigned=asigned))
    w_all = np.concatenate([c[1] for c in cases])
    cat = lambda i: np.ascontiguousarray(np.concatenate([c[i] for c in cases], axis=-1))  # noqa: E731
    off = None if not asym else cat(6)
    out = _cpu_testing._test_gemm(A, w_all, cases[0][2], cases[0][3], cat(4), cat(5), off, cases[0][7], cat(8), nblocks, taps,
                          bq, bits, zpu, -np.inf, np.inf, kernel, ntiles=ntiles, w_tstride=cases[0][1].size,
                          asigned=asigned)
    ref = np.concatenate(refs, axis=1)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
    del rng


def test_gemm_kernel_extremes():
    """Largest |products|: U = 255 against q = -128 over a long block stays exact in int32."""
    for kernel in KERNELS:
        ncols, blq = 3, 2048
        A = np.full((ncols, blq * 4), 255, np.uint8)
        q = np.full((32, blq * 4), -128, np.int8)
        from qconv.layouts.gemm_tiles import TiledWeightLayout
        lay = TiledWeightLayout(32, blq * 4, 1, 1, 8)
        w = lay.pack_array(q).reshape(-1).view(np.uint8)
        zpu = 0
        S = np.full((ncols, 1), 255 * blq * 4, np.int32)
        wsx = np.full((1, 32), -128 * blq * 4, np.int32)
        out = _cpu_testing._test_gemm(A, w, 0, S, wsx, np.ones((1, 32), np.float32), None, np.ones(ncols, np.float32),
                              np.zeros(32, np.float32), 1, 1, blq, 8, zpu, -np.inf, np.inf, kernel)
        assert (out == np.float32(-255 * 128 * blq * 4)).all(), kernel
        # the sign form's largest pairs: xq = -128 against q = -127 (|xq| = 128 unsigned, q*sign(xq) = 127)
        A = np.full((ncols, blq * 4), 0x80, np.uint8)
        w = lay.pack_array(np.full((32, blq * 4), -127, np.int8)).reshape(-1).view(np.uint8)
        S = np.full((ncols, 1), -128 * blq * 4, np.int32)
        out = _cpu_testing._test_gemm(A, w, 0, S, np.full((1, 32), -127 * blq * 4, np.int32), np.ones((1, 32), np.float32),
                                      None, np.ones(ncols, np.float32), np.zeros(32, np.float32), 1, 1, blq, 8, 0,
                                      -np.inf, np.inf, kernel, asigned=True)
        assert (out == np.float32(128 * 127 * blq * 4)).all(), kernel


def test_gemm_bad_args():
    A = np.zeros((2, 8), np.uint8)
    with pytest.raises(ValueError):
        _cpu_testing._test_gemm(A, np.zeros(256, np.uint8), 0, np.zeros((3, 1), np.int32), np.zeros((1, 32), np.int32),
                        np.ones((1, 32), np.float32), None, np.ones(2, np.float32), np.zeros(32, np.float32),
                        1, 1, 2, 8, 0, 0, 1, "scalar")
    with pytest.raises(KeyError):
        _cpu_testing._test_gemm(A, np.zeros(256, np.uint8), 0, np.zeros((2, 1), np.int32), np.zeros((1, 32), np.int32),
                        np.ones((1, 32), np.float32), None, np.ones(2, np.float32), np.zeros(32, np.float32),
                        1, 1, 2, 8, 0, 0, 1, "sse9")


# --- store ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 3), st.sampled_from([(1, 1), (5, 1), (16, 1), (40, 1), (6, 2), (12, 3), (64, 2)]),
       st.integers(1, 9), st.integers(1, 9), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_store(kernel, n, og, oh, ow, nc4hw4, int8, seed):
    o, g = og
    rng = np.random.default_rng(seed)
    ocp = -(-(o // g) // 32) * 32
    total = n * oh * ow
    p0 = int(rng.integers(0, total))
    ncols = int(min(total - p0, rng.choice([1, 5, 16, 32])))
    OUT = rng.standard_normal((ncols, g * ocp)).astype(np.float32) * 10
    og_ = o // g
    oidx = ((np.arange(o) // og_) * ocp + np.arange(o) % og_).astype(np.int32)
    oscale, ozp = (np.float32(0.07), 3) if int8 else (None, 0)
    y = _cpu_testing._test_store(OUT, oidx, p0, n, o, oh, ow, int(nc4hw4), g, ocp, None if oscale is None else float(oscale),
                         ozp, kernel)
    want = np.zeros((n * oh * ow, o), np.float64 if not int8 else np.int64)
    vals = OUT[:, oidx]
    if int8:
        vals = np.clip(round_half_away((vals / oscale).astype(np.float32)) + ozp, -128, 127)
    want[p0:p0 + ncols] = vals
    want = want.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    if nc4hw4:
        from qconv.layouts.nc4hw4 import NC4HW4
        want = NC4HW4(4).pack_array(want)
    np.testing.assert_array_equal(y, want.astype(y.dtype))


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_output_rounding(kernel):
    """The static path's requantization (qc_requant) on ties, clamps, huge values, inf and NaN: round half away
    from zero on the float32 quotient, +-1000 then [-128, 127]; NaN gives -128."""
    scale, zp = 0.07, 3
    ties = (np.arange(-40, 40) + 0.5).astype(np.float32) * np.float32(scale)
    special = np.array([0, -0.0, 1e30, -1e30, np.inf, -np.inf, np.nan, 3.4e38, 1e-40, -1e-40], np.float32)
    vals = np.concatenate([ties, special, np.nextafter(ties, np.float32(np.inf))])
    OUT = np.zeros((vals.size, 32), np.float32)
    OUT[:, 0] = vals
    y = _cpu_testing._test_store(OUT, np.zeros(1, np.int32), 0, 1, 1, 1, vals.size, 0, 1, 32, scale, zp, kernel)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.clip(round_half_away((vals / np.float32(scale)).astype(np.float32)), -1000, 1000)
    want = np.where(np.isnan(q), -128, np.clip(np.nan_to_num(q) + zp, -128, 127)).astype(np.int8)
    np.testing.assert_array_equal(y.reshape(-1), want)


@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(1, 14), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 6),
       st.sampled_from([8, 4]), st.booleans(), st.integers(0, 2**31))
def test_gemm_kernel_half_tables(kernel, ncols, ntiles, nblocks, taps, bq, bits, asym, seed):
    """float16 scale/offset tables (values that are float16 numbers) give the same bits as float32 tables."""
    rng = np.random.default_rng(seed)
    A, w, bstride, S, wsx, scale, off, dx, bias, zpu, _ = _gemm_case(rng, ncols, nblocks, taps * bq, bits, asym)
    rep = lambda a: np.ascontiguousarray(np.tile(a, ntiles))  # noqa: E731  (the same tile ntiles times)
    scale = rep(scale.astype(np.float16).astype(np.float32))
    off = None if off is None else rep(off.astype(np.float16).astype(np.float32))
    w_all = np.concatenate([w.reshape(nblocks, -1)] * ntiles, axis=1).reshape(-1)   # [block][tile][...]
    args = (A, w_all, bstride * ntiles, S, rep(wsx), scale, off, dx, rep(bias), nblocks, taps, bq, bits, zpu,
            -np.inf, np.inf, kernel)
    kw = dict(ntiles=ntiles, w_tstride=bstride)
    full = _cpu_testing._test_gemm(*args, **kw)
    half = _cpu_testing._test_gemm(*args, half=True, **kw)
    assert np.array_equal(full, half)
    with pytest.raises(ValueError, match="float16"):
        _cpu_testing._test_gemm(*args[:5], args[5] + np.float32(1e-6), *args[6:], half=True, **kw)


def test_ceiling_probes():
    """The benchmark's ceiling probes read every byte (checksum) and report a positive rate."""
    buf = np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8)
    for threads in (1, 2):
        gbs, chk = _cpu_probes.probe_read(buf, threads, reps=1)
        assert gbs > 0 and chk == int(np.bitwise_xor.reduce(buf.view(np.uint64)))
    with pytest.raises(ValueError, match="multiple of 256"):
        _cpu_probes.probe_read(buf[:100], 1)
    assert _cpu_probes.probe_vnni_gops(1, seconds=0.01) > 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_quantize_rounding_ties(kernel):
    """Halves, their float neighbours and large values round half away from zero exactly as the oracle."""
    k = np.arange(-130, 131, dtype=np.float32)
    base = np.concatenate([k + np.float32(0.5), k - np.float32(0.5), k, np.float32([0.49999997, -0.49999997,
                           0.5, -0.5, 1.5, 2.5, 126.5, -127.5, 4194304.5, 8388607.0, 1e6, -1e6])])
    vals = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    vals = vals.astype(np.float32)
    c = vals.size
    x = vals.reshape(1, c, 1, 1)
    for qlo, abias in ((-128, 128), (-127, 0)):
        Q, _, _ = _cpu_testing._test_quantize(x, 1, c, np.ones(1, np.float32), np.zeros(1, np.int32), qlo, 127,
                                      np.arange(c, dtype=np.int32), c, 1, c, kernel, 1, abias)
        want = np.clip(round_half_away(vals), qlo, 127).astype(np.int64) + abias
        np.testing.assert_array_equal(Q[0].astype(np.int64), want & 255)


# --- depth to space (a QConv node's depth_to_space) ----------------------------------------------------
@pytest.mark.parametrize("kernel", [k for k in ("scalar", "avx2") if k in KERNELS])
@given(b=st.integers(1, 3), n=st.integers(1, 2), c=st.integers(1, 5), h=st.integers(1, 4), w=st.integers(1, 21),
       threads=st.integers(1, 2))
def test_depth_to_space_is_onnx_crd(kernel, b, n, c, h, w, threads):
    x = np.random.default_rng(w).standard_normal((n, c * b * b, h, w)).astype(np.float32)
    y = np.full((n, c, h * b, w * b), np.nan, np.float32)
    _cpu.depth_to_space(x, y, b, threads, kernel)
    np.testing.assert_array_equal(y, DepthToSpace(b).pack_array(x))


def test_depth_to_space_rejects_bad_shapes():
    x = np.zeros((1, 8, 2, 2), np.float32)
    with pytest.raises(ValueError, match="blocks of 3x3"):
        _cpu.depth_to_space(x, np.zeros((1, 1, 6, 6), np.float32), 3)
    with pytest.raises(ValueError, match="y must have shape"):
        _cpu.depth_to_space(x, np.zeros((1, 2, 4, 5), np.float32), 2)
