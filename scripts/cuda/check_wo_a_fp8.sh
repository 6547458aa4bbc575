#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repo root as working directory) over the
# programs scripts/cuda/stage_device_build.sh staged in $BIN (default build-cuda/device; stage
# with EXTRA_TARGETS=cuda_model_bench EXTRA_PROGRAMS=<build>/bench/cuda/cuda_model_bench): whether
# wo_a read as released (DEEPINFER_WO_A_FP8=1, off by default) keeps its bits and what it gains.
# The kernel tests that assert the fp8 weight's bits equal its bf16 dequantization's, memcheck on
# their small shapes, the GPU goldens with the switch on, then the model bench at b1/b16/b64 with
# the switch 0 and 1 (batch invariance off, as the figures of record). Logs and a summary in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"

failed=0
: >"$OUT/summary.txt"
check fp8_kernels 120 "$BIN/linear_bf16_mma_test" --gtest_filter='*Fp8*:*Grouped*'
check cublaslt 120 "$BIN/linear_cublaslt_test"
check fp8_memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 \
  "$BIN/linear_bf16_mma_test" --gtest_filter='*Fp8WeightSmallShapes*' --gtest_brief=1
check goldens_fp8 120 env DEEPINFER_WO_A_FP8=1 "$BIN/model_golden_test" --gtest_filter='*OnGpu*'
# The whole model with the switch off and on, alternating, twice each.
OUT=$OUT BIN=$BIN BATCHES=1,16,64 "$(dirname "$0")/../../bench/cuda/ab_model_bench.sh" \
  bf16_wo_a:DEEPINFER_WO_A_FP8=0 fp8_wo_a:DEEPINFER_WO_A_FP8=1 || failed=1
cat "$OUT/ab_summary.txt" >>"$OUT/summary.txt"
exit "$failed"
