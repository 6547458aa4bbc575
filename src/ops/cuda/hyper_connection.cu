// Hyper-connection mixes (one projection of the normalized streams, Sinkhorn-projected comb),
// the collapse of the streams into one sublayer input, and the expansion back.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear_cublaslt.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxMixes = 80;  // (2 + hc) * hc for hc <= 8
constexpr int kMaxStreams = 16;

struct MixArgs {
  DeviceRows<const float> x;
  DeviceRows<const float> fn;
  const float* scale;
  const float* base;
  int hc;
  float hc_eps;
  float norm_eps;
  int sinkhorn_iters;
  DeviceRows<float> pre;
  DeviceRows<float> post;
  DeviceRows<float> comb;
};

// Every mix of row m (the one-block path): the block reduces the row's norm, then each mix's dot
// product.
__device__ void hc_mix_dots(const MixArgs& args, int64_t m, float* mixes) {
  __shared__ float scratch[32];
  const float* a = args.x.row(m);
  const int64_t cols = args.x.cols;
  float partial = 0.0f;
  for (int64_t d = threadIdx.x; d < cols; d += blockDim.x) partial += a[d] * a[d];
  const float mean_square = deepinfer::cuda::block_sum(partial, scratch) / static_cast<float>(cols);
  const float inv = 1.0f / sqrtf(mean_square + args.norm_eps);
  for (int i = 0; i < (2 + args.hc) * args.hc; ++i) {
    const float* f = args.fn.row(i);
    float dot = 0.0f;
    for (int64_t d = threadIdx.x; d < cols; d += blockDim.x) dot += (a[d] * inv) * f[d];
    const float total = deepinfer::cuda::block_sum(dot, scratch);
    if (threadIdx.x == 0) mixes[i] = total;
  }
}

constexpr int kMaxHc = 8;  // (2 + hc) * hc <= kMaxMixes

// pre, post and the Sinkhorn-projected comb of row m from its mixes (in shared memory), by the
// whole block (at least hc * hc threads): thread j * hc + k owns comb[j, k]. Each element goes
// through the reference's operations in the reference's order (a row's or column's sum is taken
// over its elements in index order, before any of them is divided), so the bits equal one
// thread doing it all; the 40 normalizations of 20 Sinkhorn iterations cost a few barriers each
// instead of a single thread's chain of dependent divisions.
__device__ void hc_mix_finish(const MixArgs& args, int64_t m, const float* mixes) {
  __shared__ float comb[kMaxHc * kMaxHc];
  const int hc = args.hc;
  const float* sc = args.scale;
  const float* bs = args.base;
  const float eps = args.hc_eps;
  const int e = threadIdx.x;
  const bool owner = e < hc * hc;
  const int j = owner ? e / hc : 0;
  const int k = owner ? e % hc : 0;
  if (e < hc) {
    args.pre.row(m)[e] = deepinfer::cuda::sigmoidf(mixes[e] * sc[0] + bs[e]) + eps;
    args.post.row(m)[e] = 2.0f * deepinfer::cuda::sigmoidf(mixes[hc + e] * sc[1] + bs[hc + e]);
  }
  float value = owner ? mixes[2 * hc + e] * sc[2] + bs[2 * hc + e] : 0.0f;
  if (owner) comb[e] = value;
  __syncthreads();
  // Row softmax plus eps.
  float max_logit = -INFINITY;
  for (int i = 0; i < hc && owner; ++i) max_logit = fmaxf(max_logit, comb[j * hc + i]);
  __syncthreads();
  if (owner) comb[e] = expf(value - max_logit);
  __syncthreads();
  float sum = 0.0f;
  for (int i = 0; i < hc && owner; ++i) sum += comb[j * hc + i];
  value = owner ? comb[e] / sum + eps : 0.0f;
  __syncthreads();
  if (owner) comb[e] = value;
  __syncthreads();
  // One column normalization, then (iters - 1) times rows and columns: the reference's order.
  const int column_passes = args.sinkhorn_iters > 1 ? args.sinkhorn_iters : 1;
  for (int iteration = 0; iteration < column_passes; ++iteration) {
    if (iteration > 0) {
      sum = 0.0f;
      for (int i = 0; i < hc && owner; ++i) sum += comb[j * hc + i];
      value /= sum + eps;
      __syncthreads();
      if (owner) comb[e] = value;
      __syncthreads();
    }
    sum = 0.0f;
    for (int i = 0; i < hc && owner; ++i) sum += comb[i * hc + k];
    value /= sum + eps;
    __syncthreads();
    if (owner) comb[e] = value;
    __syncthreads();
  }
  if (owner) args.comb.row(m)[e] = value;
}

// One block per row: every mix, then the Sinkhorn projection.
__global__ void __launch_bounds__(kThreads) hc_mixes_kernel(MixArgs args) {
  __shared__ float mixes[kMaxMixes];
  hc_mix_dots(args, blockIdx.x, mixes);
  __syncthreads();  // hc_mix_dots' last mix is written by thread 0
  hc_mix_finish(args, blockIdx.x, mixes);
}

// ---- the split path: partial sums over slices of the streams, then one thread per row --------
//
// mixes[m, i] = rsqrt(mean(x[m]^2) + eps) * sum_slices (x[m, slice] . fn[i, slice]): a block
// takes one slice of kSliceCols columns for up to kSliceRows rows (staged in shared memory),
// warp w the mixes w, w + 8, ...; a lane sums its float4 columns in order, the warp folds the
// lanes in a fixed tree. The slices, rows per block and folds are fixed by the shapes, never by
// the row count, so every row gets the same bits in any batch. fn (~2 MB at V4.1 width) is read
// by cols / kSliceCols blocks at decode instead of one.
constexpr int kSliceCols = 1024;
constexpr int kSliceRows = 8;
constexpr int kMixWarps = kThreads / 32;
static_assert(kSliceRows == kMixWarps, "warp w sums the squares of row w");
static_assert(kSliceCols % 128 == 0, "a warp reads 128 floats a step");

__device__ __forceinline__ float fold_warp(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// The warp's lane sums of rows first_row + r (r < row_count) folded, and lane 0 storing each as
// partial `column` of its row's slice in partials [M, slices, stride].
template <int kRows>
__device__ __forceinline__ void store_row_partials(const float (&sums)[kRows], int lane,
                                                   int row_count, int64_t first_row, int slices,
                                                   int slice, int stride, int column,
                                                   float* partials) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float total = fold_warp(sums[r]);
    if (lane == 0 && r < row_count)
      partials[((first_row + r) * slices + slice) * stride + column] = total;
  }
}

// partials [M, slices, mix_count + 1]: each mix's partial dot product, then the sum of squares.
__global__ void __launch_bounds__(kThreads)
    hc_mix_partials_kernel(MixArgs args, int slices, float* partials) {
  __shared__ float4 rows[kSliceRows][kSliceCols / 4];
  const int slice = blockIdx.x;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kSliceRows;
  const int row_count =
      static_cast<int>(deepinfer::cuda::min64(kSliceRows, args.x.rows - first_row));
  const int64_t first_col = static_cast<int64_t>(slice) * kSliceCols;
  const int quads =
      static_cast<int>(deepinfer::cuda::min64(kSliceCols, args.x.cols - first_col) / 4);
  for (int i = threadIdx.x; i < row_count * quads; i += kThreads) {
    const int r = i / quads;
    const int quad = i % quads;
    rows[r][quad] = reinterpret_cast<const float4*>(args.x.row(first_row + r) + first_col)[quad];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int mix_count = (2 + args.hc) * args.hc;
  const int stride = mix_count + 1;
  for (int mix = warp; mix < mix_count; mix += kMixWarps) {
    const float4* f = reinterpret_cast<const float4*>(args.fn.row(mix) + first_col);
    float sums[kSliceRows] = {};
    for (int quad = lane; quad < quads; quad += 32) {
      const float4 weights = __ldg(f + quad);
#pragma unroll
      for (int r = 0; r < kSliceRows; ++r) sums[r] += dot4(rows[r][quad], weights);
    }
    store_row_partials(sums, lane, row_count, first_row, slices, slice, stride, mix, partials);
  }
  if (warp < row_count) {
    float squares = 0.0f;
    for (int quad = lane; quad < quads; quad += 32)
      squares += dot4(rows[warp][quad], rows[warp][quad]);
    squares = fold_warp(squares);
    if (lane == 0) partials[((first_row + warp) * slices + slice) * stride + mix_count] = squares;
  }
}

// One block per row: thread i adds mix i's slice partials in slice order (the loads of all mixes
// in flight at once), then the block runs the Sinkhorn projection on them.
constexpr int kFinishThreads = 128;
static_assert(kFinishThreads >= kMaxMixes + 1 && kFinishThreads >= kMaxHc * kMaxHc);

__global__ void __launch_bounds__(kFinishThreads)
    hc_mix_finish_kernel(MixArgs args, int slices, const float* partials) {
  __shared__ float sums[kMaxMixes + 1];
  const int64_t m = blockIdx.x;
  const int mix_count = (2 + args.hc) * args.hc;
  const int stride = mix_count + 1;
  const float* row = partials + m * slices * stride;
  if (threadIdx.x < stride) {
    float sum = 0.0f;
    for (int slice = 0; slice < slices; ++slice) sum += row[slice * stride + threadIdx.x];
    sums[threadIdx.x] = sum;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(sums[mix_count] / static_cast<float>(args.x.cols) + args.norm_eps);
  __syncthreads();  // every thread read sums[mix_count] before thread i rescales its mix
  if (threadIdx.x < mix_count) sums[threadIdx.x] *= inv;
  __syncthreads();
  hc_mix_finish(args, m, sums);
}

// hc_mix_partials_kernel's sums with the loads in flight together and the mixes spread over
// more blocks. blockIdx.x = mix group g of `groups`: warp w takes the mixes g * 8 + w,
// (g + groups) * 8 + w, ... (groups = 1: hc_mix_partials_kernel's assignment); the row squares
// are group 0's. A lane's eight float4s of fn are loaded into registers before the block waits
// for its rows, then summed in the same order, so every partial has the same bits. The old
// kernel's run-time loop waits for one float4 of fn at a time: at decode each of its 20 blocks
// sat through 24 memory latencies in a row. Launched as a dependent (launch_dependent), the first
// fn loads (a weight: no kernel writes it) also overlap the end of the kernel before; the rows
// are read after the wait for it.
constexpr int kQuadsPerLane = kSliceCols / 128;

__global__ void __launch_bounds__(kThreads)
    hc_mix_partials_preload_kernel(MixArgs args, int slices, int groups, float* partials) {
  __shared__ float4 rows[kSliceRows][kSliceCols / 4];
  const int group = blockIdx.x;
  const int slice = blockIdx.y;
  const int64_t first_row = static_cast<int64_t>(blockIdx.z) * kSliceRows;
  const int row_count =
      static_cast<int>(deepinfer::cuda::min64(kSliceRows, args.x.rows - first_row));
  const int64_t first_col = static_cast<int64_t>(slice) * kSliceCols;
  const int quads =
      static_cast<int>(deepinfer::cuda::min64(kSliceCols, args.x.cols - first_col) / 4);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int mix_count = (2 + args.hc) * args.hc;
  const int stride = mix_count + 1;
  const int first_mix = group * kMixWarps + warp;
  const int mix_step = groups * kMixWarps;
  float4 weights[kQuadsPerLane];
  const auto load_weights = [&](int mix) {
    const float4* f = reinterpret_cast<const float4*>(args.fn.row(mix) + first_col);
#pragma unroll
    for (int s = 0; s < kQuadsPerLane; ++s) {
      const int quad = lane + 32 * s;
      if (quad < quads) weights[s] = __ldg(f + quad);
    }
  };
  if (first_mix < mix_count) load_weights(first_mix);  // in flight while the rows arrive
  wait_for_prior_grids();
  allow_dependent_grids();
  for (int i = threadIdx.x; i < row_count * quads; i += kThreads) {
    const int r = i / quads;
    const int quad = i % quads;
    rows[r][quad] = reinterpret_cast<const float4*>(args.x.row(first_row + r) + first_col)[quad];
  }
  __syncthreads();
  for (int mix = first_mix; mix < mix_count; mix += mix_step) {
    if (mix != first_mix) load_weights(mix);
    float sums[kSliceRows] = {};
#pragma unroll
    for (int s = 0; s < kQuadsPerLane; ++s) {
      const int quad = lane + 32 * s;
      if (quad < quads) {
#pragma unroll
        for (int r = 0; r < kSliceRows; ++r) sums[r] += dot4(rows[r][quad], weights[s]);
      }
    }
#pragma unroll
    for (int r = 0; r < kSliceRows; ++r) {
      const float total = fold_warp(sums[r]);
      if (lane == 0 && r < row_count)
        partials[((first_row + r) * slices + slice) * stride + mix] = total;
    }
  }
  if (group == 0 && warp < row_count) {
    float squares = 0.0f;
    for (int quad = lane; quad < quads; quad += 32)
      squares += dot4(rows[warp][quad], rows[warp][quad]);
    squares = fold_warp(squares);
    if (lane == 0) partials[((first_row + warp) * slices + slice) * stride + mix_count] = squares;
  }
}

// hc_mix_partials_preload_kernel's partials (groups = 1) for many rows. The old kernel stages 8
// rows of a slice in shared memory, reads each of them once per mix (24 shared reads of every x
// byte at hc 4) and all of fn from L2 per 8 rows: 0.96 ms for 8192 rows. Here a block stages one
// slice of fn (mix_count x kSliceCols, 96 KiB at hc 4) once, and warp w holds kRows rows of the
// slice in registers (lane L: quads L + 32 s, the old lanes' quads), so a shared load of fn feeds
// kRows dot products. Every partial is one lane's sum over its quads in order, then the same
// fold: the old bits. The grid is the GPU's resident blocks; block b takes a contiguous run of
// (slice, 8-tile chunk) items in slice-major order and restages fn when its slice changes.
// Measured 0.84 ms at 8192 rows (kRows 2, whole op): still ~19% of HBM, so it is latency bound,
// not byte bound; likely the per-quad guards below, which keep a mix's eight shared loads in
// separate branches (997bd8d has an unguarded full-slice variant, unmeasured).
constexpr int kRowsMaxMixes = 24;  // hc <= 4
constexpr int kSliceQuads = kSliceCols / 4;
constexpr size_t kRowsFnBytes = size_t{kRowsMaxMixes} * kSliceCols * sizeof(float);

template <int kRows>
__global__ void __launch_bounds__(kThreads, kRows <= 2 ? 2 : 1)
    hc_mix_partials_rows_kernel(MixArgs args, int slices, int64_t chunks_per_slice,
                                float* partials) {
  extern __shared__ float4 fn_slice[];  // [mix_count][kSliceQuads]
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int mix_count = (2 + args.hc) * args.hc;
  const int stride = mix_count + 1;
  const int64_t rows = args.x.rows;
  const int64_t tiles = (rows + kRows - 1) / kRows;
  const int64_t items = slices * chunks_per_slice;
  const int64_t begin = items * blockIdx.x / gridDim.x;
  const int64_t end = items * (blockIdx.x + 1) / gridDim.x;
  int staged = -1;
  int quads = 0;
  int64_t first_col = 0;
  for (int64_t item = begin; item < end; ++item) {
    const int slice = static_cast<int>(item / chunks_per_slice);
    if (slice != staged) {  // uniform over the block
      first_col = static_cast<int64_t>(slice) * kSliceCols;
      quads = static_cast<int>(deepinfer::cuda::min64(kSliceCols, args.x.cols - first_col) / 4);
      __syncthreads();  // every warp is done with the previous slice's fn
      for (int i = threadIdx.x; i < mix_count * kSliceQuads; i += kThreads) {
        const int mix = i / kSliceQuads;
        const int quad = i % kSliceQuads;
        if (quad < quads) {
          fn_slice[i] = __ldg(reinterpret_cast<const float4*>(args.fn.row(mix) + first_col) + quad);
        }
      }
      __syncthreads();
      staged = slice;
    }
    const int64_t tile = (item % chunks_per_slice) * kMixWarps + warp;
    if (tile >= tiles) continue;
    const int64_t first_row = tile * kRows;
    const int row_count = static_cast<int>(deepinfer::cuda::min64(kRows, rows - first_row));
    float4 x[kRows][kQuadsPerLane];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4* a = reinterpret_cast<const float4*>(
          args.x.row(first_row + (r < row_count ? r : 0)) + first_col);
#pragma unroll
      for (int s = 0; s < kQuadsPerLane; ++s) {
        const int quad = lane + 32 * s;
        x[r][s] = quad < quads ? a[quad] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    for (int mix = 0; mix < mix_count; ++mix) {
      const float4* f = fn_slice + mix * kSliceQuads;
      float sums[kRows] = {};
#pragma unroll
      for (int s = 0; s < kQuadsPerLane; ++s) {
        const int quad = lane + 32 * s;
        if (quad < quads) {
          const float4 weights = f[quad];
#pragma unroll
          for (int r = 0; r < kRows; ++r) sums[r] += dot4(x[r][s], weights);
        }
      }
      store_row_partials(sums, lane, row_count, first_row, slices, slice, stride, mix, partials);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float squares = 0.0f;
#pragma unroll
      for (int s = 0; s < kQuadsPerLane; ++s) {
        if (lane + 32 * s < quads) squares += dot4(x[r][s], x[r][s]);
      }
      squares = fold_warp(squares);
      if (lane == 0 && r < row_count)
        partials[((first_row + r) * slices + slice) * stride + mix_count] = squares;
    }
  }
}

// hc_mix_finish_kernel by one warp per row, for hc <= 4 (the mixes and the squares, 25 at hc 4,
// fit the lanes): lane i adds mix i's slice partials in slice order (all loads issued first),
// and lane j * hc + k owns comb[j, k], reading the others' elements by shuffles in the same index
// order as hc_mix_finish reads shared memory, so every value goes through the same operations.
// The block version spends two barriers on each of the Sinkhorn projection's 40 normalizations;
// the warp needs none.
//
// kHc > 0 fixes hc at compile time (the released 4): each normalization's hc shuffles unroll and
// issue together instead of a loop of dependent shuffle-add steps, so the projection's chain of
// 41 normalizations (one a few tens of cycles shorter each) bounds a decode step's call less.
// kHc == 0 reads args.hc. The same operations in the same order either way.
constexpr int kFinishRowsPerBlock = 4;
constexpr int kMaxWarpSlices = 32;  // rows of up to 32768 columns

template <int kHc>
__global__ void __launch_bounds__(kFinishRowsPerBlock * 32)
    hc_mix_finish_warp_kernel(MixArgs args, int slices, const float* partials) {
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kFinishRowsPerBlock + threadIdx.x / 32;
  if (m >= args.x.rows) return;  // a whole warp leaves together
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  const int hc = kHc > 0 ? kHc : args.hc;
  const int mix_count = (2 + hc) * hc;
  const int stride = mix_count + 1;
  const float* row = partials + m * slices * stride;
  float slice_sums[kMaxWarpSlices];
#pragma unroll
  for (int slice = 0; slice < kMaxWarpSlices; ++slice) {
    slice_sums[slice] = slice < slices && lane < stride ? row[slice * stride + lane] : 0.0f;
  }
  float sum = 0.0f;
#pragma unroll
  for (int slice = 0; slice < kMaxWarpSlices; ++slice) {
    if (slice < slices) sum += slice_sums[slice];
  }
  const float squares = __shfl_sync(all, sum, mix_count);
  const float inv = 1.0f / sqrtf(squares / static_cast<float>(args.x.cols) + args.norm_eps);
  const float mix = sum * inv;  // lane i < mix_count: mix i

  const float* sc = args.scale;
  const float* bs = args.base;
  const float eps = args.hc_eps;
  const int e = lane;
  const bool owner = e < hc * hc;
  const int j = owner ? e / hc : 0;
  const int k = owner ? e % hc : 0;
  const float post_mix = __shfl_sync(all, mix, (hc + e) % 32);
  const float comb_mix = __shfl_sync(all, mix, (2 * hc + e) % 32);
  if (e < hc) {
    args.pre.row(m)[e] = deepinfer::cuda::sigmoidf(mix * sc[0] + bs[e]) + eps;
    args.post.row(m)[e] = 2.0f * deepinfer::cuda::sigmoidf(post_mix * sc[1] + bs[hc + e]);
  }
  float value = owner ? comb_mix * sc[2] + bs[2 * hc + e] : 0.0f;
  // Row softmax plus eps.
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < hc; ++i) max_logit = fmaxf(max_logit, __shfl_sync(all, value, j * hc + i));
  if (owner) value = expf(value - max_logit);
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < hc; ++i) total += __shfl_sync(all, value, j * hc + i);
  if (owner) value = value / total + eps;
  // One column normalization, then (iters - 1) times rows and columns: the reference's order.
  const int column_passes = args.sinkhorn_iters > 1 ? args.sinkhorn_iters : 1;
  for (int iteration = 0; iteration < column_passes; ++iteration) {
    if (iteration > 0) {
      total = 0.0f;
#pragma unroll
      for (int i = 0; i < hc; ++i) total += __shfl_sync(all, value, j * hc + i);
      value /= total + eps;
    }
    total = 0.0f;
#pragma unroll
    for (int i = 0; i < hc; ++i) total += __shfl_sync(all, value, i * hc + k);
    value /= total + eps;
  }
  if (owner) args.comb.row(m)[e] = value;
}

void launch_finish_warp(const MixArgs& args, int slices, const float* partials) {
  const unsigned blocks = blocks_for(args.x.rows, kFinishRowsPerBlock);
  launch_dependent(args.hc == 4 ? hc_mix_finish_warp_kernel<4> : hc_mix_finish_warp_kernel<0>,
                   blocks, kFinishRowsPerBlock * 32, 0, current_stream(), args, slices, partials);
}

// false (or DEEPINFER_HC_PRELOAD=0): hc_mix_partials_kernel.
RuntimeSwitch kPreloadPartials{"DEEPINFER_HC_PRELOAD", true};
// false (or DEEPINFER_HC_ROWS=0): the preload kernel at every row count.
RuntimeSwitch kRowsPartials{"DEEPINFER_HC_ROWS", true};
// The fewest rows that take hc_mix_partials_rows_kernel (both kernels give the same bits). H200,
// hc 4 x 5120, whole op: 256 rows 0.059 ms against the preload kernel's 0.052, 1024 rows 0.123
// against 0.140, 8192 rows 0.838 against 0.960 (cuda_hc_bench).
RuntimeSetting kRowsPartialsMinRows{"DEEPINFER_HC_ROWS_MIN", 1024, 1, 1 << 30};
// Rows a warp holds in hc_mix_partials_rows_kernel: 2 (two blocks an SM) or 4 (one: 8 warps an
// SM, 1.14 ms at 8192 rows, slower than 2).
RuntimeSetting kRowsPartialsTile{"DEEPINFER_HC_ROWS_TILE", 2, 2, 4};
// false (or DEEPINFER_HC_WARP_FINISH=0): hc_mix_finish_kernel.
RuntimeSwitch kWarpFinish{"DEEPINFER_HC_WARP_FINISH", true};

// With batch invariance off and at least DEEPINFER_HC_CUBLASLT_MIN_ROWS rows (and what
// linear_cublaslt_selected asks: not while recording a graph), the mixes' dot products are one
// cuBLASLt FP32 GEMM (x . fn^T into the partials, one slice) and hc_row_squares_kernel adds the
// rows' squares: other sums' order, so other bits, within the same bounds. false
// (DEEPINFER_HC_CUBLASLT=0): the slice kernels at every row count. H200 (cuda_hc_bench, hc 4 x
// 5120, the whole op, 2026-12-02 03:22 call, ms): 256 rows 0.0625 against the preload kernel's
// 0.0541 (the GEMM and the squares' second pass over x cost more there), 1024 rows 0.1105 against
// the rows kernel's 0.1287, 2048 0.1689 against 0.2295, 8192 0.5685 against 0.8284.
RuntimeSwitch kCublasLtMixes{"DEEPINFER_HC_CUBLASLT", true};
RuntimeSetting kCublasLtMixesMinRows{"DEEPINFER_HC_CUBLASLT_MIN_ROWS", 1024, 1, 1 << 30};

// false (or DEEPINFER_HC_SPLIT=0): one block per row does every mix (hc_mixes_kernel).
RuntimeSwitch kSplitMixes{"DEEPINFER_HC_SPLIT", true};

bool split_mixes(const MixArgs& args) {
  const bool enabled = kSplitMixes.enabled();
  // float4 rows: 16-byte aligned rows of a multiple of 4 columns.
  return enabled && args.x.cols % 4 == 0 && args.x.stride % 4 == 0 && args.fn.stride % 4 == 0 &&
         deepinfer::cuda::aligned_to(args.x.data, 16) &&
         deepinfer::cuda::aligned_to(args.fn.data, 16);
}

template <int kRows>
void launch_rows_partials(const MixArgs& args, int slices, float* partials) {
  // Resident blocks of this kernel on the whole GPU (96 KiB of fn each), queried once.
  static const int64_t resident = [] {
    const int sms = deepinfer::cuda::multiprocessor_count();
    int per_sm = 0;
    DI_CUDA_CHECK(cudaFuncSetAttribute(hc_mix_partials_rows_kernel<kRows>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kRowsFnBytes)));
    DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, hc_mix_partials_rows_kernel<kRows>, kThreads, kRowsFnBytes));
    return static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  }();
  const int64_t tiles = (args.x.rows + kRows - 1) / kRows;
  const int64_t chunks_per_slice = (tiles + kMixWarps - 1) / kMixWarps;
  const int64_t items = slices * chunks_per_slice;
  const int64_t blocks = items < resident ? items : resident;
  const size_t fn_bytes = static_cast<size_t>((2 + args.hc) * args.hc) * kSliceCols * sizeof(float);
  hc_mix_partials_rows_kernel<kRows>
      <<<static_cast<unsigned>(blocks), kThreads, fn_bytes, current_stream()>>>(
          args, slices, chunks_per_slice, partials);
  DI_CUDA_LAUNCHED(hc_mix_partials_rows_kernel);
}

// One warp a row: the sum of its squares into partials[row * stride + mix_count] (the GEMM path's
// one slice; float4 rows).
constexpr int kSquaresRowsPerBlock = 8;
__global__ void __launch_bounds__(kSquaresRowsPerBlock * 32)
    hc_row_squares_kernel(DeviceRows<const float> x, int stride, int mix_count, float* partials) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSquaresRowsPerBlock + threadIdx.x / 32;
  if (row >= x.rows) return;
  const int lane = threadIdx.x & 31;
  const auto* quads = reinterpret_cast<const float4*>(x.row(row));
  const int64_t quad_count = x.cols / 4;
  float squares = 0.0f;
  for (int64_t q = lane; q < quad_count; q += 32) squares += dot4(quads[q], quads[q]);
  squares = fold_warp(squares);
  if (lane == 0) partials[row * stride + mix_count] = squares;
}

__global__ void hc_collapse_kernel(DeviceRows<const float> x, int64_t hc, int64_t dim,
                                   DeviceRows<const float> pre, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= x.rows * dim) return;
  const int64_t m = index / dim;
  const int64_t d = index % dim;
  float sum = 0.0f;
  for (int64_t j = 0; j < hc; ++j) sum += pre.row(m)[j] * x.row(m)[j * dim + d];
  out.row(m)[d] = sum;
}

// One thread per (row, channel) reads every stream's channel before writing any: out may alias
// the residual.
__global__ void hc_expand_kernel(DeviceRows<const float> y, DeviceRows<const float> residual,
                                 int hc, int64_t dim, DeviceRows<const float> post,
                                 DeviceRows<const float> comb, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= residual.rows * dim) return;
  const int64_t m = index / dim;
  const int64_t d = index % dim;
  float streams[kMaxStreams];
#pragma unroll
  for (int j = 0; j < kMaxStreams; ++j) {
    if (j < hc) streams[j] = residual.row(m)[j * dim + d];
  }
  const float* weights = comb.row(m);
  const float value = y.row(m)[d];
  for (int k = 0; k < hc; ++k) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxStreams; ++j) {
      if (j < hc) sum += weights[j * hc + k] * streams[j];
    }
    out.row(m)[k * dim + d] = post.row(m)[k] * value + sum;
  }
}

// hc_collapse_kernel and hc_expand_kernel four channels a thread: 16-byte loads and stores, the
// row's pre / post / comb read once per four channels, 32-bit channel indices from a 2D grid
// (no 64-bit division). Every output channel takes the old kernels' expression in the same order.
// The old kernels: one thread per channel, 4-byte accesses and a 64-bit division each, at
// ~30% of HBM for 8192 rows.
template <int kHc>
__global__ void __launch_bounds__(kThreads)
    hc_collapse_vec_kernel(DeviceRows<const float> x, int quads, DeviceRows<const float> pre,
                           DeviceRows<float> out) {
  wait_for_prior_grids();
  allow_dependent_grids();
  const int quad = blockIdx.x * kThreads + threadIdx.x;
  if (quad >= quads) return;
  for (int64_t m = blockIdx.y; m < x.rows; m += gridDim.y) {
    const float4* streams = reinterpret_cast<const float4*>(x.row(m));
    float4 in[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) in[j] = streams[j * quads + quad];
    float weights[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) weights[j] = pre.row(m)[j];
    float4 result;
    float* r = &result.x;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kHc; ++j) sum += weights[j] * (&in[j].x)[c];
      r[c] = sum;
    }
    reinterpret_cast<float4*>(out.row(m))[quad] = result;
  }
}

template <int kHc>
__global__ void __launch_bounds__(kThreads)
    hc_expand_vec_kernel(DeviceRows<const float> y, DeviceRows<const float> residual, int quads,
                         DeviceRows<const float> post, DeviceRows<const float> comb,
                         DeviceRows<float> out) {
  wait_for_prior_grids();
  allow_dependent_grids();
  const int quad = blockIdx.x * kThreads + threadIdx.x;
  if (quad >= quads) return;
  for (int64_t m = blockIdx.y; m < residual.rows; m += gridDim.y) {
    const float4* in = reinterpret_cast<const float4*>(residual.row(m));
    float4 streams[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) streams[j] = in[j * quads + quad];
    const float4 value = reinterpret_cast<const float4*>(y.row(m))[quad];
    const float* weights = comb.row(m);
    float4* o = reinterpret_cast<float4*>(out.row(m));
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      const float scale = post.row(m)[k];
      float4 result;
      float* r = &result.x;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kHc; ++j) sum += weights[j * kHc + k] * (&streams[j].x)[c];
        r[c] = scale * (&value.x)[c] + sum;
      }
      o[k * quads + quad] = result;
    }
  }
}

// false (or DEEPINFER_HC_COLLAPSE_VEC=0 / DEEPINFER_HC_EXPAND_VEC=0): a thread per channel.
RuntimeSwitch kCollapseVec{"DEEPINFER_HC_COLLAPSE_VEC", true};
RuntimeSwitch kExpandVec{"DEEPINFER_HC_EXPAND_VEC", true};

// float4 access: a multiple of 4 channels, 16-byte aligned rows.
template <typename T>
bool float4_rows(const DeviceRows<T>& rows) {
  return rows.stride % 4 == 0 && deepinfer::cuda::aligned_to(rows.data, 16);
}

dim3 vec_grid(int64_t rows, int quads) {
  const int64_t row_blocks = rows < 65535 ? rows : 65535;
  return dim3(static_cast<unsigned>((quads + kThreads - 1) / kThreads),
              static_cast<unsigned>(row_blocks));
}

}  // namespace

void hc_mixes(const TensorView& x, const TensorView& fn, const TensorView& scale,
              const TensorView& base, const HcParams& params, const TensorView& pre,
              const TensorView& post, const TensorView& comb) {
  MixArgs args{};
  args.hc = params.hc;
  const int64_t mix_count = static_cast<int64_t>(2 + params.hc) * params.hc;
  DI_CHECK(params.hc > 0 && params.hc <= kMaxHc && mix_count <= kMaxMixes, "hc_mult ", params.hc,
           " unsupported (1 to ", kMaxHc, ")");
  args.x = device_rows<const float>(x, "hc streams");
  args.fn = device_rows<const float>(fn, "hc fn");
  args.scale = deepinfer::cuda::device_flat<const float>(scale, "hc scale");
  args.base = deepinfer::cuda::device_flat<const float>(base, "hc base");
  args.pre = device_rows<float>(pre, "hc pre");
  args.post = device_rows<float>(post, "hc post");
  args.comb = device_rows<float>(comb, "hc comb");
  DI_CHECK(args.fn.rows == mix_count && args.fn.cols == args.x.cols, "hc fn ", fn.to_string(),
           " for streams ", x.to_string());
  DI_CHECK(scale.numel() == 3 && base.numel() == mix_count, "hc scale/base shapes");
  DI_CHECK(args.pre.rows == args.x.rows && args.pre.cols == params.hc &&
               args.post.rows == args.x.rows && args.post.cols == params.hc &&
               args.comb.rows == args.x.rows && args.comb.cols == params.hc * params.hc,
           "hc output shapes");
  args.hc_eps = params.hc_eps;
  args.norm_eps = params.norm_eps;
  args.sinkhorn_iters = params.sinkhorn_iters;
  if (args.x.rows == 0) return;
  if (!split_mixes(args)) {
    hc_mixes_kernel<<<static_cast<unsigned>(args.x.rows), kThreads, 0, current_stream()>>>(args);
    DI_CUDA_LAUNCHED(hc_mixes_kernel);
    return;
  }
  const int stride = static_cast<int>(mix_count + 1);
  if (kCublasLtMixes.enabled() && stride <= 32 && args.x.rows >= kCublasLtMixesMinRows.value() &&
      linear_cublaslt_selected(args.x.rows)) {
    deepinfer::cuda::StreamBuffer partials(static_cast<size_t>(args.x.rows * stride) *
                                           sizeof(float));
    if (try_gemm_f32_cublaslt(args.x.data, args.x.stride, args.x.rows, args.fn.data, args.fn.stride,
                              mix_count, args.x.cols, partials.as<float>(), stride)) {
      hc_row_squares_kernel<<<blocks_for(args.x.rows, kSquaresRowsPerBlock),
                              kSquaresRowsPerBlock * 32, 0, current_stream()>>>(
          args.x, stride, static_cast<int>(mix_count), partials.as<float>());
      DI_CUDA_LAUNCHED(hc_row_squares_kernel);
      launch_finish_warp(args, /*slices=*/1, partials.as<float>());
      return;
    }
  }
  const int slices = static_cast<int>((args.x.cols + kSliceCols - 1) / kSliceCols);
  const int64_t row_blocks = (args.x.rows + kSliceRows - 1) / kSliceRows;
  DI_CHECK(row_blocks <= 65535, "hc_mixes: ", args.x.rows, " rows exceed one launch");
  deepinfer::cuda::StreamBuffer partials(
      static_cast<size_t>(args.x.rows * slices * (mix_count + 1)) * sizeof(float));
  const int tile = kRowsPartialsTile.value();
  if (kRowsPartials.enabled() && args.x.rows >= kRowsPartialsMinRows.value() &&
      mix_count <= kRowsMaxMixes && (tile == 2 || tile == 4)) {
    if (tile == 2) {
      launch_rows_partials<2>(args, slices, partials.as<float>());
    } else {
      launch_rows_partials<4>(args, slices, partials.as<float>());
    }
  } else if (kPreloadPartials.enabled()) {
    // Few rows: one mix per warp (3 groups at hc 4), enough blocks to read fn at the machine's
    // width. Many rows: one group, each block's rows reusing its fn slice for every mix.
    // The choice moves work between blocks only, never a partial's bits.
    constexpr int64_t kWideGrid = 4 * 132;  // four blocks per SM of an H200
    const int64_t one_group_blocks = slices * row_blocks;
    const int groups = one_group_blocks < kWideGrid
                           ? static_cast<int>((mix_count + kMixWarps - 1) / kMixWarps)
                           : 1;
    launch_dependent(hc_mix_partials_preload_kernel,
                     dim3(static_cast<unsigned>(groups), static_cast<unsigned>(slices),
                          static_cast<unsigned>(row_blocks)),
                     kThreads, 0, current_stream(), args, slices, groups, partials.as<float>());
  } else {
    hc_mix_partials_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(row_blocks)),
                             kThreads, 0, current_stream()>>>(args, slices, partials.as<float>());
    DI_CUDA_LAUNCHED(hc_mix_partials_kernel);
  }
  if (kWarpFinish.enabled() && mix_count + 1 <= 32 && slices <= kMaxWarpSlices) {
    launch_finish_warp(args, slices, partials.as<float>());
    return;
  }
  hc_mix_finish_kernel<<<static_cast<unsigned>(args.x.rows), kFinishThreads, 0, current_stream()>>>(
      args, slices, partials.as<float>());
  DI_CUDA_LAUNCHED(hc_mix_finish_kernel);
}

void hc_collapse(const TensorView& x, const TensorView& pre, const TensorView& out) {
  DI_CHECK(x.rank() == 3, "hc_collapse streams must be [M, hc, D]: ", x.to_string());
  const int64_t hc = x.size(1);
  const int64_t dim = x.size(2);
  const auto in = device_rows<const float>(x, "hc streams");
  const auto p = device_rows<const float>(pre, "hc pre");
  const auto o = device_rows<float>(out, "hc collapse output");
  DI_CHECK(p.rows == in.rows && p.cols == hc && o.rows == in.rows && o.cols == dim,
           "hc_collapse shapes");
  if (in.rows * dim == 0) return;
  if (kCollapseVec.enabled() && (hc == 1 || hc == 2 || hc == 4 || hc == 8) && dim % 4 == 0 &&
      dim / 4 <= INT32_MAX && float4_rows(in) && float4_rows(o)) {
    const int quads = static_cast<int>(dim / 4);
    const auto kernel = hc == 1   ? hc_collapse_vec_kernel<1>
                        : hc == 2 ? hc_collapse_vec_kernel<2>
                        : hc == 4 ? hc_collapse_vec_kernel<4>
                                  : hc_collapse_vec_kernel<8>;
    launch_dependent(kernel, vec_grid(in.rows, quads), kThreads, 0, current_stream(), in, quads, p,
                     o);
    return;
  }
  hc_collapse_kernel<<<blocks_for(in.rows * dim, kThreads), kThreads, 0, current_stream()>>>(
      in, hc, dim, p, o);
  DI_CUDA_LAUNCHED(hc_collapse_kernel);
}

void hc_expand(const TensorView& y, const TensorView& residual, const TensorView& post,
               const TensorView& comb, const TensorView& out) {
  DI_CHECK(residual.rank() == 3, "hc_expand residual must be [M, hc, D]");
  const int64_t hc = residual.size(1);
  const int64_t dim = residual.size(2);
  DI_CHECK(hc <= kMaxStreams, "hc_expand supports up to ", kMaxStreams, " streams, got ", hc);
  const auto in = device_rows<const float>(y, "hc sublayer output");
  const auto r = device_rows<const float>(residual, "hc residual");
  const auto q = device_rows<const float>(post, "hc post");
  const auto c = device_rows<const float>(comb, "hc comb");
  const auto o = device_rows<float>(out, "hc expand output");
  DI_CHECK(in.rows == r.rows && in.cols == dim && q.cols == hc && c.cols == hc * hc &&
               o.rows == r.rows && o.cols == hc * dim,
           "hc_expand shapes");
  if (r.rows * dim == 0) return;
  if (kExpandVec.enabled() && (hc == 1 || hc == 2 || hc == 4 || hc == 8) && dim % 4 == 0 &&
      dim / 4 <= INT32_MAX && float4_rows(in) && float4_rows(r) && float4_rows(o)) {
    const int quads = static_cast<int>(dim / 4);
    const auto kernel = hc == 1   ? hc_expand_vec_kernel<1>
                        : hc == 2 ? hc_expand_vec_kernel<2>
                        : hc == 4 ? hc_expand_vec_kernel<4>
                                  : hc_expand_vec_kernel<8>;
    launch_dependent(kernel, vec_grid(r.rows, quads), kThreads, 0, current_stream(), in, r, quads,
                     q, c, o);
    return;
  }
  hc_expand_kernel<<<blocks_for(r.rows * dim, kThreads), kThreads, 0, current_stream()>>>(
      in, r, static_cast<int>(hc), dim, q, c, o);
  DI_CUDA_LAUNCHED(hc_expand_kernel);
}

}  // namespace deepinfer::ops::cuda
