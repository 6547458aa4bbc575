// ops::cuda::sink_attention_batch at V4.1-Flash shapes (64 heads x 512, K = V shared by the
// heads): the head-group kernel against the per-head kernel it replaces
// (DEEPINFER_ATTENTION_HEAD_GROUPS=0), and the batched path against the per-request loop it
// replaces (DEEPINFER_ATTENTION_BATCHED=0: gathered window rows, one call per request), next to
// the HBM read bandwidth measured in the same run. The head-group column is the one-block kernel
// (DEEPINFER_ATTENTION_SPLIT=0); the split-KV column (decode only: DEEPINFER_ATTENTION_SPLIT=1)
// is its split path, which must give the same bits; the op itself takes the split path when the
// one-block kernel would launch fewer than 2 blocks per SM. Those two columns are the FMA
// kernels (DEEPINFER_ATTENTION_MMA=0); "mma" and "mma-split" are the tensor-core kernels that
// replace them (the op's default), the same two forms, which must give each other's bits too.
// The KV rows are bf16-exact, as the model's are (FP8 window rows, FP4 compressed rows): the
// tensor-core kernels' one-term key path; "mma-f32kv" times the op's choice once more with the
// KV rows refilled as plain f32 values (their three-term path). "inv-off" times the op's choice
// with batch invariance off (ops::ScopedBatchInvariance(false)): from
// DEEPINFER_ATTENTION_PREFILL_DECODE tokens (default 8) the prefill kernel (a cluster of the 4
// head-group blocks a token loading each bf16 key tile once), below 96 tokens its split form
// (chunks of each token's keys, then a merge), below 8 the head-group kernels;
// "inv-off-f32kv" the same with the f32 KV rows (its fallback: the one-block kernel for every
// token); "off-differ" its worst difference from the "mma" column's output (the default: one
// bf16 term a query and probability value, FlashMLA's numerics; exit 2 past kOneTermDiffer);
// "inv-off-exact" the prefill kernel with exact products (DEEPINFER_ATTENTION_PREFILL_EXACT=1:
// three bf16 terms, the kernel before the one-term default; "exact-differ": its worst difference
// from "mma", exit 2 past 2e-5). After the main table: the op with batch invariance off against
// the path before the split form ("before": the head-group kernels below 256 tokens, the
// whole-token prefill kernel from 256), ms, GB/s and of HBM each; then the prefill kernel at every
// batch with its chunks a token forced (1: whole tokens), the sweep its heuristic was fitted to.
//
//   cuda_attention_bench [json_path]   (default: $OUT/attention_bench.json, else
//                                       ./attention_bench.json)
//   ATTENTION_BENCH_ONLY=256 cuda_attention_bench   (one decode batch, no prefill case)
//   ATTENTION_BENCH_WGMMA=1 cuda_attention_bench    (the wgmma section alone; with
//                                                   ATTENTION_BENCH_WGMMA_BATCH=N one batch,
//                                                   0 the prefill case)
//
// Decode batch 1, 8, 16, 64, 128, 256: one query row per token, each token its own request (a
// window of 127 rows of its ring plus its new row, and 512 entries selected from its own 2048
// compressed rows). Prefill: the first 8192 tokens of one request, token t attending the window
// (t - 128, t] of the call's rows and min(512, t / 4) compressed entries (the rest -1). "Bytes"
// counts the distinct KV rows a call must read plus q and out; GB/s is bytes over time, next to
// the read roofline. Before timing, both kernels' outputs are compared (worst difference over
// the output's scale; exit 2 past 2e-5; "differ" is per-head vs FMA head-group, "mma-differ" FMA
// vs tensor-core head-group), the two paths' (the same bits or exit 3) and the split-KV paths'
// against their one-block kernels' (the same bits or exit 4). "speedup" is the faster FMA
// head-group form over the faster tensor-core form; GB/s and "of HBM" are the faster
// tensor-core form's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "roofline.cuh"
#include "uniform_fill.cuh"

namespace deepinfer::bench {
namespace {

namespace rt = deepinfer::cuda;

constexpr int64_t kHeads = 64;
constexpr int64_t kHeadDim = 512;
constexpr int64_t kWindow = 128;
constexpr int64_t kSelected = 512;
constexpr int64_t kCompressedPerSequence = 2048;
constexpr int64_t kPrefillTokens = 8192;
constexpr int kCompressRatio = 4;

Tensor device_i32(Shape shape, const std::vector<int32_t>& values) {
  Tensor host = Tensor::empty(DType::kI32, shape);
  std::copy(values.begin(), values.end(), host.data<int32_t>());
  return rt::to_device(host.view());
}

// ---- cases ----------------------------------------------------------------------------------

// Ring rows per request: the window plus a rollback margin, as RequestState keeps.
constexpr int64_t kRingCapacity = kWindow + 8;

// One batched call: every request's views into shared device tensors.
struct AttentionCase {
  std::string name;
  int64_t tokens = 0;
  Tensor q, new_kv, rings, compressed, sink, index, out;
  std::vector<ops::AttentionRequest> requests;
  double bytes = 0;  // distinct KV rows, q and out
};

// Each token its own request at position 4000 + 37 b (the ring's window wraps at different
// slots), reading 127 ring rows and its own new row, 512 entries selected from its own 2048
// compressed rows.
AttentionCase decode_case(int64_t batch) {
  AttentionCase c;
  c.name = "decode b" + std::to_string(batch);
  c.tokens = batch;
  c.q = device_f32({batch, kHeads, kHeadDim}, 1, 1.0f);
  c.new_kv = device_f32({batch, kHeadDim}, 6, 0.5f, true);
  c.rings = device_f32({batch * kRingCapacity, kHeadDim}, 2, 0.5f, true);
  c.compressed = device_f32({batch * kCompressedPerSequence, kHeadDim}, 3, 0.5f, true);
  c.sink = device_f32({kHeads}, 4, 2.0f);
  std::vector<int32_t> indices;
  std::mt19937 rng(5);
  for (int64_t b = 0; b < batch; ++b) {
    // 512 distinct rows of the request's 2048, in random order.
    std::vector<int32_t> rows(kCompressedPerSequence);
    for (int64_t j = 0; j < kCompressedPerSequence; ++j) rows[j] = static_cast<int32_t>(j);
    std::shuffle(rows.begin(), rows.end(), rng);
    indices.insert(indices.end(), rows.begin(), rows.begin() + kSelected);
  }
  c.index = device_i32({batch, kSelected}, indices);
  for (int64_t b = 0; b < batch; ++b) {
    ops::AttentionRequest request;
    request.window_ring = c.rings.view().narrow(0, b * kRingCapacity, kRingCapacity);
    request.compressed_kv =
        c.compressed.view().narrow(0, b * kCompressedPerSequence, kCompressedPerSequence);
    request.selected = c.index.view().narrow(0, b, 1);
    request.offset = b;
    request.count = 1;
    request.start = 4000 + 37 * b;
    c.requests.push_back(request);
  }
  c.out = Tensor::empty(DType::kF32, {batch, kHeads, kHeadDim}, rt::device_allocator());
  c.bytes = static_cast<double>(batch) * (kWindow + kSelected) * kHeadDim * 4 +
            2.0 * static_cast<double>(batch) * kHeads * kHeadDim * 4;
  return c;
}

// One request's first 8192 tokens: token t attends (t - 128, t] of this call's rows and
// min(512, t / 4) compressed entries (the rest -1).
AttentionCase prefill_case() {
  const int64_t tokens = kPrefillTokens;
  const int64_t compressed_rows = tokens / kCompressRatio;
  AttentionCase c;
  c.name = "prefill " + std::to_string(tokens);
  c.tokens = tokens;
  c.q = device_f32({tokens, kHeads, kHeadDim}, 11, 1.0f);
  c.new_kv = device_f32({tokens, kHeadDim}, 12, 0.5f, true);
  c.rings = device_f32({kRingCapacity, kHeadDim}, 16, 0.5f, true);
  c.compressed = device_f32({compressed_rows, kHeadDim}, 13, 0.5f, true);
  c.sink = device_f32({kHeads}, 14, 2.0f);
  std::vector<int32_t> indices;
  std::mt19937 rng(15);
  std::vector<int32_t> rows(compressed_rows);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t visible = t / kCompressRatio;
    const int64_t chosen = std::min(kSelected, visible);
    for (int64_t j = 0; j < visible; ++j) rows[j] = static_cast<int32_t>(j);
    std::shuffle(rows.begin(), rows.begin() + visible, rng);
    for (int64_t k = 0; k < kSelected; ++k) indices.push_back(k < chosen ? rows[k] : -1);
  }
  c.index = device_i32({tokens, kSelected}, indices);
  ops::AttentionRequest request;
  request.window_ring = c.rings.view();
  request.compressed_kv = c.compressed.view();
  request.selected = c.index.view();
  request.offset = 0;
  request.count = tokens;
  request.start = 0;
  c.requests.push_back(request);
  c.out = Tensor::empty(DType::kF32, {tokens, kHeads, kHeadDim}, rt::device_allocator());
  // Every window row and compressed row is read at least once; q and out once.
  c.bytes = static_cast<double>(tokens + compressed_rows) * kHeadDim * 4 +
            2.0 * static_cast<double>(tokens) * kHeads * kHeadDim * 4;
  return c;
}

// The kernel (head groups or per head), the path (batched, or the per-request loop: window
// rows gathered with copies, one single-matrix call per request), for head groups the split
// setting ("0": one-block kernel, "1": split-KV, nullptr: the op's choice) and whether they run
// on the tensor cores (false: the FMA kernels, DEEPINFER_ATTENTION_MMA=0).
void call(const AttentionCase& c, bool head_groups, bool batched = true,
          const char* split = nullptr, bool mma = true) {
  // Overrides only where the caller asks for a path, so the environment's settings apply to the
  // rest (as when these were environment variables set around the call).
  std::optional<rt::ScopedSwitch> per_head;
  std::optional<rt::ScopedSwitch> per_request;
  std::optional<rt::ScopedSetting> split_setting;
  std::optional<rt::ScopedSwitch> fma;
  if (!head_groups) per_head.emplace("DEEPINFER_ATTENTION_HEAD_GROUPS", false);
  if (!batched) per_request.emplace("DEEPINFER_ATTENTION_BATCHED", false);
  if (split != nullptr) split_setting.emplace("DEEPINFER_ATTENTION_SPLIT", std::stoi(split));
  if (!mma) fma.emplace("DEEPINFER_ATTENTION_MMA", false);
  ops::cuda::sink_attention_batch(c.q, c.new_kv, c.requests, kWindow, c.sink,
                                  1.0f / std::sqrt(static_cast<float>(kHeadDim)), c.out);
}

// The op's choice with batch invariance off; `exact`: the prefill kernel's
// DEEPINFER_ATTENTION_PREFILL_EXACT (-1: the default, one term); `chunks`:
// DEEPINFER_ATTENTION_PREFILL_CHUNKS (-1: the op's heuristic; 1: whole tokens); `decode`:
// DEEPINFER_ATTENTION_PREFILL_DECODE (-1: the default; 0: decode-sized calls keep the head-group
// kernels, the path before the split form; 1: the prefill kernel at any token count).
void call_invariance_off(const AttentionCase& c, int exact = -1, int chunks = -1, int decode = -1) {
  const ops::ScopedBatchInvariance invariance(false);
  std::optional<rt::ScopedSetting> exact_setting, chunk_setting, decode_setting;
  if (exact >= 0) exact_setting.emplace("DEEPINFER_ATTENTION_PREFILL_EXACT", exact);
  if (chunks >= 0) chunk_setting.emplace("DEEPINFER_ATTENTION_PREFILL_CHUNKS", chunks);
  if (decode >= 0) decode_setting.emplace("DEEPINFER_ATTENTION_PREFILL_DECODE", decode);
  call(c, true);
}

// Batch invariance off, DEEPINFER_ATTENTION_WGMMA `wgmma` (1: the wgmma kernel at any token
// count, 0: never) and DEEPINFER_ATTENTION_WGMMA_PREFETCH `prefetch`; `whole`: whole tokens
// (DEEPINFER_ATTENTION_PREFILL_CHUNKS=1) and the prefill kernel at any count
// (DEEPINFER_ATTENTION_PREFILL_DECODE=1), else the op's choice of form.
void call_prefill_kernels(const AttentionCase& c, int wgmma, bool whole, bool prefetch = false) {
  const ops::ScopedBatchInvariance invariance(false);
  const rt::ScopedSetting wgmma_setting("DEEPINFER_ATTENTION_WGMMA", wgmma);
  const rt::ScopedSwitch prefetch_setting("DEEPINFER_ATTENTION_WGMMA_PREFETCH", prefetch);
  std::optional<rt::ScopedSetting> chunk_setting, decode_setting;
  if (whole) {
    chunk_setting.emplace("DEEPINFER_ATTENTION_PREFILL_CHUNKS", 1);
    decode_setting.emplace("DEEPINFER_ATTENTION_PREFILL_DECODE", 1);
  }
  call(c, true);
}

// The keys the call's tokens attend (each counted once a token): decode 128 + 512 a token,
// prefill token t min(t + 1, 128) window rows and min(512, t / 4) compressed entries.
double attended_keys(const AttentionCase& c) {
  if (c.requests.size() > 1 || c.tokens < kPrefillTokens) {
    return static_cast<double>(c.tokens) * (kWindow + kSelected);
  }
  double keys = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    keys += static_cast<double>(std::min(t + 1, kWindow) + std::min(kSelected, t / kCompressRatio));
  }
  return keys;
}

// The wgmma kernel (whole tokens, without and with its L2 prefetch: "wgmma", "wgmma-pf") against
// the cluster kernel (whole tokens) and the op's choice without the wgmma kernel, in one run:
// decode b1 to b256 and prefill 8192; bf16 TFLOP/s of the products (QK^T and PV, 2 x 2 x 512 a head
// and key) and of HBM (the case's bytes over the time). Exit 2 past kOneTermDiffer from the "mma"
// column's output.
int wgmma_section(double read_gbps);

// The path before the split form, batch invariance off: below 256 tokens the head-group kernels,
// from 256 the whole-token prefill kernel.
void call_off_before(const AttentionCase& c) {
  call_invariance_off(c, -1, 1, 0);
}

// The split-form sweep: chunks a token forced (1: whole tokens), at any token count.
constexpr int kSweepChunks[] = {1, 2, 3, 4, 5, 7, 10, 20};
constexpr int kSweepCount = static_cast<int>(sizeof(kSweepChunks) / sizeof(kSweepChunks[0]));

// The one-term prefill kernel's bound against the CPU (attention_gpu_test's
// kPrefillOneTermTolerance, 2^-8 of the output's scale) plus the "mma" column's own 1e-5.
constexpr double kOneTermDiffer = 0x1p-8 + 1e-5;

// Worst |b - a| over max |a| of two outputs; infinite when either is not finite.
double outputs_differ(const Tensor& a_out, const Tensor& b_out) {
  double scale = 1e-30;
  double worst = 0;
  for (int64_t i = 0; i < a_out.numel(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(a_out.data<float>()[i])));
  }
  for (int64_t i = 0; i < a_out.numel(); ++i) {
    const double a = a_out.data<float>()[i];
    const double b = b_out.data<float>()[i];
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    worst = std::max(worst, std::abs(a - b) / scale);
  }
  return worst;
}

struct Row {
  std::string name;
  double old_ms = 0, new_ms = 0, split_ms = 0, per_request_ms = 0, bytes = 0, difference = 0;
  double mma_ms = 0, mma_split_ms = 0, mma_difference = 0;  // the tensor-core kernels
  double mma_f32_ms = 0;  // the op's choice with f32 KV rows (the three-term key path)
  double off_ms = 0, off_f32_ms = 0, off_difference = 0;  // batch invariance off
  double off_exact_ms = 0, off_exact_difference = 0;      // exact products
  double off_before_ms = 0, off_before_difference = 0;    // the path before the split form
  double sweep_ms[kSweepCount] = {};                      // the prefill kernel, chunks forced
  bool has_split = false;                                 // a split-KV timing (decode cases)
  bool split_equal = false;  // split-KV and one-block kernel: the same bits (FMA and MMA each)
  bool paths_equal = false;  // batched and per-request paths: the same bits
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return std::memcmp(a.data<float>(), b.data<float>(),
                     static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}

// The kernels' differences (per-head vs FMA head-group, FMA vs tensor-core head-group), whether
// each split-KV path gives its one-block kernel's bits, and whether the batched and per-request
// paths (both the op's default kernels) agree bit for bit.
void compare_outputs(const AttentionCase& c, Row& row) {
  call(c, false);
  const Tensor per_head = rt::to_host(c.out.view());
  call(c, true, true, "0", false);
  const Tensor head_group = rt::to_host(c.out.view());
  call(c, true, true, "0");
  const Tensor mma = rt::to_host(c.out.view());
  call(c, true, false);
  const Tensor per_request = rt::to_host(c.out.view());
  call_invariance_off(c);
  row.off_difference = outputs_differ(mma, rt::to_host(c.out.view()));
  call_invariance_off(c, 1);
  row.off_exact_difference = outputs_differ(mma, rt::to_host(c.out.view()));
  call_off_before(c);
  row.off_before_difference = outputs_differ(mma, rt::to_host(c.out.view()));
  row.difference = outputs_differ(per_head, head_group);
  row.mma_difference = outputs_differ(head_group, mma);
  row.paths_equal = same_bits(mma, per_request);
  row.split_equal = true;
  if (row.has_split) {
    call(c, true, true, "1", false);
    row.split_equal = same_bits(head_group, rt::to_host(c.out.view()));
    call(c, true, true, "1");
    row.split_equal = row.split_equal && same_bits(mma, rt::to_host(c.out.view()));
  }
  rt::synchronize();
}

int wgmma_section(double read_gbps) {
  std::printf(
      "\nbatch invariance off: the wgmma kernel (whole tokens) against the cluster kernel (whole "
      "tokens) and the op's choice without it (before: head-group kernels below 8 tokens, the "
      "cluster kernel's split form below 96, whole tokens from 96)\n");
  std::printf("%-14s %10s %10s %10s %10s %8s %8s %9s %9s %8s %8s %10s %10s\n", "case", "before",
              "cluster", "wgmma", "wgmma-pf", "vs bef.", "vs cl.", "TFLOP/s cl", "TFLOP/s wg",
              "HBM cl", "HBM wg", "differ cl", "differ wg");
  int status = 0;
  std::vector<int64_t> batches = {1, 8, 16, 32, 64, 128, 256, 0};
  // ATTENTION_BENCH_WGMMA_BATCH=N: decode batch N alone (0: the prefill case), e.g. under ncu.
  if (const char* one = std::getenv("ATTENTION_BENCH_WGMMA_BATCH");
      one != nullptr && *one != '\0') {
    batches = {std::stoll(one)};
  }
  for (const int64_t batch : batches) {
    AttentionCase c = batch > 0 ? decode_case(batch) : prefill_case();
    call(c, true, true, "0");
    const Tensor mma = rt::to_host(c.out.view());
    call_prefill_kernels(c, 0, true);
    const double cluster_differ = outputs_differ(mma, rt::to_host(c.out.view()));
    call_prefill_kernels(c, 1, true);
    const double wgmma_differ = outputs_differ(mma, rt::to_host(c.out.view()));
    call_prefill_kernels(c, 1, true, true);
    const double prefetch_differ = outputs_differ(mma, rt::to_host(c.out.view()));
    const double before_ms = time_ms([&] { call_prefill_kernels(c, 0, false); });
    const double cluster_ms = time_ms([&] { call_prefill_kernels(c, 0, true); });
    const double wgmma_ms = time_ms([&] { call_prefill_kernels(c, 1, true); });
    const double prefetch_ms = time_ms([&] { call_prefill_kernels(c, 1, true, true); });
    const double flops = 4.0 * kHeads * kHeadDim * attended_keys(c);
    std::printf(
        "%-14s %8.4fms %8.4fms %8.4fms %8.4fms %7.2fx %7.2fx %10.1f %10.1f %7.1f%% %7.1f%% %10.2g "
        "%10.2g\n",
        c.name.c_str(), before_ms, cluster_ms, wgmma_ms, prefetch_ms, before_ms / wgmma_ms,
        cluster_ms / wgmma_ms, flops / (cluster_ms * 1e9), flops / (wgmma_ms * 1e9),
        100.0 * c.bytes / (cluster_ms * 1e6) / read_gbps,
        100.0 * c.bytes / (wgmma_ms * 1e6) / read_gbps, cluster_differ, wgmma_differ);
    if (!(wgmma_differ <= kOneTermDiffer) || !(cluster_differ <= kOneTermDiffer) ||
        !(prefetch_differ <= kOneTermDiffer)) {
      status = 2;
    }
  }
  return status;
}

int run(int argc, char** argv) {
  rt::require_supported_device(0);
  std::string json_path = "attention_bench.json";
  if (argc > 1) {
    json_path = argv[1];
  } else if (const char* out = std::getenv("OUT")) {
    json_path = std::string(out) + "/attention_bench.json";
  }
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double read_gbps = measure_hbm_read_gbps(size_t{2} << 30);  // far past the L2
  std::printf("attention bench on %s (%d SMs): HBM read %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, read_gbps);
  // ATTENTION_BENCH_WGMMA=1: the wgmma section alone.
  if (const char* only_wgmma = std::getenv("ATTENTION_BENCH_WGMMA");
      only_wgmma != nullptr && std::string(only_wgmma) == "1") {
    return wgmma_section(read_gbps);
  }
  std::printf(
      "%-14s %10s %10s %10s %10s %10s %10s %10s %13s %13s %8s %10s %9s %9s %9s %10s %10s %12s %6s "
      "%11s %s\n",
      "case", "per-head", "head-grp", "split-KV", "mma", "mma-split", "mma-f32kv", "inv-off",
      "inv-off-exact", "inv-off-f32kv", "speedup", "MB", "GB/s", "of HBM", "differ", "mma-differ",
      "off-differ", "exact-differ", "split", "per-request", "bits");
  std::vector<Row> rows;
  std::vector<int64_t> batches = {1, 8, 16, 64, 128, 256};
  // ATTENTION_BENCH_ONLY=N: decode batch N alone, no prefill case (e.g. under a profiler).
  const char* only = std::getenv("ATTENTION_BENCH_ONLY");
  const bool only_decode = only != nullptr && *only != '\0';
  if (only_decode) batches = {std::stoll(only)};
  for (size_t i = 0; i < batches.size() + (only_decode ? 0 : 1); ++i) {
    AttentionCase c = i < batches.size() ? decode_case(batches[i]) : prefill_case();
    Row row;
    row.name = c.name;
    row.bytes = c.bytes;
    // The prefill's split scratch would pass the op's cap (it takes the one-block kernel).
    row.has_split = i < batches.size();
    compare_outputs(c, row);
    row.old_ms = time_ms([&] { call(c, false); });
    row.new_ms = time_ms([&] { call(c, true, true, "0", false); });
    if (row.has_split) row.split_ms = time_ms([&] { call(c, true, true, "1", false); });
    row.mma_ms = time_ms([&] { call(c, true, true, "0"); });
    if (row.has_split) row.mma_split_ms = time_ms([&] { call(c, true, true, "1"); });
    row.per_request_ms = time_ms([&] { call(c, true, false); });
    row.off_ms = time_ms([&] { call_invariance_off(c); });
    row.off_exact_ms = time_ms([&] { call_invariance_off(c, 1); });
    row.off_before_ms = time_ms([&] { call_off_before(c); });
    for (int k = 0; k < kSweepCount; ++k) {
      // The prefill case's split scratch would pass the op's cap: whole tokens only.
      if (!row.has_split && kSweepChunks[k] > 1) continue;
      row.sweep_ms[k] = time_ms([&] { call_invariance_off(c, -1, kSweepChunks[k], 1); });
    }
    // Last: the KV rows as plain f32 values (not bf16-exact; the FMA kernels' time does not
    // depend on them).
    fill(c.new_kv, 106, 0.5f, false);
    fill(c.rings, 102, 0.5f, false);
    fill(c.compressed, 103, 0.5f, false);
    row.mma_f32_ms = time_ms([&] { call(c, true); });
    row.off_f32_ms = time_ms([&] { call_invariance_off(c); });
    const double fma_best_ms = row.has_split ? std::min(row.new_ms, row.split_ms) : row.new_ms;
    const double best_ms = row.has_split ? std::min(row.mma_ms, row.mma_split_ms) : row.mma_ms;
    const double gbps = c.bytes / (best_ms * 1e6);
    char split_column[32] = "         -";
    char mma_split_column[32] = "         -";
    if (row.has_split) {
      std::snprintf(split_column, sizeof(split_column), "%8.3fms", row.split_ms);
      std::snprintf(mma_split_column, sizeof(mma_split_column), "%8.3fms", row.mma_split_ms);
    }
    std::printf(
        "%-14s %8.3fms %8.3fms %10s %8.3fms %10s %8.3fms %8.3fms %11.3fms %11.3fms %7.2fx %10.1f "
        "%9.0f %8.1f%% %9.2g %10.2g %10.2g %12.2g %6s %9.3fms %s\n",
        row.name.c_str(), row.old_ms, row.new_ms, split_column, row.mma_ms, mma_split_column,
        row.mma_f32_ms, row.off_ms, row.off_exact_ms, row.off_f32_ms, fma_best_ms / best_ms,
        c.bytes / 1e6, gbps, 100.0 * gbps / read_gbps, row.difference, row.mma_difference,
        row.off_difference, row.off_exact_difference,
        !row.has_split ? "-" : (row.split_equal ? "same" : "DIFF"), row.per_request_ms,
        row.paths_equal ? "same" : "DIFFERENT");
    rows.push_back(row);
  }
  // Batch invariance off, the op's choice now ("new": the prefill kernel's split form from
  // DEEPINFER_ATTENTION_PREFILL_DECODE tokens below 96, whole tokens from 96) against the path
  // before ("before": the head-group kernels below 256 tokens, the whole-token prefill kernel from
  // 256), GB/s and of HBM each.
  std::printf("\nbatch invariance off: the op's choice against the path before\n");
  std::printf("%-14s %10s %10s %10s %10s %9s %9s %8s %10s %10s\n", "case", "MB", "before", "new",
              "GB/s bef.", "of HBM", "GB/s new", "of HBM", "speedup", "new-differ");
  for (const Row& r : rows) {
    const double before_gbps = r.bytes / (r.off_before_ms * 1e6);
    const double new_gbps = r.bytes / (r.off_ms * 1e6);
    std::printf("%-14s %10.1f %8.4fms %8.4fms %10.0f %8.1f%% %9.0f %7.1f%% %9.2fx %10.2g\n",
                r.name.c_str(), r.bytes / 1e6, r.off_before_ms, r.off_ms, before_gbps,
                100.0 * before_gbps / read_gbps, new_gbps, 100.0 * new_gbps / read_gbps,
                r.off_before_ms / r.off_ms, r.off_difference);
  }
  std::printf("\nprefill kernel at any token count, chunks a token forced (ms)\n");
  std::printf("%-14s", "case");
  for (const int chunks : kSweepChunks) std::printf(" %9d", chunks);
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf("%-14s", r.name.c_str());
    for (int k = 0; k < kSweepCount; ++k) {
      if (r.sweep_ms[k] == 0) {
        std::printf(" %9s", "-");
      } else {
        std::printf(" %9.4f", r.sweep_ms[k]);
      }
    }
    std::printf("\n");
  }
  if (FILE* f = std::fopen(json_path.c_str(), "w")) {
    std::fprintf(f, "{\"gpu\": \"%s\", \"read_gbps\": %.1f, \"cases\": [", prop.name, read_gbps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "%s{\"case\": \"%s\", \"per_head_ms\": %.5f, \"head_group_ms\": %.5f, "
                   "\"split_kv_ms\": %s, \"mma_ms\": %.5f, \"mma_split_kv_ms\": %s, "
                   "\"mma_f32_kv_ms\": %.5f, \"invariance_off_ms\": %.5f, "
                   "\"invariance_off_f32_kv_ms\": %.5f, \"invariance_off_difference\": %.3g, "
                   "\"invariance_off_exact_ms\": %.5f, "
                   "\"invariance_off_exact_difference\": %.3g, "
                   "\"split_bit_equal\": %s, "
                   "\"per_request_path_ms\": %.5f, \"bytes\": %.0f, \"kernel_difference\": %.3g, "
                   "\"mma_difference\": %.3g, \"paths_bit_equal\": %s, "
                   "\"invariance_off_before_ms\": %.5f, \"invariance_off_before_difference\": "
                   "%.3g, \"sweep_chunks\": [",
                   i == 0 ? "" : ", ", r.name.c_str(), r.old_ms, r.new_ms,
                   r.has_split ? std::to_string(r.split_ms).c_str() : "null", r.mma_ms,
                   r.has_split ? std::to_string(r.mma_split_ms).c_str() : "null", r.mma_f32_ms,
                   r.off_ms, r.off_f32_ms, r.off_difference, r.off_exact_ms, r.off_exact_difference,
                   r.has_split ? (r.split_equal ? "true" : "false") : "null", r.per_request_ms,
                   r.bytes, r.difference, r.mma_difference, r.paths_equal ? "true" : "false",
                   r.off_before_ms, r.off_before_difference);
      for (int k = 0; k < kSweepCount; ++k) {
        std::fprintf(f, "%s{\"chunks\": %d, \"ms\": %.5f}", k == 0 ? "" : ", ", kSweepChunks[k],
                     r.sweep_ms[k]);
      }
      std::fprintf(f, "]}");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (const int status = wgmma_section(read_gbps); status != 0) {
    std::fprintf(stderr, "cuda_attention_bench: the whole-token prefill kernels differ\n");
    return status;
  }
  // The kernels must agree within the op's tolerance against the reference (1e-5 each way; the
  // one-term prefill kernel kOneTermDiffer).
  for (const Row& r : rows) {
    if (!(r.difference <= 2e-5) || !(r.mma_difference <= 2e-5) ||
        !(r.off_difference <= kOneTermDiffer) || !(r.off_exact_difference <= 2e-5) ||
        !(r.off_before_difference <= kOneTermDiffer)) {
      std::fprintf(stderr,
                   "cuda_attention_bench: %s: kernels differ by %.3g (FMA vs MMA %.3g, invariance "
                   "off %.3g, exact %.3g)\n",
                   r.name.c_str(), r.difference, r.mma_difference, r.off_difference,
                   r.off_exact_difference);
      return 2;
    }
    if (!r.paths_equal) {
      std::fprintf(stderr, "cuda_attention_bench: %s: batched and per-request paths differ\n",
                   r.name.c_str());
      return 3;
    }
    if (!r.split_equal) {
      std::fprintf(stderr, "cuda_attention_bench: %s: split-KV and one-block bits differ\n",
                   r.name.c_str());
      return 4;
    }
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer::bench

int main(int argc, char** argv) {
  try {
    return deepinfer::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n", e.what());
    return 1;
  }
}
