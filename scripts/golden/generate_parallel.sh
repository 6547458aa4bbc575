#!/bin/bash
# Runs scripts/golden/generate.py for several configs at once, each over several disjoint seed
# ranges, and keeps per config the valid result of the lowest range (docs/GOLDEN.md,
# "Regenerating"). Needs a python3 with the oracle packages; HF_SRC and REF_SRC name the oracle
# source directories (REF_SRC may be left unset when every config is dense-only), OUT_DIR where
# the chosen fixtures go (default tests/data/golden).
#
#   HF_SRC=DIR REF_SRC=DIR [PER=10] [BASE=0] [BUDGET=seconds] scripts/golden/generate_parallel.sh CONFIG:NPROC ...
# BUDGET: each process starts no new seed after that many seconds (0: no limit).
set -u
: "${HF_SRC:?set HF_SRC}"
REF_ARGS=()
if [ -n "${REF_SRC:-}" ]; then REF_ARGS=(--ref-src "$REF_SRC"); fi
PER=${PER:-10}
BASE=${BASE:-0}
OUT_DIR=${OUT_DIR:-tests/data/golden}
WORK=$(mktemp -d)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
for spec in "$@"; do
  c=${spec%%:*}
  n=${spec##*:}
  for k in $(seq 0 $((n - 1))); do
    o=$WORK/${c}_$k
    mkdir -p "$o" && cp tests/data/golden/tokenizer.json "$o/"
    python3 scripts/golden/generate.py --hf-src "$HF_SRC" "${REF_ARGS[@]}" --out "$o" --only "$c" \
      --first-attempt $((BASE + k * PER)) --max-attempts "$PER" --time-budget "${BUDGET:-0}" > "$o/log" 2>&1 &
  done
done
wait
for spec in "$@"; do
  c=${spec%%:*}
  n=${spec##*:}
  chosen=""
  for k in $(seq 0 $((n - 1))); do
    meta=$WORK/${c}_$k/$c/meta.json
    if [ -f "$meta" ] && grep -q '"valid": true' "$meta"; then chosen=$WORK/${c}_$k/$c; break; fi
  done
  if [ -z "$chosen" ]; then echo "$c: no valid seed in this range (logs in $WORK)"; continue; fi
  rm -rf "${OUT_DIR:?}/$c" && cp -r "$chosen" "$OUT_DIR/$c"
  echo "$c: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['seed'])" "$chosen/meta.json")"
done
