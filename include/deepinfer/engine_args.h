// Engine construction arguments of the offline API (vLLM-like names).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace deepinfer {

enum class Accelerator { kCpu, kNvidia };

struct EngineArgs {
  // Checkpoint directory (config.json, safetensors, tokenizer). Empty: DEEPINFER_HF_MODEL_DIR,
  // else the embedded tiny default model (models/default, random weights from a fixed seed
  // made in memory; see docs/ENGINE.md for how its files are found after install).
  std::string model;
  // Directory of tokenizer.json (+ tokenizer_config.json). Empty: the model's directory. Text
  // prompts, chat, stop strings, structured outputs and CompletionOutput::text need one.
  std::string tokenizer;
  // Empty: DEEPINFER_ACCELERATOR ("cpu" | "nvidia"), else cpu.
  std::optional<Accelerator> accelerator;
  // Longest prompt + output a request may reach; 0: min(model's maximum, 4096), because every
  // state slot is allocated at this length at start-up. Also capped by the state pool.
  int32_t max_model_len = 0;
  // Cap on requests running at once (continuous batching).
  int32_t max_num_seqs = 64;
  // Token budget of one step: decode tokens first, then prefill chunks fill the rest.
  int32_t max_num_batched_tokens = 2048;
  // Fraction of the memory free on the model's device after the weights (host memory on cpu)
  // the state slots may take: engine creation fails naming it when max_num_seqs slots of
  // max_model_len tokens do not fit.
  float memory_fraction = 0.9f;
  // Explicit size of the state pools in bytes; overrides memory_fraction when > 0 (tests use
  // tiny pools to force preemption).
  int64_t state_pool_bytes = 0;
  // Seed for requests without seq_seed.
  uint64_t seed = 0;
  // Plan step N+1 while step N runs. DEEPINFER_ASYNC_SCHEDULING=0 turns it off.
  bool async_scheduling = true;
  // Every reduction in a fixed order whatever the batch holds. Unset: DEEPINFER_BATCH_INVARIANT
  // ("0" | "1"), else true. The CPU backend is batch-invariant by construction, so it is true
  // there whatever is asked.
  std::optional<bool> batch_invariant;
  // CPU kernel threads; 0: DEEPINFER_NUM_THREADS, else all cores.
  int32_t num_threads = 0;

  // Fills the unset fields from the environment and defaults; throws Error naming a bad value.
  EngineArgs resolved() const;
};

}  // namespace deepinfer
