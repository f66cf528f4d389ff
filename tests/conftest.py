"""qconv's own test session: no OpenCL auto-tuning (it never changes results, only speed; the tuning
tests turn it on themselves) and a private tuning cache, so tests neither spend seconds tuning each new
shape nor write to the user's cache.

Under ``CI`` (set and not ``0``/``false``/``no``) the session fails at its start when no OpenCL device is
visible: about a third of the suite needs one, and a CI run where those tests all skip would pass while
testing nothing of qconv.gpu (the README's test command installs PoCL). Outside CI those tests skip with
the reason, for users without an OpenCL driver or root. ``QCONV_REQUIRE_OPENCL=0`` turns the check off
(the sanitizer job, which runs only the CPU engine), ``=1`` turns it on outside CI; a ``--qconv-device``
that is not OpenCL also turns it off."""
import os
import tempfile

import pytest


def _truthy(value) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def opencl_required(config=None) -> bool:
    """Whether this session must see an OpenCL device (CI, unless turned off; see the module docstring)."""
    flag = os.environ.get("QCONV_REQUIRE_OPENCL")
    if flag is not None and flag.strip() != "":
        return _truthy(flag)
    if config is not None:
        try:
            wanted = config.getoption("--qconv-device")
        except ValueError:  # the qconv plugin is not loaded
            wanted = None
        if wanted and not str(wanted).startswith("opencl"):
            return False
    return _truthy(os.environ.get("CI"))


def opencl_missing_reason():
    """Why no OpenCL device is visible ("" when one is)."""
    try:
        import pyopencl as cl
    except ImportError as exc:
        return f"pyopencl does not import ({exc})"
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        return f"no OpenCL platform (ICD loader: {exc}; OCL_ICD_VENDORS={os.environ.get('OCL_ICD_VENDORS')!r})"
    found = []
    for p in platforms:
        try:
            found += p.get_devices()
        except cl.Error:
            pass
    if not found:
        return f"OpenCL platforms {[p.name for p in platforms]} have no device"
    return ""


def pytest_configure(config):
    os.environ.setdefault("QCONV_TUNE", "none")
    if "QCONV_CACHE_DIR" not in os.environ:
        os.environ["QCONV_CACHE_DIR"] = tempfile.mkdtemp(prefix="qconv-test-cache-")


def pytest_sessionstart(session):
    if not opencl_required(session.config):
        return
    why = opencl_missing_reason()
    if why:
        pytest.exit(f"CI requires an OpenCL device and none is visible: {why}. Install one (scripts/setup.sh "
                    f"installs pocl-opencl-icd as root), or set QCONV_REQUIRE_OPENCL=0 to let the OpenCL "
                    f"tests skip.", returncode=3)


@pytest.fixture(scope="module")
def threaded_paths():
    """CPU engine tests: small layers would otherwise run on one thread (``SERIAL_MACS``,
    ``SERIAL_QUANT_VALUES``); with this fixture every call takes the threaded paths."""
    from qconv.cpu import serial_thresholds

    with serial_thresholds(macs=0, quant_values=0):
        yield
