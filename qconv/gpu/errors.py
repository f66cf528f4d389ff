"""Exceptions of the OpenCL engine (all subclasses of ``RuntimeError``)."""
from __future__ import annotations


class OpenCLUnavailableError(RuntimeError):
    """pyopencl is missing, or no OpenCL platform/device is visible, or the one asked for is not there."""


class OpenCLBuildError(RuntimeError):
    """A kernel program failed to build. ``.log`` holds the compiler's build log, ``.options`` the -D options."""

    def __init__(self, program: str, options, log: str):
        self.program, self.options, self.log = program, tuple(options), log
        super().__init__(f"OpenCL build of {program!r} failed with options {' '.join(self.options)}:\n{log}")


class OpenCLError(RuntimeError):
    """An OpenCL call failed; ``.code`` is the status code and ``.name`` its OpenCL name (e.g. ``OUT_OF_RESOURCES``)."""

    def __init__(self, what: str, code: int | None = None, name: str | None = None):
        self.code, self.name = code, name
        super().__init__(what if name is None else f"{what}: {name}")


def wrap_cl_error(exc, what: str) -> OpenCLError:
    """Turn a ``pyopencl.Error`` into :class:`OpenCLError` naming the OpenCL status (call with ``raise ... from exc``)."""
    code = getattr(exc, "code", None)
    name = None
    try:
        import pyopencl as cl
        name = cl.status_code.to_string(code) if isinstance(code, int) else None
    except Exception:  # unknown code value
        name = None
    detail = getattr(exc, "what", None) or str(exc)
    return OpenCLError(f"{what} ({detail})", code, name or str(code))
