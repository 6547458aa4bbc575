#include <algorithm>

#include "core/error.h"
#include "model/deepseek_v41/model.h"

namespace deepinfer::deepseek_v41 {

std::vector<float> run_prompts(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                               int64_t chunk) {
  DI_CHECK(chunk >= 0, "chunk must be >= 0 (0 = whole prompt), got ", chunk);
  const DeepseekV41TextConfig& config = model.config();
  const int64_t vocab = config.vocab_size;
  std::vector<std::unique_ptr<RequestState>> states;
  std::vector<int64_t> offsets = {0};  // first output row of each request
  for (const auto& prompt : prompts) {
    const int64_t length = static_cast<int64_t>(prompt.size());
    states.push_back(std::make_unique<RequestState>(config, StateLimits{length, 0},
                                                    ops::allocator_for(model.device())));
    offsets.push_back(offsets.back() + length);
  }
  std::vector<float> logits(static_cast<size_t>(offsets.back() * vocab));
  std::vector<float> step_logits;
  std::vector<ForwardRequest> requests;
  std::vector<size_t> which;
  std::vector<int64_t> starts;
  while (true) {
    requests.clear();
    which.clear();
    starts.clear();
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t done = states[i]->length();
      const int64_t left = static_cast<int64_t>(prompts[i].size()) - done;
      if (left == 0) continue;
      const int64_t count = chunk == 0 ? left : std::min(left, chunk);
      requests.push_back({states[i].get(), {prompts[i].data() + done, static_cast<size_t>(count)}});
      which.push_back(i);
      starts.push_back(done);
      total += count;
    }
    if (requests.empty()) break;
    step_logits.resize(static_cast<size_t>(total * vocab));
    model.forward(requests,
                  TensorView::contiguous(step_logits.data(), DType::kF32, {total, vocab}));
    // The step's rows are request after request; scatter them to each request's positions.
    int64_t row = 0;
    for (size_t j = 0; j < requests.size(); ++j) {
      const int64_t count = static_cast<int64_t>(requests[j].tokens.size());
      std::copy_n(step_logits.data() + row * vocab, count * vocab,
                  logits.data() + (offsets[which[j]] + starts[j]) * vocab);
      row += count;
    }
  }
  return logits;
}

}  // namespace deepinfer::deepseek_v41
