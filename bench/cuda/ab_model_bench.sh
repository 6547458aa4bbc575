#!/usr/bin/env bash
# A/B of environment switches on the whole model in one GPU call: cuda_model_bench (batch
# invariance off, as the figures of record) once per config, configs alternating, ROUNDS rounds,
# so run-to-run drift shows against the configs' difference. A config is NAME:VAR=VALUE,... (an
# empty list after the colon runs the defaults; PROGRAM=NAME in the list runs BIN/NAME instead of
# BIN/cuda_model_bench, for two builds of the model bench staged side by side). On the GPU
# machine, from the programs scripts/cuda/stage_device_build.sh staged with the model bench (BIN):
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/ab_model_bench.sh base: \
#     woa:DEEPINFER_WO_A_FP8=1 branches_off:DEEPINFER_CONCURRENT_BRANCHES=0
# BATCHES (default 1,16,64), CONTEXTS (4096), ROUNDS (2), BUDGET_S (90: the bench's time budget
# for its cases, counted once the weights are drawn), RUN_TIMEOUT (120 s a run), EXTRA_ARGS (more
# bench arguments). Output in $OUT:
# ab_NAME_ROUND.{log,json} and ab_summary.txt (each run's decode rows and measured HBM read).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: ab_model_bench.sh NAME:VAR=VALUE,... [...]" >&2; exit 2; }
BIN=${BIN:-$PWD/build-perf/device}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
summary=$OUT/ab_summary.txt
: >"$summary"
failed=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for config in "$@"; do
    name=${config%%:*}
    settings=${config#*:}
    [ "$config" = "$name" ] && settings=""
    environment=()
    program=cuda_model_bench
    IFS=, read -ra pairs <<<"$settings"
    for pair in "${pairs[@]}"; do
      case $pair in
        "") ;;
        PROGRAM=*) program=${pair#PROGRAM=} ;;
        *) environment+=("$pair") ;;
      esac
    done
    log=$OUT/ab_${name}_$round.log
    # shellcheck disable=SC2086  # EXTRA_ARGS is a list of arguments
    env DEEPINFER_BATCH_INVARIANT=0 "${environment[@]}" timeout "${RUN_TIMEOUT:-120}" \
      "$BIN/$program" --batches "${BATCHES:-1,16,64}" --contexts "${CONTEXTS:-4096}" \
      --prefill-tokens 0 --time-budget-s "${BUDGET_S:-90}" --json "$OUT/ab_${name}_$round.json" \
      ${EXTRA_ARGS:-} >"$log" 2>&1
    status=$?
    [ "$status" = 0 ] || failed=1
    {
      echo "$name (${settings:-defaults}), round $round: exit $status," \
        "$(grep -o 'HBM read [0-9]* GB/s' "$log" | head -1)"
      grep -E '^\| [0-9]+ \| [0-9]+ \| [0-9.]+ ' "$log"
    } | tee -a "$summary"
  done
done
exit "$failed"
