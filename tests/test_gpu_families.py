"""The kernel families' one "can it run this layer, and if not why" check (qconv/gpu/families/*.py,
``unsupported(layer, problem=None, variant=None) -> str | None``): for every family a layer it refuses (the
reason asserted) and one it accepts; forcing a variant of a family that cannot run a layer raises ValueError
carrying that same reason; no family refuses a layer because its scales are float32 values that float16
cannot hold."""
import types

import numpy as np
import pytest

import qconv
from qconv import gpu
from qconv.geometry import ConvSpec
from qconv.gpu import families
from qconv.gpu.families import (Problem, act_quant, conv_1x1, conv_gemm, conv_general, conv_mma, gemv_1x1, gemv_a8,
                                gemv_mma)
from qconv.layouts.opencl import OpenCLScaleLayout

from test_gpu_engine import cl_device  # noqa: F401


def _weight(o, i, k=1, bits=8, block=0, sym=True, groups=1, scale_dtype="auto", seed=0):
    w = np.random.default_rng(seed).standard_normal((o, i // groups, k, k)).astype(np.float32)
    return qconv.quantize_weight(w, bits=bits, block_size=block, symmetric=sym, groups=groups,
                                 scale_dtype=scale_dtype)


def _engine(device, w, k=1, act_quant=None, stride=1, **opts):
    spec = ConvSpec(w, None, stride, k // 2, 1, None, act_quant)
    return gpu.OpenCLEngine(spec, device=device, tune="none", **opts)


def _problem(n=1, h=1, w=1, k=1, stride=1):
    oh, ow = (h + 2 * (k // 2) - k) // stride + 1, (w + 2 * (k // 2) - k) // stride + 1
    return Problem("nchw", n, h, w, oh, ow)


PAST_LOCAL = "input channels whose f16 halves of x overflow the device's local memory"  # see _channels

# (family, forced variant, weight args, engine args, problem args, the reason's words); the problem is None
# when the refusal holds for every input shape (then the engine refuses the forced variant when it is built)
REFUSALS = [
    (conv_general, "c4h1w1", dict(o=8, i=16), {}, None, "1x1 layout"),
    (conv_1x1, "buf_c4_r1", dict(o=8, i=16, k=3), dict(k=3), None, "1x1 convs with stride 1"),
    (conv_1x1, "buf_c4_r1", dict(o=8, i=16), dict(stride=2), None, "1x1 convs with stride 1"),
    (gemv_1x1, "gemv_u4", dict(o=8, i=64), {}, dict(n=2), "one row"),
    (gemv_1x1, "gemv_u4", dict(o=4, i=12, block=6, sym=False), {}, None, "multiple of 4 input channels, got 6"),
    (gemv_1x1, "gemv_u4", dict(o=8, i=16, k=3), dict(k=3), None, "linear layers"),
    (conv_gemm, "gemm_64x64", dict(o=4, i=4, k=3, groups=2), dict(k=3), None, "ungrouped"),
    (conv_gemm, "gemm_64x64", dict(o=8, i=16, k=3), dict(k=3, ic_pack=1), None, "ic_pack=4, got ic_pack=1"),
    (conv_gemm, "gemm_128x32k2", dict(o=16, i=8), dict(stride=2), None, "do not fit"),
    (gemv_a8, "gemv_a8_c1", dict(o=8, i=64), {}, None, "act_quant='row'"),
    (gemv_a8, "gemv_a8_c1", dict(o=8, i=16, k=3), dict(k=3, act_quant="row"), None, "linear / 1x1 layer"),
    (gemv_a8, "gemv_a8_c1", dict(o=4, i=48, bits=4, block=4, sym=False), dict(act_quant="row"), None,
     "multiple or a divisor of 32 input channels"),
    (gemv_a8, "gemv_a8_c2", dict(o=8, i=64), dict(act_quant="row"), dict(n=2), "one row"),
    (gemv_a8, "gemv_a8f_c1", dict(o=8, i=64), dict(act_quant="row", local_size=(3, 2, 1)), dict(),
     "l0 * SPLIT a power of two"),
    (gemv_mma, "gemv_mma", dict(o=8, i=96), dict(act_quant="row"), None, "float activations"),
    (gemv_mma, "gemv_mma", dict(o=8, i=96, k=3), dict(k=3), None, "linear / 1x1 layer"),
    (gemv_mma, "gemv_mma", dict(o=4, i=96, bits=4, block=48, sym=False), {}, None, "scale blocks must be 16"),
    (gemv_mma, "gemv_mma", dict(o=1, i=PAST_LOCAL, bits=4), {}, None, "bytes of local memory for {i} input"),
    (gemv_mma, "gemv_mma", dict(o=8, i=96), {}, dict(n=1, h=2), "one row"),
    (conv_mma, "mma_64x32", dict(o=8, i=32, k=3), dict(k=3), None, "act_quant='row'"),
    (conv_mma, "mma_64x32", dict(o=4, i=8, k=3, groups=2), dict(k=3, act_quant="row"), None, "ungrouped"),
    (conv_mma, "mma_64x32", dict(o=4, i=32, bits=4, block=16, sym=False), dict(act_quant="row"), None,
     "multiple of 32 input channels, got 16"),
]

ACCEPTS = [  # (family, weight args, engine args, problem args)
    (conv_general, dict(o=8, i=16, k=3), dict(k=3), dict(n=2, h=5, w=5)),
    (conv_general, dict(o=6, i=6, k=3, groups=6), dict(k=3), dict(h=5, w=5)),
    (conv_1x1, dict(o=8, i=16), {}, dict(n=3, h=2, w=2)),
    (gemv_1x1, dict(o=8, i=64, block=32), {}, dict()),
    (conv_gemm, dict(o=8, i=16, k=3), dict(k=3), dict(n=2, h=8, w=8)),
    (conv_gemm, dict(o=8, i=64), {}, dict(n=16)),
    (gemv_a8, dict(o=8, i=64, bits=4, block=32, sym=False), dict(act_quant="row"), dict()),
    (gemv_mma, dict(o=8, i=96, bits=8, block=32), {}, dict()),
    (conv_mma, dict(o=8, i=64, k=3, block=32), dict(k=3, act_quant="row"), dict(n=2, h=4, w=4)),
    (act_quant, dict(o=8, i=16, k=3), dict(k=3, act_quant="row"), dict(h=4, w=4)),
]


def _case_id(case):
    return f"{case[0].__name__.rsplit('.', 1)[1]}-{case[-1][:24]}"


def _channels(device, wargs: dict) -> dict:
    """``wargs`` with PAST_LOCAL replaced: int4 input channels whose x halves (4 bytes a channel in gemv_mma)
    need more than the device's local memory (1 MiB under PoCL on some CPUs, 48 KiB on NVIDIA GPUs)."""
    if wargs.get("i") is not PAST_LOCAL:
        return wargs
    _, dev = gpu.resolve(device)
    return dict(wargs, i=(int(dev.local_mem_size) // 4 // 64 + 1) * 64)


@pytest.mark.parametrize("case", REFUSALS, ids=_case_id)
def test_unsupported_gives_the_reason(cl_device, case):
    family, variant, wargs, eargs, pargs, words = case
    wargs = _channels(cl_device, wargs)
    words = words.format(**wargs)
    eargs = dict(eargs)
    k, stride = eargs.pop("k", 1), eargs.get("stride", 1)
    opts = {key: v for key, v in eargs.items() if key not in ("stride", "act_quant")}
    w = _weight(**wargs)
    eng = _engine(cl_device, w, k, eargs.get("act_quant"), stride, **{o: v for o, v in opts.items()
                                                                       if o != "local_size"})
    problem = None if pargs is None else _problem(k=k, stride=stride, **pargs)
    forced_lws = opts.get("local_size")
    if forced_lws is not None:  # the check reads the layer's forced local size
        eng.forced_lws = tuple(forced_lws)
    why = family.unsupported(eng, problem, variant)
    assert why is not None and words in why, why
    # forcing a variant of the family: refused with the same reason, when built or at the first call
    with pytest.raises(ValueError) as err:
        forced = _engine(cl_device, w, k, eargs.get("act_quant"), stride, variant=variant, **opts)
        shape = (problem.n, w.in_channels, problem.h, problem.w)
        forced.forward(np.zeros(shape, np.float32))
    assert f"variant {variant!r} cannot run this layer: {why}" in str(err.value)


@pytest.mark.parametrize("case", ACCEPTS, ids=lambda c: c[0].__name__.rsplit(".", 1)[1])
def test_supported_layers_get_candidates(cl_device, case):
    family, wargs, eargs, pargs = case
    eargs = dict(eargs)
    k = eargs.pop("k", 1)
    eng = _engine(cl_device, _weight(**wargs), k, **eargs)
    problem = _problem(k=k, **pargs)
    assert family.unsupported(eng) is None
    assert family.unsupported(eng, problem) is None
    if family is act_quant:
        return
    for variant in family.variants:
        if family.unsupported(eng, problem, variant) is None:  # forced, it plans that variant
            eng.forced_variant = variant
            [cand] = family.candidates(eng, problem)
            assert cand.variant == variant and cand.program == family.program
            break
    else:
        pytest.fail(f"no variant of {family.__name__} runs {wargs}")


def test_1x1_variants_read_their_weights_store(cl_device):
    """buf_* variants read buffer weights, img_* ones Image2D weights; a forced img_* variant falls back to its
    buf_* twin when the weights stay in a buffer (image=None/True: no image support or too large)."""
    buf = _engine(cl_device, _weight(8, 64), image=False)
    assert conv_1x1.unsupported(buf, None, "buf_c4_r1") is None
    assert "Image2D weights" in conv_1x1.unsupported(buf, None, "img_c1_r1")
    img = _engine(cl_device, _weight(8, 64), image=True)
    if img.image:
        assert conv_1x1.unsupported(img, None, "img_c1_r1") is None
        assert "pass image=False" in conv_1x1.unsupported(img, None, "buf_c4_r1")
    assert _engine(cl_device, _weight(8, 64), image=True, image_limits=(1, 1),
                   variant="img_c2_r1").forced_variant == "buf_c2_r1"


def test_act_quant_needs_exact_division(cl_device):
    eng = _engine(cl_device, _weight(8, 16), act_quant="row")
    assert act_quant.unsupported(eng) is None
    layer = types.SimpleNamespace(act_row=True, exact_division=False, device=eng.device)
    assert "correctly rounded float32 division" in act_quant.unsupported(layer)
    assert "act_quant='row'" in act_quant.unsupported(_engine(cl_device, _weight(8, 16)))


def test_variant_names_and_families(cl_device):
    """Every variant belongs to one family; an unknown name lists them all."""
    names = [v for f in families.KERNEL_FAMILIES for v in f.variants]
    assert len(names) == len(set(names)) == len(families.all_variants())
    assert families.family_of("gemv_a8f_c2") is gemv_a8 and families.family_of("nope") is None
    with pytest.raises(ValueError, match="does not exist; choose from .*gemv_mma"):
        _engine(cl_device, _weight(8, 16), variant="nope")


@pytest.mark.parametrize("act", [None, "row"])
@pytest.mark.parametrize("shape", [(24, 64, 1, 0), (24, 64, 3, 32), (16, 64, 1, 32)])
def test_no_family_refuses_float32_scales(cl_device, act, shape):
    """Scales that float16 cannot hold are stored as float32 and read by every kernel: each family's verdict on
    such a layer is the one it gives the same layer with fp16-exact scales."""
    o, i, k, block = shape
    w32 = _weight(o, i, k, 4, block, False, scale_dtype="float32", seed=3)
    assert not OpenCLScaleLayout.lossless(w32.scales)
    w16 = qconv.QuantizedWeight(w32.q, w32.scales.astype(np.float16).astype(np.float32),
                                w32.offsets.astype(np.float16).astype(np.float32), 4, block)
    e32, e16 = _engine(cl_device, w32, k, act), _engine(cl_device, w16, k, act)
    assert (e32.scale_layout.dtype, e16.scale_layout.dtype) == ("float32", "float16")
    problem = _problem(h=4 if k > 1 else 1, w=4 if k > 1 else 1, k=k)
    for family in (*families.KERNEL_FAMILIES, act_quant):
        for p in (None, problem):
            assert family.unsupported(e32, p) == family.unsupported(e16, p), family.__name__
