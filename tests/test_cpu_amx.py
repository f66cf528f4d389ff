"""The AMX-INT8 kernel (``kernel="amx"``) and its weight layout :class:`qconv.layouts.amx.AmxWeightLayout`.

Everywhere: the layout's exact round trip and an explicit byte-position check, and the clear refusal of
``kernel="amx"`` on a CPU (or OS) without AMX. Where the CPU has AMX-INT8: the kernel's integer parts exactly
against numpy, its results bitwise equal to the VNNI kernel's (the integer sums are exact, the float epilogue is
the VNNI kernel's own code), proof that it reads the AMX tiles, and whole engines -- convs and batched linears,
per-channel and blockwise weights (block lengths that are not multiples of the 64-byte K step), 4/8 bits, every
activation mode (tensor, row, block, static) -- bitwise equal to the VNNI engine and within the oracle's rule.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("qconv._ext._cpu")

from qconv import quantize_weight  # noqa: E402
from qconv._ext import _cpu, _cpu_testing  # noqa: E402
from qconv.cpu import CpuEngine, serial_thresholds  # noqa: E402
from qconv.geometry import ConvSpec  # noqa: E402
from qconv.layouts import all_specs  # noqa: E402
from qconv.layouts.amx import AmxWeightLayout  # noqa: E402
from qconv.layouts.gemm_tiles import TiledWeightLayout  # noqa: E402
from qconv.testing import assert_layout_roundtrip, assert_matches_reference, strategies as qst  # noqa: E402

HAVE_AMX = _cpu.kernel_supported("amx")
needs_amx = pytest.mark.skipif(not HAVE_AMX, reason="this CPU (or OS) has no AMX-INT8: the AMX kernel cannot run "
                                                    "here (its layout tests still run)")


@pytest.fixture(autouse=True, scope="module")
def _threaded_paths():
    with serial_thresholds(macs=0, quant_values=0):
        yield


# --------------------------------------------------------------------------------------------------------------
# the layout (every machine)
# --------------------------------------------------------------------------------------------------------------
def test_amx_layout_is_registered():
    assert AmxWeightLayout in all_specs()


@given(AmxWeightLayout.hypothesis_case())
def test_amx_layout_round_trips(case):
    spec, q = case
    assert_layout_roundtrip(spec, q)
    packed = spec.pack_array(q)
    assert packed.nbytes == spec.nbytes and spec.block_bytes % 64 == 0
    # K tails (positions Lb .. KP-1 of every block) are 0 for both widths: they must add nothing on AMX
    rows = packed.reshape(spec.groups, spec.oc_tiles, spec.n_blocks, 2, -1, 16, 4)
    flat = rows.transpose(0, 1, 2, 3, 5, 4, 6).reshape(spec.groups, spec.oc_tiles, spec.n_blocks, 32, -1)
    assert (flat[..., spec.block_values:] == 0).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_amx_layout_explicit_positions(bits):
    """Every weight sits at the byte the docstring formula names; everything else is padding (q = 0: byte 0 for
    int8, 8 for int4 inside Lb; byte 0 in the K tail)."""
    O, ipg, nb, kh, kw, G = 40, 6, 2, 2, 2, 2          # Og = 20, BC = 3 -> ICL 4, Lb = 16, KP = 64
    spec = AmxWeightLayout(O, ipg, kh * kw, nb, bits, G)
    assert (spec.block_icl, spec.block_values, spec.block_bytes, spec.oc_tiles) == (4, 16, 64, 1)
    rng = np.random.default_rng(0)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q = rng.integers(lo, hi + 1, (O, ipg, kh, kw)).astype(np.int8)
    flat = spec.pack_array(q).reshape(-1).view(np.uint8 if bits == 4 else np.int8).astype(np.int64)
    o, c, t = np.meshgrid(np.arange(O), np.arange(ipg), np.arange(kh * kw), indexing="ij")
    pos = spec.byte_offset(o, c, t)
    # hand-computed: o = 17 (group 0, half 1, lane 1), c = 4 (block 1, channel 1), tap 2: l = 2*4 + 1 = 9
    # -> block 1 * 32*64 + half 1 * 16*64 + row 9//4 = 2 -> 2*64 + lane 1*4 + 9%4 = 1
    assert spec.byte_offset(17, 4, 2) == 2048 + 1024 + 128 + 4 + 1
    assert len(np.unique(pos)) == pos.size
    off = 8 if bits == 4 else 0
    np.testing.assert_array_equal(flat[pos], q.reshape(O, ipg, -1).astype(np.int64) + off)
    rest = np.ones(flat.size, bool)
    rest[pos.reshape(-1)] = False
    r = np.arange(flat.size) % 64 % 4 + (np.arange(flat.size) // 64) % 16 * 4   # l inside the block (KP = 64)
    inside = r < spec.block_values
    assert (flat[rest & inside] == off).all() and (flat[rest & ~inside] == 0).all()


def test_amx_layout_same_reduction_order_as_tiled():
    """The AMX tiles and the engine's tiled layout hold each (channel, l) at the same reduction index l."""
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, (33, 10, 3, 3)).astype(np.int8)
    amx, tiled = AmxWeightLayout(33, 10, 9, 2, 8), TiledWeightLayout(33, 10, 9, 2, 8, order="tile")
    assert amx.block_values == tiled.block_values and amx.block_icl == tiled.block_icl
    a = amx.pack_array(q).transpose(0, 1, 2, 3, 5, 4, 6).reshape(1, 2, 2, 32, -1)[..., :amx.block_values]
    t = tiled.pack_array(q).transpose(0, 1, 2, 4, 3, 5).reshape(1, 2, 2, 32, -1)
    np.testing.assert_array_equal(a, t)


def test_amx_refused_clearly_without_amx(monkeypatch):
    """Runs everywhere: on an AMX machine the CPU's answer is replaced by 'no AMX' (so that no test of this file is
    skipped there: benchmarks/amx_device.sh tests fails on a skip)."""
    if HAVE_AMX:
        real = _cpu.kernel_supported
        monkeypatch.setattr(_cpu, "kernel_supported", lambda name: name != "amx" and real(name))
        monkeypatch.setattr(_cpu, "best_kernel", lambda: "avx512vnni")
    spec = ConvSpec(quantize_weight(np.ones((4, 4, 1, 1), np.float32)))
    with pytest.raises(ValueError, match="AMX"):
        CpuEngine(spec, kernel="amx")
    monkeypatch.setenv("QCONV_CPU_KERNEL", "amx")
    with pytest.raises(ValueError, match="QCONV_CPU_KERNEL.*AMX"):
        CpuEngine(spec)


# --------------------------------------------------------------------------------------------------------------
# the kernel (AMX machines)
# --------------------------------------------------------------------------------------------------------------
def _case(rng, ncols, ntiles, nblocks, taps, bq, bits, unit_scales):
    """A micro-kernel call: A (ncols, nblocks*Lb) stored bytes, q (32*ntiles, nblocks, Lb), tiled + AMX weights."""
    lb = taps * bq * 4
    O = 32 * ntiles
    A = rng.integers(0, 256, (ncols, nblocks * lb)).astype(np.uint8)
    Ai = A.view(np.int8).astype(np.int64) if bits == 4 else A.astype(np.int64)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q = rng.integers(lo, hi + 1, (O, nblocks, lb)).astype(np.int8)
    tl = TiledWeightLayout(O, nblocks * lb, 1, nblocks, bits, order="tile")
    al = AmxWeightLayout(O, nblocks * lb, 1, nblocks, bits)
    w = tl.pack_array(q.reshape(O, -1)).reshape(-1).view(np.uint8)
    wa = al.pack_array(q.reshape(O, -1)).reshape(-1).view(np.uint8)
    zpu = int(rng.integers(-128, 128)) if bits == 4 else int(rng.integers(0, 256))
    u = Ai.reshape(ncols, nblocks, lb) - zpu
    S = u.sum(-1).astype(np.int32)
    ws = q.astype(np.int64).sum(-1).T                        # (nblocks, O)
    wsx = np.ascontiguousarray(ws + (8 * lb if bits == 4 else 0), dtype=np.int32)
    if unit_scales:
        scale, off = np.ones((nblocks, O), np.float32), None
        dx, bias = np.ones(ncols, np.float32), np.zeros(O, np.float32)
    else:
        scale = rng.uniform(0.001, 0.1, (nblocks, O)).astype(np.float32)
        off = rng.uniform(-0.5, 0.5, (nblocks, O)).astype(np.float32) if rng.integers(0, 2) else None
        dx = rng.uniform(0.01, 0.1, ncols).astype(np.float32)
        bias = rng.standard_normal(O).astype(np.float32)
    I = np.einsum("ekl,okl->eko", u, q.astype(np.int64))    # exact integer parts (ncols, nblocks, O)
    return dict(A=A, w=w, wa=wa, tl=tl, al=al, S=S, wsx=wsx, scale=scale, off=off, dx=dx, bias=bias, zpu=zpu, I=I)


def _call(c, kernel, nblocks, taps, bq, bits, ntiles, amx_min=1, wa=None):
    return _cpu_testing._test_gemm(c["A"], c["w"], c["tl"].block_stride, c["S"], c["wsx"], c["scale"], c["off"], c["dx"],
                           c["bias"], nblocks, taps, bq, bits, c["zpu"], -np.inf, np.inf, kernel, ntiles=ntiles,
                           w_tstride=c["tl"].oc_tile_stride, wa=c["wa"] if wa is None else wa,
                           wa_bstride=c["al"].block_stride, wa_tstride=c["al"].oc_tile_stride,
                           kp=c["al"].block_bytes, amx_min=amx_min)


@needs_amx
@given(ncols=st.integers(1, 70), ntiles=st.integers(1, 3), nblocks=st.integers(1, 3), taps=st.integers(1, 4),
       bq=st.sampled_from([1, 2, 3, 8, 15, 16, 17, 40]), bits=st.sampled_from([8, 4]), seed=st.integers(0, 2**31))
def test_amx_gemm_integer_parts_exact(ncols, ntiles, nblocks, taps, bq, bits, seed):
    """Unit scales, no offsets, dx = 1, bias 0: the output is the float of the exact integer sum of every block
    (|I| < 2**24 keeps it exact), compared with numpy's int64 einsum."""
    rng = np.random.default_rng(seed)
    c = _case(rng, ncols, ntiles, nblocks, taps, bq, bits, unit_scales=True)
    out = _call(c, "amx", nblocks, taps, bq, bits, ntiles)
    ref = c["I"].sum(1)
    if np.abs(c["I"]).sum(1).max() < 2**24:        # every partial float sum over the blocks is then exact
        np.testing.assert_array_equal(out, ref.astype(np.float32))
    np.testing.assert_array_equal(out, _call(c, "avx512vnni", nblocks, taps, bq, bits, ntiles))


@needs_amx
@given(ncols=st.integers(1, 70), ntiles=st.integers(1, 3), nblocks=st.integers(1, 4), taps=st.integers(1, 3),
       bq=st.sampled_from([1, 3, 8, 16, 17, 33]), bits=st.sampled_from([8, 4]), seed=st.integers(0, 2**31))
def test_amx_gemm_bitwise_vnni(ncols, ntiles, nblocks, taps, bq, bits, seed):
    """Random scales, offsets, dx and bias: bitwise the VNNI kernel's floats."""
    rng = np.random.default_rng(seed)
    c = _case(rng, ncols, ntiles, nblocks, taps, bq, bits, unit_scales=False)
    np.testing.assert_array_equal(_call(c, "amx", nblocks, taps, bq, bits, ntiles),
                                  _call(c, "avx512vnni", nblocks, taps, bq, bits, ntiles))


@needs_amx
@pytest.mark.parametrize("bits", [8, 4])
def test_amx_reads_the_amx_tiles(bits):
    """AMX tiles of other weights than the tiled ones: calls of >= amx_min columns follow the AMX tiles (so the
    AMX path really ran), smaller calls the tiled ones (the VNNI kernel)."""
    rng = np.random.default_rng(7)
    c1 = _case(rng, 20, 2, 2, 3, 5, bits, unit_scales=True)
    c2 = dict(c1)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q2 = rng.integers(lo, hi + 1, (64, 2 * 60)).astype(np.int8)
    c2["wa"] = c1["al"].pack_array(q2).reshape(-1).view(np.uint8)
    c2["w"] = c1["tl"].pack_array(q2).reshape(-1).view(np.uint8)
    c2["wsx"] = np.ascontiguousarray(q2.reshape(64, 2, 60).astype(np.int64).sum(-1).T
                                     + (8 * 60 if bits == 4 else 0), dtype=np.int32)
    c1w = dict(c1, wsx=c2["wsx"])
    want = _call(c2, "avx512vnni", 2, 3, 5, bits, 2)
    assert not np.array_equal(want, _call(c1w, "avx512vnni", 2, 3, 5, bits, 2))
    np.testing.assert_array_equal(_call(c1w, "amx", 2, 3, 5, bits, 2, amx_min=20, wa=c2["wa"]), want)
    np.testing.assert_array_equal(_call(c1w, "amx", 2, 3, 5, bits, 2, amx_min=21, wa=c2["wa"]),
                                  _call(c1w, "avx512vnni", 2, 3, 5, bits, 2))


# --------------------------------------------------------------------------------------------------------------
# whole engines (AMX machines)
# --------------------------------------------------------------------------------------------------------------
def _pair(spec, tile_cols, threads, amx_min=1, direct_int8=False, **kw):
    # depthwise=False: depthwise geometries take the GEMM path too (else the depthwise path runs, never AMX);
    # direct_int8=False: the tiled GEMM on AMX tiles (the direct int8 conv has its own tests below)
    kw = dict(kw, depthwise=False)
    amx = CpuEngine(spec, kernel="amx", threads=threads, tile_cols=tile_cols, direct_int8=direct_int8, **kw)
    amx.amx_min_cols = amx_min
    amx.amx_min_block_values = 0          # AMX for every block length (the default leaves short blocks to VNNI)
    vnni = CpuEngine(spec, kernel="avx512vnni", threads=threads, **kw)
    return amx, vnni


def engine_cases():
    return qst.conv_problems(max_channels=40)


@needs_amx
@given(case=engine_cases(), aq=st.sampled_from(["tensor", "row", "block"]), tile_cols=st.sampled_from([32, 16, 5, 40]),
       threads=st.sampled_from([1, 2]), layout=st.sampled_from(["nchw", "nc4hw4"]))
def test_engine_amx_bitwise_vnni_and_oracle(case, aq, tile_cols, threads, layout):
    geo, weight, x, bias, act = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act, aq)
    amx, vnni = _pair(spec, tile_cols, threads)
    assert "amx" in amx.describe()
    if layout == "nc4hw4":
        from qconv.layouts.nc4hw4 import NC4HW4
        xp = NC4HW4(4).pack_array(x)
        y = amx.forward(xp, "nc4hw4")
        np.testing.assert_array_equal(y, vnni.forward(xp, "nc4hw4"))
        y = NC4HW4(4).unpack_array(y, geo.o)
    else:
        y = amx.forward(x)
        np.testing.assert_array_equal(y, vnni.forward(x))
    assert amx._plan.amx_bound
    assert_matches_reference(y, x, weight, bias, geo.stride, geo.padding, geo.dilation, act, aq,
                             act_block=spec.act_block if aq == "block" else 0)


@needs_amx
@given(case=engine_cases(), zp=st.integers(-128, 127), out_int8=st.booleans())
def test_engine_amx_static_int8_bitwise_vnni(case, zp, out_int8):
    geo, weight, x, bias, act = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act)
    xi = np.random.default_rng(abs(zp)).integers(-128, 128, x.shape).astype(np.int8)
    out = (0.1, -7) if out_int8 else None
    amx, vnni = _pair(spec, 32, 2, input_qparams=(0.05, zp), output_qparams=out)
    np.testing.assert_array_equal(amx.forward(xi), vnni.forward(xi))


# the benchmark's conv cases (batch 1) and a batched linear, the three benchmark schemes, default amx_min_cols
BENCH = [((64, 64, 3), 56, 1), ((128, 128, 3), 28, 1), ((256, 256, 3), 14, 1), ((128, 128, 3), 56, 2),
         ((256, 1024, 1), 14, 1)]
SCHEMES = [dict(bits=8), dict(bits=4, block_size=32, symmetric=False), dict(bits=4)]


@needs_amx
@pytest.mark.parametrize("shape", BENCH)
@pytest.mark.parametrize("scheme", SCHEMES, ids=["int8pc", "int4b32asym", "int4pc"])
@pytest.mark.parametrize("aq", ["tensor", "row", "block"])
@pytest.mark.parametrize("direct_int8", [None, False])
def test_engine_amx_benchmark_shapes(shape, scheme, aq, direct_int8):
    (c, o, k), hw, stride = shape
    rng = np.random.default_rng(c + o + k)
    w = quantize_weight((rng.standard_normal((o, c, k, k)) * 0.1).astype(np.float32), **scheme)
    spec = ConvSpec(w, rng.standard_normal(o).astype(np.float32), stride, k // 2, act_quant=aq)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    amx, vnni = _pair(spec, None, 2, amx_min=4, direct_int8=direct_int8)
    y = amx.forward(x)
    np.testing.assert_array_equal(y, vnni.forward(x))
    direct = direct_int8 is None and aq == "tensor" and (w.n_blocks == 1 or w.block_channels % 4 == 0)
    assert (amx.last_call["split"] == "direct-int8") == direct
    assert direct or amx._plan.amx_bound
    assert_matches_reference(y, x, w, spec.bias, stride, k // 2, 1, None, aq,
                             act_block=spec.act_block if aq == "block" else 0)


@needs_amx
@pytest.mark.parametrize("scheme", SCHEMES, ids=["int8pc", "int4b32asym", "int4pc"])
@pytest.mark.parametrize("batch", [1, 3, 8, 33])
def test_engine_amx_batched_linear(scheme, batch):
    rng = np.random.default_rng(batch)
    w = quantize_weight((rng.standard_normal((96, 1000)) * 0.1).astype(np.float32), **{**scheme, **(
        {"block_size": 40} if scheme.get("block_size") else {})})      # blocks of 40: Lb = 40, not a 64 multiple
    spec = ConvSpec(w, None, act_quant="row")
    x = rng.standard_normal((batch, 1000, 1, 1)).astype(np.float32)
    amx, vnni = _pair(spec, None, 2, amx_min=4)
    y = amx.forward(x)
    np.testing.assert_array_equal(y, vnni.forward(x))
    assert amx._plan.amx_bound == (batch >= 4)
    assert_matches_reference(y, x, w, None, act_quant="row")


@needs_amx
def test_amx_short_blocks_stay_on_vnni():
    """Default thresholds: blocks of fewer than 64 reduction values never pack AMX tiles; 3x3 block-32 does."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 256, 1, 1)).astype(np.float32)
    # direct_int8=False: the tiled GEMM's thresholds (the direct int8 conv takes such convs otherwise)
    short = CpuEngine(ConvSpec(quantize_weight(rng.standard_normal((64, 256)).astype(np.float32), 4, 32, False)),
                      kernel="amx", direct_int8=False)
    short.forward(x)
    assert not short._plan.amx_bound
    w3 = quantize_weight(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), 4, 32, False)
    conv = CpuEngine(ConvSpec(w3, None, 1, 1), kernel="amx", direct_int8=False)
    conv.forward(rng.standard_normal((1, 64, 6, 6)).astype(np.float32))
    assert conv._plan.amx_bound


@needs_amx
def test_amx_default_and_env(monkeypatch):
    spec = ConvSpec(quantize_weight(np.ones((4, 4, 1, 1), np.float32)))
    assert _cpu.best_kernel() == "amx"
    assert CpuEngine(spec).kernel == "amx"
    monkeypatch.setenv("QCONV_CPU_KERNEL", "avx512vnni")
    assert CpuEngine(spec).kernel == "avx512vnni"
    monkeypatch.setenv("QCONV_CPU_KERNEL", "amx")
    eng = CpuEngine(spec)
    assert eng.kernel == "amx" and eng.describe().startswith("cpu (amx,") and eng.tile_cols == 32


@needs_amx
@settings(max_examples=10)
@given(case=engine_cases())
def test_engine_amx_threads_bitwise(case):
    """Both AMX paths (the direct conv where the layer allows it) give the same bits on 1 and 2 threads."""
    geo, weight, x, bias, act = case
    spec = ConvSpec(weight, bias, geo.stride, geo.padding, geo.dilation, act)
    a1 = CpuEngine(spec, kernel="amx", threads=1, depthwise=False)
    a2 = CpuEngine(spec, kernel="amx", threads=2, depthwise=False)
    a1.amx_min_cols = a2.amx_min_cols = 1
    a1.amx_min_block_values = a2.amx_min_block_values = 0
    np.testing.assert_array_equal(a1.forward(x), a2.forward(x))
