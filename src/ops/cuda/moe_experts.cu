// moe_experts on the GPU: the routed tokens are grouped by expert on the device (a counting
// sort, so the host never learns the group sizes and never waits), every expert's rows run
// through the same tile GEMM as `linear` in one grouped launch per projection, and each token
// sums its slots in ascending expert id. With the released numerics (FP8 activations) and FP4
// experts of aligned shapes, the three projections run on the grouped FP8 x FP4 tensor-core GEMM
// (moe_grouped_gemm.cu) instead, as one fused sequence: the routed rows quantized straight from
// x, w1 and w3 in one launch, the SwiGLU folded into w2's quantizer (launch_moe_fp4_experts).
// A call makes one device allocation; the experts' descriptor table is built once per layer.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cub/block/block_scan.cuh>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/moe_grouped_gemm.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kSortThreads = 1024;
constexpr int kThreads = 256;
constexpr int kMaxTopK = 64;

// false: the released FP4 path goes back to a gather, one launch_grouped_fp4 per projection
// (each quantizing its input) and ops::cuda::swiglu in between (the path before the fused one;
// the same bits).
// DEEPINFER_MOE_FUSED=0 takes it at run time (a same-binary comparison on the GPU).
RuntimeSwitch kFusedFp4Experts{"DEEPINFER_MOE_FUSED", true};

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
  wait_for_prior_grids();
  allow_dependent_grids();
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
  // Exclusive scan of the counts, kSortThreads experts at a time.
  using Scan = cub::BlockScan<int32_t, kSortThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int32_t running = 0;  // the same in every thread
  for (int base = 0; base < args.expert_count; base += kSortThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    const int32_t count = e < args.expert_count ? counts[e] : 0;
    // A group larger than the token count means an expert repeated within a token: the
    // grouped GEMM's grid covers at most `tokens` rows per expert.
    if (count > args.tokens) {
      deepinfer::cuda::record_error(args.error, deepinfer::cuda::kMoeExpertOutOfBounds);
    }
    int32_t at = 0;
    int32_t total = 0;
    Scan(scan_storage).ExclusiveSum(count, at, total);
    if (e < args.expert_count) {
      args.offsets[e] = running + at;
      cursor[e] = running + at;
    }
    running += total;
    __syncthreads();  // the scan's storage is reused by the next chunk of experts
  }
  if (threadIdx.x == 0) args.offsets[args.expert_count] = running;
  __syncthreads();  // explicit, though the loop's last barrier already published the cursors
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
  // Each slot's result row, in ascending expert id; -1 when a slot was never placed (the row
  // becomes NaN). Thread 0 sorts from shared copies: a decode block is one token, so its time is
  // the latency of these few loads.
  __shared__ int32_t chosen[kMaxTopK];
  __shared__ int64_t row_start[kMaxTopK];
  __shared__ bool broken;
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t t = blockIdx.x;
  if (threadIdx.x < k) chosen[threadIdx.x] = experts[t * expert_stride + threadIdx.x];
  if (threadIdx.x < k) row_start[threadIdx.x] = slot_position[t * k + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t order[kMaxTopK];
    broken = false;
    for (int s = 0; s < k; ++s) {
      order[s] = s;
      if (row_start[s] < 0) broken = true;
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
    int64_t sorted[kMaxTopK];
    for (int s = 0; s < k; ++s) sorted[s] = row_start[order[s]] * dim;
    for (int s = 0; s < k; ++s) row_start[s] = sorted[s];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float sum = 0.0f;
    if (broken) {
      sum = __int_as_float(0x7fc00000);
    } else {
      for (int s = 0; s < k; ++s) sum = __fadd_rn(sum, results[row_start[s] + d]);
    }
    out.row(t)[d] = sum;
  }
}

// combine_kernel's sums, element for element (the same __fadd_rn chain from 0 in ascending expert
// id), spread over more of the machine: a block takes one token's columns
// [blockIdx.x * quads_per_block * 4, ...) as float4s, and every slot's load is issued before the
// first add. combine_kernel gives a decode token one block whose 256 threads walk 20 columns
// each, waiting on the six loads of one column before those of the next.
constexpr int kCombineThreads = 128;
constexpr int kCombineSlots = 8;  // slots held in registers; more take combine_kernel

__global__ void __launch_bounds__(kCombineThreads)
    combine_columns_kernel(const float* results, int64_t dim, const int32_t* experts,
                           int64_t expert_stride, const int32_t* slot_position, int k,
                           int64_t quads_per_block, DeviceRows<float> out) {
  __shared__ int64_t row_start[kCombineSlots];
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t t = blockIdx.y;
  // Slot s goes to its place in ascending expert id, equal ids in slot order: the place
  // combine_kernel's (stable) insertion sort gives it, found by every slot at once.
  bool broken = false;
  if (threadIdx.x < k) {
    const int s = static_cast<int>(threadIdx.x);
    const int32_t* chosen = experts + t * expert_stride;
    const int32_t mine = chosen[s];
    const int32_t position = slot_position[t * k + s];
    int place = 0;
    for (int o = 0; o < k; ++o) {
      const int32_t other = chosen[o];
      place += other < mine || (other == mine && o < s);
    }
    row_start[place] = static_cast<int64_t>(position) * dim;
    broken = position < 0;
  }
  broken = __syncthreads_or(broken);
  const int64_t quads = dim / 4;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * quads_per_block;
  const int64_t end = deepinfer::cuda::min64(quads, first + quads_per_block);
  float4* y = reinterpret_cast<float4*>(out.row(t));
  for (int64_t q = first + threadIdx.x; q < end; q += kCombineThreads) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (broken) {
      const float nan = __int_as_float(0x7fc00000);
      sum = make_float4(nan, nan, nan, nan);
    } else {
      float4 slots[kCombineSlots];
#pragma unroll
      for (int s = 0; s < kCombineSlots; ++s) {
        if (s < k) slots[s] = reinterpret_cast<const float4*>(results + row_start[s])[q];
      }
#pragma unroll
      for (int s = 0; s < kCombineSlots; ++s) {
        if (s < k) {
          sum.x = __fadd_rn(sum.x, slots[s].x);
          sum.y = __fadd_rn(sum.y, slots[s].y);
          sum.z = __fadd_rn(sum.z, slots[s].z);
          sum.w = __fadd_rn(sum.w, slots[s].w);
        }
      }
    }
    y[q] = sum;
  }
}

// false (or DEEPINFER_MOE_COMBINE_COLUMNS=0): combine_kernel, one block per token.
RuntimeSwitch kCombineColumns{"DEEPINFER_MOE_COMBINE_COLUMNS", true};

void launch_combine(const float* results, int64_t dim, const int32_t* experts,
                    int64_t expert_stride, const int32_t* slot_position, int k,
                    DeviceRows<float> y) {
  const bool columns = kCombineColumns.enabled();
  // (tokens are gridDim.y, at most 65535)
  if (columns && k <= kCombineSlots && dim % 4 == 0 && y.stride % 4 == 0 &&
      aligned_to(y.data, 16) && aligned_to(results, 16) && y.rows <= 65535) {
    // One float4 a thread for a few tokens (the whole machine on one token's columns); several
    // for many tokens, so that a prefill's blocks do not each repeat the slot ordering for 512
    // columns only.
    const int64_t quads = dim / 4;
    const int64_t quads_per_block =
        y.rows <= 32 ? kCombineThreads : deepinfer::cuda::min64(quads, 4 * kCombineThreads);
    const int64_t column_blocks = (quads + quads_per_block - 1) / quads_per_block;
    launch_dependent(combine_columns_kernel,
                     dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(y.rows)),
                     kCombineThreads, 0, current_stream(), results, dim, experts, expert_stride,
                     slot_position, k, quads_per_block, y);
    return;
  }
  launch_dependent(combine_kernel, static_cast<unsigned>(y.rows), kThreads, 0, current_stream(),
                   results, dim, experts, expert_stride, slot_position, k, y);
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

// A layer's expert descriptors: [w1 of every expert, w3 of every expert, w2 of every expert] on
// the host and resident on the device, and whether the tensor-core kernel takes them all.
struct ExpertTable {
  std::vector<DeviceWeight> host;
  const DeviceWeight* device = nullptr;
  bool fp4_kernel = false;
};

// Whether `table` still describes `experts` of inputs `dim` wide: every role's weight and scale
// pointers, and the full descriptors (shape, dtype, scale layout) of the first and last expert
// (a mismatch rebuilds the table, which reports bad shapes). A model's experts never move; this
// only guards against a span reused for other weights (tests).
bool table_matches(const ExpertTable& table, std::span<const ExpertWeights> experts, int64_t dim) {
  const size_t count = experts.size();
  if (table.host.size() != 3 * count || table.host[0].in != dim) return false;
  using Role = const LinearWeight ExpertWeights::*;
  const Role roles[3] = {&ExpertWeights::w1, &ExpertWeights::w3, &ExpertWeights::w2};
  for (size_t r = 0; r < 3; ++r) {
    for (size_t e = 0; e < count; ++e) {
      const LinearWeight& w = experts[e].*roles[r];
      const DeviceWeight& cached = table.host[r * count + e];
      if (w.weight.raw_data() != cached.bytes ||
          (w.scale.numel() > 0 ? w.scale.raw_data() : nullptr) != cached.scale) {
        return false;
      }
    }
    for (const size_t e : {size_t{0}, count - 1}) {
      const DeviceWeight now = describe(experts[e].*roles[r]);
      if (std::memcmp(&now, &table.host[r * count + e], sizeof(DeviceWeight)) != 0) return false;
    }
  }
  return true;
}

// The descriptor table of `experts`, built and uploaded (resident_copy) on first use and then
// kept per expert span, so a decode step does not describe the 3 x 384 weights and compare the
// ~83 KB table with resident_copy's entries again.
const ExpertTable& expert_table(std::span<const ExpertWeights> experts, int64_t dim) {
  struct Entry {
    const ExpertWeights* data = nullptr;
    size_t size = 0;
    std::unique_ptr<ExpertTable> table;
  };
  static std::mutex mutex;
  static std::vector<Entry> entries;
  // Replaced tables stay alive: a caller may still hold a reference to one.
  static std::vector<std::unique_ptr<ExpertTable>> retired;
  const std::lock_guard lock(mutex);
  Entry* found = nullptr;
  for (Entry& entry : entries) {
    if (entry.data == experts.data() && entry.size == experts.size()) found = &entry;
  }
  if (found != nullptr && table_matches(*found->table, experts, dim)) return *found->table;
  auto table = std::make_unique<ExpertTable>();
  const int64_t inter = experts[0].w1.out_features();
  table->host.reserve(experts.size() * 3);
  describe_role(experts, &ExpertWeights::w1, inter, dim, "w1", table->host);
  describe_role(experts, &ExpertWeights::w3, inter, dim, "w3", table->host);
  describe_role(experts, &ExpertWeights::w2, dim, inter, "w2", table->host);
  // A layer's experts do not move while the model lives: their descriptor table is uploaded
  // once and reused by every step.
  static_assert(sizeof(DeviceWeight) == 9 * sizeof(int64_t), "DeviceWeight must have no padding");
  table->device = static_cast<const DeviceWeight*>(deepinfer::cuda::resident_copy(
      table->host.data(), table->host.size() * sizeof(DeviceWeight)));
  table->fp4_kernel = std::all_of(table->host.begin(), table->host.end(), grouped_fp4_supports);
  if (found != nullptr) {
    retired.push_back(std::move(found->table));
    found->table = std::move(table);
    return *found->table;
  }
  entries.push_back(Entry{experts.data(), experts.size(), std::move(table)});
  return *entries.back().table;
}

// Pieces of one device allocation, each on 256 bytes.
class ScratchLayout {
 public:
  size_t take(size_t bytes) {
    const size_t at = used_;
    used_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t bytes() const { return used_; }

 private:
  size_t used_ = 0;
};

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
  const ExpertTable& expert_descriptors = expert_table(expert_weights, dim);
  const std::vector<DeviceWeight>& host_table = expert_descriptors.host;
  const DeviceWeight* table = expert_descriptors.device;
  const int64_t inter = host_table[0].out;

  const int64_t entries = n * k;
  const bool tensor_cores =
      quant == ActivationQuant::kFp8PerBlock32 && expert_descriptors.fp4_kernel;
  const bool fused = tensor_cores && kFusedFp4Experts.enabled();
  // The tile GEMM needs the activations quantized beforehand; the tensor-core one does it itself.
  const bool quantized = quant == ActivationQuant::kFp8PerBlock32 && !tensor_cores;
  const auto grouped_gemm = tensor_cores ? launch_grouped_fp4 : launch_linear;
  MoeFp4Tables fp4_tables;
  fp4_tables.w1 = table;
  fp4_tables.w3 = table + expert_count;
  fp4_tables.w2 = table + 2 * expert_count;
  fp4_tables.w13_shape = host_table[0];
  fp4_tables.w2_shape = host_table[2 * static_cast<size_t>(expert_count)];

  // Every buffer of the call from one allocation.
  ScratchLayout layout;
  const auto f32_bytes = [](int64_t count) { return static_cast<size_t>(count) * sizeof(float); };
  const size_t offsets_at = layout.take(static_cast<size_t>(expert_count + 1) * sizeof(int32_t));
  const size_t sorted_token_at = layout.take(static_cast<size_t>(entries) * sizeof(int32_t));
  const size_t sorted_weight_at = layout.take(f32_bytes(entries));
  const size_t slot_position_at = layout.take(static_cast<size_t>(entries) * sizeof(int32_t));
  const size_t results_at = layout.take(f32_bytes(entries * dim));
  const size_t fused_at = layout.take(fused ? moe_fp4_scratch_bytes(entries, fp4_tables) : 0);
  const size_t rows_at = layout.take(fused ? 0 : f32_bytes(entries * dim));
  const size_t rows_quantized_at = layout.take(quantized ? f32_bytes(entries * dim) : 0);
  const size_t gate_at = layout.take(fused ? 0 : f32_bytes(entries * inter));
  const size_t up_at = layout.take(fused ? 0 : f32_bytes(entries * inter));
  const size_t gate_quantized_at = layout.take(quantized ? f32_bytes(entries * inter) : 0);
  StreamBuffer scratch(layout.bytes());
  const auto piece = [&](size_t at) { return scratch.as<uint8_t>() + at; };
  auto* offsets = reinterpret_cast<int32_t*>(piece(offsets_at));
  auto* sorted_token = reinterpret_cast<int32_t*>(piece(sorted_token_at));
  auto* sorted_weight = reinterpret_cast<float*>(piece(sorted_weight_at));
  auto* slot_position = reinterpret_cast<int32_t*>(piece(slot_position_at));
  auto* results = reinterpret_cast<float*>(piece(results_at));

  SortArgs sort{};
  sort.experts = chosen.data;
  sort.expert_stride = chosen.stride;
  sort.weights = route_weights.data;
  sort.weight_stride = route_weights.stride;
  sort.tokens = n;
  sort.k = static_cast<int>(k);
  sort.expert_count = expert_count;
  sort.offsets = offsets;
  sort.sorted_token = sorted_token;
  sort.sorted_weight = sorted_weight;
  sort.slot_position = slot_position;
  sort.error = deepinfer::cuda::kernel_error_word();
  const size_t sort_shared = static_cast<size_t>(expert_count) * 2 * sizeof(int32_t);
  if (sort_shared > 32 * 1024) {  // with the scan's static storage, past the default 48 KB
    DI_CUDA_CHECK(cudaFuncSetAttribute(sort_by_expert_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(sort_shared)));
  }
  launch_dependent(sort_by_expert_kernel, 1, kSortThreads, sort_shared, current_stream(), sort);

  GemmGroups groups;
  groups.offsets = offsets;
  groups.count = expert_count;
  groups.max_rows = n;  // an expert appears at most once per token (checked by the sort)
  const DeviceRows<float> results_rows{results, entries, dim, dim};
  if (fused) {
    launch_moe_fp4_experts(in, sorted_token, sorted_weight, groups, entries, fp4_tables,
                           swiglu_limit, piece(fused_at), results_rows);
  } else {
    float* rows = reinterpret_cast<float*>(piece(rows_at));
    float* gate = reinterpret_cast<float*>(piece(gate_at));
    float* up = reinterpret_cast<float*>(piece(up_at));
    gather_rows_kernel<<<blocks_for(entries * dim, kThreads), kThreads, 0, current_stream()>>>(
        in, sorted_token, offsets, expert_count, rows);
    DI_CUDA_LAUNCHED(gather_rows_kernel);

    const DeviceRows<const float> gathered{rows, entries, dim, dim};
    DeviceRows<const float> gemm_in = gathered;
    if (quantized) {
      auto* rows_quantized = reinterpret_cast<float*>(piece(rows_quantized_at));
      quantize_activation(gathered, rows_quantized);
      gemm_in.data = rows_quantized;
    }
    const DeviceRows<float> gate_rows{gate, entries, inter, inter};
    const DeviceRows<float> up_rows{up, entries, inter, inter};
    groups.weights = table;
    grouped_gemm(gemm_in, host_table[0], gate_rows, groups);
    groups.weights = table + expert_count;
    grouped_gemm(gemm_in, host_table[static_cast<size_t>(expert_count)], up_rows, groups);

    const Device device = x.device();
    const auto view = [&](void* data, Shape shape) {
      return TensorView::contiguous(data, DType::kF32, shape, device);
    };
    // Rows past offsets[E] (only with bad expert ids) hold garbage that nothing reads.
    ops::cuda::swiglu(view(gate, {entries, inter}), view(up, {entries, inter}), swiglu_limit,
                      view(sorted_weight, {entries}), view(gate, {entries, inter}));
    DeviceRows<const float> down_in{gate, entries, inter, inter};
    if (quantized) {
      auto* gate_quantized = reinterpret_cast<float*>(piece(gate_quantized_at));
      quantize_activation(down_in, gate_quantized);
      down_in.data = gate_quantized;
    }
    groups.weights = table + 2 * expert_count;
    grouped_gemm(down_in, host_table[2 * static_cast<size_t>(expert_count)], results_rows, groups);
  }

  launch_combine(results, dim, chosen.data, chosen.stride, slot_position, static_cast<int>(k), y);
}

}  // namespace deepinfer::ops::cuda
