// The prefill attention kernel (batch invariance off, many tokens): included by attention.cu inside
// its anonymous namespace, after the tensor-core head-group kernels, whose pieces it reuses
// (TokenKeys, resolve_token_keys, attention_split_pair, mma_term_pairs, the AttentionArgs).
//
// Why not all 64 heads in one block: the products can stay exact (queries and probabilities as
// three bf16 terms), and a token's three-term queries are 64 x 512 x 3 bf16 = 192 KiB, more than
// the registers of a block can hold next to its sums and, with a key tile, more than an SM's shared
// memory. So each block keeps the head-group kernels' 16 heads (the query terms in registers), and
// the 4 blocks of a token form a thread-block cluster that loads each key tile once: block r of
// the cluster reads rows [8 r, 8 r + 8) of the 32-key tile from global memory, converts them to
// bf16 once and writes them into the shared memory of all four blocks (distributed shared
// memory), so a token's keys cross L2 once instead of four times, and the MMAs read bf16 tiles
// with ldmatrix (no conversion in the inner loops). The next tile's rows are loaded into
// registers while the current tile's products run (one cluster barrier a tile publishes them).
// One online softmax over the whole token, from the sink (no 64-key chunk merges: batch
// invariance is off, so the summation order need not match the decode kernels').
//
// Terms (a template parameter; DEEPINFER_ATTENTION_PREFILL_EXACT picks 3): the bf16 terms a query
// or probability value is cut into. 3 makes every product exact (the head-group kernels'
// numerics, within 1e-5 of the CPU); 1 (the default: batch invariance is off, so the op may follow
// DeepSeek's own numerics, FlashMLA's sparse prefill: bf16 queries and probabilities) rounds
// each query and probability to bf16 once, a relative error of at most 2^-8 (about 2^-9.2 RMS)
// each, and takes a third of the MMAs (the error bound: attention_gpu_test's
// kPrefillOneTermTolerance).
//
// Key rows that are not bf16-exact (the op takes any f32; every cached V4.1 row is exact): the
// cluster finds out tile by tile (every block votes for its rows), stops, and flags the token;
// the one-block tensor-core kernel then runs for the flagged tokens only (redo_tokens), so such a
// token gets exactly the old path's bits.
// (attention.cu includes <cooperative_groups.h> at its top: it cannot be included in a namespace.)
namespace prefill {

namespace cg = cooperative_groups;

constexpr int kClusterBlocks = 4;  // head groups of a token: 64 heads
constexpr int kHeads = kGroupHeads;
constexpr int kKeys = 32;  // key rows a tile
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerBlock = kKeys / kClusterBlocks;
// bf16 key rows: 1040 bytes = 260 words, 4 banks on per row, so the 8 rows of an ldmatrix 8x8
// matrix (16 bytes each) fall in 8 different bank quads.
constexpr int kRowHalves = kGroupHeadDim + 8;
constexpr int kScoreRow = kKeys + 8;
constexpr int kWarpColumns = kGroupHeadDim / kWarps;  // 64: 4 MMA K steps for the scores
constexpr int kSteps = kWarpColumns / 16;
static_assert(kRowsPerBlock == kWarps, "a warp loads one row of its block's share of a tile");
static_assert(kGroupHeadDim == 32 * 4 * 4, "a lane loads 4 float4 of a row");

struct Shared {
  uint16_t keys[2][kKeys][kRowHalves];  // bf16 tiles, double-buffered; absent keys zeros
  float partial_scores[kWarps][kHeads][kScoreRow];
  float probs[kHeads][kScoreRow];
  uint4 query_smallest[kWarps][kSteps][32];  // the smallest query term's A registers
  float rescale[kHeads];
  float denominator[kHeads];
  int inexact[2];         // a block found a row of the buffer's tile that is not bf16-exact
  int present[2][kKeys];  // the buffer's key rows that exist (written by the loading blocks)
  TokenKeys token_keys;
};
constexpr size_t kSharedBytes = sizeof(Shared);
static_assert(kSharedBytes <= 113 * 1024, "two blocks per SM");

// The RuntimeSetting: calls of at least this many tokens take the kernel while batch invariance
// is off; 0: never.
RuntimeSetting kMinTokens{"DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS", 256, 0, 1 << 30};

// true: queries and probabilities as three bf16 terms (exact products, the kernel before the
// one-term default); false (the default): one term each, FlashMLA's numerics.
RuntimeSwitch kExactProducts{"DEEPINFER_ATTENTION_PREFILL_EXACT", false};

// The kernel's schedule (schedules 0-2, each measured slower on the H200 and removed after
// 2026-12-02: docs/BENCHMARKS.md, "Batch invariance off: attention's prefill kernel"): the next
// tile's row is resolved a tile before its load and its rows are loaded at the top of the tile
// (in flight during the whole tile), the loading blocks publish which rows exist with the tile,
// the scores' MMA chains are split in two (shorter dependency chains), and the cluster barrier is
// split: each block arrives once it has written the next tile and waits at the top of that tile,
// after issuing its loads. A tile without any key present (the selection's -1 entries) skips its
// scores, softmax and weighted sum (every block sees the same presence flags; such a tile would
// change nothing), and the one-term kernel's softmax runs in base 2 (ex2.approx: its 2^-22 error
// is far below the probabilities' bf16 rounding).

// 2^x (ex2.approx.ftz: -inf gives 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ const float* key_row(const AttentionArgs& args, const TokenKeys& keys,
                                                int64_t slot) {
  if (slot < keys.window_count) return keys.window_row(slot);
  if (slot < keys.total()) return keys.compressed_row(slot - keys.window_count, args.error);
  return nullptr;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += the products of A's kTerms terms and one bf16 key term, chained from the smallest term to
// the largest (kTerms 3: the order of mma_term_pairs, the same bits).
template <int kTerms>
__device__ __forceinline__ void mma_terms(const uint32_t (&a)[kTerms][4], uint32_t b0, uint32_t b1,
                                          float (&d)[4]) {
#pragma unroll
  for (int term = kTerms - 1; term >= 0; --term) mma_bf16_m16n8k16(a[term], b0, b1, d);
}

// One block per (token, 16 heads); the 4 blocks of a token are one cluster (rank = head group).
// kTerms: the bf16 terms of a query or probability value (1 to 3); with more than one the
// smallest query term lives in shared memory (registers: see Shared).
template <int kTerms>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 2)
    sink_attention_prefill_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  Shared& shared = *reinterpret_cast<Shared*>(shared_quads);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t t = blockIdx.x / kClusterBlocks;
  const int64_t first_head = static_cast<int64_t>(rank) * kHeads;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int group = lane >> 2;
  const int quad = lane & 3;

  if (tid == 0) resolve_token_keys(args, t, shared.token_keys);
  if (tid < 2) shared.inexact[tid] = 0;
  if (tid < kHeads) shared.denominator[tid] = 1.0f;

  // Query A registers, the standard m16n8k16 layout: step s covers columns 64 warp + 16 s + [0,
  // 16); a0 / a2 head `group` columns 2 quad (+1) and 2 quad + 8 (+9), a1 / a3 head group + 8.
  constexpr bool kSmallestShared = kTerms > 1;
  constexpr int kRegisterTerms = kSmallestShared ? kTerms - 1 : kTerms;
  uint32_t query[kSteps][kRegisterTerms][4];
  {
    const float* q_low = args.q.row(t) + (first_head + group) * kGroupHeadDim;
    const float* q_high = q_low + kMmaUpperHeads * kGroupHeadDim;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int column = warp * kWarpColumns + 16 * s + 2 * quad;
      const float2 v[4] = {*reinterpret_cast<const float2*>(q_low + column),
                           *reinterpret_cast<const float2*>(q_high + column),
                           *reinterpret_cast<const float2*>(q_low + column + 8),
                           *reinterpret_cast<const float2*>(q_high + column + 8)};
      uint32_t words[4][kTerms];
#pragma unroll
      for (int r = 0; r < 4; ++r) attention_split_pair(v[r].x, v[r].y, words[r]);
#pragma unroll
      for (int term = 0; term < kRegisterTerms; ++term) {
#pragma unroll
        for (int r = 0; r < 4; ++r) query[s][term][r] = words[r][term];
      }
      if constexpr (kSmallestShared) {
        constexpr int kSmallest = kTerms - 1;
        shared.query_smallest[warp][s][lane] = make_uint4(words[0][kSmallest], words[1][kSmallest],
                                                          words[2][kSmallest], words[3][kSmallest]);
      }
    }
  }
  // One term: the softmax in base 2 (scores and maxima times log2 e).
  constexpr bool kBase2 = kTerms == 1;
  constexpr float kLog2e = 1.4426950408889634f;
  const float score_scale = kBase2 ? args.scale * kLog2e : args.scale;
  const auto exponential = [](float x) { return kBase2 ? exp2_approx(x) : expf(x); };
  // Softmax state of heads 2 warp + i (the same in every lane).
  float running_max[2], running_sum[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    running_max[i] = args.sinks[first_head + 2 * warp + i];
    if constexpr (kBase2) running_max[i] *= kLog2e;
    running_sum[i] = 1.0f;  // exp(sink - running_max)
  }
  float acc[8][4];  // 8-column tiles of this warp's 64 columns; heads group (0, 1), group + 8
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  }

  cluster.sync();  // token_keys written; every block's inexact flags cleared
  const TokenKeys& keys = shared.token_keys;
  const bool bad_range = keys.bad_range != 0;
  const int64_t total_keys = keys.total();
  const int64_t tiles = (total_keys + kKeys - 1) / kKeys;

  // This thread's share of a tile: row 8 rank + warp, float4 columns lane + 32 i.
  const int load_row = kRowsPerBlock * rank + warp;
  float4 staged[4];
  const float* staged_row = nullptr;
  const auto load_rows = [&](const float* row) {
    staged_row = row;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      staged[i] = row != nullptr ? reinterpret_cast<const float4*>(row)[lane + 32 * i]
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  const auto load_tile = [&](int64_t tile) {
    load_rows(key_row(args, keys, tile * kKeys + load_row));
  };
  const auto store_tile = [&](int buffer) {
    bool exact = true;
    uint2 words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      exact = exact && bf16_exact(staged[i]);
      words[i] = make_uint2(attention_bf16_pair(staged[i].x, staged[i].y),
                            attention_bf16_pair(staged[i].z, staged[i].w));
    }
#pragma unroll
    for (int destination = 0; destination < kClusterBlocks; ++destination) {
      uint16_t* row = cluster.map_shared_rank(&shared.keys[buffer][load_row][0], destination);
#pragma unroll
      for (int i = 0; i < 4; ++i) *reinterpret_cast<uint2*>(row + 4 * (lane + 32 * i)) = words[i];
      if (!exact) *cluster.map_shared_rank(&shared.inexact[buffer], destination) = 1;
      if (lane == 0) {
        *cluster.map_shared_rank(&shared.present[buffer][load_row], destination) =
            staged_row != nullptr;
      }
    }
  };

  if (tiles > 0) {
    load_tile(0);
    store_tile(0);
  }
  // The row of the tile after the one being loaded (a tile ahead of its load).
  const float* ahead_row = tiles > 1 ? key_row(args, keys, kKeys + load_row) : nullptr;
  cluster.sync();  // tile 0 in every block

  bool redo = false;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int buffer = static_cast<int>(tile & 1);
    const bool more = tile + 1 < tiles;
    // Registers only (the staged rows were stored at the end of the last tile): before the wait
    // for the other blocks' stores of this tile.
    if (more) {
      load_rows(ahead_row);
      ahead_row = tile + 2 < tiles ? key_row(args, keys, (tile + 2) * kKeys + load_row) : nullptr;
    }
    if (tile > 0) cluster_wait();  // this tile in every block (the arrive: the last tile's end)
    // The same flag in every block of the cluster: all stop at the same tile, before any block
    // writes the next one.
    if (shared.inexact[buffer] != 0) {
      redo = true;
      break;
    }
    // No key of the tile present (the same flags in every block): nothing to add; the next
    // tile's rows still go out and the barriers stay in step.
    if (!__any_sync(0xFFFFFFFFu, shared.present[buffer][lane] != 0)) {
      __syncthreads();  // every thread has read inexact[buffer]
      if (tid == 0) shared.inexact[buffer] = 0;
      if (more) {
        store_tile(buffer ^ 1);
        cluster_arrive();
      }
      continue;
    }
    const uint32_t tile_base = shared_address(&shared.keys[buffer][0][0]);

    // Scores over this warp's 64 columns: key tile j (8 keys) is the MMA's N. The smallest
    // query term is read from shared memory where it is used (registers: see Shared).
    {
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
        float chains[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int pair = 0; pair < kSteps / 2; ++pair) {
          float(&d)[4] = chains[pair];
          // Matrices: keys 8 j + [0, 8) x columns 64 warp + 32 pair + 8 m, m = lane / 8.
          const int row = 8 * j + (lane & 7);
          const int column = warp * kWarpColumns + 32 * pair + 8 * (lane >> 3);
          uint32_t r[4];
          ldmatrix_x4(tile_base + static_cast<uint32_t>((row * kRowHalves + column) * 2), r);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int s = 2 * pair + half;
            uint32_t a[kTerms][4];
#pragma unroll
            for (int term = 0; term < kRegisterTerms; ++term) {
#pragma unroll
              for (int k = 0; k < 4; ++k) a[term][k] = query[s][term][k];
            }
            if constexpr (kSmallestShared) {
              const uint4 smallest = shared.query_smallest[warp][s][lane];
              a[kTerms - 1][0] = smallest.x;
              a[kTerms - 1][1] = smallest.y;
              a[kTerms - 1][2] = smallest.z;
              a[kTerms - 1][3] = smallest.w;
            }
            mma_terms<kTerms>(a, r[2 * half], r[2 * half + 1], d);
          }
        }
        float d[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          d[i] = __fadd_rn(chains[0][i], chains[1][i]);
        }
        *reinterpret_cast<float2*>(&shared.partial_scores[warp][group][8 * j + 2 * quad]) =
            make_float2(d[0], d[1]);
        *reinterpret_cast<float2*>(
            &shared.partial_scores[warp][group + kMmaUpperHeads][8 * j + 2 * quad]) =
            make_float2(d[2], d[3]);
      }
    }
    __syncthreads();  // partial scores written; every thread has read inexact[buffer]
    if (tid == 0) shared.inexact[buffer] = 0;  // for the tile after next (written after a barrier)

    // Softmax: warp w updates heads 2w and 2w + 1, a lane per key.
    {
      const bool present = shared.present[buffer][lane] != 0;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int head = 2 * warp + i;
        float dot = shared.partial_scores[0][head][lane];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) dot = __fadd_rn(dot, shared.partial_scores[w][head][lane]);
        const float score = present ? __fmul_rn(dot, score_scale) : -INFINITY;
        const float new_max = fmaxf(running_max[i], deepinfer::cuda::warp_max(score));
        const float p = present ? exponential(score - new_max) : 0.0f;
        const float tile_sum = deepinfer::cuda::warp_sum(p);
        const float rescale =
            running_max[i] == -INFINITY ? 0.0f : exponential(running_max[i] - new_max);
        running_sum[i] = __fadd_rn(__fmul_rn(running_sum[i], rescale), tile_sum);
        running_max[i] = new_max;
        shared.probs[head][lane] = p;
        if (lane == 0) {
          shared.rescale[head] = rescale;
          shared.denominator[head] = running_sum[i];
        }
      }
    }
    __syncthreads();

    // Weighted sum: this warp's 16 heads x 64 columns, the tile's 32 keys as two K steps.
    {
      const float rescale = shared.rescale[group];
      const float rescale8 = shared.rescale[group + kMmaUpperHeads];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        acc[n][0] = __fmul_rn(acc[n][0], rescale);
        acc[n][1] = __fmul_rn(acc[n][1], rescale);
        acc[n][2] = __fmul_rn(acc[n][2], rescale8);
        acc[n][3] = __fmul_rn(acc[n][3], rescale8);
      }
#pragma unroll
      for (int step = 0; step < kKeys / 16; ++step) {
        const int key = 16 * step + 2 * quad;
        uint32_t probs[kTerms][4];
        {
          const float2 v[4] = {
              *reinterpret_cast<const float2*>(&shared.probs[group][key]),
              *reinterpret_cast<const float2*>(&shared.probs[group + kMmaUpperHeads][key]),
              *reinterpret_cast<const float2*>(&shared.probs[group][key + 8]),
              *reinterpret_cast<const float2*>(&shared.probs[group + kMmaUpperHeads][key + 8])};
          uint32_t words[4][kTerms];
#pragma unroll
          for (int r = 0; r < 4; ++r) attention_split_pair(v[r].x, v[r].y, words[r]);
#pragma unroll
          for (int term = 0; term < kTerms; ++term) {
#pragma unroll
            for (int r = 0; r < 4; ++r) probs[term][r] = words[r][term];
          }
        }
#pragma unroll
        for (int pair = 0; pair < 4; ++pair) {
          // Matrices (transposed): keys 16 step + [0, 8) and + [8, 16) x columns 64 warp +
          // 16 pair + [0, 8), then the same keys x the next 8 columns.
          const int row = 16 * step + (lane & 7) + 8 * ((lane >> 3) & 1);
          const int column = warp * kWarpColumns + 16 * pair + 8 * (lane >> 4);
          uint32_t r[4];
          ldmatrix_x4_trans(tile_base + static_cast<uint32_t>((row * kRowHalves + column) * 2), r);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if constexpr (kTerms == 1) {
              // One term: the MMA accumulates into the sums (no separate chain to add).
              mma_bf16_m16n8k16(probs[0], r[2 * e], r[2 * e + 1], acc[2 * pair + e]);
            } else {
              float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_terms<kTerms>(probs, r[2 * e], r[2 * e + 1], d);
#pragma unroll
              for (int i = 0; i < 4; ++i)
                acc[2 * pair + e][i] = __fadd_rn(acc[2 * pair + e][i], d[i]);
            }
          }
        }
      }
    }
    if (more) store_tile(buffer ^ 1);
    // The next tile in every block; every block done with this tile's buffer, scores and probs.
    // The last tile: no block writes another's shared memory any more; the denominators are this
    // block's own.
    if (more) {
      cluster_arrive();
    } else {
      __syncthreads();
    }
  }

  if (redo) {
    if (rank == 0 && tid == 0) args.redo_tokens[t] = 1;
    return;
  }
  // Denominators: written by the softmax warps before the last barrier (1 without keys).
  const float inv = bad_range ? __int_as_float(0x7fc00000) : 1.0f / shared.denominator[group];
  const float inv8 =
      bad_range ? __int_as_float(0x7fc00000) : 1.0f / shared.denominator[group + kMmaUpperHeads];
  float* y =
      args.out.row(t) + (first_head + group) * kGroupHeadDim + warp * kWarpColumns + 2 * quad;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    *reinterpret_cast<float2*>(y + 8 * n) = make_float2(acc[n][0] * inv, acc[n][1] * inv);
    *reinterpret_cast<float2*>(y + kMmaUpperHeads * kGroupHeadDim + 8 * n) =
        make_float2(acc[n][2] * inv8, acc[n][3] * inv8);
  }
}

}  // namespace prefill
