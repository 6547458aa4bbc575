// Flags shared by `deepinfer generate` and `deepinfer bench`: the engine's arguments.
#pragma once

#include <CLI/CLI.hpp>

#include "deepinfer/engine_args.h"

namespace deepinfer::cli {

struct EngineFlags {
  EngineArgs args;
  std::string accelerator;
  bool no_async = false;

  void add_to(CLI::App& command) {
    command.add_option("--model", args.model,
                       "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, else the embedded "
                       "default model)");
    command.add_option("--tokenizer", args.tokenizer,
                       "directory of tokenizer.json (default: the model's)");
    command
        .add_option("--accelerator", accelerator, "cpu | nvidia (default: DEEPINFER_ACCELERATOR)")
        ->check(CLI::IsMember({"cpu", "nvidia"}));
    command.add_option("--max-num-seqs", args.max_num_seqs, "cap on running requests");
    command.add_option("--max-num-batched-tokens", args.max_num_batched_tokens,
                       "token budget per step");
    command.add_option("--max-model-len", args.max_model_len,
                       "longest prompt + output (0: min(model maximum, 4096))");
    command.add_option("--engine-seed", args.seed, "seed of requests without their own");
    command.add_flag("--no-async", no_async, "plan each step after the previous one");
  }

  EngineArgs resolved() const {
    EngineArgs out = args;
    if (accelerator == "cpu") out.accelerator = Accelerator::kCpu;
    if (accelerator == "nvidia") out.accelerator = Accelerator::kNvidia;
    if (no_async) out.async_scheduling = false;
    return out;
  }
};

}  // namespace deepinfer::cli
