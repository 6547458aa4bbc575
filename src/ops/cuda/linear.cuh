// The CUDA linear layer's pieces that other kernels build on (moe_experts runs the same GEMM
// per expert group): weights described in their storage format, the tile GEMM launcher, and
// the released numerics' activation quantizer. Internal to the CUDA backend.
#pragma once

#include <cooperative_groups.h>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace deepinfer::ops::cuda {

// 64-bit so that DeviceWeight has no padding (its bytes key resident_copy).
enum class WeightKind : int64_t { kF32, kBF16, kF8, kF4 };

// A linear weight as the kernels read it (plain data, copyable to device memory, no padding).
struct DeviceWeight {
  WeightKind kind = WeightKind::kF32;
  const uint8_t* bytes = nullptr;
  int64_t out = 0;
  int64_t in = 0;
  int64_t row_bytes = 0;
  const uint8_t* scale = nullptr;
  int64_t scale_cols = 0;
  int64_t block_out = 1;
  int64_t block_in = 1;
};

// Checks a device LinearWeight and describes it; throws Error naming what does not fit.
DeviceWeight describe(const LinearWeight& weight);

// Grouped mode of launch_linear: group g owns rows [offsets[g], offsets[g + 1]) of x and out
// and multiplies them by weights[g] (both arrays in device memory, so the grouping can be
// decided on the device); no group has more than max_rows rows.
struct GemmGroups {
  const int32_t* offsets = nullptr;
  const DeviceWeight* weights = nullptr;
  int count = 0;
  int64_t max_rows = 0;
};

// out = x . W^T on the current stream; `shape` gives out/in features (in grouped mode every
// group's weight has this shape).
void launch_linear(deepinfer::cuda::DeviceRows<const float> x, const DeviceWeight& shape,
                   deepinfer::cuda::DeviceRows<float> out, const GemmGroups& groups = {});

// The tensor-core GEMMs of moe_grouped_gemm.cu (released numerics only: they quantize x
// themselves, e4m3 with a ue8m0 scale per 32): whether a weight fits them (fp4 with per-32
// scales, or fp8 with 32x32 block scales; K % 256 == 0, N % 16 == 0), and the grouped fp4 one
// over groups.weights (every group's weight must fit). Both are batch invariant; they differ
// from launch_linear's FMA chain in summation order only.
bool grouped_fp4_supports(const DeviceWeight& w);
bool fp8_mma_supports(const DeviceWeight& w);
void launch_grouped_fp4(deepinfer::cuda::DeviceRows<const float> x, const DeviceWeight& shape,
                        deepinfer::cuda::DeviceRows<float> out, const GemmGroups& groups);

// The routed experts' three projections on the grouped fp4 kernel (moe_experts' released path),
// each input quantized once: the rows x[sorted_token[p]] for p < offsets[E] straight into codes,
// w1 and w3 in one launch (gate, up), swiglu(gate, up) * sorted_weight[p] folded into w2's
// quantizer (ops::cuda::swiglu's arithmetic), w2 into results [entries, dim] (rows past offsets[E]
// not written). The same bits as gathering, launch_grouped_fp4 per projection and swiglu in
// between. Scratch: moe_fp4_scratch_bytes(entries, tables) device bytes, 256-byte aligned.
struct MoeFp4Tables {
  const DeviceWeight* w1 = nullptr;  // device tables [E]; every weight fits grouped_fp4_supports
  const DeviceWeight* w3 = nullptr;
  const DeviceWeight* w2 = nullptr;
  DeviceWeight w13_shape;  // [inter, dim]
  DeviceWeight w2_shape;   // [dim, inter]
};
size_t moe_fp4_scratch_bytes(int64_t entries, const MoeFp4Tables& tables);
void launch_moe_fp4_experts(deepinfer::cuda::DeviceRows<const float> x, const int32_t* sorted_token,
                            const float* sorted_weight, const GemmGroups& groups, int64_t entries,
                            const MoeFp4Tables& tables, float swiglu_limit, void* scratch,
                            deepinfer::cuda::DeviceRows<float> results);

// Where quantize_fp8_rows stores each e4m3 code inside its 32-block, chosen by the GEMM that
// reads it. Every layout puts the same K position in the same MMA k-slot; they differ in which
// loads fetch it.
enum class CodeLayout {
  // K order (64-bit loads of 8 consecutive K: linear_fp8_mma's and linear_fp8_dense's kernels).
  kNatural,
  // Each 8 values as elements 0, 2, 4, 6, 1, 3, 5, 7 (the fp4 kernel's 64-bit loads: 8t..8t+7
  // gives thread t its even K in b0 and its odd K in b1).
  kEvenOdd8,
  // K 8t + 2i at byte 4t + i and K 8t + 2i + 1 at byte 16 + 4t + i: the same k-slots, but b0 and
  // b1 are then words t of the block's two 16-byte halves, which is what ldmatrix hands thread t
  // of a quad when the halves are two 8x8 matrices (the fp4 prefill tile).
  kMmaHalves,
};

// The released activation quantizer (linear.cu's kFp8PerBlock32) as the FP8 tensor-core GEMMs
// read it, on the current stream: e4m3 codes [x.rows, x.cols] (each block's in `layout`) and one
// ue8m0 scale code per 32-block [x.rows, x.cols / 32]; x.cols % 32 == 0. One quantizer for
// moe_grouped_gemm.cu and linear_fp8_dense.cu, so their codes cannot drift apart.
void quantize_fp8_rows(deepinfer::cuda::DeviceRows<const float> x, CodeLayout layout,
                       uint8_t* codes, uint8_t* scale_codes);

// K slices of the split-K tensor-core GEMMs (linear_bf16_mma.cu, linear_fp8_dense.cu): a
// function of the weight's shape only, so every batch size sums the same slices (batch
// invariance). Decode gives each 16-row group's slices to warps of one block, so S doubles, up to
// the block's 8 warps, until N / 16 * S reaches about 1024 warps in flight, while every slice
// keeps whole 32-wide chunks of K.
inline constexpr int kSplitKRowsPerWarp = 16;  // the MMAs' M
inline constexpr int kSplitKChunk = 32;        // K granularity of a slice
inline constexpr int kSplitKMaxSlices = 8;     // warps per block
inline constexpr int64_t kSplitKTargetWarps = 1024;
constexpr int split_k_slices(int64_t n, int64_t k) {
  const int64_t row_groups = n / kSplitKRowsPerWarp;
  int slices = 1;
  while (slices < kSplitKMaxSlices && row_groups * slices < kSplitKTargetWarps &&
         k % (int64_t{kSplitKChunk} * slices * 2) == 0) {
    slices *= 2;
  }
  return slices;
}

// The split-K decode kernels' reduction: a 16-row group's S slices are S consecutive warps of the
// block (slice 0 first), each holding its partial for kTokenTiles 8-token MMA tiles in `acc` (the
// m16n8 accumulator layout). Every warp stores its partial in `partials` (lane-major, so writes
// and reads are conflict-free); after a barrier the slice-0 warp (`sums`) adds them,
// 0 + P_0 + P_1 + ... in slice order (the prefill kernels' additions), and hands each token
// tile's four sums to take(j, sums) as soon as they are done. Warps past the last row group
// (!active) store and sum nothing but must still call it: it holds a barrier. The caller needs
// another barrier before `partials` is written again.
template <int kWarps, int kTokenTiles, typename Take>
__device__ __forceinline__ void sum_slice_partials(float (&partials)[kWarps][kTokenTiles * 4][32],
                                                   const float (&acc)[kTokenTiles][4], bool active,
                                                   bool sums, int slices, const Take& take) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (active) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) partials[warp][4 * j + i][lane] = acc[j][i];
    }
  }
  __syncthreads();
  if (active && sums) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      float total[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = 0.0f;
        for (int s = 0; s < slices; ++s) sum += partials[warp + s][4 * j + i][lane];
        total[i] = sum;
      }
      take(j, total);
    }
  }
}

// Batch invariance off: how many blocks of a thread-block cluster (grid.z, cluster (1, 1, G)) a
// split-K decode tile launch of `blocks` blocks (linear_bf16_mma.cu's) also cuts K over, its S
// `slices` a block becoming S x G slices of K / unit_bytes units (unit_bytes: a unit's weight
// bytes per row). 1 with invariance on or DEEPINFER_DECODE_CLUSTER_K=0. The most ranks (up to the
// portable 8) that divide the units evenly, leave every warp at least
// DEEPINFER_DECODE_CLUSTER_MIN_SLICE_BYTES of each weight row (default 256: two of the BF16
// tile's stages) and the launch at most DEEPINFER_DECODE_CLUSTER_BLOCKS_PER_SM blocks an SM
// (default 4: two waves of the tile's two blocks an SM). The router gate's grid is otherwise 24
// blocks and the compressor's 32 at decode, with most of 132 SMs idle (on the H100, 2026-12-07:
// 14.5 us under ncu for the gate's 4 MB; 6.8 us a call clustered in the model against 10).
// The FP8 split tile was measured with the same clusters and gained nothing (docs/BENCHMARKS.md).
int decode_cluster_ranks(int64_t blocks, int64_t k_units, int slices, int64_t unit_bytes);

// Programmatic dependent launch of the decode tiles (both batch-invariance modes: it moves no
// arithmetic; decode_pdl_enabled, wait_for_prior_grids and allow_dependent_grids are in
// common.cuh): launched with it, a tile's blocks may start while the kernel before it in the
// stream still runs, stream their first weight stages (weights are never written by the step) and
// only then wait for that kernel (wait_for_prior_grids) before reading activations or writing
// anything. Hides the launch gap and the first weight bytes' latency behind the kernel before,
// which at decode is a small one (the activation quantizer, a norm).
//
// Launches `kernel` on `grid` with clusters of (1, 1, ranks) blocks (grid.z a multiple of ranks;
// ranks 1: no cluster) and, with `dependent`, as a programmatic dependent launch (the kernel must
// call wait_for_prior_grids before it reads another kernel's output or writes memory).
template <typename Kernel, typename Args>
void launch_decode_kernel(Kernel kernel, dim3 grid, int threads, size_t shared_bytes,
                          cudaStream_t stream, int ranks, bool dependent, const Args& args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (ranks > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = 1;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = static_cast<unsigned>(ranks);
    ++count;
  }
  if (dependent) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args));
}

// sum_slice_partials across a thread-block cluster (batch invariance off): the cluster's blocks
// are ranks 0..G-1 of the same row groups and token tiles, rank r holding K slices
// [r S, r S + S). Each block sums its own S slices as sum_slice_partials does and leaves the
// sums in the sums warp's own `partials` slot (no other warp reads it again); after a cluster
// barrier rank 0 adds the ranks' sums in rank order, T_0 + T_1 + ..., reading the others' shared
// memory, and hands them to take(j, sums). A second cluster barrier keeps every block's shared
// memory alive and unchanged until rank 0 has read it. Every thread of every block must call it.
template <int kWarps, int kTokenTiles, typename Take>
__device__ __forceinline__ void sum_cluster_slice_partials(
    float (&partials)[kWarps][kTokenTiles * 4][32], const float (&acc)[kTokenTiles][4], bool active,
    bool sums, int slices, const Take& take) {
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  sum_slice_partials(partials, acc, active, sums, slices, [&](int j, const float(&total)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partials[warp][4 * j + i][lane] = total[i];
  });
  cluster.sync();
  if (active && sums && cluster.block_rank() == 0) {
    const int ranks = static_cast<int>(cluster.num_blocks());
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      float total[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) total[i] = partials[warp][4 * j + i][lane];
      for (int rank = 1; rank < ranks; ++rank) {
        const float* remote = cluster.map_shared_rank(&partials[warp][4 * j][lane], rank);
#pragma unroll
        for (int i = 0; i < 4; ++i) total[i] += remote[32 * i];
      }
      take(j, total);
    }
  }
  cluster.sync();
}

// The BF16 tensor-core GEMM of linear_bf16_mma.cu (bf16 weights, f32 activations, no activation
// quantization): whether it takes this weight and input (its on/off switch, K % 32 == 0,
// N % 16 == 0, 16-byte aligned rows; never the row count), and its launch. Batch invariant; with
// three bf16 terms per activation (the default) it differs from launch_linear's FMA chain in
// summation order only, with two also by x's remainder below about 2^-16 of |x|.
bool bf16_mma_supports(const DeviceWeight& w, const deepinfer::cuda::DeviceRows<const float>& x);
// linear_grouped's fp8 block-scaled weight (the attention's wo_a as released) times f32
// activations without quantization: the decode tile reading the codes at 1-16 rows, else the
// bf16 path on the weight's exact bf16 dequantization. Same bits as the bf16 path on that
// dequantization. False (nothing done) for other weights. (ops::cuda::linear's own fp8 weights
// without activation quantization -- the dense numerics' -- keep the FMA kernel until this path
// has run its tests on a GPU.)
bool linear_fp8_weight_unquantized(const TensorView& x, const LinearWeight& weight, int64_t groups,
                                   const TensorView& out);
void launch_linear_bf16_mma(deepinfer::cuda::DeviceRows<const float> x, const DeviceWeight& w,
                            deepinfer::cuda::DeviceRows<float> out);

// The released numerics' activation quantization of x into `out` (dense [x.rows, x.cols]).
void quantize_activation(deepinfer::cuda::DeviceRows<const float> x, float* out);

}  // namespace deepinfer::ops::cuda
