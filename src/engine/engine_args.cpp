#include "deepinfer/engine_args.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "deepinfer/outputs.h"
#include "ops/batch_invariance.h"

namespace deepinfer {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace

EngineArgs EngineArgs::resolved() const {
  EngineArgs out = *this;
  if (out.model.empty()) {
    if (auto dir = env("DEEPINFER_HF_MODEL_DIR")) out.model = *dir;
  }
  if (!out.accelerator) {
    const std::string name = env("DEEPINFER_ACCELERATOR").value_or("cpu");
    if (name == "cpu") {
      out.accelerator = Accelerator::kCpu;
    } else if (name == "nvidia") {
      out.accelerator = Accelerator::kNvidia;
    } else {
      DI_THROW("DEEPINFER_ACCELERATOR='", name, "' is not one of: cpu, nvidia");
    }
  }
  if (auto value = env("DEEPINFER_ASYNC_SCHEDULING")) {
    if (*value == "0") {
      out.async_scheduling = false;
    } else if (*value != "1") {
      DI_THROW("DEEPINFER_ASYNC_SCHEDULING='", *value, "' must be 0 or 1");
    }
  }
  // The op layer's policy reads DEEPINFER_BATCH_INVARIANT (the one parser of it); the engine
  // hands the resolved value back to the op layer when it starts.
  if (!out.batch_invariant) out.batch_invariant = ops::batch_invariant();
  // The CPU backend has one fixed reduction order per output element whatever the batch.
  if (out.accelerator == Accelerator::kCpu) out.batch_invariant = true;
  if (out.max_model_len < 0)
    DI_THROW("EngineArgs.max_model_len must be >= 0, got ", out.max_model_len);
  if (out.max_num_seqs <= 0)
    DI_THROW("EngineArgs.max_num_seqs must be > 0, got ", out.max_num_seqs);
  if (out.max_num_batched_tokens <= 0) {
    DI_THROW("EngineArgs.max_num_batched_tokens must be > 0, got ", out.max_num_batched_tokens);
  }
  if (!(out.memory_fraction > 0.0f && out.memory_fraction <= 1.0f)) {
    DI_THROW("EngineArgs.memory_fraction must be in (0, 1], got ", out.memory_fraction);
  }
  if (out.state_pool_bytes < 0) {
    DI_THROW("EngineArgs.state_pool_bytes must be >= 0, got ", out.state_pool_bytes);
  }
  if (out.num_threads < 0) DI_THROW("EngineArgs.num_threads must be >= 0, got ", out.num_threads);
  return out;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace deepinfer
