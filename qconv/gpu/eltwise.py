"""Elementwise launches of :mod:`qconv.pipeline` (``kernels/eltwise.cl``): the residual add.

:func:`add_plan` gives a :class:`~qconv.gpu.launch.LaunchPlan` of ``add_act`` for ``n`` float32 elements:
``plan.enqueue(queue, r, y)`` computes ``y = activation(y + r)`` in place (``X`` = the residual ``r``, ``Y`` = the
sum's target ``y``; both whole buffers of at least ``4 * n`` bytes, not overlapping). ``activation``: None,
``"relu"`` or ``"relu6"`` (as the layers'). One float32 rounding: bitwise numpy's ``y + r`` then the activation.
"""
from __future__ import annotations

import numpy as np

from .launch import X, Y, LaunchPlan, Step

ACTIVATIONS = {None: 0, "relu": 1, "relu6": 2}
LOCAL = 64


def add_steps(n: int, activation=None) -> list:
    """The :class:`~qconv.gpu.launch.Step` list of the in-place residual add of ``n`` float32 elements."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None, 'relu' or 'relu6', got {activation!r}")
    n = int(n)
    if not 0 < n < 2**31 - 4:
        raise ValueError(f"the add takes 1 to 2**31 - 5 elements, got {n}")
    items = -(-n // 4)
    gsize = -(-items // LOCAL) * LOCAL
    return [Step("eltwise", (f"-DACT={ACTIVATIONS[activation]}",), "add_act", (Y, X, np.int32(n)), (gsize,),
                 (LOCAL,))]


def add_plan(ctx, n: int, activation=None) -> LaunchPlan:
    """A prepared in-place residual add (see the module docstring)."""
    return LaunchPlan(ctx, add_steps(n, activation), f"add {n}" + (f" + {activation}" if activation else ""))
