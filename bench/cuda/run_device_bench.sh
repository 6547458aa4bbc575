#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repo root as working directory) over what
# bench/cuda/stage.sh staged in build-perf/device/. Logs to $OUT (./device-out by hand):
# env.txt, moe_test.log, backend_ops.log, layer_bench.txt/.json, torch_layers.txt.
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
BIN=$PWD/build-perf/device
# cuBLASLt from the machine: its CUDA toolkit, else PyTorch's nvidia-cublas wheel.
lt=$(find /usr/local/cuda*/ /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$BIN:$(dirname "${lt:-/nonexistent/x}"):${LD_LIBRARY_PATH:-}
export DEEPINFER_SOURCE_DIR=$PWD
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.sm,clocks.mem \
    --format=csv
  nvcc --version | tail -1 || true
  echo "cuBLASLt: $lt"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

status=0
echo "== moe_grouped_gemm_test"
timeout 120 "$BIN/moe_grouped_gemm_test" >"$OUT/moe_test.log" 2>&1 || status=1
tail -n 25 "$OUT/moe_test.log"
echo "== backend_ops_test"
timeout 180 "$BIN/backend_ops_test" --gtest_brief=1 >"$OUT/backend_ops.log" 2>&1 || status=1
tail -n 4 "$OUT/backend_ops.log"
echo "== cuda_layer_bench"
timeout ${BENCH_TIMEOUT:-300} "$BIN/cuda_layer_bench" "$OUT/layer_bench.json" \
  >"$OUT/layer_bench.txt" 2>&1 || status=1
if [ -f bench/cuda/torch_layers.py ] && [ "${SKIP_TORCH:-0}" != 1 ]; then
  echo "== torch_layers.py"
  PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-150} python3 bench/cuda/torch_layers.py \
    >"$OUT/torch_layers.txt" 2>&1 || status=1
  tail -n 30 "$OUT/torch_layers.txt"
fi
echo "== layer bench"
grep -E "^(roofline|moe )" "$OUT/layer_bench.txt" | cut -c1-120
grep "^moe batch" "$OUT/layer_bench.txt"
exit $status
