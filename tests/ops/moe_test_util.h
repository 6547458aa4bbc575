// Helpers shared by the GPU tests of the routed experts (moe_grouped_gemm_test, moe_wgmma_test):
// grouped GEMM problems and their CPU reference, random fp4 experts on the host and the device,
// random routes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops::testing {

// Random FP4 experts of one layer, host and device (each weight its own allocation, as in the
// model).
struct ExpertSet {
  std::vector<Tensor> host_storage, device_storage;
  std::vector<ExpertWeights> host, device;
};

inline ExpertSet make_experts(int64_t count, int64_t dim, int64_t inter, uint32_t seed) {
  ExpertSet set;
  set.host.resize(count);
  set.device.resize(count);
  set.host_storage.reserve(6 * count);
  set.device_storage.reserve(6 * count);
  const auto make = [&](int64_t out, int64_t in, LinearWeight& host, LinearWeight& device) {
    const Tensor& w =
        set.host_storage.emplace_back(random_bytes(DType::kF4E2M1x2, {out, in}, ++seed, 0, 255));
    const Tensor& sc = set.host_storage.emplace_back(
        random_bytes(DType::kF8E8M0, {out, in / 32}, ++seed, 117, 121));
    const Tensor& dw = set.device_storage.emplace_back(deepinfer::cuda::to_device(w.view()));
    const Tensor& dsc = set.device_storage.emplace_back(deepinfer::cuda::to_device(sc.view()));
    host = LinearWeight{w.view(), sc.view()};
    device = LinearWeight{dw.view(), dsc.view()};
  };
  for (int64_t e = 0; e < count; ++e) {
    make(inter, dim, set.host[e].w1, set.device[e].w1);
    make(inter, dim, set.host[e].w3, set.device[e].w3);
    make(dim, inter, set.host[e].w2, set.device[e].w2);
  }
  return set;
}

// A grouped expert GEMM: rows grouped by expert (offsets), host tensors.
struct Problem {
  int64_t experts = 0;
  int64_t n = 0;
  int64_t k = 0;
  std::vector<int32_t> offsets;  // E + 1
  Tensor x;                      // host [R, K] f32
  Tensor weight;                 // host [E, N, K] fp4
  Tensor scale;                  // host [E, N, K/32] ue8m0
};

// `experts` groups of fp4 weights [n, k], the experts' row counts, `extra_rows` rows past every
// expert (they stay unwritten); scale codes drawn from [lowest_scale, highest_scale] (117..121,
// near 2^-8: realistic weight magnitudes).
inline Problem make_problem(int64_t experts, int64_t n, int64_t k,
                            const std::vector<int32_t>& counts, int64_t extra_rows, uint32_t seed,
                            int lowest_scale = 117, int highest_scale = 121) {
  Problem p;
  p.experts = experts;
  p.n = n;
  p.k = k;
  p.offsets.push_back(0);
  for (int32_t c : counts) p.offsets.push_back(p.offsets.back() + c);
  const int64_t rows = p.offsets.back() + extra_rows;
  p.x = Tensor::empty(DType::kF32, {rows, k});
  const std::vector<float> values = testing::random_values(static_cast<size_t>(rows * k), seed);
  std::copy(values.begin(), values.end(), p.x.data<float>());
  p.weight = random_bytes(DType::kF4E2M1x2, {experts, n, k}, seed + 1, 0, 255);
  p.scale =
      random_bytes(DType::kF8E8M0, {experts, n, k / 32}, seed + 2, lowest_scale, highest_scale);
  return p;
}

// The CPU reference, expert by expert; rows outside every expert stay NaN.
inline Tensor reference(const Problem& p) {
  const int64_t rows = p.x.view().size(0);
  Tensor want = Tensor::empty(DType::kF32, {rows, p.n});
  std::fill(want.data<float>(), want.data<float>() + want.numel(), NAN);
  for (int64_t e = 0; e < p.experts; ++e) {
    const int64_t first = p.offsets[e];
    const int64_t count = p.offsets[e + 1] - first;
    if (count == 0) continue;
    linear(p.x.view().narrow(0, first, count),
           LinearWeight{p.weight.view().select(0, e), p.scale.view().select(0, e)},
           want.view().narrow(0, first, count), ActivationQuant::kFp8PerBlock32);
  }
  return want;
}

// top_k distinct experts per token, in random order.
inline Tensor random_routes(int64_t tokens, int64_t experts, int64_t top_k, uint32_t seed) {
  Tensor chosen = Tensor::empty(DType::kI32, {tokens, top_k});
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) ids[e] = static_cast<int32_t>(e);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::copy(ids.begin(), ids.begin() + top_k, chosen.data<int32_t>() + t * top_k);
  }
  return chosen;
}

// ops::cuda::moe_experts over tokens [first, first + count) with swiglu_limit 10 and the released
// activation quantizer, the fused path (DEEPINFER_MOE_FUSED) or not; the host copy of its output.
inline Tensor run_moe_op(const ExpertSet& set, const Tensor& x, const Tensor& chosen,
                         const Tensor& weights, int64_t first, int64_t count, bool fused = true) {
  const int64_t dim = x.view().size(1);
  Tensor dx = deepinfer::cuda::to_device(x.view().narrow(0, first, count));
  Tensor dc = deepinfer::cuda::to_device(chosen.view().narrow(0, first, count));
  Tensor dwt = deepinfer::cuda::to_device(weights.view().narrow(0, first, count));
  Tensor out = Tensor::empty(DType::kF32, {count, dim}, deepinfer::cuda::device_allocator());
  deepinfer::cuda::fill_bytes(out.view(), 0xFF);
  {
    const deepinfer::cuda::ScopedSwitch fused_path("DEEPINFER_MOE_FUSED", fused);
    ops::cuda::moe_experts(dx.view(), dc.view(), dwt.view(), set.device, 10.0f,
                           ActivationQuant::kFp8PerBlock32, out.view());
  }
  deepinfer::cuda::synchronize();
  return deepinfer::cuda::to_host(out.view());
}

}  // namespace deepinfer::ops::testing
