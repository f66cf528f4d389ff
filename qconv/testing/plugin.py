"""pytest plugin of qconv (entry point ``pytest11``, active wherever qconv is installed).

* ``qconv_device`` fixture: parametrised over the fast engines visible here — ``"cpu"`` and every
  ``"opencl:P:D"``. An engine family that is not usable still appears once and is **skipped with the
  reason** (e.g. no OpenCL platform), so the test summary shows what did not run.
* ``--qconv-device=NAME`` runs only that engine (``cpu``, ``reference``, ``opencl``, ``opencl:P:D``).
* Hypothesis profiles ``qconv-ci`` (derandomised, no example database, bounded, no deadline),
  ``qconv-dev`` (random, small) and ``qconv-debug`` (many examples). ``qconv-ci`` is loaded when the
  ``CI`` environment variable is set, else ``qconv-dev``; ``HYPOTHESIS_PROFILE`` overrides both.
"""
import os

import pytest


def _register_profiles():
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # hypothesis is a test extra
        return
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("qconv-ci", derandomize=True, database=None, max_examples=40,
                              print_blob=True, **common)
    settings.register_profile("qconv-dev", max_examples=20, **common)
    settings.register_profile("qconv-debug", max_examples=500, **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE",
                                         "qconv-ci" if os.environ.get("CI") else "qconv-dev"))


def pytest_addoption(parser):
    parser.addoption("--qconv-device", action="store", default=None,
                     help="run qconv_device tests on this engine only (cpu, reference, opencl, opencl:P:D)")


def pytest_configure(config):
    _register_profiles()


def _why_missing(device: str):
    """None when ``device`` can run here, else the reason it cannot."""
    from qconv.devices import cpu_available, opencl_devices

    if device == "reference":
        return None
    if device == "cpu":
        return None if cpu_available() else "the qconv CPU extension is not built"
    if device == "opencl" or device.startswith("opencl:"):
        found = opencl_devices()
        if not found:
            try:
                import pyopencl  # noqa: F401
            except ImportError:
                return "pyopencl is not installed (pip install pyopencl)"
            return "no OpenCL device is visible (install an ICD, e.g. apt-get install pocl-opencl-icd)"
        if device != "opencl" and device not in found:
            return f"{device} is not among the visible OpenCL devices {found}"
        return None
    return f"unknown qconv device {device!r}"


def _device_params(wanted):
    if wanted:
        return [wanted]
    from qconv.devices import opencl_devices

    return ["cpu"] + (opencl_devices() or ["opencl"])


def pytest_generate_tests(metafunc):
    if "qconv_device" in metafunc.fixturenames:
        devices = _device_params(metafunc.config.getoption("--qconv-device"))
        metafunc.parametrize("qconv_device", devices, ids=devices, indirect=True)


@pytest.fixture
def qconv_device(request):
    """A qconv device string (``"cpu"``, ``"opencl:P:D"``...); skips with the reason when unusable."""
    device = getattr(request, "param", None) or request.config.getoption("--qconv-device") or "cpu"
    why = _why_missing(device)
    if why:
        pytest.skip(f"qconv device {device}: {why}")
    return device
