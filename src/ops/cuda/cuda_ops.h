// The CUDA implementation of the op layer (ops/ops.h): the same functions and semantics as
// ops/cpu, over views in device memory. Every op is asynchronous on cuda::current_stream();
// host std::span metadata (positions, ids) is copied to the device inside the op. Index
// problems that only the data reveals (a window range or engram id out of bounds) are reported
// by the next cuda::synchronize().
#pragma once

#include <span>

#include "ops/ops.h"

namespace deepinfer::ops::cuda {

void linear(const TensorView& x, const LinearWeight& weight, const TensorView& out,
            ActivationQuant activation_quant = ActivationQuant::kNone);
void dequantize_weight(const LinearWeight& weight, const TensorView& out);

void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out);
void rmsnorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out);
void rope(const TensorView& x, std::span<const int32_t> positions, const RopeTable& table,
          bool inverse);
void softmax_rows(const TensorView& x);
void fake_quant_fp8(const TensorView& x, int block = 32);
void fake_quant_fp4(const TensorView& x, int block, Fp4ScaleFormat scale_format);

void sink_attention(const TensorView& q, const TensorView& window_kv,
                    const TensorView& window_range, const TensorView& compressed_kv,
                    const TensorView& compressed_idx, const TensorView& sink, float scale,
                    const TensorView& out);

void compress_pool(const TensorView& kv, const TensorView& gate, int ratio, const TensorView& out);
void indexer_scores(const TensorView& q, const TensorView& keys, const TensorView& weights,
                    const TensorView& visible, float scale, const TensorView& out);
void candidate_blocks(const TensorView& scores, const TensorView& visible, int topk_blocks,
                      int block_size, const TensorView& mask_out);
void mask_scores(const TensorView& scores, const TensorView& mask);
void topk_indices(const TensorView& scores, int k, const TensorView& idx_out);

void hc_mixes(const TensorView& x, const TensorView& fn, const TensorView& scale,
              const TensorView& base, const HcParams& params, const TensorView& pre,
              const TensorView& post, const TensorView& comb);
void hc_collapse(const TensorView& x, const TensorView& pre, const TensorView& out);
void hc_expand(const TensorView& y, const TensorView& residual, const TensorView& post,
               const TensorView& comb, const TensorView& out);

void route(const TensorView& x, const TensorView& gate, const TensorView& bias,
           const RouterParams& params, const TensorView& weights_out,
           const TensorView& experts_out);
void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& row_weight,
            const TensorView& out);

void engram_gather(const TensorView& table, const TensorView& scale, const TensorView& ids,
                   const TensorView& out);
void engram_mix(const TensorView& x, const TensorView& key, const TensorView& value,
                const TensorView& qk, float eps, const TensorView& out);

}  // namespace deepinfer::ops::cuda
