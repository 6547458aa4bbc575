// ops::cuda::indexer_scores_batch and topk_indices at V4.1-Flash decode shapes (32 indexer heads
// x 128, each request one token against its own key cache in the release's format -- e2m1
// codes and a ue8m0 scale per 32 channels, 68 bytes a key, written by write_indexer_keys from
// random f32 rows as the model writes them -- k = 512; 32k of context is 32768,
// 16384 or 8192 entries at compression ratio 1, 2 or 4): the
// invariant path's kernel (indexer_scores_mma_kernel), the same kernel with batch invariance off
// (DEEPINFER_INDEXER_DECODE=0: the A/B baseline) and the decode kernel that replaces it there
// (the default with invariance off), next to the HBM read bandwidth measured in the same run.
// "GB/s" counts the keys, q, weights and scores once. "differ": the decode kernel's worst score
// difference from the invariant kernel's over the row's largest |score| (exit 2 past 1e-5);
// "sel-rows": rows whose top-k selection differs between the two (near-ties only: the sum order
// differs). Then topk_indices on the decode kernel's scores: "topk ms" the invariant path's
// kernel (the shared-memory one to 16384 entries, else the global-memory one), "topk-off ms"
// batch invariance off (the register kernel to 32768 entries, its two-pass chunked form past
// that and for fewer than 64 rows of over 8192: then also at each chunk width); their indices
// must be equal (exit 3 otherwise).
//
//   cuda_indexer_bench              (batches 1, 64, 256 x entries 1024 .. 65536)
//   INDEXER_BENCH_NCU=1 cuda_indexer_bench   (b256 x 32768 entries: each kernel once, for ncu)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "roofline.cuh"
#include "uniform_fill.cuh"

namespace deepinfer::bench {
namespace {

namespace rt = deepinfer::cuda;

constexpr int64_t kHeads = 32;
constexpr int64_t kDim = 128;
constexpr int kTopK = 512;

// The model's fp4 values are bf16-exact: every row here is too.
Tensor device_bf16_exact_f32(Shape shape, uint64_t seed, float scale) {
  return device_f32(shape, seed, scale, /*bf16_exact=*/true);
}

struct Case {
  int64_t batch = 0;
  int64_t entries = 0;
  Tensor q, w, vis, key_codes, key_scales, scores, selection;
  std::vector<ops::IndexerRequest> requests;
};

Case make_case(int64_t batch, int64_t entries) {
  Case c;
  c.batch = batch;
  c.entries = entries;
  c.q = device_bf16_exact_f32({batch, kHeads, kDim}, 1, 1.0f);
  // As the model quantizes q (MODEL.md 5.3): with fp4 keys every product and dot is exact.
  ops::cuda::fake_quant_fp4(c.q.view(), 32, ops::Fp4ScaleFormat::kUe8m0);
  c.w = device_bf16_exact_f32({batch, kHeads}, 2, 1.0f);
  const int64_t keys = batch * c.entries;
  c.key_codes = Tensor::empty(DType::kF4E2M1x2, {keys, kDim}, rt::device_allocator());
  c.key_scales = Tensor::empty(DType::kF8E8M0, {keys, kDim / 32}, rt::device_allocator());
  const ops::IndexerKeys cache{c.key_codes.view(), c.key_scales.view()};
  constexpr int64_t kChunk = 1 << 16;  // f32 rows quantized a chunk at a time
  Tensor rows = device_f32({std::min(keys, kChunk), kDim}, 3, 1.0f);
  for (int64_t first = 0; first < keys; first += kChunk) {
    const int64_t count = std::min(kChunk, keys - first);
    fill(rows, 3 + static_cast<uint64_t>(first), 1.0f, false);
    const ops::IndexerKeyWrite write{cache, 0, count, first};
    ops::cuda::write_indexer_keys(rows.view().narrow(0, 0, count), {&write, 1});
  }
  Tensor host_vis = Tensor::empty(DType::kI32, {batch});
  for (int64_t t = 0; t < batch; ++t) host_vis.data<int32_t>()[t] = static_cast<int32_t>(c.entries);
  c.vis = rt::to_device(host_vis.view());
  c.scores = Tensor::empty(DType::kF32, {batch, c.entries}, rt::device_allocator());
  c.selection = Tensor::empty(DType::kI32, {batch, kTopK}, rt::device_allocator());
  for (int64_t r = 0; r < batch; ++r) {
    c.requests.push_back({cache.narrow(r * c.entries, c.entries), r, 1});
  }
  return c;
}

// invariant: batch invariance on; otherwise off, with the decode kernel on or off.
void score(Case& c, bool invariant, bool decode) {
  const ops::ScopedBatchInvariance policy(invariant);
  const rt::ScopedSetting setting("DEEPINFER_INDEXER_DECODE", decode ? 1 : 0);
  ops::cuda::indexer_scores_batch(c.q.view(), c.requests, c.w.view(), c.vis.view(),
                                  1.0f / std::sqrt(static_cast<float>(kDim)), c.scores.view());
}

void select(Case& c, bool invariant = true) {
  const ops::ScopedBatchInvariance policy(invariant);
  ops::cuda::topk_indices(c.scores.view(), kTopK, c.selection.view());
}

int run() {
  rt::require_supported_device(0);
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (std::getenv("INDEXER_BENCH_NCU") != nullptr) {
    Case c = make_case(256, 32768);  // ratio 1 at 32k
    score(c, true, false);
    score(c, false, true);
    select(c);
    select(c, false);
    rt::synchronize();
    std::printf("ncu mode: b256 x 32768 scored by both kernels and selected once\n");
    return 0;
  }
  const double read_gbps = measure_hbm_read_gbps(size_t{2} << 30);
  std::printf("indexer bench on %s (%d SMs): HBM read %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, read_gbps);
  std::printf("%6s %8s | %9s %9s %9s | %8s %8s | %9s %9s | %9s %11s\n", "batch", "entries",
              "inv ms", "mma ms", "decode ms", "mma GB/s", "dec GB/s", "differ", "sel-rows",
              "topk ms", "topk-off ms");
  int status = 0;
  for (int64_t batch : {1, 64, 256}) {
    for (int64_t entries : {1024, 4096, 16384, 32768, 32769, 65536}) {
      Case c = make_case(batch, entries);
      const double bytes =
          static_cast<double>(batch) *
          (c.entries * (kDim / 2 + kDim / 32) + (kHeads * kDim + kHeads + c.entries) * 4.0);
      score(c, true, false);
      const Tensor reference = rt::to_host(c.scores.view());
      select(c);
      const Tensor reference_selection = rt::to_host(c.selection.view());
      score(c, false, true);
      const Tensor decoded = rt::to_host(c.scores.view());
      select(c);
      const Tensor decoded_selection = rt::to_host(c.selection.view());
      select(c, false);
      const Tensor off_selection = rt::to_host(c.selection.view());
      if (std::memcmp(off_selection.data<int32_t>(), decoded_selection.data<int32_t>(),
                      static_cast<size_t>(batch * kTopK) * sizeof(int32_t)) != 0) {
        std::printf("topk_indices with batch invariance off selected other indices\n");
        status = 3;
      }
      double worst = 0.0;
      int64_t selection_rows = 0;
      for (int64_t t = 0; t < batch; ++t) {
        const float* a = reference.data<float>() + t * c.entries;
        const float* b = decoded.data<float>() + t * c.entries;
        double scale = 0.0;
        for (int64_t j = 0; j < c.entries; ++j) scale = std::max(scale, std::fabs(double{a[j]}));
        for (int64_t j = 0; j < c.entries; ++j) {
          worst = std::max(worst, std::fabs(double{a[j]} - double{b[j]}) / std::max(scale, 1e-30));
        }
        selection_rows += std::memcmp(reference_selection.data<int32_t>() + t * kTopK,
                                      decoded_selection.data<int32_t>() + t * kTopK,
                                      kTopK * sizeof(int32_t)) != 0;
      }
      if (!(worst <= 1e-5)) status = 2;
      const double inv_ms = time_ms([&] { score(c, true, false); });
      const double mma_ms = time_ms([&] { score(c, false, false); });
      const double decode_ms = time_ms([&] { score(c, false, true); });
      const double topk_ms = time_ms([&] { select(c); });
      const double topk_off_ms = time_ms([&] { select(c, false); });
      std::printf("%6lld %8lld | %9.4f %9.4f %9.4f | %8.0f %8.0f | %9.2e %9lld | %9.4f %11.4f\n",
                  static_cast<long long>(batch), static_cast<long long>(c.entries), inv_ms, mma_ms,
                  decode_ms, bytes / mma_ms * 1e-6, bytes / decode_ms * 1e-6, worst,
                  static_cast<long long>(selection_rows), topk_ms, topk_off_ms);
      // The chunked selection's chunk widths (DEEPINFER_TOPK_CHUNK / _FEW_ROWS_CHUNK): the same
      // indices at every width, ms at each.
      if (entries > 32768 || (batch < 64 && entries > 8192)) {
        std::printf("       topk-off ms by chunk width:");
        for (const int width : {4096, 8192, 16384, 32768}) {
          const rt::ScopedSetting many("DEEPINFER_TOPK_CHUNK", width);
          const rt::ScopedSetting few("DEEPINFER_TOPK_FEW_ROWS_CHUNK", width);
          select(c, false);
          const Tensor chunked = rt::to_host(c.selection.view());
          const bool same = std::memcmp(chunked.data<int32_t>(), decoded_selection.data<int32_t>(),
                                        static_cast<size_t>(batch * kTopK) * sizeof(int32_t)) == 0;
          if (!same) status = 3;
          std::printf(" %d: %.4f%s", width, time_ms([&] { select(c, false); }),
                      same ? "" : " (other indices)");
        }
        std::printf("\n");
      }
    }
  }
  return status;
}

}  // namespace
}  // namespace deepinfer::bench

int main() {
  try {
    return deepinfer::bench::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_indexer_bench: %s\n", e.what());
    return 1;
  }
}
