#!/usr/bin/env bash
# Builds deepinfer and runs its main job: text generation through the engine on the embedded
# default model (models/default: a tiny DeepSeek-V4.1 with the real DeepSeek tokenizer and
# deterministic random weights, written on first use into build/default-model).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
BUILD_DIR=build ./scripts/build.sh
model_dir=build/default-model
if [[ ! -f "$model_dir/config.json" ]]; then
  ./build/deepinfer make-checkpoint --config models/default/config.json --seed 0 --out "$model_dir"
  cp models/default/tokenizer.json models/default/tokenizer_config.json "$model_dir/"
fi
./build/deepinfer generate --model "$model_dir" --max-tokens 24 \
  --prompt "The capital of France is" --prompt "def fibonacci(n):" \
  --temperature 0.8 --seed 7
