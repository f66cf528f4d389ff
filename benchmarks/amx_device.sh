#!/usr/bin/env bash
# One call on the AMX device host (H200 box, Xeon with amx_int8): build, the CPU tests, the conv benchmark.
# Usage: bash benchmarks/amx_device.sh [tests|bench|noamx|zoo|di8|all] ; logs go to $OUT (or ./amx_out).
# zoo: the real-weight models against onnxruntime float (benchmarks/labs/host_zoo.py), from $ZOO_DIR (default ./zoo_dir,
# made here by `python -m benchmarks.labs.host_zoo prepare zoo_dir` and carried).
set -u
OUT=${OUT:-./amx_out}; mkdir -p "$OUT"
what=${1:-all}
status=0
export PYTHONUNBUFFERED=1 QCONV_REQUIRE_OPENCL=0 PYTHONPATH=$PWD
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "amx_(tile|int8|bf16)|avx512_vnni" /proc/cpuinfo | sort | uniq -c;
  python3 --version; python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } \
  > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 setup.py -q build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -c "from qconv._ext import _cpu, _cpu_probes as P; print('best', _cpu.best_kernel(), 'amx', _cpu.kernel_supported('amx'), \
'amx peak 1t %.0f GOP/s' % P.probe_amx_gops(1), 'vnni peak 1t %.0f GOP/s' % P.probe_vnni_gops(1))" 2>&1 | tee "$OUT/kernel.txt"
if [ "$what" = tests ] || [ "$what" = all ]; then
  CI=true timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -n 12 ${TESTS:-tests/test_cpu_amx.py \
    tests/test_cpu_direct_int8.py tests/test_cpu_direct.py tests/test_cpu_fused.py tests/test_cpu_kernels.py tests/test_cpu_engine.py tests/test_cpu_block.py tests/test_cpu_depthwise.py \
    tests/test_cpu_pool.py tests/test_layouts.py tests/test_onnx_native_calls.py} > "$OUT/tests.log" 2>&1
  rc=$?
  # every test of tests/test_cpu_amx.py runs on this host (it has AMX): a skip there is a failure
  skipped=$(grep -c "^SKIPPED .*test_cpu_amx.py" "$OUT/tests.log")
  echo "tests rc=$rc, skipped in tests/test_cpu_amx.py: $skipped"; tail -25 "$OUT/tests.log"
  if [ "$rc" != 0 ] || [ "$skipped" != 0 ]; then status=1; fi
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  taskset -c 0,1 python3 benchmarks/amx_tile_cols.py 2>&1 | tee "$OUT/tile_cols.txt"
  for qe in x86 onednn; do
    ONEDNN_VERBOSE=1 taskset -c 0,1 python3 -c "
import torch, torch.ao.nn.quantized.dynamic as nnqd
from torch.ao.quantization import quantize_dynamic, default_dynamic_qconfig
torch.backends.quantized.engine = '$qe'; torch.set_num_threads(2)
m = torch.nn.Sequential(torch.nn.Conv2d(256, 256, 3, 1, 1))
qm = quantize_dynamic(m, {torch.nn.Conv2d: default_dynamic_qconfig}, mapping={torch.nn.Conv2d: nnqd.Conv2d})
x = torch.randn(1, 256, 14, 14)
with torch.inference_mode():
    for _ in range(3): qm(x)
" 2>&1 | grep -E ",exec," | grep -oE "(brg|jit|gemm|ref)[a-z_:0-9]*" | sort | uniq -c | head -5 | sed "s/^/qengine=$qe: /" | tee -a "$OUT/onednn.txt"
  done
  timeout ${BENCH_TIMEOUT:-400} taskset -c 0,1 python3 benchmarks/bench_cpu.py --cases "${CASES:-3x3,1x1,batch-8}" \
    --kernels avx512vnni --torch-qengine onednn --sweeps ${SWEEPS:-2} ${QUICK:---quick} \
    --skip "numpy,torch conv2d,torch linear,onnxruntime Conv,onnxruntime MatMul ,1 thread" \
    --json "$OUT/bench.json" > "$OUT/bench.md" 2> "$OUT/bench.err"
  echo "bench rc=$?"; cat "$OUT/bench.md"; tail -3 "$OUT/bench.err"
fi
if [ "$what" = noamx ] || [ "$what" = all ]; then
  # a machine without AMX, emulated: qconv's VNNI kernel, oneDNN capped at AVX-512 VNNI
  QCONV_CPU_KERNEL=avx512vnni ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI timeout ${NOAMX_TIMEOUT:-200} taskset -c 0,1 \
    python3 benchmarks/bench_cpu.py --cases "${NOAMX_CASES:-3x3,1x1}" --torch-qengine onednn --sweeps ${NOAMX_SWEEPS:-2} \
    --quick --skip "numpy,torch conv2d,torch linear,onnxruntime Conv,onnxruntime MatMul ,1 thread" \
    --json "$OUT/bench_noamx.json" > "$OUT/bench_noamx.md" 2> "$OUT/bench_noamx.err"
  echo "noamx rc=$?"; grep -A40 "fastest peer" "$OUT/bench_noamx.md" | head -30
fi
if [ "$what" = di8 ]; then   # the direct int8 conv's AMX and VNNI codes, layer by layer (benchmarks/labs/di8_variants.py)
  timeout ${DI8_TIMEOUT:-300} taskset -c 0,1 python3 -m benchmarks.labs.di8_variants 2>&1 | tee "$OUT/di8.txt"
fi
if [ "$what" = zoo ]; then
  timeout ${ZOO_TIMEOUT:-300} python3 -m benchmarks.labs.host_zoo run "${ZOO_DIR:-zoo_dir}" --rounds ${ZOO_ROUNDS:-2} \
    2>&1 | tee "$OUT/zoo.txt"
fi
exit $status
