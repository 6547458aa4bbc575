// moe_experts on the GPU: the routed tokens are grouped by expert on the device (a counting
// sort, so the host never learns the group sizes and never waits), every expert's rows run
// through the same tile GEMM as `linear` in one grouped launch per projection, and each token
// sums its slots in ascending expert id. With the released numerics (FP8 activations) and FP4
// experts of aligned shapes, the three projections run on the grouped FP8 x FP4 tensor-core GEMM
// (moe_grouped_gemm.cu) instead.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear.cuh"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kSortThreads = 1024;
constexpr int kThreads = 256;
constexpr int kMaxTopK = 64;

struct SortArgs {
  const int32_t* experts;  // [N, k] (row stride)
  int64_t expert_stride;
  const float* weights;  // [N, k] (row stride)
  int64_t weight_stride;
  int64_t tokens;
  int k;
  int expert_count;
  int32_t* offsets;        // [E + 1]
  int32_t* sorted_token;   // [N * k]
  float* sorted_weight;    // [N * k]
  int32_t* slot_position;  // [N * k]: where (token, slot) landed, -1 for a bad expert id
  int* error;
};

// One block: count per expert, exclusive scan, place. The order inside a group is whatever the
// atomics give: every row's GEMM result is independent of its group and position.
__global__ void __launch_bounds__(kSortThreads) sort_by_expert_kernel(SortArgs args) {
  extern __shared__ int32_t shared[];
  int32_t* counts = shared;                      // [E]
  int32_t* cursor = shared + args.expert_count;  // [E]
  for (int e = threadIdx.x; e < args.expert_count; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int64_t entries = args.tokens * args.k;
  for (int64_t i = threadIdx.x; i < entries; i += blockDim.x) {
    const int32_t e = args.experts[(i / args.k) * args.expert_stride + i % args.k];
    if (e >= 0 && e < args.expert_count) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t running = 0;
    for (int e = 0; e < args.expert_count; ++e) {
      // A group larger than the token count means an expert repeated within a token: the
      // grouped GEMM's grid covers at most `tokens` rows per expert.
      if (counts[e] > args.tokens) {
        deepinfer::cuda::record_error(args.error, deepinfer::cuda::kMoeExpertOutOfBounds);
      }
      args.offsets[e] = running;
      cursor[e] = running;
      running += counts[e];
    }
    args.offsets[args.expert_count] = running;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < entries; i += blockDim.x) {
    const int64_t token = i / args.k;
    const int32_t e = args.experts[token * args.expert_stride + i % args.k];
    if (e < 0 || e >= args.expert_count) {
      deepinfer::cuda::record_error(args.error, deepinfer::cuda::kMoeExpertOutOfBounds);
      args.slot_position[i] = -1;
      continue;
    }
    const int32_t position = atomicAdd(&cursor[e], 1);
    args.sorted_token[position] = static_cast<int32_t>(token);
    args.sorted_weight[position] = args.weights[token * args.weight_stride + i % args.k];
    args.slot_position[i] = position;
  }
}

// rows[p, :] = x[sorted_token[p], :] for the rows that were placed (offsets[E] of them).
__global__ void gather_rows_kernel(DeviceRows<const float> x, const int32_t* sorted_token,
                                   const int32_t* placed, int expert_count, float* rows) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t p = index / x.cols;
  if (p >= placed[expert_count]) return;
  const int64_t c = index % x.cols;
  rows[index] = x.row(sorted_token[p])[c];
}

// out[t, d] = sum of the token's slot results in ascending expert id, starting from 0 and
// adding in that order (the CPU reference's sequence of additions).
__global__ void combine_kernel(const float* results, int64_t dim, const int32_t* experts,
                               int64_t expert_stride, const int32_t* slot_position, int k,
                               DeviceRows<float> out) {
  __shared__ int32_t order[kMaxTopK];
  __shared__ bool broken;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    broken = false;
    const int32_t* chosen = experts + t * expert_stride;
    for (int s = 0; s < k; ++s) {
      order[s] = s;
      if (slot_position[t * k + s] < 0) broken = true;
    }
    for (int s = 1; s < k; ++s) {  // insertion sort by expert id (k is small)
      const int32_t slot = order[s];
      int j = s - 1;
      while (j >= 0 && chosen[order[j]] > chosen[slot]) {
        order[j + 1] = order[j];
        --j;
      }
      order[j + 1] = slot;
    }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float sum = 0.0f;
    if (broken) {
      sum = __int_as_float(0x7fc00000);
    } else {
      for (int s = 0; s < k; ++s) {
        sum = __fadd_rn(sum, results[slot_position[t * k + order[s]] * dim + d]);
      }
    }
    out.row(t)[d] = sum;
  }
}

// Describes one role of every expert and checks they share a shape.
void describe_role(std::span<const ExpertWeights> experts, const LinearWeight ExpertWeights::*role,
                   int64_t out, int64_t in, const char* name, std::vector<DeviceWeight>& table) {
  for (size_t e = 0; e < experts.size(); ++e) {
    const DeviceWeight w = describe(experts[e].*role);
    if (w.out != out || w.in != in) {
      DI_THROW("moe_experts: expert ", e, " ", name, " is ", (experts[e].*role).weight.to_string(),
               ", expected [", out, ", ", in, "]");
    }
    table.push_back(w);
  }
}

}  // namespace

void moe_experts(const TensorView& x, const TensorView& experts, const TensorView& weights,
                 std::span<const ExpertWeights> expert_weights, float swiglu_limit,
                 ActivationQuant quant, const TensorView& out) {
  const auto in = device_rows<const float>(x, "moe input");
  const auto chosen = device_rows<const int32_t>(experts, "moe experts");
  const auto route_weights = device_rows<const float>(weights, "moe weights");
  const auto y = device_rows<float>(out, "moe output");
  const int64_t n = in.rows;
  const int64_t dim = in.cols;
  const int64_t k = chosen.cols;
  DI_CHECK(chosen.rows == n && route_weights.rows == n && route_weights.cols == k && y.rows == n &&
               y.cols == dim,
           "moe_experts shapes: x ", x.to_string(), ", experts ", experts.to_string(), ", weights ",
           weights.to_string(), ", out ", out.to_string());
  DI_CHECK(k >= 1 && k <= kMaxTopK, "num_experts_per_tok ", k, " must be in [1, ", kMaxTopK, "]");
  DI_CHECK(!expert_weights.empty() && expert_weights.size() <= 65535,
           "moe_experts needs 1 to 65535 experts, got ", expert_weights.size());
  if (n == 0) return;
  const int expert_count = static_cast<int>(expert_weights.size());
  const int64_t inter = expert_weights[0].w1.out_features();
  std::vector<DeviceWeight> host_table;
  host_table.reserve(expert_weights.size() * 3);
  describe_role(expert_weights, &ExpertWeights::w1, inter, dim, "w1", host_table);
  describe_role(expert_weights, &ExpertWeights::w3, inter, dim, "w3", host_table);
  describe_role(expert_weights, &ExpertWeights::w2, dim, inter, "w2", host_table);
  // A layer's experts do not move while the model lives: their descriptor table is uploaded
  // once and reused by every step.
  static_assert(sizeof(DeviceWeight) == 9 * sizeof(int64_t), "DeviceWeight must have no padding");
  const auto* table = static_cast<const DeviceWeight*>(
      deepinfer::cuda::resident_copy(host_table.data(), host_table.size() * sizeof(DeviceWeight)));

  const int64_t entries = n * k;
  const bool tensor_cores = quant == ActivationQuant::kFp8PerBlock32 &&
                            std::all_of(host_table.begin(), host_table.end(), grouped_fp4_supports);
  // The tile GEMM needs the activations quantized beforehand; the tensor-core one does it itself.
  const bool quantized = quant == ActivationQuant::kFp8PerBlock32 && !tensor_cores;
  const auto grouped_gemm = tensor_cores ? launch_grouped_fp4 : launch_linear;
  StreamBuffer offsets(static_cast<size_t>(expert_count + 1) * sizeof(int32_t));
  StreamBuffer sorted_token(static_cast<size_t>(entries) * sizeof(int32_t));
  StreamBuffer sorted_weight(static_cast<size_t>(entries) * sizeof(float));
  StreamBuffer slot_position(static_cast<size_t>(entries) * sizeof(int32_t));
  StreamBuffer rows(static_cast<size_t>(entries * dim) * sizeof(float));
  StreamBuffer rows_quantized(quantized ? static_cast<size_t>(entries * dim) * sizeof(float) : 0);
  StreamBuffer gate(static_cast<size_t>(entries * inter) * sizeof(float));
  StreamBuffer up(static_cast<size_t>(entries * inter) * sizeof(float));
  StreamBuffer gate_quantized(quantized ? static_cast<size_t>(entries * inter) * sizeof(float) : 0);
  StreamBuffer results(static_cast<size_t>(entries * dim) * sizeof(float));

  SortArgs sort{};
  sort.experts = chosen.data;
  sort.expert_stride = chosen.stride;
  sort.weights = route_weights.data;
  sort.weight_stride = route_weights.stride;
  sort.tokens = n;
  sort.k = static_cast<int>(k);
  sort.expert_count = expert_count;
  sort.offsets = offsets.as<int32_t>();
  sort.sorted_token = sorted_token.as<int32_t>();
  sort.sorted_weight = sorted_weight.as<float>();
  sort.slot_position = slot_position.as<int32_t>();
  sort.error = deepinfer::cuda::kernel_error_word();
  const size_t sort_shared = static_cast<size_t>(expert_count) * 2 * sizeof(int32_t);
  if (sort_shared > 48 * 1024) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(sort_by_expert_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(sort_shared)));
  }
  sort_by_expert_kernel<<<1, kSortThreads, sort_shared, current_stream()>>>(sort);
  DI_CUDA_LAUNCHED(sort_by_expert_kernel);
  gather_rows_kernel<<<blocks_for(entries * dim, kThreads), kThreads, 0, current_stream()>>>(
      in, sorted_token.as<int32_t>(), offsets.as<int32_t>(), expert_count, rows.as<float>());
  DI_CUDA_LAUNCHED(gather_rows_kernel);

  const DeviceRows<const float> gathered{rows.as<float>(), entries, dim, dim};
  DeviceRows<const float> gemm_in = gathered;
  if (quantized) {
    quantize_activation(gathered, rows_quantized.as<float>());
    gemm_in.data = rows_quantized.as<float>();
  }
  GemmGroups groups;
  groups.offsets = offsets.as<int32_t>();
  groups.count = expert_count;
  groups.max_rows = n;  // an expert appears at most once per token (checked by the sort)
  const DeviceRows<float> gate_rows{gate.as<float>(), entries, inter, inter};
  const DeviceRows<float> up_rows{up.as<float>(), entries, inter, inter};
  groups.weights = table;
  grouped_gemm(gemm_in, host_table[0], gate_rows, groups);
  groups.weights = table + expert_count;
  grouped_gemm(gemm_in, host_table[static_cast<size_t>(expert_count)], up_rows, groups);

  const Device device = x.device();
  const auto view = [&](void* data, Shape shape) {
    return TensorView::contiguous(data, DType::kF32, shape, device);
  };
  // Rows past offsets[E] (only with bad expert ids) hold garbage that nothing reads.
  ops::cuda::swiglu(view(gate.as<float>(), {entries, inter}),
                    view(up.as<float>(), {entries, inter}), swiglu_limit,
                    view(sorted_weight.as<float>(), {entries}),
                    view(gate.as<float>(), {entries, inter}));
  DeviceRows<const float> down_in{gate.as<float>(), entries, inter, inter};
  if (quantized) {
    quantize_activation(down_in, gate_quantized.as<float>());
    down_in.data = gate_quantized.as<float>();
  }
  groups.weights = table + 2 * expert_count;
  grouped_gemm(down_in, host_table[2 * static_cast<size_t>(expert_count)],
               DeviceRows<float>{results.as<float>(), entries, dim, dim}, groups);

  combine_kernel<<<static_cast<unsigned>(n), kThreads, 0, current_stream()>>>(
      results.as<float>(), dim, chosen.data, chosen.stride, slot_position.as<int32_t>(),
      static_cast<int>(k), y);
  DI_CUDA_LAUNCHED(combine_kernel);
}

}  // namespace deepinfer::ops::cuda
