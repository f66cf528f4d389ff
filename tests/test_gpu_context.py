"""OpenCL device selection, program building and errors (qconv/gpu/context.py, programs.py, errors.py)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qconv
from qconv import gpu
from qconv.gpu import context, programs

DEVICES = gpu.devices()
NO_DEVICE = "no OpenCL device is visible (install one, e.g. `apt-get install pocl-opencl-icd`)"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=DEVICES or [None])
def cl_device(request):
    if request.param is None:
        pytest.skip(NO_DEVICE)
    return request.param


def _python(code: str, **env):
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=300)


def test_device_listing_format():
    assert isinstance(gpu.available(), bool)
    for d in DEVICES:
        kind, p, i = d.split(":")
        assert kind == "opencl" and p.isdigit() and i.isdigit()
    assert set(DEVICES) <= set(qconv.available_devices())


def test_resolve_every_spec_form(cl_device, monkeypatch):
    import pyopencl as cl

    monkeypatch.delenv(context.ENV_DEVICE, raising=False)
    ctx, dev = gpu.resolve(cl_device)
    assert isinstance(ctx, cl.Context) and dev in ctx.devices
    assert gpu.resolve(dev)[0] is ctx  # one shared context per device
    own = cl.Context([dev])
    assert gpu.resolve(own) == (own, dev)
    ctx0, dev0 = gpu.resolve("opencl")
    gpus = [d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU]
    assert (dev0.type & cl.device_type.GPU) or not gpus
    monkeypatch.setenv(context.ENV_DEVICE, cl_device)
    assert gpu.resolve("opencl")[1] == dev
    monkeypatch.setenv(context.ENV_DEVICE, cl_device.split(":", 1)[1])
    assert gpu.resolve("opencl")[1] == dev
    monkeypatch.setenv(context.ENV_DEVICE, dev.name[:6])
    assert gpu.resolve("opencl")[1].name.startswith(dev.name[:6])
    monkeypatch.setenv(context.ENV_DEVICE, "no such device at all")
    with pytest.raises(gpu.OpenCLUnavailableError, match="matches no OpenCL device"):
        gpu.resolve("opencl")
    assert cl_device.startswith("opencl:") and dev.name.strip() in gpu.describe_device(cl_device)


def test_resolve_rejects_bad_specs():
    with pytest.raises(gpu.OpenCLUnavailableError, match="pocl-opencl-icd"):
        gpu.resolve("opencl:97:0")
    with pytest.raises(ValueError, match="opencl:P:D"):
        gpu.resolve("opencl:first")
    with pytest.raises(ValueError):
        gpu.resolve("cuda")
    with pytest.raises(TypeError, match="pyopencl"):
        gpu.resolve(3.5)


def test_no_platform_is_a_clear_error_and_import_is_silent(tmp_path):
    """With an ICD loader that finds no vendor: import prints nothing, devices() is empty, the layer says how
    to get a device, and the CPU engine is untouched."""
    r = _python("""
        import numpy as np, qconv, qconv.gpu as g
        assert g.devices() == [] and not g.available(), g.devices()
        assert not any(d.startswith("opencl") for d in qconv.available_devices())
        w = qconv.quantize_weight(np.ones((2, 3, 1, 1), np.float32))
        try:
            qconv.Conv2d(w, device="opencl")
        except g.OpenCLUnavailableError as e:
            print("ERR", e)
        y = qconv.Conv2d(w, device="reference")(np.ones((1, 3, 2, 2), np.float32))
        assert y.shape == (1, 2, 2, 2)
    """, OCL_ICD_VENDORS=str(tmp_path), OCL_ICD_FILENAMES="")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR ") and "pocl-opencl-icd" in r.stdout
    assert r.stderr == ""


def test_without_pyopencl(tmp_path):
    r = _python("""
        import sys
        sys.modules["pyopencl"] = None  # as if it were not installed
        import numpy as np, qconv, qconv.gpu as g
        assert g.devices() == [] and not g.available()
        w = qconv.quantize_weight(np.ones((2, 3, 1, 1), np.float32))
        try:
            qconv.Conv2d(w, device="opencl")
        except RuntimeError as e:
            print("ERR", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "pip install pyopencl" in r.stdout and r.stderr == ""


def test_build_failure_carries_the_log(cl_device):
    ctx, _ = gpu.resolve(cl_device)
    with pytest.raises(gpu.OpenCLBuildError) as err:
        programs.get_program(ctx, "conv_general", ("-DQBITS=3", "-DWPACK=4"))
    assert "QBITS" in err.value.log and "-DQBITS=3" in err.value.options
    with pytest.raises(ValueError, match="unknown OpenCL program"):
        programs.get_program(ctx, "nope")


def test_programs_are_memoised_per_context(cl_device):
    import pyopencl as cl

    ctx, dev = gpu.resolve(cl_device)
    opts = ("-DQBITS=8", "-DWPACK=4", "-DNBLK1")
    a = programs.get_kernel(ctx, "conv_general", opts, "conv_general")
    assert programs.get_kernel(ctx, "conv_general", list(opts), "conv_general") is a
    assert programs.get_program(ctx, "conv_general", opts) is programs.get_program(ctx, "conv_general", opts)
    other = cl.Context([dev])
    assert programs.get_program(other, "conv_general", opts) is not programs.get_program(ctx, "conv_general", opts)


def test_kernel_sources_ship_in_the_package():
    for name in programs.PROGRAMS:
        src = programs.source(name)
        assert "__kernel" in src and "ACTIVATE" in src
    assert (programs.KERNEL_DIR / "common.cl").is_file()


def test_copy_kernel(cl_device):
    """The bandwidth kernel of the benchmark copies exactly."""
    import pyopencl as cl
    import pyopencl.array as cla

    ctx, dev = gpu.resolve(cl_device)
    q = cl.CommandQueue(ctx)
    a = cla.to_device(q, np.arange(4 * 37, dtype=np.float32))
    b = cla.zeros_like(a)
    k = programs.get_kernel(ctx, "util", (), "copy_float4")
    k(q, (40,), None, a.data, b.data, np.int32(37))
    assert np.array_equal(b.get(), a.get())


# The Oclgrind memory check of every kernel family: tests/test_gpu_memcheck.py

