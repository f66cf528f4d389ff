"""The contract between the public layers (:mod:`qconv.layer`) and an engine, as a :class:`typing.Protocol`.

Every engine -- :class:`qconv.layer.ReferenceEngine` (the numpy oracle), :class:`qconv.cpu.CpuEngine` and
:class:`qconv.gpu.OpenCLEngine` -- declares each member below; ``tests/test_engines.py`` checks that they do.
A layer picks the engine class by ``device`` (:func:`qconv.layer.engine_class`), builds it once from a
validated :class:`~qconv.geometry.ConvSpec` and reads only these members.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol


class Engine(Protocol):
    """What a layer needs of an engine.

    Class attributes:

    * ``name``: the device family (``"reference"``, ``"cpu"``, ``"opencl"``);
    * ``supported_act_quant``: the activation modes the engine runs (``"tensor"``, ``"row"``, ``"block"``,
      ``None`` = float activations);
    * ``default_act_quant`` / ``default_linear_act_quant``: what ``act_quant="auto"`` means for a
      :class:`~qconv.Conv2d` / a :class:`~qconv.Linear`;
    * ``native_layouts``: the layouts :meth:`forward` takes; the layer converts NC4HW4 <-> NCHW for the others;
    * ``rejects_nonfinite``: True when :meth:`forward` itself raises ``ValueError`` on NaN/inf input (the layer
      then skips its own pass over numpy inputs);
    * ``supports_device_arrays``: True when the engine has :meth:`forward_array` (``pyopencl.array.Array`` in
      and out; see :class:`DeviceArrayEngine`).

    Instance attributes: ``int8_input`` (True for the CPU's static path: ``x`` is int8) and ``output_qparams``
    (``(scale, zero_point)`` when the output is int8, else None).
    """

    name: str
    supported_act_quant: tuple
    default_act_quant: Optional[str]
    default_linear_act_quant: Optional[str]
    native_layouts: tuple
    rejects_nonfinite: bool
    supports_device_arrays: bool
    int8_input: bool
    output_qparams: Optional[tuple]

    def forward(self, x: Any, layout: str = "nchw") -> Any:
        """float32 (int8 with ``int8_input``) NCHW ``(N, C, H, W)`` or NC4HW4 ``(ceil(C/4), N, H, W, 4)``
        ``x`` (a layout of ``native_layouts``) -> the output in the same layout, float32 (int8 with
        ``output_qparams``)."""
        ...

    def describe(self) -> str:
        """One line naming the engine, its kernel and what it chose (tiles, variant)."""
        ...


class DeviceArrayEngine(Engine, Protocol):
    """An engine with ``supports_device_arrays = True``: device arrays go straight to :meth:`forward_array`."""

    def forward_array(self, x: Any, layout: str = "nchw", out: Any = None, linear: bool = False) -> Any:
        """``pyopencl.array.Array`` ``x`` -> device output (written into ``out`` when given); ``linear``:
        ``x`` is ``(N, K)`` and so is the result ``(N, O)``."""
        ...
