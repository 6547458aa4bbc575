// The CUDA sampler: one block per row runs the CPU reference's pipeline (sampler.cpp) over
// the row's logits in device scratch. Whatever decides the token is computed exactly as the
// CPU does: the mask, bans, penalties and temperature are the same float operations (no FMA
// contraction), min_p and top_k compare the same values, and the survivors are visited in the
// CPU's sorted order (logit descending, id ascending), chunk by chunk, by one thread that adds
// the double weights in that order. No row is sorted whole: each chunk of the next kChunk
// survivors is found by an exact radix select over unique 64-bit (key, id) composites and
// sorted in shared memory. The one sum that is not in the CPU's order is the total weight of
// more than kChunk survivors (a fixed-order block reduction instead), see docs/SAMPLING.md.
#include <algorithm>
#include <climits>
#include <cstring>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <limits>
#include <string>

#include "ops/cuda/common.cuh"
#include "sampling/cuda_sampler.h"
#include "sampling/penalties.h"
#include "sampling/philox.h"

namespace deepinfer::sampling {
namespace {

using deepinfer::cuda::DeviceRows;

constexpr int kThreads = 512;
constexpr int kItemsPerThread = 4;
// Survivors sorted at a time; a row with at most this many is handled wholly in CPU order.
constexpr int kChunk = kThreads * kItemsPerThread;
constexpr uint64_t kBeforeEverything = ~0ull;

enum RowStatus : int32_t {
  kRowOk = 0,
  kRowRejectedOnHost = 1,
  kNonFiniteLogit = 2,
  kGrammarAllowsNothing = 3,
  kAllowedAllNegativeInfinity = 4,
  kNothingSampleable = 5,
  kScaledLogitsOverflow = 6,
};

// One row's work, packed on the host. Offsets index the call's id and mask pools.
struct RowJob {
  int64_t prompt_offset = 0;
  int64_t prompt_count = 0;
  int64_t output_offset = 0;
  int64_t output_count = 0;
  int64_t ban_offset = 0;  // min_tokens bans, decided on the host (empty once reached)
  int64_t ban_count = 0;
  int64_t mask_offset = -1;  // -1: no grammar mask
  int64_t top_offset = 0;    // first slot of this row's top logprobs
  double uniform = 0.0;      // token_uniform(seed, position, sample_index)
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition = 1.0f;
  float frequency = 0.0f;
  float presence = 0.0f;
  int32_t top_k = 0;
  int32_t logprobs = -1;  // -1: not requested
  int32_t rejected = 0;
  int32_t greedy = 0;
  int32_t penalties = 0;
};

struct RowOutcome {
  int64_t rank = 0;
  int32_t token = -1;
  int32_t status = kRowOk;
  int32_t error_token = 0;
  float error_value = 0.0f;
  int32_t allowed = 0;
  int32_t top_count = 0;
  float sampled_logprob = 0.0f;
};

struct KernelArgs {
  DeviceRows<const float> logits;
  const RowJob* jobs;
  const int32_t* ids;
  const uint32_t* masks;
  float* work;       // [rows, vocab] processed logits, then scaled logits
  uint32_t* keys;    // [rows, vocab] sortable keys of the candidates, 0 = not a candidate
  int32_t* history;  // [rows, vocab] penalty counts, all zero between calls
  int32_t* tokens;
  RowOutcome* outcomes;
  int32_t* top_ids;
  float* top_logprobs;
};

struct ValueAndId {
  float value;
  int32_t id;
};

struct MoreLikely {
  __device__ ValueAndId operator()(const ValueAndId& a, const ValueAndId& b) const {
    return (a.value > b.value || (a.value == b.value && a.id < b.id)) ? a : b;
  }
};

struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

using BlockSort = cub::BlockRadixSort<uint64_t, kThreads, kItemsPerThread>;
using ReduceInt = cub::BlockReduce<int, kThreads>;
using ReduceFloat = cub::BlockReduce<float, kThreads>;
using ReduceDouble = cub::BlockReduce<double, kThreads>;
using ReduceArg = cub::BlockReduce<ValueAndId, kThreads>;

struct Shared {
  union {
    typename BlockSort::TempStorage sort;
    double weights[kChunk];  // the loaded chunk's weights (computed after its sort)
  } chunk_scratch;
  union {
    typename ReduceInt::TempStorage ints;
    typename ReduceFloat::TempStorage floats;
    typename ReduceDouble::TempStorage doubles;
    typename ReduceArg::TempStorage args;
  } reduce;
  uint64_t chunk[kChunk];  // composites of the loaded chunk, most likely first
  int histogram[256];
  uint64_t prefix;
  int remaining;
  int counter;
  int first_chunk_count;  // >= 0: chunk/weights hold the first chunk of the current keys
  int stop;
  ValueAndId best;
  int int_result;
  float float_result;
  double double_result;
};

// Float -> unsigned key with the same order (-0 folded onto +0, as float comparison does);
// never 0 for a float, so 0 marks "not a candidate".
__device__ __forceinline__ uint32_t sortable_bits(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// (key, id) as one number whose descending order is the CPU's order: key descending, then id
// ascending. Unique per id, so selections over composites never meet ties.
__device__ __forceinline__ uint64_t composite(uint32_t key, int64_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t composite_id(uint64_t c) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(c));
}

// Block-wide reductions whose result every thread gets (cub's order is fixed: deterministic).
// Thread 0 holds cub's result; `slot` is the shared word it is broadcast through.
template <typename T>
__device__ T broadcast_from_thread0(T value, T& slot) {
  if (threadIdx.x == 0) slot = value;
  __syncthreads();
  const T result = slot;
  __syncthreads();
  return result;
}

__device__ int block_sum(int v, Shared& sh) {
  return broadcast_from_thread0(ReduceInt(sh.reduce.ints).Sum(v), sh.int_result);
}

__device__ int block_min(int v, Shared& sh) {
  return broadcast_from_thread0(ReduceInt(sh.reduce.ints).Reduce(v, MinOp()), sh.int_result);
}

__device__ float block_max(float v, Shared& sh) {
  return broadcast_from_thread0(ReduceFloat(sh.reduce.floats).Reduce(v, MaxOp()), sh.float_result);
}

__device__ double block_sum(double v, Shared& sh) {
  return broadcast_from_thread0(ReduceDouble(sh.reduce.doubles).Sum(v), sh.double_result);
}

__device__ ValueAndId block_most_likely(ValueAndId v, Shared& sh) {
  return broadcast_from_thread0(ReduceArg(sh.reduce.args).Reduce(v, MoreLikely()), sh.best);
}

// A threshold t such that exactly the k largest of key_of(j), over the j in [0, n) for which
// key_of returns true, are >= t, or (with ties at the k-th value) all keys >= the k-th largest:
// an 8-bit-digit radix select (k must not exceed their number). It stops early once the
// digit's bucket is taken whole: the prefix with zero low bits then separates the same set.
template <typename Key, typename KeyOf>
__device__ Key kth_largest(int64_t n, int k, KeyOf key_of, Shared& sh) {
  Key prefix = 0;
  Key mask = 0;
  int remaining = k;
  for (int shift = static_cast<int>(sizeof(Key)) * 8 - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.histogram[b] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += kThreads) {
      Key key;
      if (key_of(j, key) && (key & mask) == prefix) {
        atomicAdd(&sh.histogram[static_cast<int>((key >> shift) & 0xFF)], 1);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      int digit = 255;
      for (; digit > 0; --digit) {
        if (above + sh.histogram[digit] >= remaining) break;
        above += sh.histogram[digit];
      }
      sh.prefix = static_cast<uint64_t>(prefix | (static_cast<Key>(digit) << shift));
      sh.remaining = remaining - above;
      sh.stop = sh.histogram[digit] == remaining - above;
    }
    __syncthreads();
    prefix = static_cast<Key>(sh.prefix);
    remaining = sh.remaining;
    mask |= static_cast<Key>(0xFF) << shift;
    const bool whole_bucket = sh.stop != 0;
    __syncthreads();
    if (whole_bucket) break;
  }
  return prefix;
}

// Loads into sh.chunk, most likely first, the (at most `want`) most likely candidates of
// `keys` that come after composite `after` in the sorted order. Returns how many.
__device__ int load_chunk(const uint32_t* keys, int64_t n, uint64_t after, int want, Shared& sh) {
  const auto eligible = [&](int64_t j, uint64_t& c) {
    const uint32_t key = keys[j];
    c = composite(key, j);
    return key != 0 && c < after;
  };
  int local = 0;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    uint64_t c;
    local += eligible(j, c) ? 1 : 0;
  }
  const int available = block_sum(local, sh);
  // Composites of candidates are >= 2^32, so threshold 0 takes every eligible one.
  const uint64_t threshold =
      available > want ? kth_largest<uint64_t>(n, want, eligible, sh) : uint64_t{0};
  if (threadIdx.x == 0) {
    sh.counter = 0;
    sh.first_chunk_count = -1;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    uint64_t c;
    if (eligible(j, c) && c >= threshold) sh.chunk[atomicAdd(&sh.counter, 1)] = c;
  }
  __syncthreads();
  const int count = available < want ? available : want;
  uint64_t items[kItemsPerThread];
  for (int i = 0; i < kItemsPerThread; ++i) {
    const int slot = threadIdx.x * kItemsPerThread + i;
    items[i] = slot < count ? sh.chunk[slot] : 0;
  }
  __syncthreads();
  BlockSort(sh.chunk_scratch.sort).SortDescending(items);
  __syncthreads();
  for (int i = 0; i < kItemsPerThread; ++i) sh.chunk[threadIdx.x * kItemsPerThread + i] = items[i];
  __syncthreads();
  return count;
}

// Visits the candidates of `keys` in the CPU's sorted order with their weights
// exp(scaled - max_scaled) in double: thread 0 calls visit(weight, id) for each, in order, until
// it returns true or `limit` were visited. The first chunk stays cached between walks.
template <typename Visit>
__device__ void walk_sorted(const uint32_t* keys, const float* scaled, int64_t n, double max_scaled,
                            int64_t limit, Shared& sh, Visit visit) {
  uint64_t after = kBeforeEverything;
  int64_t visited = 0;
  while (true) {
    int count;
    if (after == kBeforeEverything && sh.first_chunk_count >= 0) {
      count = sh.first_chunk_count;
    } else {
      count = load_chunk(keys, n, after, kChunk, sh);
      for (int i = threadIdx.x; i < count; i += kThreads) {
        sh.chunk_scratch.weights[i] =
            exp(static_cast<double>(scaled[composite_id(sh.chunk[i])]) - max_scaled);
      }
      if (threadIdx.x == 0 && after == kBeforeEverything) sh.first_chunk_count = count;
      __syncthreads();
    }
    if (count == 0) break;
    if (threadIdx.x == 0) {
      bool stop = false;
      for (int i = 0; i < count && visited < limit && !stop; ++i, ++visited) {
        stop = visit(sh.chunk_scratch.weights[i], composite_id(sh.chunk[i]));
      }
      sh.stop = stop || visited >= limit;
    }
    __syncthreads();
    const bool stop = sh.stop != 0;
    after = sh.chunk[count - 1];
    __syncthreads();
    if (stop) break;
  }
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(KernelArgs a) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const RowJob& job = a.jobs[r];
  const int64_t vocab = a.logits.cols;
  RowOutcome out;
  const auto finish = [&] {
    if (threadIdx.x == 0) {
      a.outcomes[r] = out;
      a.tokens[r] = out.status == kRowOk ? out.token : -1;
    }
  };
  if (job.rejected != 0) {
    out.status = kRowRejectedOnHost;
    finish();
    return;
  }
  const float* row = a.logits.row(r);
  float* work = a.work + r * vocab;
  uint32_t* keys = a.keys + r * vocab;
  const uint32_t* mask = job.mask_offset >= 0 ? a.masks + job.mask_offset : nullptr;
  const auto allowed = [&](int64_t t) {
    return mask == nullptr || ((mask[t >> 5] >> (t & 31)) & 1u) != 0;
  };

  // 1. Grammar mask; logits no distribution can come from.
  int first_bad = INT_MAX;
  int allowed_count = 0;
  int finite_count = 0;
  float raw_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float v = row[j];
    if ((isnan(v) || v == INFINITY) && j < first_bad) first_bad = static_cast<int>(j);
    const bool ok = allowed(j);
    const float masked = ok ? v : -INFINITY;
    work[j] = masked;
    allowed_count += ok ? 1 : 0;
    finite_count += masked > -INFINITY ? 1 : 0;
    raw_max = fmaxf(raw_max, masked);
  }
  first_bad = block_min(first_bad, sh);
  if (first_bad < vocab) {
    out.status = kNonFiniteLogit;
    out.error_token = first_bad;
    out.error_value = row[first_bad];
    finish();
    return;
  }
  out.allowed = block_sum(allowed_count, sh);
  finite_count = block_sum(finite_count, sh);
  out.status = out.allowed == 0    ? kGrammarAllowsNothing
               : finite_count == 0 ? kAllowedAllNegativeInfinity
                                   : kRowOk;
  if (out.status != kRowOk) {
    finish();
    return;
  }
  raw_max = block_max(raw_max, sh);

  // 2. Raw log-probabilities: the log-sum-exp and the top ones of the masked logits.
  double lse = 0.0;
  if (job.logprobs >= 0) {
    double partial = 0.0;
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      partial += exp(static_cast<double>(work[j]) - raw_max);
    }
    lse = static_cast<double>(raw_max) + log(block_sum(partial, sh));
    if (job.logprobs > 0) {
      for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
        keys[j] = work[j] != -INFINITY ? sortable_bits(work[j]) : 0u;
      }
      __syncthreads();
      int emitted = 0;
      uint64_t after = kBeforeEverything;
      while (emitted < job.logprobs) {
        const int want = job.logprobs - emitted < kChunk ? job.logprobs - emitted : kChunk;
        const int count = load_chunk(keys, vocab, after, want, sh);
        if (count == 0) break;
        for (int i = threadIdx.x; i < count; i += kThreads) {
          const int32_t id = composite_id(sh.chunk[i]);
          a.top_ids[job.top_offset + emitted + i] = id;
          a.top_logprobs[job.top_offset + emitted + i] =
              static_cast<float>(static_cast<double>(work[id]) - lse);
        }
        emitted += count;
        after = sh.chunk[count - 1];
        __syncthreads();
      }
      out.top_count = emitted;
    }
  }

  // 3-4. min_tokens bans, then penalties: the history counts sit in a zeroed per-row array;
  // whichever thread claims a token first (atomicExch back to 0) applies its penalties once.
  for (int64_t i = threadIdx.x; i < job.ban_count; i += kThreads) {
    const int32_t t = a.ids[job.ban_offset + i];
    if (t >= 0 && t < vocab) work[t] = -INFINITY;
  }
  __syncthreads();
  if (job.penalties != 0) {
    int32_t* counts = a.history + r * vocab;
    const int32_t* prompt = a.ids + job.prompt_offset;
    const int32_t* output = a.ids + job.output_offset;
    // Bit 0: seen in the prompt; the rest: occurrences in the output.
    for (int64_t i = threadIdx.x; i < job.prompt_count; i += kThreads)
      atomicOr(&counts[prompt[i]], 1);
    for (int64_t i = threadIdx.x; i < job.output_count; i += kThreads)
      atomicAdd(&counts[output[i]], 2);
    __syncthreads();
    const auto claim = [&](int32_t t) {
      const int32_t seen = atomicExch(&counts[t], 0);
      if (seen == 0) return;
      float l = work[t];
      if (job.repetition != 1.0f) l = l > 0.0f ? l / job.repetition : l * job.repetition;
      const int32_t occurrences = seen >> 1;
      if ((job.frequency != 0.0f || job.presence != 0.0f) && occurrences > 0) {
        // No FMA: the CPU rounds the product before subtracting.
        l = __fsub_rn(l, __fmul_rn(job.frequency, static_cast<float>(occurrences)));
        l = __fsub_rn(l, job.presence);
      }
      work[t] = l;
    };
    for (int64_t i = threadIdx.x; i < job.prompt_count; i += kThreads) claim(prompt[i]);
    for (int64_t i = threadIdx.x; i < job.output_count; i += kThreads) claim(output[i]);
    __syncthreads();
  }

  // 5. Greedy: argmax with ties to the lowest id (also tells whether anything is left).
  ValueAndId best{-INFINITY, INT_MAX};
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    if (work[j] > best.value) best = {work[j], static_cast<int32_t>(j)};
  }
  best = block_most_likely(best, sh);
  if (!(best.value > -INFINITY)) {
    out.status = kNothingSampleable;
    finish();
    return;
  }
  int32_t token = best.id;
  if (job.greedy == 0) {
    // 6. Temperature, min_p, top_k (all boundary ties kept), then the CPU's sorted walks.
    float max_scaled = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      const float s = work[j] / job.temperature;
      work[j] = s;
      max_scaled = fmaxf(max_scaled, s);
    }
    max_scaled = block_max(max_scaled, sh);
    if (!isfinite(max_scaled)) {
      out.status = kScaledLogitsOverflow;
      finish();
      return;
    }
    const double max_s = max_scaled;
    const double min_weight = job.min_p;
    int candidates = 0;
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      const float s = work[j];
      const double weight = exp(static_cast<double>(s) - max_s);
      const bool keep = weight > 0.0 && weight >= min_weight;
      keys[j] = keep ? sortable_bits(s) : 0u;
      candidates += keep ? 1 : 0;
    }
    candidates = block_sum(candidates, sh);
    if (job.top_k > 0 && job.top_k < candidates) {
      const uint32_t threshold = kth_largest<uint32_t>(
          vocab, job.top_k,
          [&](int64_t j, uint32_t& key) {
            key = keys[j];
            return key != 0;
          },
          sh);
      int kept = 0;
      for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
        const uint32_t key = keys[j];
        if (key < threshold) keys[j] = 0;
        kept += key >= threshold ? 1 : 0;
      }
      candidates = block_sum(kept, sh);
    }
    if (threadIdx.x == 0) sh.first_chunk_count = -1;
    __syncthreads();

    // Only thread 0's copies of total/keep/... matter: it runs every visit.
    double total = 0.0;
    if (candidates <= kChunk) {
      walk_sorted(keys, work, vocab, max_s, candidates, sh, [&](double w, int32_t) {
        total += w;
        return false;
      });
    } else {
      double partial = 0.0;
      for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
        if (keys[j] != 0) partial += exp(static_cast<double>(work[j]) - max_s);
      }
      total = block_sum(partial, sh);
    }
    int64_t keep = candidates;
    if (job.top_p < 1.0f) {
      const double mass = static_cast<double>(job.top_p) * total;
      double before = 0.0;
      keep = 0;
      walk_sorted(keys, work, vocab, max_s, candidates, sh, [&](double w, int32_t) {
        if (!(before < mass)) return true;
        before += w;
        ++keep;
        return false;
      });
      total = before;  // the CPU re-adds the kept weights from 0 in the same order: same value
    }
    const double target = job.uniform * total;
    double running = 0.0;
    int32_t picked = -1;
    walk_sorted(keys, work, vocab, max_s, keep, sh, [&](double w, int32_t id) {
      running += w;
      picked = id;  // the last visited one is the fallback when target rounds up to total
      return target < running;
    });
    if (threadIdx.x == 0) sh.int_result = picked;
    __syncthreads();
    token = sh.int_result;
    __syncthreads();
  }
  out.token = token;

  // 7. The sampled token's raw log-probability and rank.
  if (job.logprobs >= 0) {
    const float chosen = allowed(token) ? row[token] : -INFINITY;
    int at_least = 0;
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      const float raw = allowed(j) ? row[j] : -INFINITY;
      at_least += raw >= chosen ? 1 : 0;
    }
    out.rank = block_sum(at_least, sh);
    out.sampled_logprob = static_cast<float>(static_cast<double>(chosen) - lse);
  }
  finish();
}

template <typename T>
T* advance(std::byte*& cursor, size_t count) {
  T* start = reinterpret_cast<T*>(cursor);
  cursor += (count * sizeof(T) + 15) / 16 * 16;
  return start;
}

size_t padded(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

// Grow-only device and pinned host buffers (a warm call allocates nothing).
class DeviceBytes {
 public:
  ~DeviceBytes() { cudaFree(data_); }
  // Returns true when it had to grow (the contents are then undefined).
  bool reserve(size_t bytes) {
    if (bytes <= size_) return false;
    if (data_ != nullptr) DI_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    size_ = 0;
    DI_CUDA_CHECK(cudaMalloc(&data_, bytes));
    size_ = bytes;
    return true;
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

class PinnedBytes {
 public:
  ~PinnedBytes() { cudaFreeHost(data_); }
  void reserve(size_t bytes) {
    if (bytes <= size_) return;
    if (data_ != nullptr) DI_CUDA_CHECK(cudaFreeHost(data_));
    data_ = nullptr;
    size_ = 0;
    DI_CUDA_CHECK(cudaMallocHost(&data_, bytes));
    size_ = bytes;
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

struct CudaSampler::State {
  PinnedBytes upload;
  PinnedBytes download;
  DeviceBytes device_upload;
  DeviceBytes device_results;
  DeviceBytes scratch;  // work and keys
  DeviceBytes history;  // zero between calls
  DeviceBytes tokens;
  size_t history_bytes = 0;
  cudaEvent_t done = nullptr;
  bool pending = false;
  // Per row of the pending call.
  std::vector<std::string> host_errors;
  std::vector<size_t> positions;
  std::vector<int32_t> min_tokens;
  std::vector<int32_t> requested_logprobs;
  std::vector<int64_t> top_offsets;
  size_t rows = 0;
  size_t top_slots = 0;
  Device device = Device::cuda(0);  // the last launch's logits device
};

CudaSampler::CudaSampler() : state_(std::make_unique<State>()) {
  DI_CUDA_CHECK(cudaEventCreateWithFlags(&state_->done, cudaEventDisableTiming));
}

CudaSampler::~CudaSampler() {
  if (state_->done != nullptr) cudaEventDestroy(state_->done);
}

void CudaSampler::launch(const TensorView& logits, std::span<const SamplerRow> rows) {
  DI_CHECK(!state_->pending, "CudaSampler::launch called again before wait()");
  const DeviceRows<const float> matrix =
      deepinfer::cuda::device_rows<const float>(logits, "logits");
  DI_CHECK(matrix.rows == static_cast<int64_t>(rows.size()), "logits have ", matrix.rows,
           " rows for ", rows.size(), " sampler rows");
  const int64_t vocab = matrix.cols;
  DI_CHECK(vocab > 0 && vocab < std::numeric_limits<int32_t>::max(), "vocabulary of ", vocab);
  State& s = *state_;
  const size_t n = rows.size();
  s.rows = n;
  s.device = logits.device();
  s.host_errors.assign(n, std::string());
  s.positions.resize(n);
  s.min_tokens.resize(n);
  s.requested_logprobs.assign(n, -1);
  s.top_offsets.assign(n, 0);

  std::vector<RowJob> jobs(n);
  std::vector<int32_t> ids;
  std::vector<uint32_t> masks;
  size_t top_slots = 0;
  for (size_t i = 0; i < n; ++i) {
    const SamplerRow& row = rows[i];
    RowJob& job = jobs[i];
    s.positions[i] = row.output_token_ids.size();
    try {
      check_row_inputs(row, vocab);
    } catch (const Error& error) {
      s.host_errors[i] = error.what();
      job.rejected = 1;
      continue;
    }
    const SamplingParams& params = *row.params;
    s.min_tokens[i] = params.min_tokens;
    job.temperature = params.temperature;
    job.top_p = params.top_p;
    job.top_k = params.top_k;
    job.min_p = params.min_p;
    job.repetition = params.repetition_penalty;
    job.frequency = params.frequency_penalty;
    job.presence = params.presence_penalty;
    job.greedy = params.is_greedy() ? 1 : 0;
    if (job.greedy == 0) {
      job.uniform = token_uniform(row.seed, row.output_token_ids.size(), row.sample_index);
    }
    if (params.logprobs) {
      // More than the vocabulary can never be listed; reserve no more slots than that.
      const int64_t slots = std::min<int64_t>(*params.logprobs, vocab);
      job.logprobs = static_cast<int32_t>(slots);
      job.top_offset = static_cast<int64_t>(top_slots);
      s.requested_logprobs[i] = job.logprobs;
      s.top_offsets[i] = job.top_offset;
      top_slots += static_cast<size_t>(slots);
    }
    if (row.output_token_ids.size() < static_cast<size_t>(params.min_tokens)) {
      job.ban_offset = static_cast<int64_t>(ids.size());
      ids.insert(ids.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
      if (!params.ignore_eos)
        ids.insert(ids.end(), row.eos_token_ids.begin(), row.eos_token_ids.end());
      job.ban_count = static_cast<int64_t>(ids.size()) - job.ban_offset;
    }
    if (has_penalties(params)) {
      job.penalties = 1;
      job.prompt_offset = static_cast<int64_t>(ids.size());
      job.prompt_count = static_cast<int64_t>(row.prompt_token_ids.size());
      ids.insert(ids.end(), row.prompt_token_ids.begin(), row.prompt_token_ids.end());
      job.output_offset = static_cast<int64_t>(ids.size());
      job.output_count = static_cast<int64_t>(row.output_token_ids.size());
      ids.insert(ids.end(), row.output_token_ids.begin(), row.output_token_ids.end());
    }
    if (!row.allowed_token_bitmask.empty()) {
      job.mask_offset = static_cast<int64_t>(masks.size());
      masks.insert(masks.end(), row.allowed_token_bitmask.begin(), row.allowed_token_bitmask.end());
    }
  }
  s.top_slots = top_slots;
  if (n == 0) return;

  // One upload: jobs, ids, masks.
  const size_t upload_bytes = padded(n * sizeof(RowJob)) + padded(ids.size() * sizeof(int32_t)) +
                              padded(masks.size() * sizeof(uint32_t));
  s.upload.reserve(upload_bytes);
  s.device_upload.reserve(upload_bytes);
  std::byte* cursor = s.upload.data();
  std::memcpy(advance<RowJob>(cursor, n), jobs.data(), n * sizeof(RowJob));
  std::memcpy(advance<int32_t>(cursor, ids.size()), ids.data(), ids.size() * sizeof(int32_t));
  std::memcpy(advance<uint32_t>(cursor, masks.size()), masks.data(),
              masks.size() * sizeof(uint32_t));
  const auto stream = deepinfer::cuda::current_stream();
  DI_CUDA_CHECK(cudaMemcpyAsync(s.device_upload.data(), s.upload.data(), upload_bytes,
                                cudaMemcpyHostToDevice, stream));

  const size_t row_elements = n * static_cast<size_t>(vocab);
  s.scratch.reserve(row_elements * (sizeof(float) + sizeof(uint32_t)));
  if (s.history.reserve(row_elements * sizeof(int32_t))) {
    DI_CUDA_CHECK(cudaMemsetAsync(s.history.data(), 0, row_elements * sizeof(int32_t), stream));
  }
  s.tokens.reserve(n * sizeof(int32_t));
  const size_t result_bytes = padded(n * sizeof(RowOutcome)) + 2 * padded(top_slots * 4);
  s.device_results.reserve(result_bytes);
  s.download.reserve(result_bytes);

  KernelArgs args{};
  args.logits = matrix;
  cursor = s.device_upload.data();
  args.jobs = advance<RowJob>(cursor, n);
  args.ids = advance<int32_t>(cursor, ids.size());
  args.masks = advance<uint32_t>(cursor, masks.size());
  args.work = reinterpret_cast<float*>(s.scratch.data());
  args.keys = reinterpret_cast<uint32_t*>(s.scratch.data() + row_elements * sizeof(float));
  args.history = reinterpret_cast<int32_t*>(s.history.data());
  args.tokens = reinterpret_cast<int32_t*>(s.tokens.data());
  cursor = s.device_results.data();
  args.outcomes = advance<RowOutcome>(cursor, n);
  args.top_ids = advance<int32_t>(cursor, top_slots);
  args.top_logprobs = advance<float>(cursor, top_slots);
  sample_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(args);
  DI_CUDA_LAUNCHED(sample_rows_kernel);
  DI_CUDA_CHECK(cudaMemcpyAsync(s.download.data(), s.device_results.data(), result_bytes,
                                cudaMemcpyDeviceToHost, stream));
  DI_CUDA_CHECK(cudaEventRecord(s.done, stream));
  s.pending = true;
}

TensorView CudaSampler::device_token_ids() const {
  return TensorView::contiguous(state_->tokens.data(), DType::kI32,
                                {static_cast<int64_t>(state_->rows)}, state_->device);
}

void CudaSampler::wait(std::span<SampledToken> results) {
  State& s = *state_;
  DI_CHECK(results.size() == s.rows, "wait() given ", results.size(), " results for ", s.rows,
           " rows");
  if (s.pending) {
    s.pending = false;
    DI_CUDA_CHECK(cudaEventSynchronize(s.done));
  }
  std::byte* cursor = s.download.data();
  const RowOutcome* outcomes = advance<RowOutcome>(cursor, s.rows);
  const int32_t* top_ids = advance<int32_t>(cursor, s.top_slots);
  const float* top_logprobs = advance<float>(cursor, s.top_slots);
  for (size_t i = 0; i < s.rows; ++i) {
    SampledToken& result = results[i];
    result = SampledToken{};
    if (!s.host_errors[i].empty()) {
      result.error = s.host_errors[i];
      continue;
    }
    const RowOutcome& outcome = outcomes[i];
    const size_t position = s.positions[i];
    switch (outcome.status) {
      case kRowOk:
        break;
      case kNonFiniteLogit:
        result.error =
            non_finite_logit_message(outcome.error_value, static_cast<size_t>(outcome.error_token));
        continue;
      case kGrammarAllowsNothing:
        result.error = grammar_allows_nothing_message(position);
        continue;
      case kAllowedAllNegativeInfinity:
        result.error = allowed_all_negative_infinity_message(position);
        continue;
      case kNothingSampleable:
        result.error = nothing_sampleable_message(position, static_cast<size_t>(outcome.allowed),
                                                  s.min_tokens[i]);
        continue;
      case kScaledLogitsOverflow:
        result.error = concat("no finite logit to sample from at output position ", position,
                              ": a penalty or the temperature overflowed the logits to +inf");
        continue;
      default:
        DI_CHECK(false, "CUDA sampler row ", i, " has status ", outcome.status);
    }
    result.token_id = outcome.token;
    if (s.requested_logprobs[i] >= 0) {
      result.sampled_logprob = TokenLogprob{outcome.token, outcome.sampled_logprob, outcome.rank};
      const int64_t offset = s.top_offsets[i];
      for (int32_t k = 0; k < outcome.top_count; ++k) {
        result.top_logprobs.push_back(
            {top_ids[offset + k], top_logprobs[offset + k], static_cast<int64_t>(k + 1)});
      }
    }
  }
}

std::vector<SampledToken> CudaSampler::sample(const TensorView& logits,
                                              std::span<const SamplerRow> rows) {
  std::vector<SampledToken> results(rows.size());
  launch(logits, rows);
  wait(results);
  return results;
}

}  // namespace deepinfer::sampling
