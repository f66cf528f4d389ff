"""Argument checks shared by every public entry point.

Each check raises ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind, wrong value) with a
message naming the argument and the offending value, before any native code runs.
"""
from __future__ import annotations

import functools
import os

import numpy as np

# activation -> the code the OpenCL kernels' ACT build option and the CPU epilogues use. hardswish is
# (v * min(max(v + 3, 0), 6)) / 6 in float32 op by op, PyTorch's x * relu6(x + 3) / 6; silu is v / (1 + exp(-v))
# (x * sigmoid(x), YOLO's SiLU / Swish), float32, exp within 2 ulp (numpy's in the oracle).
ACTIVATION_CODES = {None: 0, "relu": 1, "relu6": 2, "hardswish": 3, "silu": 4}
ACTIVATIONS = tuple(ACTIVATION_CODES)
#: The activations the CPU epilogues apply after their clamp (relu and relu6 are the clamp).
TAIL_ACTIVATIONS = ("hardswish", "silu")


def tail_code(activation) -> int:
    """The CPU epilogues' code of the activation after the clamp: its :data:`ACTIVATION_CODES` entry for
    :data:`TAIL_ACTIVATIONS`, else 0."""
    return ACTIVATION_CODES[activation] if activation in TAIL_ACTIVATIONS else 0


def as_pair(value, name: str, *, minimum: int) -> tuple[int, int]:
    """``int`` or 2-sequence of ints -> ``(a, b)``, each ``>= minimum``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if isinstance(value, (int, np.integer)):
        pair = (int(value), int(value))
    else:
        try:
            items = tuple(value)
        except TypeError:
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
        if len(items) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                      for v in items):
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
        pair = (int(items[0]), int(items[1]))
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if max(pair) > 1 << 20:
        raise ValueError(f"{name} is unreasonably large: {value!r}")
    return pair


def check_choice(value, name: str, choices):
    if not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {list(choices)!r}, got {value!r}")
    return value


def check_bits(bits) -> int:
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"bits must be an int (4 or 8), got {bits!r}")
    if int(bits) not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return int(bits)


def check_int(value, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_float(value, name: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """``value`` as a float: a real, finite number within [minimum, maximum] (TypeError / ValueError naming it)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not np.isfinite(v) or (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        lo = "-inf" if minimum is None else f"{minimum:g}"
        hi = "inf" if maximum is None else f"{maximum:g}"
        raise ValueError(f"{name} must be a finite number in [{lo}, {hi}], got {value!r}")
    return v


def float_array(x, name: str, *, ndim=None, finite: bool = True, empty_ok: bool = False) -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 ndarray (copying only when needed).

    Accepts float16/32/64 arrays (and nested sequences of floats); integer, bool, complex and object
    arrays are refused so that a wrong argument order is not silently accepted. Empty arrays are refused
    unless ``empty_ok``.
    """
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{name} must be a float array, got {type(x).__name__}: {exc}") from None
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must have a floating dtype (float32 preferred), got dtype {x.dtype}")
    if ndim is not None:
        allowed = ndim if isinstance(ndim, tuple) else (ndim,)
        if x.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {x.shape}")
    if x.size == 0 and not empty_ok:
        raise ValueError(f"{name} must not be empty, got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if finite and not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf); qconv refuses them")
    return x


def memory_limit() -> int:
    """Largest single allocation qconv will make, in bytes.

    ``QCONV_MAX_BYTES`` overrides; the default is half of the physical memory (or 8 GiB when unknown).
    """
    env = os.environ.get("QCONV_MAX_BYTES")
    if env:
        try:
            return int(float(env))
        except ValueError:
            raise ValueError(f"QCONV_MAX_BYTES must be a number of bytes, got {env!r}") from None
    return _half_physical_memory()


@functools.lru_cache(maxsize=1)
def _half_physical_memory() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 << 30
    return int(total // 2)


def check_alloc(nbytes: int, what: str) -> None:
    """Raise ``MemoryError`` naming ``what`` when ``nbytes`` exceeds :func:`memory_limit`."""
    limit = memory_limit()
    if nbytes > limit:
        raise MemoryError(f"{what} would need {nbytes / 2**20:.1f} MiB, over qconv's limit of "
                          f"{limit / 2**20:.1f} MiB (set QCONV_MAX_BYTES to change it)")
