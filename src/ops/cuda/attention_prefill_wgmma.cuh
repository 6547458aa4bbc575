// The prefill attention kernel on Hopper's warpgroup MMA (wgmma, sm_90a; batch invariance off):
// included by attention.cu inside its anonymous namespace, after attention_prefill.cuh, whose
// pieces it reuses (key_row, exp2_approx, kLog2e; TokenKeys, resolve_token_keys and the
// AttentionArgs of attention.cu). The same numerics as that file's one-term kernel (FlashMLA's
// sparse prefill: queries and probabilities rounded to bf16 once, FP32 accumulation, the softmax
// in base 2), another summation order.
//
// Why another kernel: the cluster kernel keeps 16 heads a block (mma.sync, 4 blocks a token
// sharing key tiles through distributed shared memory) and runs latency-bound at 25% occupancy
// (docs/BENCHMARKS.md). Here one block is one token and all 64 heads are the wgmma's M, the shape
// of FlashMLA's SM90 sparse prefill:
//  - the token's queries (64 x 512) are converted to bf16 once into 128-byte-swizzled shared
//    memory (64 KiB), the A operand of S = Q K^T;
//  - a producer warpgroup gathers each tile's 64 key rows (window ring or this call's rows, then
//    the selected compressed rows: scattered addresses) from f32 into registers, converts them
//    to bf16 and stores them swizzled (cp.async cannot convert), two tiles deep on mbarriers;
//    a row that is absent (past the token's keys, a -1 selection, an index out of bounds) is
//    stored as zeros and its bit left out of the tile's presence mask;
//  - two consumer warpgroups each own 256 of the output's 512 columns (O: 64 x 256 f32 in
//    registers); both compute the whole S tile (64 heads x 64 keys, 32 wgmma m64n64k16 from
//    shared memory; the same bits in both, so their softmax states agree), run the online
//    softmax in registers, and multiply P (bf16, the accumulators' own layout as wgmma's register
//    A) by V = the same key tile read as an MN-major B (4 wgmma m64n256k16 a tile);
//  - the consumers get the registers (setmaxnreg): O 128, S 32, P 16 a thread.
// A tile's weighted sum (O += P V) stays in flight while the next tile's S is issued; its buffer
// is handed back once the wait for that S returns. Tiles without any key present (-1 selections)
// are skipped.
//
// Key rows that are not bf16-exact: the producer flags the tile, the consumers flag the token for
// the one-block tensor-core kernel (redo_tokens), as the cluster kernel does, so such a token gets
// exactly the old path's bits. (attention.cu includes wgmma.cuh at its top: it cannot be
// included in a namespace.)

namespace prefill_wgmma {

namespace wg = deepinfer::cuda::wgmma;

constexpr int kHeads = 64;  // wgmma's M
constexpr int kDim = kGroupHeadDim;
constexpr int kKeys = 64;  // key rows a tile
constexpr int kStages = 2;
constexpr int kThreads = 3 * 128;   // warpgroup 0 the producer, 1 and 2 the consumers
constexpr int kBlocks = kDim / 64;  // 64-column swizzled blocks of a row
constexpr int kOperandBlockBytes = kHeads * wg::kLineBytes;  // 64 lines (queries or keys)
constexpr int kOperandBytes = kBlocks * kOperandBlockBytes;  // 64 KiB
constexpr int kConsumerColumns = kDim / 2;
constexpr int kProducerWarps = 4;
constexpr int kRowsPerWarp = kKeys / kProducerWarps;  // 16
// Rows a producer warp has in flight (registers: 16 floats a row and lane).
constexpr int kRowsInFlight = 4;
// Registers after setmaxnreg: 2 x consumers + producer <= 3 x the 168 a thread gets at launch.
constexpr int kProducerRegisters = 88;
constexpr int kConsumerRegisters = 208;
static_assert(kHeads == prefill::kClusterBlocks * kGroupHeads);
static_assert(kRowsPerWarp % kRowsInFlight == 0);
static_assert(kDim == 512, "a producer lane converts 4 float4 of a row");
static_assert(2 * kConsumerRegisters + kProducerRegisters <= 3 * 168);

struct Shared {
  uint8_t queries[kOperandBytes];             // swizzled bf16, 8 blocks of 64 heads x 64 columns
  uint8_t keys[kStages][kOperandBytes];       // swizzled bf16, 8 blocks of 64 keys x 64 columns
  uint64_t full[kStages];                     // producer -> consumers (128 arrivals)
  uint64_t empty[kStages];                    // consumers -> producer (256 arrivals)
  uint32_t present[kStages][kProducerWarps];  // bit r: row 16 w + r of the tile exists
  uint32_t inexact[kStages][kProducerWarps];  // a row of warp w's share is not bf16-exact
  TokenKeys token_keys;
};
// The swizzled operands start on 1024 bytes: the dynamic allocation is aligned by hand.
constexpr size_t kSharedBytes = sizeof(Shared) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "one block per SM");
static_assert(offsetof(Shared, keys) % 1024 == 0);

// The RuntimeSetting: prefill-kernel calls (batch invariance off: from
// DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS tokens, or decode-sized from
// DEEPINFER_ATTENTION_PREFILL_DECODE) of at least this many tokens take this kernel, whole tokens,
// in place of the cluster kernel (whole tokens or its split form); 0: never (the path before).
// The default, kFromTokensDefault = 32, is where it measured faster on the H200
// (docs/BENCHMARKS.md, "Batch invariance off: the wgmma prefill kernel"): b16 0.0733 ms against the
// split form's 0.0554, b32 0.0814 against 0.1038, b64 0.0829 against 0.1541, b256 0.186 against
// 0.404, prefill 8192 3.46 against 10.09 (a token's block runs about 6 us a tile whatever the
// batch, so below 32 tokens too few blocks fill the GPU).
constexpr int kFromTokensDefault = 32;
RuntimeSetting kFromTokens{"DEEPINFER_ATTENTION_WGMMA", kFromTokensDefault, 0, 1 << 30};

__device__ __forceinline__ uint4 bf16_words(float4 a, float4 b) {
  return make_uint4(attention_bf16_pair(a.x, a.y), attention_bf16_pair(a.z, a.w),
                    attention_bf16_pair(b.x, b.y), attention_bf16_pair(b.z, b.w));
}

// true: the producer asks L2 for each row of the next tile while it loads this one
// (cp.async.bulk.prefetch, one instruction a row), so the next tile's loads would wait for L2, not
// HBM (a decode token's rows are its own). Off by default: on the H200 (2026-12-02, same run) it
// was faster at b64 (0.0829 against 0.0919 ms) but slower at b128 (0.1100 against 0.1035), b256
// (0.1998 against 0.1858) and prefill 8192 (3.478 against 3.456): the rows are not what a tile
// waits for (docs/BENCHMARKS.md). Kept for the A/B (benches time both).
RuntimeSwitch kPrefetch{"DEEPINFER_ATTENTION_WGMMA_PREFETCH", false};

// The producer warpgroup: tile by tile, each warp's 16 rows into the tile's stage.
template <bool kPrefetchRows>
__device__ __forceinline__ void produce(const AttentionArgs& args, Shared& shared,
                                        const TokenKeys& keys, int64_t tiles) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  // Lane l (and l + 16) resolves row 16 warp + l % 16 of a tile, a tile ahead of its loads.
  const auto resolve = [&](int64_t tile) {
    return prefill::key_row(args, keys, tile * kKeys + kRowsPerWarp * warp + (lane & 15));
  };
  const float* next = tiles > 0 ? resolve(0) : nullptr;
  // Lane l loads columns 128 i + 4 l + [0, 4) (coalesced): block 2 i + l / 16, chunk (l % 16) / 2,
  // half l % 2 of the chunk.
  const uint32_t lane_block = static_cast<uint32_t>((lane / 16) * kOperandBlockBytes);
  const int chunk = (lane & 15) >> 1;
  const uint32_t half = static_cast<uint32_t>(lane & 1) * 8;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int stage = static_cast<int>(tile & 1);
    const float* mine = next;
    if (tile + 1 < tiles) {
      next = resolve(tile + 1);
      if (kPrefetchRows && lane < 16 && next != nullptr) {
        wg::prefetch_l2(next, kDim * sizeof(float));
      }
    }
    if (tile >= kStages) {
      wg::mbarrier_wait(shared_address(&shared.empty[stage]),
                        static_cast<uint32_t>(((tile >> 1) + 1) & 1));
    }
    const uint32_t present = __ballot_sync(0xFFFFFFFFu, mine != nullptr) & 0xFFFFu;
    bool exact = true;
    uint8_t* tile_bytes = shared.keys[stage];
#pragma unroll 1
    for (int first = 0; first < kRowsPerWarp; first += kRowsInFlight) {
      float4 values[kRowsInFlight][4];
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const float* row = reinterpret_cast<const float*>(
            __shfl_sync(0xFFFFFFFFu, reinterpret_cast<uintptr_t>(mine), first + r));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          values[r][i] = row != nullptr
                             ? __ldg(reinterpret_cast<const float4*>(row) + lane + 32 * i)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int line = kRowsPerWarp * warp + first + r;
        const uint32_t line_offset = wg::swizzled_offset(line, chunk) + half;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          exact = exact && bf16_exact(values[r][i]);
          *reinterpret_cast<uint2*>(tile_bytes + (2 * i) * kOperandBlockBytes + lane_block +
                                    line_offset) =
              make_uint2(attention_bf16_pair(values[r][i].x, values[r][i].y),
                         attention_bf16_pair(values[r][i].z, values[r][i].w));
        }
      }
    }
    const bool inexact = __any_sync(0xFFFFFFFFu, !exact);
    if (lane == 0) {
      shared.present[stage][warp] = present;
      shared.inexact[stage][warp] = inexact ? 1u : 0u;
    }
    wg::fence_proxy_async();
    wg::mbarrier_arrive(shared_address(&shared.full[stage]));
  }
}

// One block per token (module comment); kPrefetchRows: kPrefetch.
template <bool kPrefetchRows>
__global__ void __launch_bounds__(kThreads, 1) sink_attention_wgmma_kernel(AttentionArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t shared_raw[];
  Shared& shared = *reinterpret_cast<Shared*>(
      shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023));
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  if (tid == 0) {
    resolve_token_keys(args, t, shared.token_keys);
    for (int stage = 0; stage < kStages; ++stage) {
      wg::mbarrier_init(shared_address(&shared.full[stage]), 128);
      wg::mbarrier_init(shared_address(&shared.empty[stage]), 256);
    }
  }
  // The queries as bf16 (round to nearest even, as the cluster kernel's one term): 4096 chunks
  // of 8 columns, chunk i head i / 64, columns 8 (i % 64) + [0, 8); all loads in flight at once.
  {
    const float* q = args.q.row(t);
    constexpr int kChunks = kHeads * kDim / 8;
    constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
    float4 values[kPerThread][2];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = tid + kThreads * k;
      if (i < kChunks) {
        values[k][0] = reinterpret_cast<const float4*>(q)[2 * i];
        values[k][1] = reinterpret_cast<const float4*>(q)[2 * i + 1];
      }
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = tid + kThreads * k;
      if (i < kChunks) {
        const int head = i >> 6;
        const int column_chunk = i & 63;
        *reinterpret_cast<uint4*>(shared.queries + (column_chunk >> 3) * kOperandBlockBytes +
                                  wg::swizzled_offset(head, column_chunk & 7)) =
            bf16_words(values[k][0], values[k][1]);
      }
    }
  }
  wg::fence_proxy_async();
  __syncthreads();  // queries, token keys, barriers
  const TokenKeys& keys = shared.token_keys;
  const int64_t tiles = (keys.total() + kKeys - 1) / kKeys;
  const int warpgroup = tid >> 7;
  if (warpgroup == 0) {
    wg::registers_decrease<kProducerRegisters>();
    produce<kPrefetchRows>(args, shared, keys, tiles);
    return;
  }
  wg::registers_increase<kConsumerRegisters>();
  const int consumer = warpgroup - 1;  // columns 256 consumer + [0, 256)
  const int lane = tid & 31;
  const int warp = (tid >> 5) & 3;
  const int quad = lane & 3;
  const int head = 16 * warp + (lane >> 2);  // and head + 8
  const float score_scale = args.scale * prefill::kLog2e;
  float running_max[2], running_sum[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    running_max[i] = args.sinks[head + 8 * i] * prefill::kLog2e;
    running_sum[i] = quad == 0 ? 1.0f : 0.0f;  // exp(sink - running_max), once a row
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  const uint32_t query_base = shared_address(shared.queries);
  bool redo = false;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int stage = static_cast<int>(tile & 1);
    wg::mbarrier_wait(shared_address(&shared.full[stage]), static_cast<uint32_t>((tile >> 1) & 1));
    uint64_t mask = 0;
    bool inexact = false;
#pragma unroll
    for (int w = 0; w < kProducerWarps; ++w) {
      mask |= static_cast<uint64_t>(shared.present[stage][w]) << (kRowsPerWarp * w);
      inexact = inexact || shared.inexact[stage][w] != 0;
    }
    // A tile without any key present (-1 selections), or a token going to the one-block kernel:
    // nothing to add. The last tile's weighted sum completes here, and its buffer goes back as
    // on the computing path; this tile's goes back with the next tile (or at the end).
    redo = redo || inexact;
    if (redo || mask == 0) {
      wg::wgmma_wait<0>();
      wg::hold_after_wait(o);
      wg::mbarrier_arrive_if(shared_address(&shared.empty[stage ^ 1]), tile > 0);
      continue;
    }
    const uint32_t key_base = shared_address(shared.keys[stage]);
    float s[32];
    wg::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDim / 16; ++k) {
      const uint32_t offset = static_cast<uint32_t>((k >> 2) * kOperandBlockBytes + (k & 3) * 32);
      const uint64_t a = wg::k_major_descriptor(query_base + offset);
      const uint64_t b = wg::k_major_descriptor(key_base + offset);
      if (k == 0) {
        wg::wgmma_m64n64k16_ss_fresh(s, a, b);
      } else {
        wg::wgmma_m64n64k16_ss(s, a, b, 1);
      }
    }
    wg::wgmma_commit();
    // This S and the last tile's weighted sum (in issue order on the tensor cores, so waiting for
    // both costs nothing; a wait_group 1 between them made ptxas serialize every wgmma: C7514).
    wg::wgmma_wait<0>();
    wg::mbarrier_arrive_if(shared_address(&shared.empty[stage ^ 1]), tile > 0);
    wg::hold_after_wait(s);
    wg::hold_after_wait(o);

    // Online softmax of rows head (s[4j], s[4j + 1]) and head + 8 (s[4j + 2], s[4j + 3]), keys
    // 8 j + 2 quad + {0, 1}; a quad holds a row's 64 keys.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int key = 8 * (i >> 2) + 2 * quad + (i & 1);
      const bool present = ((mask >> key) & 1) != 0;
      s[i] = present ? __fmul_rn(s[i], score_scale) : -INFINITY;
      tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
    }
    float rescale[2], new_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 2));
      new_max[r] = fmaxf(running_max[r], tile_max[r]);
      rescale[r] =
          running_max[r] == -INFINITY ? 0.0f : prefill::exp2_approx(running_max[r] - new_max[r]);
      running_max[r] = new_max[r];
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int r = (i >> 1) & 1;
      s[i] = s[i] == -INFINITY ? 0.0f : prefill::exp2_approx(s[i] - new_max[r]);
      tile_sum[r] = __fadd_rn(tile_sum[r], s[i]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      running_sum[r] = __fadd_rn(__fmul_rn(running_sum[r], rescale[r]), tile_sum[r]);
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] = __fmul_rn(o[4 * j], rescale[0]);
      o[4 * j + 1] = __fmul_rn(o[4 * j + 1], rescale[0]);
      o[4 * j + 2] = __fmul_rn(o[4 * j + 2], rescale[1]);
      o[4 * j + 3] = __fmul_rn(o[4 * j + 3], rescale[1]);
    }
    // P as register A: keys 16 step + [0, 16) are s[8 step + (0..7)].
    uint32_t p[4][4];
#pragma unroll
    for (int step = 0; step < 4; ++step) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        p[step][k] = attention_bf16_pair(s[8 * step + 2 * k], s[8 * step + 2 * k + 1]);
      }
    }
    const uint32_t value_base =
        key_base + static_cast<uint32_t>(consumer * (kConsumerColumns / 64) * kOperandBlockBytes);
    // Every value of the softmax complete before the weighted sum's stage (settle).
#pragma unroll
    for (int step = 0; step < 4; ++step) wg::settle(p[step]);
    wg::settle(s);
    wg::settle(o);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      wg::settle(running_sum[r]);
      wg::settle(running_max[r]);
    }
    wg::wgmma_fence();
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      wg::wgmma_m64n256k16_rs(
          o, p[step],
          wg::mn_major_descriptor(value_base + static_cast<uint32_t>(step * 2 * wg::kAtomBytes),
                                  kOperandBlockBytes),
          1);
    }
    wg::wgmma_commit();
  }
  wg::wgmma_wait<0>();
  wg::hold_after_wait(o);
  if (tiles > 0) wg::mbarrier_arrive(shared_address(&shared.empty[(tiles - 1) & 1]));
  if (redo) {
    if (consumer == 0 && (tid & 127) == 0) args.redo_tokens[t] = 1;
    return;
  }
  const bool bad_range = keys.bad_range != 0;
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = running_sum[r];
    sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, 2));
    inverse[r] = bad_range ? __int_as_float(0x7fc00000) : 1.0f / sum;
  }
  float* y =
      args.out.row(t) + static_cast<int64_t>(head) * kDim + consumer * kConsumerColumns + 2 * quad;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<float2*>(y + 8 * j) =
        make_float2(o[4 * j] * inverse[0], o[4 * j + 1] * inverse[0]);
    *reinterpret_cast<float2*>(y + 8 * kDim + 8 * j) =
        make_float2(o[4 * j + 2] * inverse[1], o[4 * j + 3] * inverse[1]);
  }
#else
  (void)args;
  __trap();  // wgmma is sm_90a's: the host launches it there only (device_has_wgmma)
#endif
}

}  // namespace prefill_wgmma
