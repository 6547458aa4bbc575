// The model's parameters as views in the layout the forward reads, whatever the checkpoint
// layout was: linear weights keep their storage format (f32 / bf16 / fp8 block-scaled / packed
// fp4) and are dequantized row by row inside the GEMM; the few tensors the ops need in f32
// (hyper-connection parameters, sinks, gate biases, the engram's q*k product, the grouped wo_a
// unless the loader keeps it as stored: loader.h) are converted once at load and owned here.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::deepseek_v41 {

struct ExpertParameters {
  ops::LinearWeight w1;  // gate  [I, D]
  ops::LinearWeight w2;  // down  [D, I]
  ops::LinearWeight w3;  // up    [I, D]
};

struct AttentionParameters {
  ops::LinearWeight wq_a;
  TensorView q_norm;
  ops::LinearWeight wq_b;
  ops::LinearWeight wkv;
  TensorView kv_norm;
  // [o_groups * o_lora_rank, H * Dh / o_groups]: dense bf16 / f32, or fp8 block-scaled as
  // released (DEEPINFER_WO_A_FP8=1, loader.h); run without activation quantization.
  ops::LinearWeight wo_a;
  ops::LinearWeight wo_b;
  TensorView attn_sink;  // f32 [H]
  // KV sources only.
  ops::LinearWeight compressor_wkv;
  ops::LinearWeight compressor_wgate;  // ratio > 1 only
  TensorView compressor_norm;
  // Index sources only (wk / k_norm on KV sources).
  ops::LinearWeight indexer_wq_b;
  ops::LinearWeight indexer_weights_proj;
  ops::LinearWeight indexer_wk;
  TensorView indexer_k_norm;
};

struct EngramParameters {
  TensorView table;        // [rows, engram_head_dim]: e4m3 (+ scale) or f32 / bf16
  TensorView table_scale;  // ue8m0 [rows, engram_head_dim / 32], or empty
  ops::LinearWeight wkv;   // [D * (hc + 1), hash_columns * engram_head_dim]
  TensorView qk;           // f32 [hc, D] = q_weight * k_weight
};

struct LayerParameters {
  TensorView attn_norm;
  TensorView ffn_norm;
  TensorView hc_attn_fn, hc_attn_base, hc_attn_scale;  // f32
  TensorView hc_ffn_fn, hc_ffn_base, hc_ffn_scale;     // f32
  AttentionParameters attn;
  TensorView gate_weight;  // [E, D] f32 / bf16
  TensorView gate_bias;    // f32 [E]
  std::vector<ExpertParameters> experts;
  ExpertParameters shared_expert;
  std::optional<EngramParameters> engram;
};

struct ModelParameters {
  TensorView embed;  // [V, D]
  std::vector<LayerParameters> layers;
  TensorView norm;
  ops::LinearWeight head;  // [V, D]
  // Storage for everything the views above point into that the checkpoint does not own.
  std::vector<Tensor> owned;

  // Copies `view` into an owned f32 tensor (converting bf16 / f32) and returns a view of it.
  TensorView own_f32(const TensorView& view);
  // Dequantizes a linear weight into an owned dense tensor: bf16 when every value is exact in
  // bf16 (always for FP8 weights), else f32.
  ops::LinearWeight own_dense(const ops::LinearWeight& weight);
};

// Calls fn on every tensor view the parameters hold (empty ones included).
void for_each_view(ModelParameters& parameters, const std::function<void(TensorView&)>& fn);

// Calls fn on every linear weight but the routed experts' (attention, shared expert, engram,
// head): the dense GEMMs' weights.
void for_each_dense_linear(ModelParameters& parameters,
                           const std::function<void(ops::LinearWeight&)>& fn);

// DEEPINFER_BF16_WEIGHT_COPIES=1 (default 0; any other value is an error): the GPU model keeps an
// exact bf16 copy of every dense fp8 weight (add_bf16_copies) while batch invariance is off.
// Memory for speed: the batch-variant GEMMs from DEEPINFER_CUBLASLT_MIN_ROWS rows on multiply bf16
// operands and otherwise dequantize each fp8 weight on every call (docs/BENCHMARKS.md measures
// both); the copies take twice the dense fp8 weights' bytes again.
bool bf16_copies_requested();

// Gives every dense fp8 linear weight a bf16_copy on `allocator`'s device (owned by
// `parameters`, made by ops::dequantize_weight) and returns the bytes they take.
size_t add_bf16_copies(ModelParameters& parameters, Allocator& allocator);

// A copy of `source` on `allocator`'s device (ops::allocator_for(Device::cuda(0)) for the
// first GPU): every tensor in its storage format, one copy per distinct tensor (views that
// name the same tensor share the copy). The result owns its memory; the copy has completed
// when this returns.
std::unique_ptr<ModelParameters> copy_parameters(const ModelParameters& source,
                                                 Allocator& allocator);

}  // namespace deepinfer::deepseek_v41
