// The op layer: every computation the DeepSeek-V4.1 forward needs, as free functions over
// tensor views. The model (src/model/deepseek_v41) is written once against these; ops/cpu is
// the reference implementation and the oracle for other backends.
//
// Conventions shared by every op:
//  - Activations are f32, rows along the first dimension, the last dimension contiguous
//    (row strides may be larger than the row, so column slices of a wider matrix work).
//  - Every reduction runs in a fixed order per output element that does not depend on how many
//    rows are in the call or on the thread count (batch invariance).
//  - Small host metadata (positions, selected indices) is passed as int32 views.
//  - `out` may alias an input only where the op says so.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace deepinfer::ops {

// ---- linear ------------------------------------------------------------------------------

// A linear layer's weight [out, in] in its storage format:
//  - f32 or bf16, no scale;
//  - f8 e4m3 with ue8m0 block scales [ceil(out/bo), ceil(in/bi)] (block shape derived from the
//    scale's shape: 32x32 in the released DeepSeek-V4.1 checkpoint);
//  - packed fp4 e2m1 (two per byte) with ue8m0 scales [out, in/bi] along `in` (bi = 32).
struct LinearWeight {
  TensorView weight;
  TensorView scale;  // empty (numel 0) for f32 / bf16
  // Optional (empty unless the model made one): the fp8 weight dequantized into bf16 [out, in],
  // exact. The GPU's batch-variant GEMMs (ops/cuda/linear_cublaslt.h) read it instead of
  // dequantizing the weight on every call; every other path ignores it.
  TensorView bf16_copy = TensorView();  // an initializer: the two-member braces stay warning-free

  int64_t out_features() const { return weight.size(0); }
  int64_t in_features() const { return weight.size(1); }
};

// What happens to the activation before it meets a quantized weight.
enum class ActivationQuant {
  kNone,           // dense numerics: f32 activation
  kFp8PerBlock32,  // released numerics: e4m3 with one ue8m0 scale per 32 activations
};

// out[m, n] = sum_k act(x)[m, k] * W[n, k]. x [M, K] f32, out [M, N] f32 (must not alias x).
// Each output element sums K in one fixed order, so a row's result is independent of M.
void linear(const TensorView& x, const LinearWeight& weight, const TensorView& out,
            ActivationQuant activation_quant = ActivationQuant::kNone);

// Two linears of one input, linear(x, first, first_out, q) and linear(x, second, second_out, q),
// with the same bits as those calls; the GPU makes one launch of both at decode where it can (a
// layer's wq_a and wkv, the shared expert's w1 and w3: small calls that each leave most SMs idle).
void linear_pair(const TensorView& x, const LinearWeight& first, const TensorView& first_out,
                 const LinearWeight& second, const TensorView& second_out,
                 ActivationQuant activation_quant = ActivationQuant::kNone);

// A grouped linear: for g < groups, out[:, g * N/G, (g + 1) * N/G) = x[:, g * K, (g + 1) * K)
// times weight rows [g * N/G, (g + 1) * N/G), i.e. the `groups` calls
//   linear(x.narrow(1, g * K, K), {weight.weight.narrow(0, g * N/G, N/G),
//          weight.scale.narrow(0, g * S/G, S/G)}, out.narrow(1, ...), ActivationQuant::kNone)
// (S the scale's rows; no scale for f32 / bf16), with the same bits as those calls (the
// attention's wo_a groups in one launch on the GPU). x [M, groups * K] f32, out [M, N]; weight
// [N, K] f32 or bf16 without scale, or fp8 e4m3 with ue8m0 block scales whose groups are whole
// scale blocks (linear_grouped_supports; Error otherwise). The activation is never quantized, so
// an fp8 weight gives the bits of its exact bf16 dequantization (dequantize_weight).
void linear_grouped(const TensorView& x, const LinearWeight& weight, int64_t groups,
                    const TensorView& out);

// Whether linear_grouped takes `weight` in `groups` groups (formats and shapes only, any device):
// N % groups == 0 and an f32 / bf16 weight without scale, or an fp8 one whose row block (derived
// from the scale grid as linear derives it) divides N / groups, and which each group's share of
// the scale rows gives again. The released wo_a (1024-row groups, 32-row blocks) fits.
bool linear_grouped_supports(const LinearWeight& weight, int64_t groups);

// The edge of `blocks` fp8 scale blocks over `extent` weight rows or columns, as every backend
// reads a scale grid: the grid is ceil(extent / edge) blocks, and where several edges give it the
// power of two the checkpoints use wins (32, then 128, 64, 16). 0: no edge gives it.
int64_t scale_block_edge(int64_t extent, int64_t blocks);

// Dequantizes any LinearWeight to a dense f32 [out, in] tensor (exact: every stored format is a
// subset of f32), or to a bf16 one for bf16 and fp8 weights (exact too: an e4m3 value times a
// power-of-two scale has 4 significant bits, for every scale from 2^-124 up, which covers every
// released weight; the CPU checks each value, the GPU trusts the scales).
void dequantize_weight(const LinearWeight& weight, const TensorView& out);

// ---- elementwise / normalization ------------------------------------------------------------

// Rows of table [V, D] (f32 or bf16) selected by ids -> out [M, D]. Throws Error naming the
// position of an out-of-range id.
void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out);

// out = x * rsqrt(mean(x^2) + eps) * weight. weight is f32/bf16 [D], or empty for the unweighted
// norm. x and out are [M, D]; out may alias x.
void rmsnorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out);

// ---- rotary embedding -----------------------------------------------------------------------

struct YarnParams {
  double factor = 1.0;
  double original_max_position = 0.0;  // 0 disables YaRN
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// One inverse frequency per rotated pair (rope_dim / 2 of them).
struct RopeTable {
  int rope_dim = 0;
  std::vector<float> inv_freq;
};

// Base frequencies theta^(-2i/rope_dim), with YaRN's ramp between the beta_fast and beta_slow
// correction dimensions when yarn.original_max_position > 0 (no attention-factor scaling: V4.1
// applies YaRN with attention factor 1).
RopeTable make_rope_table(int rope_dim, double theta, const YarnParams& yarn = {});

// Rotates the trailing rope_dim channels of every head in place, taking adjacent channels
// (2i, 2i+1) as one complex number, by angle position * inv_freq[i] (negated when `inverse`).
// x is [M, H, Dh] (or [M, Dh]); positions i32 [M] on x's device (the model uploads them once
// per step with the rest of its metadata).
void rope(const TensorView& x, const TensorView& positions, const RopeTable& table, bool inverse);

// Softmax over each row of x [M, N] in place.
void softmax_rows(const TensorView& x);

// ---- quantization semantics that are part of the model --------------------------------------

// In place: each block of 32 along the last dim becomes e4m3 values times a power-of-two (ue8m0)
// scale 2^ceil(log2(max(amax, 1e-4) / 448)). Rows whose length is not a multiple of the block are
// left as they are (HF does the same for shapes the reference cannot block).
void fake_quant_fp8(const TensorView& x, int block = 32);

enum class Fp4ScaleFormat { kUe8m0, kE4m3 };
// In place: e2m1 values (round to nearest even) times a per-block scale: ue8m0 =
// 2^ceil(log2(max(amax, 6*2^-126) / 6)); e4m3 = e4m3(max(amax, 6*2^-9) / 6).
void fake_quant_fp4(const TensorView& x, int block, Fp4ScaleFormat scale_format);

// ---- attention ------------------------------------------------------------------------------

// Shared-KV attention with a per-head sink over two key sets, K = V:
//  - window_kv [Nw, Dh]: query t attends rows [window_range[t,0], window_range[t,1]);
//  - compressed_kv [Nc, Dh]: query t attends rows compressed_idx[t, :] (entries < 0 skipped).
// q [T, H, Dh], sink [H] f32, out [T, H, Dh]. The sink only joins the softmax denominator.
// Keys are visited window first, then compressed, each in the given order.
void sink_attention(const TensorView& q, const TensorView& window_kv,
                    const TensorView& window_range, const TensorView& compressed_kv,
                    const TensorView& compressed_idx, const TensorView& sink, float scale,
                    const TensorView& out);

// Calls fn(slot, row, length) for the runs of ring slots holding positions [first, first +
// count) of a ring of `capacity` rows (slot = position % capacity): at most two runs. For copies
// of ring rows in contiguous pieces.
template <typename Fn>
void for_each_ring_run(int64_t capacity, int64_t first, int64_t count, Fn&& fn) {
  int64_t row = 0;
  while (row < count) {
    const int64_t slot = (first + row) % capacity;
    const int64_t length = std::min(count - row, capacity - slot);
    fn(slot, row, length);
    row += length;
  }
}

// One request's share of a batched attention call (sink_attention_batch, write_window_rings).
// Its tokens are rows [offset, offset + count) of the call, at positions [start, start + count).
struct AttentionRequest {
  TensorView window_ring;    // [capacity, Dh]: position p's K=V row at slot p % capacity
  TensorView compressed_kv;  // [Nc, Dh]; may be empty when `selected` is
  TensorView selected;       // i32 [count, k]: compressed rows per token (< 0 skipped); may be
                             // empty: no compressed keys
  int64_t offset = 0;
  int64_t count = 0;
  int64_t start = 0;
};

// sink_attention for the tokens of every request of a step in one call. Token t of a request,
// at position p, attends the window positions [max(0, p - window + 1), p] in order, then its
// selected compressed rows in order: positions before the request's `start` come from its
// ring (which must hold them: capacity >= window - 1), later ones from new_kv [T, Dh] (this
// call's rows, not yet in the ring). Same keys in the same order as sink_attention over the
// gathered window rows, so the same output bit for bit. The requests' rows must tile [0, T).
void sink_attention_batch(const TensorView& q, const TensorView& new_kv,
                          std::span<const AttentionRequest> requests, int64_t window,
                          const TensorView& sink, float scale, const TensorView& out);

// Writes each request's new rows new_kv [T, Dh] into its window ring at slot position %
// capacity (only the last `capacity` positions of a request longer than its ring).
void write_window_rings(const TensorView& new_kv, std::span<const AttentionRequest> requests);

// ---- compressed branch ------------------------------------------------------------------------

// Softmax-gated pooling of `ratio` consecutive rows: out[g, c] = sum_j kv[g*r+j, c] *
// softmax_j(gate[g*r+j, c]). kv, gate [G*r, D]; out [G, D].
void compress_pool(const TensorView& kv, const TensorView& gate, int ratio, const TensorView& out);

// The indexer key cache in the release's format: the keys of MODEL.md 5.2 are fp4 fake-quantized
// (e2m1 values times a ue8m0 scale per 32 channels), so the cache stores exactly those values as
// codes [N, D] kF4E2M1x2 (packed, channel 2i in the low nibble of byte i) and scales [N, D/32]
// kF8E8M0: key j channel c = e2m1(codes[j], c) * 2^(scales[j, c/32] - 127). 68 bytes a 128-channel
// key where f32 rows took 512; the scores read every visible key each step, so these are the
// bytes a decode step's indexer moves.
struct IndexerKeys {
  TensorView codes;
  TensorView scales;

  int64_t rows() const { return codes.numel() == 0 ? 0 : codes.size(0); }
  // Channels a key has (0 when empty).
  int64_t dim() const { return codes.numel() == 0 ? 0 : codes.size(1); }
  size_t nbytes() const { return codes.nbytes() + scales.nbytes(); }
  // Keys [start, start + count).
  IndexerKeys narrow(int64_t start, int64_t count) const {
    return {codes.narrow(0, start, count), scales.narrow(0, start, count)};
  }
};

// One request's share of write_indexer_keys: rows [offset, offset + count) of the call's keys go
// to rows [start, start + count) of its cache.
struct IndexerKeyWrite {
  IndexerKeys cache;
  int64_t offset = 0;
  int64_t count = 0;
  int64_t start = 0;
};

// Quantizes keys [G, D] f32 (D % 32 == 0) to e2m1 with a ue8m0 scale per 32 channels, exactly
// as fake_quant_fp4(keys, 32, kUe8m0) rounds them (the stored values are its output bit for
// bit), and writes each request's rows into its cache. The writes' rows must lie inside the
// call's keys and each cache, and no cache row may be written twice in one call (the CUDA
// version writes all rows at once); `keys` is not modified.
void write_indexer_keys(const TensorView& keys, std::span<const IndexerKeyWrite> writes);

// What every backend's write_indexer_keys checks of write `index` before it writes: the cache's
// channels are the keys' (`keys` [key_rows, key_dim]), and its rows lie inside the keys and the
// cache (cache_rows x cache_dim, as the backend reads it).
void check_indexer_key_write(size_t index, const IndexerKeyWrite& write, int64_t cache_rows,
                             int64_t cache_dim, int64_t key_rows, int64_t key_dim,
                             const TensorView& keys);

// Indexer scores: out[t, j] = sum_h weights[t, h] * relu(q[t, h, :] . keys[j, :]) * scale for
// j < visible[t], -inf otherwise. q [T, Hi, Di], keys N cached keys of Di channels, weights
// [T, Hi], visible [T] I32, out [T, N].
void indexer_scores(const TensorView& q, const IndexerKeys& keys, const TensorView& weights,
                    const TensorView& visible, float scale, const TensorView& out);

// One request's share of indexer_scores_batch: token rows [offset, offset + count) of the call
// score this request's keys (the first `entries` rows of its indexer key cache).
struct IndexerRequest {
  IndexerKeys keys;  // may be empty (entries 0): every score of its rows is -inf
  int64_t offset = 0;
  int64_t count = 0;
};

// indexer_scores for the tokens of every request of a step in one call: out [T, width] with
// width >= every request's entries. Row t of request r holds indexer_scores of its q, weights
// and visible row against r's keys in columns [0, entries_r) and -inf in [entries_r, width), so
// a ragged batch needs no fill. The requests' rows must tile [0, T). The CPU reference calls
// indexer_scores per request (same bits). The CUDA version multiplies on bf16 tensor cores:
// it rounds q to bf16, which is exact for the model's fp4-quantized (e2m1 x ue8m0) values --
// other inputs lose their low bits -- and sums the heads in a fixed order of its own
// (differences of a few ulp of the scores' scale from the reference).
void indexer_scores_batch(const TensorView& q, std::span<const IndexerRequest> requests,
                          const TensorView& weights, const TensorView& visible, float scale,
                          const TensorView& out);

// Level one of the two-level top-k: per row of scores [T, N], keep the `topk_blocks` best blocks
// of `block_size` entries (block score = max entry; the block holding entry visible[t]-1 is
// pinned in; -inf blocks never kept). mask_out [T, N] I8 gets 1 for kept entries.
void candidate_blocks(const TensorView& scores, const TensorView& visible, int topk_blocks,
                      int block_size, const TensorView& mask_out);

// scores[t, j] = -inf wherever mask[t, j] == 0.
void mask_scores(const TensorView& scores, const TensorView& mask);

// Per row of scores [T, N]: the indices of the k largest finite entries (ties: lower index
// first), written ascending into idx_out [T, k] I32 and padded with -1.
void topk_indices(const TensorView& scores, int k, const TensorView& idx_out);

// ---- hyper-connections ------------------------------------------------------------------------

struct HcParams {
  int hc = 0;
  int sinkhorn_iters = 0;
  float hc_eps = 0.0f;
  float norm_eps = 0.0f;
};

// From the streams x [M, hc*D]: mixes = fn . (x / rms(x)) with fn [(2+hc)*hc, hc*D] f32, then
// pre = sigmoid(mixes[:hc]*scale[0]+base) + eps, post = 2 sigmoid(mixes[hc:2hc]*scale[1]+base),
// comb = Sinkhorn(softmax_rows(mixes[2hc:]*scale[2]+base) + eps). pre/post [M, hc], comb
// [M, hc, hc] with comb[j, k] the weight of input stream j in output stream k.
void hc_mixes(const TensorView& x, const TensorView& fn, const TensorView& scale,
              const TensorView& base, const HcParams& params, const TensorView& pre,
              const TensorView& post, const TensorView& comb);

// out[m, :] = sum_j pre[m, j] * x[m, j, :]. x [M, hc, D], pre [M, hc], out [M, D].
void hc_collapse(const TensorView& x, const TensorView& pre, const TensorView& out);

// out[m, k, :] = post[m, k] * y[m, :] + sum_j comb[m, j, k] * residual[m, j, :].
// y [M, D], residual [M, hc, D], out [M, hc, D] (may alias residual).
void hc_expand(const TensorView& y, const TensorView& residual, const TensorView& post,
               const TensorView& comb, const TensorView& out);

// ---- mixture of experts ----------------------------------------------------------------------

enum class ScoreFunction { kSoftmax, kSigmoid, kSqrtSoftplus };

struct RouterParams {
  ScoreFunction score_function = ScoreFunction::kSqrtSoftplus;
  float temperature = 1.0f;
  int top_k = 1;
  bool normalize = true;
  float routed_scale = 1.0f;
};

// scores = score_fn(x . gate^T / temperature); experts = top-k of scores + bias (bias steers
// selection only); weights = scores of the chosen experts, renormalized (sum + 1e-20) when
// `normalize` and top_k > 1, times routed_scale. x [M, D]; gate [E, D] (f32/bf16); bias [E] f32
// or empty. weights_out [M, k] f32; experts_out [M, k] I32 (in descending biased-score order).
void route(const TensorView& x, const TensorView& gate, const TensorView& bias,
           const RouterParams& params, const TensorView& weights_out,
           const TensorView& experts_out);

// out = silu(min(gate, limit)) * clamp(up, -limit, limit) * row_weight (limit <= 0: no clamp;
// row_weight empty: 1). gate, up, out [M, I] (out may alias gate or up); row_weight [M].
void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& row_weight,
            const TensorView& out);

// ---- engram ----------------------------------------------------------------------------------

// Rows of an engram table [R, Dg] (e4m3 with ue8m0 scales [R, Dg/32], or f32/bf16 with no
// scale) for ids [M, C] (I32/I64) -> out [M, C*Dg].
void engram_gather(const TensorView& table, const TensorView& scale, const TensorView& ids,
                   const TensorView& out);

// The engram's gated write into the streams, per (row, stream k):
//   dot = sum_d x[k,d] * qk[k,d] * key[k,d] * rsqrt(mean(x[k]^2)+eps) * rsqrt(mean(key[k]^2)+eps)
//         / sqrt(D)
//   gate = sigmoid(sign(dot) * sqrt(max(|dot|, 1e-6)))
//   out[k] = x[k] + gate * value
// x, key, out [M, hc, D] (out may alias x); value [M, D]; qk [hc, D] f32 (q_weight * k_weight).
void engram_mix(const TensorView& x, const TensorView& key, const TensorView& value,
                const TensorView& qk, float eps, const TensorView& out);

// ---- glue: data movement and elementwise helpers the forward needs on any device ------------

// dst = src: equal dtype and shape, each side contiguous or rows with a row stride (a column
// slice or one stream of [M, hc, D]). Either side may be host or device memory (a device copy
// is ordered on the current stream; a host source may be reused as soon as this returns).
void copy(const TensorView& src, const TensorView& dst);

// Every element of the f32 view x (rows, row stride allowed) becomes `value`.
void fill(const TensorView& x, float value);

// out = x * factor (f32 [M, ...]; out may alias x).
void scale(const TensorView& x, float factor, const TensorView& out);

// out = x + y (f32 [M, ...] of one shape; out may alias x or y).
void add(const TensorView& x, const TensorView& y, const TensorView& out);

// One routed expert's weights (the SwiGLU FFN: down(silu(gate x) * up x)).
struct ExpertWeights {
  LinearWeight w1;  // gate [I, D]
  LinearWeight w3;  // up   [I, D]
  LinearWeight w2;  // down [D, I]
};

// The routed part of a MoE layer, from the router's result:
//   out[t] = sum over the slots s of token t, in ascending expert id (HF's combine order), of
//            w2_e(swiglu(w1_e(x[t]), w3_e(x[t]), swiglu_limit) * weights[t, s]),  e = experts[t, s]
// x [N, D] f32; experts [N, k] i32 (distinct per token, each in [0, expert_weights.size()));
// weights [N, k] f32; out [N, D] f32 (must not alias x). `quant` is applied to the input of
// every expert GEMM (as `linear` does). Every row's result is independent of the other rows
// (batch invariance): each expert GEMM accumulates K in a fixed order per output element.
// The span's entries must stay valid while the model lives (backends may cache a device table
// of the expert weights keyed by their addresses). The CUDA version groups the tokens by
// expert on the device (counting sort, no host synchronization); a faster grouped GEMM can
// replace its expert GEMMs behind this signature.
void moe_experts(const TensorView& x, const TensorView& experts, const TensorView& weights,
                 std::span<const ExpertWeights> expert_weights, float swiglu_limit,
                 ActivationQuant quant, const TensorView& out);

// ---- devices --------------------------------------------------------------------------------

// The allocator for long-lived tensors (weights, request state, scratch) on `device`.
Allocator& allocator_for(Device device);
// Bytes a new allocation on `device` can still take: free device memory on a GPU, the
// kernel's MemAvailable estimate of host memory on the CPU.
int64_t free_memory(Device device);
// Waits for the work queued on `device` (the current stream) and throws Error for any
// out-of-range index a kernel met since the last call; nothing on the host.
void synchronize(Device device);

// ---- recorded op sequences (CUDA graphs) -----------------------------------------------------

// A run of ops recorded once (OpRecorder) and queued again, with the same kernels, arguments and
// addresses, by one call. Valid while every buffer it touches stays where it was.
class RecordedOps {
 public:
  virtual ~RecordedOps() = default;
  // Queues the recorded ops on the current stream.
  virtual void replay() = 0;
};

// A backend's recorder of the ops one thread queues (the model's decode step records the
// stretches of a step whose kernels and arguments repeat: docs/CUDA.md, "CUDA graphs for
// decode"). Not an op: there is no CPU version, and op_recorder() is null for such devices.
class OpRecorder {
 public:
  virtual ~OpRecorder() = default;
  // Brackets a step that may record: makes the current stream one that can be recorded (a
  // stream of the recorder's own when this thread's is the device's legacy default stream, ordered
  // with that stream's work both ways), until end_step.
  virtual void begin_step() = 0;
  virtual void end_step() noexcept = 0;
  // From begin() to end(), the ops this thread queues on the current stream are recorded, not
  // run; ops that would queue host data (uploads) throw instead of recording bytes a replay
  // would read stale.
  virtual void begin() = 0;
  virtual std::unique_ptr<RecordedOps> end() = 0;
  // Ends a recording that failed part way (an op threw); never throws.
  virtual void abandon() noexcept = 0;
};

namespace detail {
inline OpRecorder*& gpu_op_recorder() {
  static OpRecorder* recorder = nullptr;  // set by the CUDA backend when it is linked in
  return recorder;
}
}  // namespace detail

// The recorder for `device`, or null where there is none (the CPU, a build without CUDA).
inline OpRecorder* op_recorder(Device device) {
  return device.is_cuda() ? detail::gpu_op_recorder() : nullptr;
}

}  // namespace deepinfer::ops

// ---- backends ------------------------------------------------------------------------------
// Every function above dispatches on the device of its first tensor argument
// (src/ops/dispatch.cpp): host views run ops::cpu, the reference (src/ops/cpu); CUDA views run
// ops::cuda (src/ops/cuda/cuda_ops.h, built with DEEPINFER_CUDA). All of a call's tensors must
// be on the same device.
namespace deepinfer::ops::cpu {
#include "ops/backend_ops.inc"
RopeTable make_rope_table(int rope_dim, double theta, const YarnParams& yarn = {});
bool linear_grouped_supports(const LinearWeight& weight, int64_t groups);
}  // namespace deepinfer::ops::cpu
