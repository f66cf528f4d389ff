"""pytest plugin of qconv (entry point ``pytest11``).

* ``--qconv-device=NAME`` restricts the ``qconv_device`` fixture to one engine ("cpu", "reference",
  "opencl:P:D"); by default the fixture is parametrised over every visible engine.
* Hypothesis profiles: ``qconv-ci`` (derandomised, bounded, no deadline) and ``qconv-dev`` (random,
  small). ``qconv-ci`` is loaded when ``CI`` is set, else ``qconv-dev``; ``HYPOTHESIS_PROFILE`` overrides.
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
                     help="run qconv_device tests on this engine only (cpu, reference, opencl:P:D)")


def pytest_configure(config):
    _register_profiles()


def _visible_devices():
    from qconv.devices import available_devices
    return available_devices()


def pytest_generate_tests(metafunc):
    if "qconv_device" not in metafunc.fixturenames:
        return
    wanted = metafunc.config.getoption("--qconv-device")
    devices = _visible_devices()
    if wanted:
        devices = [d for d in devices if d == wanted] or [wanted]
    metafunc.parametrize("qconv_device", devices, ids=[str(d) for d in devices])
