#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repo root as working directory) over the
# programs scripts/cuda/stage_device_build.sh staged in $BIN (default build-cuda/device). Logs
# go to $OUT (or ./device-out when run by hand): env.txt, backend_ops.log/.xml,
# gpu_forward.log, golden_gpu.log, memcheck.log, racecheck.log, memcheck_forward.log.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
export DEEPINFER_SOURCE_DIR=$PWD
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvcc --version | tail -1 || true
  compute-sanitizer --version | head -2 || true
} >"$OUT/env.txt" 2>&1

status=0
# KERNEL_SANITIZERS=0 skips the kernel tests' sanitizer runs, =only runs nothing else (so a
# caller can put them after the benchmarks).
KERNEL_SANITIZERS=${KERNEL_SANITIZERS:-1}
if [ "$KERNEL_SANITIZERS" != only ]; then
echo "== backend ops test (tiny and V4.1-Flash shapes)"
timeout ${BACKEND_TIMEOUT:-180} "$BIN/backend_ops_test" --gtest_output="xml:$OUT/backend_ops.xml" \
  >"$OUT/backend_ops.log" 2>&1 || status=1
tail -n 40 "$OUT/backend_ops.log"

if [ -x "$BIN/model_gpu_forward_test" ]; then
  echo "== model on the GPU vs the CPU backend (tiny random models)"
  timeout ${MODEL_TIMEOUT:-180} "$BIN/model_gpu_forward_test" >"$OUT/gpu_forward.log" 2>&1 || status=1
  grep -E "^\[ gpu|OK|FAILED|PASSED|Failure|error" "$OUT/gpu_forward.log" | tail -n 30
fi
if [ -x "$BIN/model_golden_test" ]; then
  echo "== golden logits on the GPU"
  timeout ${MODEL_TIMEOUT:-180} "$BIN/model_golden_test" --gtest_filter='*OnGpu*' \
    >"$OUT/golden_gpu.log" 2>&1 || status=1
  grep -E "^\[ golden|OK|FAILED|PASSED|SKIPPED" "$OUT/golden_gpu.log" | tail -n 60
fi

# The sanitizers slow kernels down a hundredfold: tiny shapes only.
export BACKEND_OPS_TINY_ONLY=1
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool (tiny shapes)"
  timeout ${SANITIZER_TIMEOUT:-100} compute-sanitizer --tool "$tool" --error-exitcode 3 \
    "$BIN/backend_ops_test" --gtest_brief=1 >"$OUT/$tool.log" 2>&1 || status=1
  tail -n 8 "$OUT/$tool.log"
done
if [ -x "$BIN/model_gpu_forward_test" ]; then
  echo "== compute-sanitizer --tool memcheck, the tiny model's forward on the GPU"
  timeout ${SANITIZER_TIMEOUT:-100} compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$BIN/model_gpu_forward_test" --gtest_brief=1 \
    --gtest_filter='*ARequestsLogitsDoNotDependOnTheRestOfTheBatch*' \
    >"$OUT/memcheck_forward.log" 2>&1 || status=1
  tail -n 8 "$OUT/memcheck_forward.log"
fi
# The CUDA sampler against the CPU sampler, when staged (EXTRA_TARGETS=cuda_sampler_test
# EXTRA_PROGRAMS=<build>/tests/sampling/cuda_sampler_test); memcheck on its small cases.
if [ -x "$BIN/cuda_sampler_test" ]; then
  echo "== CUDA sampler test (vs the CPU sampler)"
  timeout ${SAMPLER_TIMEOUT:-120} "$BIN/cuda_sampler_test" >"$OUT/cuda_sampler.log" 2>&1 || status=1
  tail -n 10 "$OUT/cuda_sampler.log"
  echo "== compute-sanitizer --tool memcheck, CUDA sampler (tiny vocabulary, errors, reuse)"
  timeout ${SANITIZER_TIMEOUT:-100} compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$BIN/cuda_sampler_test" --gtest_filter='*Tiny*:*RowErrors*:*Reused*' --gtest_brief=1 \
    >"$OUT/cuda_sampler_memcheck.log" 2>&1 || status=1
  tail -n 4 "$OUT/cuda_sampler_memcheck.log"
fi
fi
# The tensor-core kernel tests (each against the CPU reference, with bit-exact batch invariance),
# then the sanitizers on their small-shape cases: program, memcheck filter, racecheck filter and,
# optionally, the sanitizer runs' time limit in seconds (default $SANITIZER_TIMEOUT or 100: the
# BF16 small cases loop over every decode variant and term count, which racecheck did not finish
# in 90 s on 2026-12-01).
kernel_tests=(
  "moe_grouped_gemm_test|*PrefillTileSmallShapes*:*DecodeTile*SmallShapes*:*ModelMoeExperts*:*BadInput*|*PrefillTileSmallShapes*:*DecodeTile*SmallShapes*"
  "moe_wgmma_test|*SmallShapes*|*GroupedGemmSmallShapes*"
  "linear_bf16_mma_test|*SmallShapes*:*Unaligned*|*SmallShapes*|400"
  "linear_fp8_dense_test|*SmallShapes*|*SmallShapes*"
  # racecheck: the fallbacks only (the path's own kernels use no shared memory; cuBLASLt's are not
  # ours); memcheck also on a replay after the staging it recorded on was outgrown
  "linear_cublaslt_test|*OddShapes*:*Unsupported*:*RecordsOnStagingThatFits*|*Unsupported*"
  "attention_gpu_test|*SmallShapes*|*SmallShapes*"
)
for entry in "${kernel_tests[@]}"; do
  IFS='|' read -r program memcheck_filter racecheck_filter sanitizer_limit <<<"$entry"
  [ -x "$BIN/$program" ] || continue
  if [ "$KERNEL_SANITIZERS" != only ]; then
    echo "== $program (tensor-core kernels vs the CPU reference)"
    timeout ${MODEL_TIMEOUT:-180} "$BIN/$program" >"$OUT/$program.log" 2>&1 || status=1
    grep -E "worst|differ|error|FAILED|PASSED|SKIPPED" "$OUT/$program.log" | tail -n 24
  fi
  [ "$KERNEL_SANITIZERS" = 0 ] && continue
  for tool in memcheck racecheck; do
    filter=$memcheck_filter
    [ "$tool" = racecheck ] && filter=$racecheck_filter
    echo "== compute-sanitizer --tool $tool: $program ($filter)"
    timeout "${sanitizer_limit:-${SANITIZER_TIMEOUT:-100}}" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$BIN/$program" --gtest_filter="$filter" --gtest_brief=1 >"$OUT/${program}_$tool.log" 2>&1 ||
      status=1
    tail -n 3 "$OUT/${program}_$tool.log"
  done
done
if [ "$KERNEL_SANITIZERS" = only ]; then exit $status; fi
if [ -x "$BIN/engine_test" ] && [ -x "$BIN/deepinfer" ]; then
  BIN="$BIN" OUT="$OUT" "$(dirname "$0")/run_engine_device_tests.sh" || status=1
fi
exit $status
