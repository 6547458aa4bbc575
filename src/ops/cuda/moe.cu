// MoE routing (score function, selection bias, renormalization) and the clamped SwiGLU.
// Part 2: permutation into expert-contiguous order and the grouped FP4 GEMM.
#include <climits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopK = 32;

struct RouteArgs {
  const float* logits;  // [M, E]
  int64_t experts;
  const float* bias;  // null: none
  ScoreFunction score_function;
  float temperature;
  int top_k;
  bool normalize;
  float routed_scale;
  DeviceRows<float> weights;
  DeviceRows<int32_t> chosen;
};

// (value, index) ordered as the reference's partial sort: larger value, then lower index.
__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}

// Every lane of the warp ends with the warp's best (value, index) under ranks_before.
__device__ __forceinline__ void warp_best(float& best, int& best_index) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (ranks_before(other, other_index, best, best_index)) {
      best = other;
      best_index = other_index;
    }
  }
}

// Row m's scores and biased scores into shared memory, by the whole block (256 threads: the
// softmax's block reductions are in that order). Ends with a barrier.
__device__ __forceinline__ void route_scores(const RouteArgs& args, int64_t m, float* scores,
                                             float* biased, float* scratch) {
  const int64_t experts = args.experts;
  const float* row = args.logits + m * experts;
  for (int64_t i = threadIdx.x; i < experts; i += blockDim.x) scores[i] = row[i] / args.temperature;
  if (args.score_function == ScoreFunction::kSoftmax) {
    float local_max = -INFINITY;
    for (int64_t i = threadIdx.x; i < experts; i += blockDim.x)
      local_max = fmaxf(local_max, scores[i]);
    const float max_value = deepinfer::cuda::block_max(local_max, scratch);
    float partial = 0.0f;
    for (int64_t i = threadIdx.x; i < experts; i += blockDim.x) {
      scores[i] = expf(scores[i] - max_value);
      partial += scores[i];
    }
    const float sum = deepinfer::cuda::block_sum(partial, scratch);
    for (int64_t i = threadIdx.x; i < experts; i += blockDim.x) scores[i] /= sum;
  } else {
    for (int64_t i = threadIdx.x; i < experts; i += blockDim.x) {
      const float s = scores[i];
      scores[i] = args.score_function == ScoreFunction::kSigmoid
                      ? 1.0f / (1.0f + expf(-s))
                      : sqrtf(s > 20.0f ? s : log1pf(expf(s)));  // torch's softplus threshold
    }
  }
  for (int64_t i = threadIdx.x; i < experts; i += blockDim.x) {
    biased[i] = scores[i] + (args.bias != nullptr ? args.bias[i] : 0.0f);
  }
  __syncthreads();
}

// Row m's weights (the picked experts' unbiased scores, renormalized and scaled) and experts,
// by one thread.
__device__ __forceinline__ void write_route(const RouteArgs& args, int64_t m, const float* scores,
                                            const int* picked) {
  float sum = 0.0f;
  for (int i = 0; i < args.top_k; ++i) sum += scores[picked[i]];
  for (int i = 0; i < args.top_k; ++i) {
    float weight = scores[picked[i]];
    if (args.normalize && args.top_k > 1) weight /= sum + 1e-20f;
    args.weights.row(m)[i] = weight * args.routed_scale;
    args.chosen.row(m)[i] = picked[i];
  }
}

// One block per row: scores and biased scores in shared memory, then top_k rounds of a
// block-wide argmax (top_k is small: 6 of 384 in V4.1).
__global__ void __launch_bounds__(kThreads) route_kernel(RouteArgs args) {
  extern __shared__ float shared[];  // scores[E], biased[E]
  __shared__ float scratch[32];
  __shared__ float best_values[32];
  __shared__ int best_indices[32];
  __shared__ int picked[kMaxTopK];
  const int64_t m = blockIdx.x;
  const int64_t experts = args.experts;
  float* scores = shared;
  float* biased = shared + experts;
  route_scores(args, m, scores, biased, scratch);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int round = 0; round < args.top_k; ++round) {
    float best = -INFINITY;
    int best_index = INT_MAX;
    for (int64_t i = threadIdx.x; i < experts; i += blockDim.x) {
      bool taken = false;
      for (int r = 0; r < round; ++r) taken |= picked[r] == static_cast<int>(i);
      if (!taken && ranks_before(biased[i], static_cast<int>(i), best, best_index)) {
        best = biased[i];
        best_index = static_cast<int>(i);
      }
    }
    warp_best(best, best_index);
    if (lane == 0) {
      best_values[warp] = best;
      best_indices[warp] = best_index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
        if (ranks_before(best_values[w], best_indices[w], best_values[0], best_indices[0])) {
          best_values[0] = best_values[w];
          best_indices[0] = best_indices[w];
        }
      }
      picked[round] = best_indices[0];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  write_route(args, m, scores, picked);
}

// route_kernel with the selection in one warp: lane l holds the biased scores of experts l,
// l + 32, ... in registers, and each of the top_k rounds is a scan of those plus one warp
// argmax, with no barrier (route_kernel's rounds cost two barriers and thread 0 merging the 8
// warps' winners serially). The order (larger value, then lower index) is total for values that
// are not NaN, so the argmax is the same expert whichever way it is reduced, and so are the
// weights (write_route, the same code). The scores are route_kernel's, by the whole block.
constexpr int kMaxLaneExperts = 16;  // up to 512 experts

__global__ void __launch_bounds__(kThreads) route_warp_select_kernel(RouteArgs args) {
  extern __shared__ float shared[];  // scores[E], biased[E]
  __shared__ float scratch[32];
  __shared__ int picked[kMaxTopK];
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t m = blockIdx.x;
  const int experts = static_cast<int>(args.experts);
  float* scores = shared;
  float* biased = shared + experts;
  route_scores(args, m, scores, biased, scratch);
  if (threadIdx.x >= 32) return;
  const int lane = static_cast<int>(threadIdx.x);
  float values[kMaxLaneExperts];
  unsigned taken = 0;  // bit s: expert lane + 32 * s is picked or absent
#pragma unroll
  for (int s = 0; s < kMaxLaneExperts; ++s) {
    const int i = lane + 32 * s;
    values[s] = i < experts ? biased[i] : -INFINITY;
    if (i >= experts) taken |= 1u << s;
  }
  for (int round = 0; round < args.top_k; ++round) {
    float best = -INFINITY;
    int best_index = INT_MAX;
#pragma unroll
    for (int s = 0; s < kMaxLaneExperts; ++s) {
      const int i = lane + 32 * s;
      if (!((taken >> s) & 1u) && ranks_before(values[s], i, best, best_index)) {
        best = values[s];
        best_index = i;
      }
    }
    warp_best(best, best_index);
    if (best_index != INT_MAX && best_index % 32 == lane) taken |= 1u << (best_index / 32);
    if (lane == 0) picked[round] = best_index;
  }
  __syncwarp();
  if (lane == 0) write_route(args, m, scores, picked);
}

// false (or DEEPINFER_ROUTE_WARP_SELECT=0): route_kernel.
RuntimeSwitch kRouteWarpSelect{"DEEPINFER_ROUTE_WARP_SELECT", true};

__global__ void swiglu_kernel(DeviceRows<const float> gate, DeviceRows<const float> up, float limit,
                              const float* row_weight, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= gate.rows * gate.cols) return;
  const int64_t m = index / gate.cols;
  const int64_t i = index % gate.cols;
  float a = gate.row(m)[i];
  float b = up.row(m)[i];
  if (limit > 0) {
    b = fminf(fmaxf(b, -limit), limit);
    a = fminf(a, limit);
  }
  float y = a / (1.0f + expf(-a)) * b;
  if (row_weight != nullptr) y = row_weight[m] * y;
  out.row(m)[i] = y;
}

}  // namespace

void route(const TensorView& x, const TensorView& gate, const TensorView& bias,
           const RouterParams& params, const TensorView& weights_out,
           const TensorView& experts_out) {
  const auto in = device_rows<const float>(x, "router input");
  RouteArgs args{};
  args.experts = gate.size(0);
  args.top_k = params.top_k;
  args.weights = device_rows<float>(weights_out, "router weights");
  args.chosen = device_rows<int32_t>(experts_out, "router experts");
  DI_CHECK(args.top_k >= 1 && args.top_k <= args.experts && args.top_k <= kMaxTopK &&
               args.weights.rows == in.rows && args.weights.cols == args.top_k &&
               args.chosen.rows == in.rows && args.chosen.cols == args.top_k,
           "route shapes");
  if (bias.numel() > 0) {
    args.bias = deepinfer::cuda::device_flat<const float>(bias, "router bias");
    DI_CHECK(bias.numel() == args.experts, "router bias ", bias.to_string());
  }
  if (in.rows == 0) return;
  deepinfer::cuda::StreamBuffer logits(static_cast<size_t>(in.rows * args.experts) * sizeof(float));
  deepinfer::ops::cuda::linear(
      x, LinearWeight{gate, TensorView()},
      TensorView::contiguous(logits.as<float>(), DType::kF32, {in.rows, args.experts},
                             Device::cuda(gate.device().index)));
  args.logits = logits.as<float>();
  args.score_function = params.score_function;
  args.temperature = params.temperature;
  args.normalize = params.normalize;
  args.routed_scale = params.routed_scale;
  const size_t shared_bytes = static_cast<size_t>(2 * args.experts) * sizeof(float);
  DI_CHECK(shared_bytes <= 48 * 1024, "route: ", args.experts, " experts exceed shared memory");
  if (kRouteWarpSelect.enabled() && args.experts <= 32 * kMaxLaneExperts) {
    launch_dependent(route_warp_select_kernel, static_cast<unsigned>(in.rows), kThreads,
                     shared_bytes, current_stream(), args);
    return;
  }
  route_kernel<<<static_cast<unsigned>(in.rows), kThreads, shared_bytes, current_stream()>>>(args);
  DI_CUDA_LAUNCHED(route_kernel);
}

void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& row_weight,
            const TensorView& out) {
  const auto g = device_rows<const float>(gate, "swiglu gate");
  const auto u = device_rows<const float>(up, "swiglu up");
  const auto o = device_rows<float>(out, "swiglu output");
  DI_CHECK(g.rows == u.rows && g.cols == u.cols && o.rows == g.rows && o.cols == g.cols,
           "swiglu shapes");
  const float* rw = nullptr;
  if (row_weight.numel() > 0) {
    rw = deepinfer::cuda::device_flat<const float>(row_weight, "swiglu row weights");
    DI_CHECK(row_weight.numel() == g.rows, "swiglu row weights ", row_weight.to_string());
  }
  if (g.rows * g.cols == 0) return;
  swiglu_kernel<<<blocks_for(g.rows * g.cols, kThreads), kThreads, 0, current_stream()>>>(
      g, u, limit, rw, o);
  DI_CUDA_LAUNCHED(swiglu_kernel);
}

}  // namespace deepinfer::ops::cuda
