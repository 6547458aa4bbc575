#!/usr/bin/env bash
# Runs on the GPU machine over the programs scripts/cuda/stage_device_build.sh staged in $BIN
# (stage with EXTRA_TARGETS=cuda_model_bench EXTRA_PROGRAMS=<build>/bench/cuda/cuda_model_bench):
# whether the decode step's concurrent branches (ops::ConcurrentBranch, DEEPINFER_CONCURRENT_BRANCHES,
# on by default) keep every bit and what they gain. The branch's op test and its memcheck, the
# model's branched-against-in-place tests, the GPU goldens and the engine's GPU tests (the engine
# steps the model from its own scheduling thread), then the model bench with the branches on and
# off, alternating (BATCHES, CONTEXTS and ROUNDS as bench/cuda/ab_model_bench.sh; on an H200 pass
# BATCHES=256 CONTEXTS=4096,32768 for the done-when's b256 margin). Logs and a summary in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"

failed=0
: >"$OUT/summary.txt"
check branch_op 60 "$BIN/backend_ops_test" --gtest_filter='*ConcurrentBranch*'
check branch_memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 3 \
  "$BIN/backend_ops_test" --gtest_filter='*ConcurrentBranch*' --gtest_brief=1
check branch_forward 180 "$BIN/model_gpu_forward_test" --gtest_filter='GpuConcurrentBranches.*'
check goldens 120 "$BIN/model_golden_test" --gtest_filter='*OnGpu*'
check engine 240 env DEEPINFER_SOURCE_DIR="$PWD" DEEPINFER_DEFAULT_MODEL_DIR="$PWD/models/default" \
  "$BIN/engine_test"
OUT=$OUT BIN=$BIN "$(dirname "$0")/../../bench/cuda/ab_model_bench.sh" \
  branches_on: branches_off:DEEPINFER_CONCURRENT_BRANCHES=0 || failed=1
cat "$OUT/ab_summary.txt" >>"$OUT/summary.txt"
exit "$failed"
