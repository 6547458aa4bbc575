// The hyper-connection ops (ops::cuda::hc_mixes, hc_collapse, hc_expand) at V4.1-Flash shapes
// (hc 4 x 5120, fn [24, 20480], 20 Sinkhorn iterations), decode to prefill rows, each fast path
// against the kernel behind its run-time switch: median ms a call, GB/s of the bytes a call must
// move (hc_mixes: x + fn + the slice partials written and read; collapse: x + pre + out; expand:
// y + residual + post + comb + out) and that over the HBM read pass measured in the same run.
// "same" says whether the two paths gave the same bits.
//
//   cuda_hc_bench            # rows 1 16 256 2048 8192
//   cuda_hc_bench 8192 ...   # the given row counts
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "roofline.cuh"

namespace deepinfer::bench {
namespace {

namespace rt = deepinfer::cuda;

constexpr int kHc = 4;
constexpr int64_t kHidden = 5120;
constexpr int64_t kMixes = (2 + kHc) * kHc;
constexpr int64_t kSlices = kHc * kHidden / 1024;

__global__ void fill_kernel(float* data, int64_t count, uint64_t seed, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    uint64_t h = seed * 0x100000001B3ull + static_cast<uint64_t>(i);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    data[i] = (static_cast<float>(h >> 40) * 0x1p-23f - 1.0f) * scale;
  }
}

Tensor device_f32(Shape shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(DType::kF32, shape, rt::device_allocator());
  fill_kernel<<<2048, 256>>>(t.data<float>(), t.numel(), seed, scale);
  DI_CUDA_CHECK(cudaGetLastError());
  return t;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor x = rt::to_host(a[i].view());
    const Tensor y = rt::to_host(b[i].view());
    if (std::memcmp(x.data<float>(), y.data<float>(), static_cast<size_t>(x.numel()) * 4) != 0) {
      return false;
    }
  }
  return true;
}

void row(const char* op, const char* path, int64_t rows, double ms, double bytes, double hbm,
         const char* same) {
  const double gbps = bytes / ms * 1e-6;
  std::printf("%-12s %-28s %6lld %9.4f %8.1f %8.0f %6.1f%% %s\n", op, path,
              static_cast<long long>(rows), ms, bytes * 1e-6, gbps, 100.0 * gbps / hbm, same);
}

void bench_rows(int64_t rows, double hbm) {
  Tensor x = device_f32({rows, kHc, kHidden}, 1, 1.0f);
  Tensor fn = device_f32({kMixes, kHc * kHidden}, 2, 0.02f);
  Tensor scale = device_f32({3}, 3, 1.0f);
  Tensor base = device_f32({kMixes}, 4, 1.0f);
  Tensor y = device_f32({rows, kHidden}, 5, 1.0f);
  Tensor pre = Tensor::empty(DType::kF32, {rows, kHc}, rt::device_allocator());
  Tensor post = Tensor::empty(DType::kF32, {rows, kHc}, rt::device_allocator());
  Tensor comb = Tensor::empty(DType::kF32, {rows, kHc, kHc}, rt::device_allocator());
  Tensor collapsed = Tensor::empty(DType::kF32, {rows, kHidden}, rt::device_allocator());
  Tensor expanded = Tensor::empty(DType::kF32, {rows, kHc, kHidden}, rt::device_allocator());
  const ops::HcParams params{kHc, 20, 1e-6f, 1e-6f};
  const double stream_bytes = static_cast<double>(rows) * kHc * kHidden * 4;
  const double row_bytes = static_cast<double>(rows) * kHidden * 4;

  const auto mixes = [&] {
    ops::cuda::hc_mixes(x, fn, scale, base, params, pre, post, comb);
    return std::vector<Tensor>{};
  };
  const auto mixes_out = [&] {
    mixes();
    rt::synchronize();
    std::vector<Tensor> out;
    for (Tensor* t : {&pre, &post, &comb}) out.push_back(rt::to_device(rt::to_host(t->view())));
    return out;
  };
  const double mix_bytes = stream_bytes + kMixes * kHc * kHidden * 4.0 +
                           2.0 * rows * kSlices * (kMixes + 1) * 4 + rows * (2 + kHc) * kHc * 4.0;
  // The old path (the preload kernel), the rows kernel's two tiles at every row count.
  std::vector<Tensor> old_out;
  double old_ms = 0;
  {
    const rt::ScopedSwitch off{"DEEPINFER_HC_ROWS", false};
    old_ms = time_ms([&] { mixes(); });
    old_out = mixes_out();
  }
  row("hc_mixes", "old (DEEPINFER_HC_ROWS=0)", rows, old_ms, mix_bytes, hbm, "");
  row("hc_mixes", "default", rows, time_ms([&] { mixes(); }), mix_bytes, hbm,
      same_bits(old_out, mixes_out()) ? "same" : "DIFFER");
  for (const int tile : {2, 4}) {
    const rt::ScopedSetting all{"DEEPINFER_HC_ROWS_MIN", 1};
    const rt::ScopedSetting t{"DEEPINFER_HC_ROWS_TILE", tile};
    const double ms = time_ms([&] { mixes(); });
    row("hc_mixes", tile == 2 ? "rows kernel, 2 rows a warp" : "rows kernel, 4 rows a warp", rows,
        ms, mix_bytes, hbm, same_bits(old_out, mixes_out()) ? "same" : "DIFFER");
  }

  {  // batch invariance off: the dots as one cuBLASLt FP32 GEMM at every row count (from 65)
    const ops::ScopedBatchInvariance off(false);
    const rt::ScopedSetting all{"DEEPINFER_HC_CUBLASLT_MIN_ROWS", 65};
    row("hc_mixes", "invariance off, cuBLASLt GEMM", rows, time_ms([&] { mixes(); }), mix_bytes,
        hbm, same_bits(old_out, mixes_out()) ? "same" : "other bits");
  }

  const double collapse_bytes = stream_bytes + row_bytes + rows * kHc * 4.0;
  const double expand_bytes = 2 * stream_bytes + row_bytes + rows * (kHc + kHc * kHc) * 4.0;
  const auto collapse = [&] { ops::cuda::hc_collapse(x, pre, collapsed); };
  const auto expand = [&] { ops::cuda::hc_expand(y, x, post, comb, expanded); };
  const auto snapshot = [&](const std::function<void()>& call, Tensor& out) {
    call();
    rt::synchronize();
    std::vector<Tensor> copy;
    copy.push_back(rt::to_device(rt::to_host(out.view())));
    return copy;
  };
  std::vector<Tensor> old_collapse, old_expand;
  double old_collapse_ms = 0, old_expand_ms = 0;
  {
    const rt::ScopedSwitch c{"DEEPINFER_HC_COLLAPSE_VEC", false};
    const rt::ScopedSwitch e{"DEEPINFER_HC_EXPAND_VEC", false};
    old_collapse_ms = time_ms(collapse);
    old_expand_ms = time_ms(expand);
    old_collapse = snapshot(collapse, collapsed);
    old_expand = snapshot(expand, expanded);
  }
  row("hc_collapse", "old (COLLAPSE_VEC=0)", rows, old_collapse_ms, collapse_bytes, hbm, "");
  row("hc_collapse", "float4", rows, time_ms(collapse), collapse_bytes, hbm,
      same_bits(old_collapse, snapshot(collapse, collapsed)) ? "same" : "DIFFER");
  row("hc_expand", "old (EXPAND_VEC=0)", rows, old_expand_ms, expand_bytes, hbm, "");
  row("hc_expand", "float4", rows, time_ms(expand), expand_bytes, hbm,
      same_bits(old_expand, snapshot(expand, expanded)) ? "same" : "DIFFER");
}

}  // namespace
}  // namespace deepinfer::bench

int main(int argc, char** argv) {
  using namespace deepinfer::bench;
  std::vector<int64_t> rows_list;
  for (int i = 1; i < argc; ++i) rows_list.push_back(std::atoll(argv[i]));
  if (rows_list.empty()) rows_list = {1, 16, 256, 2048, 8192};
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double hbm = measure_hbm_read_gbps(size_t{2} << 30);
  std::printf("hc bench on %s (%d SMs): HBM read %.0f GB/s; hc %d x %lld\n", prop.name,
              prop.multiProcessorCount, hbm, kHc, static_cast<long long>(kHidden));
  std::printf("%-12s %-28s %6s %9s %8s %8s %7s %s\n", "op", "path", "rows", "ms", "MB", "GB/s",
              "of HBM", "bits");
  for (const int64_t rows : rows_list) bench_rows(rows, hbm);
  return 0;
}
