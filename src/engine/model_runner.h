// What the engine needs from a model: a fixed pool of per-request state slots and a ragged
// forward over them. Keeping the engine behind this interface lets the scheduler, state
// manager and async loop be tested on a cheap deterministic model, and the CUDA backend plug
// in a runner of its own without touching the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace deepinfer::sampling {
struct SamplerRow;
struct SampledToken;
}  // namespace deepinfer::sampling

namespace deepinfer::engine {

struct SlotTokens {
  int32_t slot = -1;
  // Placed at positions slot_length, slot_length + 1, ... of that slot's sequence.
  std::span<const int32_t> tokens;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;
  // Longest sequence the model supports.
  virtual int64_t max_model_len() const = 0;
  // Bytes of state one token of one request occupies (pool sizing from state_pool_bytes).
  virtual int64_t state_bytes_per_token() const = 0;
  // Bytes one slot allocated for `max_tokens` takes, and the bytes its memory has free now
  // (the engine checks its slots against EngineArgs.memory_fraction of that).
  virtual int64_t slot_bytes(int64_t max_tokens) const {
    return max_tokens * state_bytes_per_token();
  }
  virtual int64_t free_memory() const;

  // Creates every state slot, and whatever a step needs (a runner on a GPU: its logits
  // buffers), once at start-up; nothing is allocated per step afterwards. A step holds at most
  // `max_tokens_per_step` tokens and samples at most `num_slots` rows.
  virtual void allocate_slots(int32_t num_slots, int64_t max_tokens_per_slot,
                              int64_t max_tokens_per_step) = 0;
  // Empties a slot for its next request (no memory is freed).
  virtual void reset_slot(int32_t slot) = 0;
  // Runs the batch (its tokens are numbered request after request) and advances each slot by
  // its token count. Writes the logits of the tokens `logits_rows` names (ascending token
  // numbers) as a dense row-major [logits_rows.size(), vocab] block: only the rows the sampler
  // reads leave the model, so a runner on a GPU copies those and nothing else to the host.
  virtual void forward(std::span<const SlotTokens> batch, std::span<const int64_t> logits_rows,
                       std::span<float> logits) = 0;

  // A runner whose logits live on a GPU samples there, so that only the sampled tokens and
  // the requested log-probabilities come back to the host. Then the engine passes forward() an
  // empty `logits` (the rows stay on the device) and calls sample() for the same step: row r
  // of `rows` is drawn from the logits of token logits_rows[r], with the CPU sampler's
  // definitions (src/sampling/sampler.h) and the same tokens.
  virtual bool samples_on_device() const { return false; }
  virtual void sample(std::span<const sampling::SamplerRow> rows,
                      std::span<sampling::SampledToken> results);
};

}  // namespace deepinfer::engine

namespace deepinfer {
struct EngineArgs;
}
namespace deepinfer::tokenizer {
class Tokenizer;
}

namespace deepinfer::engine {
// The runner for args.model on args.accelerator (a resolved EngineArgs): loads the checkpoint,
// or, when args.model is empty, builds the embedded default model (default_model_dir()'s
// config with random weights of seed 0, made in memory: the model `deepinfer make-checkpoint
// --config models/default/config.json --seed 0` writes). `tokenizer`, when given, is the
// model's (its engram map is derived from it instead of loading tokenizer.json again).
std::unique_ptr<ModelRunner> make_model_runner(const EngineArgs& args,
                                               const tokenizer::Tokenizer* tokenizer = nullptr);

// Where the default model's config.json and tokenizer files are: the installed copy
// (<prefix>/share/deepinfer/models/default) when it exists, else the source tree's
// models/default (both paths fixed at compile time). Throws Error naming both when neither
// exists.
std::string default_model_dir();
}  // namespace deepinfer::engine
