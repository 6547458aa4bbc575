// The tensor table of a DeepSeek-V4.1 text checkpoint: for a config, every tensor the layout
// holds (name, shape, dtype, role, quantization block), and the check of a checkpoint's
// tensors against it. Two layouts:
//  - kReleased: DeepSeek's checkpoint-native names, FP8 e4m3 dense weights with ue8m0 32x32
//    block scales (`.scale` siblings), FP4 e2m1 routed experts packed two per byte in I8 with
//    ue8m0 1x32 scales, FP8 engram tables with ue8m0 1x32 row scales, BF16/F32 elsewhere
//    (/work/shared/notes/replay-parallel-checkpoint.md §C.3/C.4; DeepSeek inference/model.py).
//  - kHfDense: what HF transformers' save_pretrained writes for DeepseekV41ForCausalLM in bf16:
//    `model.` / `lm_head.` names (§C.5), every quantized weight dequantized, no `.scale`
//    siblings except the engram table's (an HF parameter), F32 only for
//    _keep_in_fp32_modules_strict.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer::deepseek_v41 {

enum class WeightLayout : uint8_t { kReleased, kHfDense };
std::string_view weight_layout_name(WeightLayout layout);
// "released" or "hf"; throws Error otherwise.
WeightLayout parse_weight_layout(std::string_view name);

// How a tensor's bytes are to be read.
enum class WeightRole : uint8_t {
  kPlain,          // values in `dtype` (bf16 / f32), used as they are
  kFp8Block,       // e4m3 values; `scale_name` holds ue8m0 scales of `block` (32x32) tiles
  kFp8BlockScale,  // [ceil(out/32), ceil(in/32)] ue8m0 scales of `scale_of`
  kFp4Packed,      // e2m1 pairs in I8 [out, in/2], even element in the low nibble
  kFp4Scale,       // [out, in/32] ue8m0 scales of `scale_of`
  kEngramTable,    // e4m3 rows (released) or bf16 rows (HF), one row per hash bucket
  kEngramScale,    // [rows, dim/32] ue8m0 (released) or bf16 (HF, unused by the math)
};
std::string_view weight_role_name(WeightRole role);

// How make-checkpoint initialises a tensor (before quantization).
enum class WeightInit : uint8_t { kNormal, kOnes, kZeros };

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;  // stored shape (packed fp4: [out, in/2])
  DType dtype = DType::kBF16;  // stored dtype
  // Stored dtypes that are also accepted (sources disagree on a few small tensors, see §D.6).
  std::vector<DType> alternative_dtypes;
  WeightRole role = WeightRole::kPlain;
  std::vector<int64_t> logical_shape;  // the math's [out, in] (differs from `shape` for fp4)
  int64_t block_rows = 0;              // quantization block (0: not quantized)
  int64_t block_cols = 0;
  std::string scale_name;  // weight -> its scale tensor ("" when none)
  std::string scale_of;    // scale -> the weight it scales ("" when not a scale)
  int64_t layer = -1;      // backbone layer, -1 for top-level tensors
  WeightInit init = WeightInit::kNormal;

  bool accepts(DType stored) const;
  int64_t element_count() const;
};

// Every tensor of the text model in `layout`, in a stable order (top-level, then by layer).
// Throws Error when the config cannot be laid out (e.g. a dimension the fp4 packing needs
// to be even, or a quantization block that does not divide).
std::vector<WeightSpec> build_weight_table(const DeepseekV41TextConfig& config,
                                           WeightLayout layout);

// Tensors that ship with the checkpoint but are not part of the text model: DSpark draft
// layers (mtp.*), the vision tower (vision.*), the aligner (aligner.*) and the image
// delimiter embeddings (HF's _keys_to_ignore_on_load_unexpected).
bool is_ignored_non_text_tensor(std::string_view name);

// One tensor as a checkpoint declares it (safetensors header: name, dtype, shape).
struct CheckpointTensorInfo {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
};

// What is wrong with a checkpoint, all of it at once.
struct WeightTableMismatch {
  std::vector<std::string> missing;      // in the table, not in the checkpoint
  std::vector<std::string> unexpected;   // in the checkpoint, not in the table nor ignored
  std::vector<std::string> misshaped;    // "name: expected [..], got [..]"
  std::vector<std::string> wrong_dtype;  // "name: expected X, got Y"
  size_t ignored = 0;                    // non-text tensors skipped

  bool ok() const {
    return missing.empty() && unexpected.empty() && misshaped.empty() && wrong_dtype.empty();
  }
  // One message naming every problem (at most `max_per_kind` names per kind, then a count).
  std::string describe(size_t max_per_kind = 20) const;
};

WeightTableMismatch compare_with_table(const std::vector<WeightSpec>& table,
                                       const std::vector<CheckpointTensorInfo>& tensors);
// Throws Error("<where>: checkpoint does not match the DeepSeek-V4.1 <layout> layout: ...").
void validate_checkpoint_tensors(const std::vector<WeightSpec>& table,
                                 const std::vector<CheckpointTensorInfo>& tensors,
                                 WeightLayout layout, std::string_view where);

// Guesses the layout from the names: `model.layers.` / `lm_head.` means kHfDense.
std::optional<WeightLayout> detect_weight_layout(const std::vector<CheckpointTensorInfo>& tensors);

}  // namespace deepinfer::deepseek_v41
