#!/usr/bin/env bash
# Run on the lent NVIDIA H200 (the `device` tool): install the carried wheels (.whl/), register NVIDIA's
# OpenCL ICD, build qconv in place, run the OpenCL tests on the GPU, then the GPU benchmark.
# Usage there: [RUNS=2] [TESTS="tests/..."] bash scripts/h200.sh [tests|bench|all|lab|mma] [extra bench args...]
# (lab: scripts/a8_lab.py; mma: scripts/mma_lab.py)
# RUNS=2 runs the benchmark twice with one tuning cache ($OUT/tune-cache): the second run's setup column
# shows the cache skipping the tuning. Outputs: $OUT/bench_gpu_${TAG:-run}<i>.{json,txt}.
set -uo pipefail
what="${1:-all}"; shift || true
OUT="${OUT:-/tmp/qconv-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
export QCONV_CACHE_DIR="$OUT/tune-cache" PYTHONUNBUFFERED=1
t0=$SECONDS
python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
python3 -c "import qconv, qconv.gpu as g; print('devices:', qconv.available_devices()); print(g.devices())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
dev="$(python3 -c 'import qconv.gpu as g; d=[str(x) for x in g.devices()]; print(d[0] if d else "")')"
[ -n "$dev" ] || { echo "no OpenCL device"; exit 1; }
if [ "$what" = tests ] || [ "$what" = all ]; then
    HYPOTHESIS_PROFILE=qconv-ci QCONV_TUNE=none timeout 400 python3 -m pytest -q -p no:cacheprovider \
        ${TESTS:-tests/test_gpu_*.py tests/test_opencl_layouts.py} 2>&1 | tail -15
fi
if [ "$what" = lab ]; then
    timeout 500 python3 scripts/a8_lab.py 2>&1 | tee "$OUT/a8_lab.txt"
fi
if [ "$what" = mma ]; then
    timeout 500 python3 scripts/mma_lab.py 2>&1 | tee "$OUT/mma_lab.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    for i in $(seq 1 "${RUNS:-1}"); do
        timeout 420 python3 benchmarks/bench_gpu.py --device "$dev" --baselines --json "$OUT/bench_gpu_${TAG:-run}$i.json" "$@" \
            2>&1 | tee "$OUT/bench_gpu_${TAG:-run}$i.txt"
    done
fi
