// The sampler on the GPU: one launch samples every row of a device logits matrix with the CPU
// reference's definitions (sampler.h, docs/SAMPLING.md) and gives the same token for the same
// inputs. The token ids stay in a device buffer for the next step; the host copy, the
// log-probabilities and the per-row errors arrive with wait().
//
// Per call, the rows' parameters, the penalty histories, the min_tokens ban lists, the grammar
// bitmasks and the Philox uniforms (computed here from (seed, position, sample index), the same
// function the CPU calls) are packed into one pinned buffer and copied up once. Device scratch
// grows to the largest batch seen and is then reused: a warm call allocates nothing.
// Built only with -DDEEPINFER_CUDA=ON; no CUDA header is needed to include this file.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "sampling/sampler.h"

namespace deepinfer::sampling {

class CudaSampler {
 public:
  CudaSampler();
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  // Enqueues the sampling of rows.size() rows on cuda::current_stream() and returns without
  // waiting. `logits` is a device f32 view [rows.size(), vocab] (dense rows, any row stride);
  // it must stay unchanged until the stream reaches the sampler's kernel. `rows` is read
  // during the call only. Per-row input problems become that row's error (as the CPU
  // sampler's); wrong shapes throw InternalError. Call wait() before the next launch().
  void launch(const TensorView& logits, std::span<const SamplerRow> rows);

  // The last launch's token ids, device int32 [rows]: written in stream order by the kernel, so
  // work enqueued after launch() on the same stream may read them. -1 in rows with an error.
  // Valid until the next launch().
  TensorView device_token_ids() const;

  // Waits for the last launch and writes one result per row (token, logprobs, error), equal
  // to what Sampler::sample gives for the same inputs (see docs/SAMPLING.md for the limits).
  void wait(std::span<SampledToken> results);

  // launch() then wait().
  std::vector<SampledToken> sample(const TensorView& logits, std::span<const SamplerRow> rows);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace deepinfer::sampling
