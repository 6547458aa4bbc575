#!/usr/bin/env bash
# Nsight Compute on a b1 decode step's FP8 split-tile GEMMs (split_tile_kernel: wq_a + wkv, wq_b,
# wo_b, the shared expert, the indexer's wq_b; one profile per launch configuration) under
# cuda_model_bench on 3 layers (released 0-2), batch invariance off. Their ~0.72 ms a 7-layer b1
# step is ~2.4x their bytes' time (docs/BENCHMARKS.md): the "detailed" set's warp states and
# source counters say what their warps wait on. On the GPU machine, from what
# scripts/cuda/stage_device_build.sh staged with the model bench (BIN):
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/profile_decode_gemms.sh
# Output: $OUT/ncu_decode_gemms.txt.
set -uo pipefail
DEEPINFER_BATCH_INVARIANT=0 NCU_TIMEOUT=${NCU_TIMEOUT:-150} \
  "$(dirname "$0")/ncu_profile.sh" decode_gemms split_tile_kernel \
  cuda_model_bench --layers 3 --mix first --batches 1 --contexts 4096 --prefill-tokens 0 \
  --steps 1 --time-budget-s 120 --no-trace
