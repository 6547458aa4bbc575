#!/usr/bin/env bash
# The engine on the GPU, on the GPU machine (the device tool's `run`, repo root as working
# directory), over the programs scripts/cuda/stage_device_build.sh staged in $BIN
# (default build-cuda/device); scripts/cuda/run_device_tests.sh calls it.
# Logs to $OUT (./device-out by hand): engine.log/.xml, generate_{cpu,nvidia}.json,
# memcheck_generate.log, racecheck_generate.log.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
export DEEPINFER_SOURCE_DIR=$PWD DEEPINFER_DEFAULT_MODEL_DIR=$PWD/models/default
status=0

echo "== engine tests (GPU variants run; CPU reference in the same process)"
timeout ${ENGINE_TIMEOUT:-240} "$BIN/engine_test" --gtest_output="xml:$OUT/engine.xml" \
  >"$OUT/engine.log" 2>&1 || status=1
grep -E "^\[ *(OK|FAILED|SKIPPED) *\]|PASSED|tests ran" "$OUT/engine.log" | tail -n 40

# `deepinfer generate`, greedy on the default model: cpu and nvidia must print the same tokens.
generate() {
  "$BIN/deepinfer" --log-level warn generate --prompt "The capital of France is" \
    --prompt "def fibonacci(n):" --prompt-ids 5,6,7,8 --max-tokens "$1" --temperature 0 \
    --ignore-eos --json
}
echo "== deepinfer generate: cpu vs nvidia (greedy, 24 tokens)"
DEEPINFER_ACCELERATOR=cpu generate 24 >"$OUT/generate_cpu.json" 2>&1 || status=1
DEEPINFER_ACCELERATOR=nvidia generate 24 >"$OUT/generate_nvidia.json" 2>&1 || status=1
strip_times() { sed -E 's/"(ttft_s|latency_s)":[^,}]*,?//g' "$1"; }
if diff <(strip_times "$OUT/generate_cpu.json") <(strip_times "$OUT/generate_nvidia.json"); then
  echo "identical outputs: $(wc -l <"$OUT/generate_cpu.json") requests"
else
  echo "cpu and nvidia outputs differ"; status=1
fi

for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool: deepinfer generate on nvidia (4 tokens)"
  DEEPINFER_ACCELERATOR=nvidia timeout ${SANITIZER_TIMEOUT:-150} compute-sanitizer --tool "$tool" \
    --error-exitcode 3 "$BIN/deepinfer" --log-level warn generate --prompt "Hello" \
    --prompt-ids 5,6,7,8 --max-tokens 4 --temperature 0 --ignore-eos --json \
    >"$OUT/${tool}_generate.log" 2>&1 || status=1
  tail -n 4 "$OUT/${tool}_generate.log"
done
exit $status
