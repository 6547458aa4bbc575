// The prefill attention kernel (batch invariance off; prefill, and decode through its split form):
// included by attention.cu inside its anonymous namespace, after the tensor-core head-group
// kernels, whose pieces it reuses (TokenKeys, resolve_token_keys, attention_split_pair,
// mma_term_pairs, the AttentionArgs).
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
//
// The split form (kSplit; decode-sized calls, where tokens x 4 blocks leave SMs idle): each cluster
// takes one chunk of a token's key tiles from a fresh softmax state and leaves the chunk's maxima,
// sums and unnormalized weighted sums in scratch (ChunkState, as the head-group split path's);
// sink_attention_prefill_merge_kernel merges a token's chunks into the sink's state and writes the
// output. Same numerics (one bf16 term, base 2), another summation order; a chunk that meets a row
// that is not bf16-exact flags its token like the whole-token kernel, and the merge leaves flagged
// tokens to the one-block kernel. prefill_chunks (attention.cu) picks the chunks.
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
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kRowsPerBlock == kWarps, "a warp loads one row of its block's share of a tile");
static_assert(kGroupHeadDim == 32 * 4 * 4, "a lane loads 4 float4 of a row");

struct Shared {
  uint16_t keys[2][kKeys][kRowHalves];  // bf16 tiles, double-buffered; absent keys zeros
  float partial_scores[kWarps][kHeads][kScoreRow];
  float probs[kHeads][kScoreRow];
  uint4 query_smallest[kWarps][kSteps][32];  // the smallest query term's A registers
  float rescale[kHeads];
  float denominator[kHeads];
  // Per row of the buffer's tile, written with the row by its loading block: bit 0 the key
  // exists, bit 1 some value of it is not bf16-exact.
  int row_flags[2][kKeys];
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

// Decode-sized calls (batch invariance off, fewer than kMinTokens tokens): from this many tokens
// (the default: kDecodeFromTokensDefault) they take the prefill kernel (its split form below 96
// tokens, whole tokens from 96: prefill_chunks in attention.cu; from DEEPINFER_ATTENTION_WGMMA
// tokens, default 32, the wgmma kernel of attention_prefill_wgmma.cuh); below it, or with 0, the
// head-group kernels (the path before, exact products). 8: on the H200 the split form lost at one
// token (0.0299 against the head-group split path's 0.0256 ms) and won from 8 (0.0356 against
// 0.0475; docs/BENCHMARKS.md, "Batch invariance off: the prefill kernel's split form").
constexpr int kDecodeFromTokensDefault = 8;
RuntimeSetting kDecodeFromTokens{"DEEPINFER_ATTENTION_PREFILL_DECODE", kDecodeFromTokensDefault, 0,
                                 1 << 30};

// The split form's chunks a token: 0 (the default) by the heuristic in prefill_chunks
// (attention.cu); n forces n (1: the whole-token kernel, one cluster a token); tests and benches
// force each.
RuntimeSetting kChunks{"DEEPINFER_ATTENTION_PREFILL_CHUNKS", 0, 0, 64};

// The kernel's schedule (schedules 0-2, each measured slower on the H200 and removed after
// 2026-12-02: docs/BENCHMARKS.md, "Batch invariance off: attention's prefill kernel"): the next
// tile's row is resolved a tile before its load and its rows are loaded at the top of the tile
// (in flight during the whole tile), the loading blocks publish which rows exist with the tile,
// the scores' MMA chains are split in two (shorter dependency chains), and the cluster barrier is
// split: each block arrives once it has written the next tile and waits at the top of that tile,
// after issuing its loads. A tile without any key present (the selection's -1 entries) skips its
// scores, softmax and weighted sum (every block sees the same presence flags; such a tile would
// change nothing), and the one-term kernel's softmax runs in base 2 (ex2.approx: its 2^-22 error
// is far below the probabilities' bf16 rounding). Each row's flags (present, not bf16-exact) go
// out with the row. Two more schedules were measured no faster on the H200 (2026-12-02) and
// removed: a row copied two tiles ahead through a cp.async staging buffer (b256 0.4216 against
// 0.4170 ms; commit 5c0e5d7 has it), and the rows sent by st.async onto each block's mbarrier
// with a relaxed cluster barrier, which drops the GPU-scope MEMBAR a release arrive compiles to
// (b256 0.458 against 0.422 ms, prefill 8192 10.99 against 10.15; commit 05b1807). ncu at b256:
// 25% occupancy (16 warps an SM: 128 registers and 104 KiB of shared memory a block), no
// eligible warp in 74% of the issue slots, 15 cycles a warp between instructions, DRAM 22%:
// latency in each block's chain (barriers, MMA chains, shuffles), not bytes or the fence.

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

// One thread's share of a key row as the tile stores it: 16 bf16 values, whether they were all
// exact, whether the row exists.
struct StagedRow {
  uint2 words[4];
  bool exact;
  bool present;
};

__device__ __forceinline__ StagedRow convert_row(const float4 (&values)[4], bool present) {
  StagedRow row;
  row.exact = true;
  row.present = present;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    row.exact = row.exact && bf16_exact(values[i]);
    row.words[i] = make_uint2(attention_bf16_pair(values[i].x, values[i].y),
                              attention_bf16_pair(values[i].z, values[i].w));
  }
  return row;
}

// One block per (token, 16 heads[, chunk]); the 4 blocks of a token (and chunk) are one cluster
// (rank = head group).
// kTerms: the bf16 terms of a query or probability value (1 to 3); with more than one the
// smallest query term lives in shared memory (registers: see Shared).
// kSplit (split-KV, for calls with few tokens): cluster c takes token c / max_chunks and its
// tiles [chunk_tiles * chunk, + chunk_tiles), chunk = c % max_chunks, from a fresh softmax state
// (max -inf, sum 0: the sink joins in the merge), and leaves the chunk's unnormalized state in
// args.chunk_states (sink_attention_prefill_merge_kernel combines them); a chunk past the token's
// keys writes nothing.
template <int kTerms, bool kSplit>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 2)
    sink_attention_prefill_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  Shared& shared = *reinterpret_cast<Shared*>(shared_quads);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t cluster_index = blockIdx.x / kClusterBlocks;
  const int64_t t = kSplit ? cluster_index / args.max_chunks : cluster_index;
  const int64_t chunk = kSplit ? cluster_index % args.max_chunks : 0;
  const int64_t first_head = static_cast<int64_t>(rank) * kHeads;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int group = lane >> 2;
  const int quad = lane & 3;

  // The block's tiles: [first_tile, first_tile + tiles) of the token's (all of them unless split).
  const auto tile_range = [&](const TokenKeys& keys, int64_t& first_tile, int64_t& tiles) {
    first_tile = kSplit ? chunk * args.chunk_tiles : 0;
    tiles = (keys.total() + kKeys - 1) / kKeys - first_tile;
    if constexpr (kSplit) tiles = min(tiles, args.chunk_tiles);
  };
  if (tid == 0) resolve_token_keys(args, t, shared.token_keys);
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
  const float score_scale = kBase2 ? args.scale * kLog2e : args.scale;
  const auto exponential = [](float x) { return kBase2 ? exp2_approx(x) : expf(x); };
  // Softmax state of heads 2 warp + i (the same in every lane): from the sink, or for a chunk of
  // the split form from nothing (max -inf, sum 0).
  float running_max[2], running_sum[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (kSplit) {
      running_max[i] = -INFINITY;
      running_sum[i] = 0.0f;
    } else {
      running_max[i] = args.sinks[first_head + 2 * warp + i];
      if constexpr (kBase2) running_max[i] *= kLog2e;
      running_sum[i] = 1.0f;  // exp(sink - running_max)
    }
  }
  float acc[8][4];  // 8-column tiles of this warp's 64 columns; heads group (0, 1), group + 8
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  }

  cluster.sync();  // token_keys written
  const TokenKeys& keys = shared.token_keys;
  const bool bad_range = keys.bad_range != 0;
  int64_t first_tile, tiles;
  tile_range(keys, first_tile, tiles);
  // A chunk past the token's keys: every block of the cluster leaves here (the same keys in
  // each), before any of them touches another's shared memory.
  if (kSplit && tiles <= 0) return;

  // This thread's share of a tile: row 8 rank + warp, float4 columns lane + 32 i.
  const int load_row = kRowsPerBlock * rank + warp;
  const int64_t first_slot = first_tile * kKeys + load_row;
  const auto slot_of = [&](int64_t tile) { return first_slot + tile * kKeys; };
  // The row (converted) into buffer `buffer` of every block of the cluster, its flags with it.
  const auto publish = [&](int buffer, const StagedRow& row) {
    const int flags = (row.present ? 1 : 0) | (__all_sync(0xFFFFFFFFu, row.exact) ? 0 : 2);
#pragma unroll
    for (int destination = 0; destination < kClusterBlocks; ++destination) {
      uint16_t* to = cluster.map_shared_rank(&shared.keys[buffer][load_row][0], destination);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint2*>(to + 4 * (lane + 32 * i)) = row.words[i];
      if (lane == 0) {
        *cluster.map_shared_rank(&shared.row_flags[buffer][load_row], destination) = flags;
      }
    }
  };
  const auto load_global = [&](const float* row, float4(&values)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      values[i] = row != nullptr ? reinterpret_cast<const float4*>(row)[lane + 32 * i]
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };

  // The next tile's row in registers (loaded at the top of a tile, converted and stored at its
  // end), its address resolved a tile ahead.
  float4 staged[4];
  const float* staged_row = nullptr;
  if (tiles > 0) {
    staged_row = key_row(args, keys, slot_of(0));
    load_global(staged_row, staged);
    publish(0, convert_row(staged, staged_row != nullptr));
  }
  // The row of the tile after the one being loaded (a tile ahead of its load).
  const float* ahead_row = tiles > 1 ? key_row(args, keys, slot_of(1)) : nullptr;
  cluster.sync();  // tile 0 in every block

  bool redo = false;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int buffer = static_cast<int>(tile & 1);
    const bool more = tile + 1 < tiles;
    // Registers only (the last tile's rows were stored at its end): before the wait for the
    // other blocks' stores of this tile.
    if (more) {
      staged_row = ahead_row;
      load_global(ahead_row, staged);
      ahead_row = tile + 2 < tiles ? key_row(args, keys, slot_of(tile + 2)) : nullptr;
    }
    // The next tile's rows into every block, then the arrive: the next tile in every block once
    // all have arrived; every block done with this tile's buffer, scores and probs.
    const auto store_next = [&] {
      publish(buffer ^ 1, convert_row(staged, staged_row != nullptr));
      cluster_arrive();
    };
    if (tile > 0) cluster_wait();  // this tile in every block (the arrive: the last tile's end)
    const int row_flags = shared.row_flags[buffer][lane];
    // The same flags in every block of the cluster: all stop at the same tile, before any block
    // writes the next one.
    if (__any_sync(0xFFFFFFFFu, (row_flags & 2) != 0)) {
      redo = true;
      break;
    }
    // No key of the tile present (the same flags in every block): nothing to add; the next
    // tile's rows still go out and the barriers stay in step.
    if (!__any_sync(0xFFFFFFFFu, (row_flags & 1) != 0)) {
      if (more) store_next();
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
    __syncthreads();  // partial scores written

    // Softmax: warp w updates heads 2w and 2w + 1, a lane per key.
    {
      const bool present = (row_flags & 1) != 0;
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
        // A chunk's first tile (max -inf): exp(-inf - new max) is 0 anyway, and the sum is 0.
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
    // The last tile: no block writes another's shared memory any more; the denominators are this
    // block's own.
    if (more) {
      store_next();
    } else {
      __syncthreads();
    }
  }

  if (redo) {
    if (rank == 0 && tid == 0) args.redo_tokens[t] = 1;
    return;
  }
  if constexpr (kSplit) {
    // The chunk's state for the merge: the maxima and sums from the softmax warps' registers,
    // the unnormalized weighted sums.
    ChunkState& state = args.chunk_states[(t * kClusterBlocks + rank) * args.max_chunks + chunk];
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        state.max[2 * warp + i] = running_max[i];
        state.denominator[2 * warp + i] = running_sum[i];
      }
    }
    float* low = reinterpret_cast<float*>(state.sum[group]) + warp * kWarpColumns + 2 * quad;
    float* high = reinterpret_cast<float*>(state.sum[group + kMmaUpperHeads]) +
                  warp * kWarpColumns + 2 * quad;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      *reinterpret_cast<float2*>(low + 8 * n) = make_float2(acc[n][0], acc[n][1]);
      *reinterpret_cast<float2*>(high + 8 * n) = make_float2(acc[n][2], acc[n][3]);
    }
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

// The split form's second kernel: one block per (token, head) merges the token's chunks in chunk
// order into the sink's state (the prefill kernel's softmax: base 2 with one term, kBase2) and
// writes the output; a thread owns columns 2 tid, 2 tid + 1. Tokens flagged for the redo are
// left to the one-block kernel.
template <bool kBase2>
__global__ void __launch_bounds__(kThreads)
    sink_attention_prefill_merge_kernel(AttentionArgs args) {
  static_assert(kThreads * 2 == kGroupHeadDim);
  __shared__ TokenKeys token_keys;
  const int64_t t = blockIdx.x / args.heads;
  const int64_t head = blockIdx.x % args.heads;
  if (args.redo_tokens[t] != 0) return;  // the whole block
  const int tid = threadIdx.x;
  if (tid == 0) resolve_token_keys(args, t, token_keys);
  __syncthreads();
  const bool bad_range = token_keys.bad_range != 0;
  const int64_t tiles = (token_keys.total() + kKeys - 1) / kKeys;
  const int64_t chunks = (tiles + args.chunk_tiles - 1) / args.chunk_tiles;
  const int group_head = static_cast<int>(head % kHeads);
  const ChunkState* states =
      args.chunk_states + (t * kClusterBlocks + head / kHeads) * args.max_chunks;
  const auto exponential = [](float x) { return kBase2 ? exp2_approx(x) : expf(x); };

  float total_max = args.sinks[head];
  if constexpr (kBase2) total_max *= kLog2e;
  float total_denominator = 1.0f;  // exp(sink - total_max)
  float2 total = make_float2(0.0f, 0.0f);
#pragma unroll 4
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const ChunkState& state = states[chunk];
    const float chunk_max = state.max[group_head];
    const float new_max = fmaxf(total_max, chunk_max);
    const float keep = total_max == -INFINITY ? 0.0f : exponential(total_max - new_max);
    const float add = chunk_max == -INFINITY ? 0.0f : exponential(chunk_max - new_max);
    total_denominator = __fadd_rn(__fmul_rn(total_denominator, keep),
                                  __fmul_rn(state.denominator[group_head], add));
    total = merge_chunk_sum(total, state.sum[group_head][tid], keep, add);
    total_max = new_max;
  }
  const float inv = bad_range ? __int_as_float(0x7fc00000) : 1.0f / total_denominator;
  reinterpret_cast<float2*>(args.out.row(t) + head * kGroupHeadDim)[tid] =
      make_float2(total.x * inv, total.y * inv);
}

}  // namespace prefill
