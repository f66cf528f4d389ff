"""Every engine declares every member of the engine contract (:mod:`qconv.engines`), with sane values."""
import numpy as np
import qconv
from qconv.engines import DeviceArrayEngine, Engine

MEMBERS = sorted(set(Engine.__annotations__) | {"forward", "describe"})


def _layer(device):
    rng = np.random.default_rng(0)
    w = qconv.quantize_weight(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    return qconv.Conv2d(w, padding=1, device=device)


def _check_contract(device):
    engine = _layer(device).engine
    missing = [m for m in MEMBERS if not hasattr(engine, m)]
    assert not missing, f"{type(engine).__name__} lacks {missing} of qconv.engines.Engine"
    cls = type(engine)
    for m in ("name", "supported_act_quant", "default_act_quant", "default_linear_act_quant", "native_layouts",
              "rejects_nonfinite", "supports_device_arrays"):
        assert any(m in vars(b) for b in cls.__mro__[:-1]), f"{cls.__name__}.{m} is not a class attribute"
    assert cls.default_act_quant in cls.supported_act_quant
    assert cls.default_linear_act_quant in cls.supported_act_quant
    assert set(cls.native_layouts) <= {"nchw", "nc4hw4"} and "nchw" in cls.native_layouts
    if cls.supports_device_arrays:
        assert callable(getattr(engine, "forward_array", None)), f"{cls.__name__} lacks {DeviceArrayEngine.__name__}.forward_array"
    assert isinstance(engine.describe(), str) and engine.describe()
    assert engine.int8_input is False and engine.output_qparams is None


def test_every_engine_declares_the_contract(qconv_device):
    _check_contract(qconv_device)


def test_the_reference_engine_declares_the_contract():
    _check_contract("reference")


def test_the_static_path_declares_its_int8_ends():
    rng = np.random.default_rng(1)
    w = qconv.quantize_weight(rng.standard_normal((8, 4, 1, 1)).astype(np.float32))
    e = qconv.Conv2d(w, input_qparams=(0.05, 3), output_qparams=(0.1, -2)).engine
    assert e.int8_input is True and e.output_qparams is not None
