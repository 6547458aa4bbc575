#!/usr/bin/env bash
# Nsight Compute on a b1 decode step's small kernels (the hc Sinkhorn finish, attention's chunk
# and combine kernels, the register rmsnorm), one profile per launch configuration, while
# cuda_model_bench runs a 3-layer model (layers 0-2 of the release: a dense, an engram and an
# indexer layer) at batch 1, 4k context. Their CUPTI times (9.5, 14.8, 4.2, 5.5 us a call on the
# H100, docs/BENCHMARKS.md) are well above their bytes' time; this says what they wait on. On the
# GPU machine, from what scripts/cuda/stage_device_build.sh staged with the model bench (BIN):
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/profile_decode_small.sh
# KERNELS (an ncu regex) picks other kernels. (Its one run, 2026-12-07 22:41, profiled nothing:
# the bench's budget of 1 s then counted the weights' drawing; now it starts after them.)
# Output: $OUT/ncu_decode_small.txt.
set -uo pipefail
NCU_TIMEOUT=${NCU_TIMEOUT:-120} "$(dirname "$0")/ncu_profile.sh" decode_small \
  "${KERNELS:-hc_mix_finish|sink_attention_mma_chunk|sink_attention_combine|rmsnorm_registers_kernel}" \
  cuda_model_bench --layers 3 --mix first --batches 1 --contexts 4096 --prefill-tokens 0 \
  --steps 1 --time-budget-s 120 --no-trace
