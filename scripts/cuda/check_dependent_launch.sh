#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repo root as working directory) over the
# programs scripts/cuda/stage_device_build.sh staged in $BIN (default build-cuda/device): whether
# the small kernels' dependent launches (DEEPINFER_DEPENDENT_LAUNCH, on by default) keep the GPU
# goldens' decode mode equal to prefill. The failure they caused was not reproducible run to run
# (docs/BENCHMARKS.md, twelfth session, "The race"), so the goldens run ROUNDS times with the
# switch on and once off; if any round on fails, one kernel family at a time is launched as a
# dependent (DEEPINFER_DEPENDENT_LAUNCH_ONLY) to find the family. Logs and a summary in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
ROUNDS=${ROUNDS:-3}

# goldens NAME [VAR=VALUE...]: the GPU goldens under the given environment; prints the number of
# failed assertions; fails unless every fixture matched in every mode.
goldens() {
  local name=$1
  shift
  env "$@" timeout 300 "$BIN/model_golden_test" --gtest_filter='*OnGpu/*' >"$OUT/golden_$name.log" 2>&1
  local failures
  failures=$(grep -c 'Failure' "$OUT/golden_$name.log")
  echo "$name: $failures failed assertions ($*)" | tee -a "$OUT/summary.txt"
  [ "$failures" = 0 ]
}

: >"$OUT/summary.txt"
goldens off DEEPINFER_DEPENDENT_LAUNCH=0
failed=0
for round in $(seq 1 "$ROUNDS"); do
  goldens "on_$round" DEEPINFER_DEPENDENT_LAUNCH=1 || failed=1
done
if [ "$failed" = 1 ]; then
  for family in "rmsnorm,rope_kernel,fill_kernel" "hc_mix,hc_collapse,hc_expand" \
    "sink_attention,write_window" "engram" \
    "route,sort_by,combine,list_token,quantize_rows,decode_wgmma" "topk,indexer"; do
    goldens "only_${family%%,*}" DEEPINFER_DEPENDENT_LAUNCH=1 \
      DEEPINFER_DEPENDENT_LAUNCH_ONLY="$family" || true
  done
fi
cat "$OUT/summary.txt"
exit "$failed"
