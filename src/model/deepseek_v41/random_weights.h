// Deterministic random weights for a DeepSeek-V4.1 config, in either weight layout: what
// `deepinfer make-checkpoint` writes. Values are a pure function of (seed, tensor name,
// element index), independent of tensor order and threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/deepseek_v41/weights.h"

namespace deepinfer::deepseek_v41 {

struct RandomTensor {
  const WeightSpec* spec = nullptr;  // points into the table given to make_random_weights
  std::vector<std::byte> bytes;      // stored bytes: dtype_storage_bytes(spec->dtype, count)
};

// Initialisation (HF DeepseekV41PreTrainedModel._init_weights): normal(0, initializer_range)
// for linears, embeddings, the gate and hc_*_fn; ones for norms, hc_*_scale and the engram q/k
// weights; zeros for hc_*_base, attn_sink and the gate biases. Quantized roles are quantized
// the reference's way: fp8 e4m3 with ue8m0 pow2-ceil scales of amax/448 per block (amax
// floored at 1e-4), fp4 e2m1 with ue8m0 scales of amax/6 per 32 elements of a row. A scale
// tensor is produced together with its weight.
std::vector<RandomTensor> make_random_weights(const std::vector<WeightSpec>& table, double std_dev,
                                              uint64_t seed);

}  // namespace deepinfer::deepseek_v41
