#include "model/deepseek_v41/random_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <string_view>

#include "core/dtype_convert.h"
#include "core/error.h"

namespace deepinfer::deepseek_v41 {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_name(std::string_view name) {  // FNV-1a: stable across platforms
  uint64_t h = 0xCBF29CE484222325ull;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
  return h;
}

// Standard normal for element `index` of the tensor keyed `key` (Box-Muller on two uniforms).
float normal_at(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

std::vector<float> logical_values(const WeightSpec& spec, double std_dev, uint64_t seed) {
  int64_t count = 1;
  for (int64_t extent : spec.logical_shape) count *= extent;
  std::vector<float> values(static_cast<size_t>(count));
  switch (spec.init) {
    case WeightInit::kOnes:
      std::fill(values.begin(), values.end(), 1.0f);
      break;
    case WeightInit::kZeros:
      std::fill(values.begin(), values.end(), 0.0f);
      break;
    case WeightInit::kNormal: {
      const uint64_t key = splitmix64(seed) ^ hash_name(spec.name);
      for (int64_t i = 0; i < count; ++i)
        values[i] = static_cast<float>(std_dev) * normal_at(key, i);
      break;
    }
  }
  return values;
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<std::byte> encode_plain(const std::vector<float>& values, DType dtype) {
  std::vector<std::byte> out(dtype_storage_bytes(dtype, static_cast<int64_t>(values.size())));
  convert_from_f32(values.data(), dtype, out.data(), static_cast<int64_t>(values.size()));
  return out;
}

// Quantizes a [rows, cols] matrix to e4m3 with one ue8m0 scale per (block_rows x block_cols)
// tile, edge tiles partial.
void quantize_fp8_blocks(const std::vector<float>& w, int64_t rows, int64_t cols,
                         int64_t block_rows, int64_t block_cols, std::vector<uint8_t>& codes,
                         std::vector<uint8_t>& scales) {
  const int64_t tile_rows = (rows + block_rows - 1) / block_rows;
  const int64_t tile_cols = (cols + block_cols - 1) / block_cols;
  codes.assign(static_cast<size_t>(rows * cols), 0);
  scales.assign(static_cast<size_t>(tile_rows * tile_cols), 0);
  for (int64_t tr = 0; tr < tile_rows; ++tr) {
    for (int64_t tc = 0; tc < tile_cols; ++tc) {
      const int64_t r_end = std::min(rows, (tr + 1) * block_rows);
      const int64_t c_end = std::min(cols, (tc + 1) * block_cols);
      float amax = 0.0f;
      for (int64_t r = tr * block_rows; r < r_end; ++r) {
        for (int64_t c = tc * block_cols; c < c_end; ++c)
          amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const uint8_t scale_code = e8m0_pow2_ceil(std::max(amax, 1e-4f) * kE4M3MaxInverse);
      const float scale = e8m0_to_float(scale_code);
      scales[tr * tile_cols + tc] = scale_code;
      for (int64_t r = tr * block_rows; r < r_end; ++r) {
        for (int64_t c = tc * block_cols; c < c_end; ++c)
          codes[r * cols + c] = float_to_e4m3_saturate(w[r * cols + c] / scale);
      }
    }
  }
}

// Packed e2m1 [rows, cols/2] with one ue8m0 scale per 32 elements of a row.
void quantize_fp4_rows(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t group,
                       std::vector<uint8_t>& packed, std::vector<uint8_t>& scales) {
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  scales.assign(static_cast<size_t>(rows * (cols / group)), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / group; ++g) {
      const float* x = &w[r * cols + g * group];
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
      const uint8_t scale_code =
          e8m0_pow2_ceil(std::max(amax, 6.0f * 0x1.0p-126f) * kE2M1MaxInverse);
      const float scale = e8m0_to_float(scale_code);
      scales[r * (cols / group) + g] = scale_code;
      for (int64_t i = 0; i < group; ++i)
        codes[r * cols + g * group + i] = float_to_e2m1(x[i] / scale);
    }
  }
  packed.assign(codes.size() / 2, 0);
  pack_fp4(codes.data(), packed.data(), static_cast<int64_t>(codes.size()));
}

}  // namespace

std::vector<RandomTensor> make_random_weights(const std::vector<WeightSpec>& table, double std_dev,
                                              uint64_t seed) {
  std::map<std::string_view, size_t> position;
  for (size_t i = 0; i < table.size(); ++i) position.emplace(table[i].name, i);
  std::vector<RandomTensor> out(table.size());
  for (size_t i = 0; i < table.size(); ++i) out[i].spec = &table[i];

  for (size_t i = 0; i < table.size(); ++i) {
    const WeightSpec& spec = table[i];
    if (!spec.scale_of.empty()) continue;  // written with its weight
    const std::vector<float> values = logical_values(spec, std_dev, seed);
    auto scale_slot = [&]() -> RandomTensor& {
      auto it = position.find(spec.scale_name);
      DI_CHECK(it != position.end(), "no scale tensor ", spec.scale_name);
      return out[it->second];
    };
    // ue8m0 codes as stored; an f32 scale tensor (no scale_fmt) holds their values.
    auto scale_bytes = [&](const std::vector<uint8_t>& scale_codes) {
      if (scale_slot().spec->dtype != DType::kF32) return as_bytes(scale_codes);
      std::vector<float> decoded(scale_codes.size());
      for (size_t k = 0; k < scale_codes.size(); ++k) decoded[k] = e8m0_to_float(scale_codes[k]);
      return as_bytes(decoded);
    };
    const int64_t rows = spec.logical_shape.empty() ? 0 : spec.logical_shape[0];
    const int64_t cols = spec.logical_shape.size() > 1 ? spec.logical_shape[1] : 0;
    std::vector<uint8_t> codes;
    std::vector<uint8_t> scales;
    switch (spec.role) {
      case WeightRole::kFp8Block:
        quantize_fp8_blocks(values, rows, cols, spec.block_rows, spec.block_cols, codes, scales);
        out[i].bytes = as_bytes(codes);
        scale_slot().bytes = scale_bytes(scales);
        break;
      case WeightRole::kFp4Packed:
        quantize_fp4_rows(values, rows, cols, spec.block_cols, codes, scales);
        out[i].bytes = as_bytes(codes);
        scale_slot().bytes = as_bytes(scales);
        break;
      case WeightRole::kEngramTable:
        if (spec.dtype == DType::kF8E4M3) {
          quantize_fp8_blocks(values, rows, cols, 1, spec.block_cols, codes, scales);
          out[i].bytes = as_bytes(codes);
          scale_slot().bytes = as_bytes(scales);
        } else {
          // Dense layout: the table is plain bf16 and its scale parameter is unused (ones).
          out[i].bytes = encode_plain(values, spec.dtype);
          RandomTensor& scale = scale_slot();
          scale.bytes = encode_plain(
              std::vector<float>(static_cast<size_t>(scale.spec->element_count()), 1.0f),
              scale.spec->dtype);
        }
        break;
      default:
        out[i].bytes = encode_plain(values, spec.dtype);
        break;
    }
  }
  for (const RandomTensor& tensor : out) {
    DI_CHECK(tensor.bytes.size() ==
                 dtype_storage_bytes(tensor.spec->dtype, tensor.spec->element_count()),
             "wrong byte count for ", tensor.spec->name);
  }
  return out;
}

}  // namespace deepinfer::deepseek_v41
