#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repo root as working directory) over the
# programs scripts/cuda/stage_device_build.sh staged in build-cuda/device/. Logs go to $OUT
# (or ./device-out when run by hand): env.txt, backend_ops.log/.xml, memcheck.log, racecheck.log.
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
BIN=$PWD/build-cuda/device
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
export DEEPINFER_SOURCE_DIR=$PWD
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvcc --version | tail -1 || true
  compute-sanitizer --version | head -2 || true
} >"$OUT/env.txt" 2>&1

status=0
echo "== backend ops test (tiny and V4.1-Flash shapes)"
timeout ${BACKEND_TIMEOUT:-180} "$BIN/backend_ops_test" --gtest_output="xml:$OUT/backend_ops.xml" \
  >"$OUT/backend_ops.log" 2>&1 || status=1
tail -n 40 "$OUT/backend_ops.log"

# The sanitizers slow kernels down a hundredfold: tiny shapes only.
export BACKEND_OPS_TINY_ONLY=1
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool (tiny shapes)"
  timeout ${SANITIZER_TIMEOUT:-100} compute-sanitizer --tool "$tool" --error-exitcode 3 \
    "$BIN/backend_ops_test" --gtest_brief=1 >"$OUT/$tool.log" 2>&1 || status=1
  tail -n 8 "$OUT/$tool.log"
done
exit $status
