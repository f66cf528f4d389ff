#!/usr/bin/env bash
# Build qconv in place, run the OpenCL tests on the GPU and/or the GPU benchmark, on a machine with an NVIDIA
# GPU (the H200 results in docs/benchmarks_gpu.md came from it). From the repository root:
#
#   [RUNS=2] [TAG=run] [TESTS="tests/..."] [LAB=variants] bash benchmarks/gpu_machine.sh [tests|bench|all|lab] [args...]
#
#   tests  the OpenCL tests (tests/test_gpu_*.py tests/test_opencl_layouts.py, or $TESTS) on the first device
#   bench  benchmarks/bench_gpu.py --baselines [args] ($RUNS times, one tuning cache: run 2 shows it at work)
#   all    tests, then bench
#   lab    python -m benchmarks.labs.$LAB --device DEV [args] (LAB: variants by default, host_cost, or device_graph
#          with model files as args: whole models through the device graph; torch_graph with float models: torch
#          on the same GPU through onnx2torch, which needs onnx2torch and torchvision installed)
#
# Needs a C compiler, NVIDIA's OpenCL driver (libnvidia-opencl.so.1) and python3 with numpy, pyopencl, pytest,
# hypothesis, platformdirs, tqdm, Cython and setuptools (torch with CUDA for the --baselines columns).
# Where pip cannot reach an index (the lent H200 machines), put those packages as wheels for that machine's
# Python into $WHEELS (default: .whl/, ignored by git; send it along with the checkout): they are installed
# into /tmp/site. Without $WHEELS the python3 on PATH must have them.
# Outputs in $OUT (default /tmp/qconv-out): build.log, bench_gpu_${TAG:-run}<i>.{json,txt}, lab.txt, tune-cache/.
set -uo pipefail
what="${1:-all}"; shift || true
OUT="${OUT:-/tmp/qconv-out}"; mkdir -p "$OUT"
WHEELS="${WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -z "${OCL_ICD_VENDORS:-}" ] && ! grep -qs nvidia /etc/OpenCL/vendors/*.icd; then
    mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
fi
export QCONV_CACHE_DIR="$OUT/tune-cache" PYTHONUNBUFFERED=1
# the qconv_device fixture's pytest plugin is an entry point of the installed package; load it by name here
python3 -c "import importlib.metadata as m; m.distribution('qconv')" 2>/dev/null || export PYTEST_PLUGINS=qconv.testing.plugin
t0=$SECONDS
python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
python3 -c "import qconv; print('qconv', qconv.__version__, 'devices:', qconv.available_devices())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
dev="$(python3 -c 'import qconv.gpu as g; d=[str(x) for x in g.devices()]; print(d[0] if d else "")')"
[ -n "$dev" ] || { echo "no OpenCL device"; exit 1; }
if [ "$what" = tests ] || [ "$what" = all ]; then
    HYPOTHESIS_PROFILE=qconv-ci QCONV_TUNE=none timeout 400 python3 -m pytest -q -p no:cacheprovider \
        ${TESTS:-tests/test_gpu_*.py tests/test_opencl_layouts.py} 2>&1 | tail -15
fi
if [ "$what" = lab ]; then
    timeout 500 python3 -m "benchmarks.labs.${LAB:-variants}" --device "$dev" "$@" 2>&1 | tee "$OUT/lab.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    for i in $(seq 1 "${RUNS:-1}"); do
        timeout 420 python3 benchmarks/bench_gpu.py --device "$dev" --baselines \
            --json "$OUT/bench_gpu_${TAG:-run}$i.json" "$@" 2>&1 | tee "$OUT/bench_gpu_${TAG:-run}$i.txt"
    done
fi
