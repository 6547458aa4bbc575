#include "core/dtype_convert.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace deepinfer {
namespace {

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QuietNaN = 0x7FC00000u;

uint32_t bits_of(float value) {
  return std::bit_cast<uint32_t>(value);
}
float float_of(uint32_t bits) {
  return std::bit_cast<float>(bits);
}

// A narrow binary float format with subnormals; its codes order like magnitudes.
struct NarrowFormat {
  int mantissa_bits;
  int exponent_bias;
  uint32_t max_finite_code;  // magnitude code of the largest finite value
};
constexpr NarrowFormat kE4M3{3, 7, 0x7E};
constexpr NarrowFormat kE5M2{2, 15, 0x7B};
constexpr NarrowFormat kF16{10, 15, 0x7BFF};
constexpr NarrowFormat kE2M1{1, 1, 0x7};

struct Rounded {
  uint32_t code;  // magnitude code (no sign)
  bool overflow;  // the rounded magnitude exceeds the largest finite value
};

// Rounds the finite, non-negative `magnitude` to nearest-even in `format`, as if the exponent
// range were unbounded above. Works on the integer significand, so there is no double rounding.
Rounded round_magnitude(float magnitude, const NarrowFormat& format) {
  const uint32_t bits = bits_of(magnitude);
  if (bits == 0) return {0, false};
  const uint32_t biased_exponent = bits >> 23;
  const uint32_t fraction = bits & 0x7FFFFFu;
  // magnitude = significand * 2^exponent exactly.
  const uint64_t significand = biased_exponent != 0 ? (fraction | 0x800000u) : fraction;
  const int exponent = (biased_exponent != 0 ? static_cast<int>(biased_exponent) : 1) - 150;
  const int floor_log2 = exponent + (63 - std::countl_zero(significand));
  const int min_exponent = 1 - format.exponent_bias;
  const int mantissa_bits = format.mantissa_bits;
  // The weight of the last mantissa bit of the result.
  int quantum_exponent = (floor_log2 > min_exponent ? floor_log2 : min_exponent) - mantissa_bits;
  const int shift = quantum_exponent - exponent;
  DI_CHECK(shift >= 0, "narrow formats keep fewer mantissa bits than f32");
  if (shift > 40) return {0, false};  // below half the smallest subnormal of every format
  uint64_t rounded = significand >> shift;
  if (shift > 0) {
    const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (remainder > half || (remainder == half && (rounded & 1) != 0)) ++rounded;
  }
  if (rounded == (uint64_t{1} << (mantissa_bits + 1))) {  // carried into the next binade
    rounded >>= 1;
    ++quantum_exponent;
  }
  uint64_t code = rounded;  // subnormal (or zero): exponent field 0
  if (rounded >= (uint64_t{1} << mantissa_bits)) {
    const int64_t exponent_field = quantum_exponent + mantissa_bits + format.exponent_bias;
    code = (static_cast<uint64_t>(exponent_field) << mantissa_bits) |
           (rounded & ((uint64_t{1} << mantissa_bits) - 1));
  }
  if (code > format.max_finite_code) return {format.max_finite_code, true};
  return {static_cast<uint32_t>(code), false};
}

float e2m1_magnitude(uint32_t code3) {
  const uint32_t exponent_field = (code3 >> 1) & 3;
  const uint32_t mantissa = code3 & 1;
  if (exponent_field == 0) return 0.5f * static_cast<float>(mantissa);
  return (1.0f + 0.5f * static_cast<float>(mantissa)) *
         static_cast<float>(1u << (exponent_field - 1));
}

struct DecodeTables {
  std::array<float, 256> e4m3;
  std::array<float, 256> e5m2;
  std::array<float, 256> e8m0;
  std::array<float, 16> e2m1;
};

const DecodeTables& decode_tables() {
  static const DecodeTables tables = [] {
    DecodeTables t{};
    for (uint32_t code = 0; code < 256; ++code) {
      t.e4m3[code] = e4m3_to_float(static_cast<uint8_t>(code));
      t.e5m2[code] = e5m2_to_float(static_cast<uint8_t>(code));
      t.e8m0[code] = e8m0_to_float(static_cast<uint8_t>(code));
    }
    for (uint32_t code = 0; code < 16; ++code)
      t.e2m1[code] = e2m1_to_float(static_cast<uint8_t>(code));
    return t;
  }();
  return tables;
}

}  // namespace

// ---- bf16 --------------------------------------------------------------------------------

float bf16_to_float(uint16_t bits) {
  return float_of(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bf16(float value) {
  const uint32_t bits = bits_of(value);
  if ((bits & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even; a carry out of
  // the mantissa bumps the exponent, which turns values past the bf16 max into inf.
  const uint32_t lowest_kept_bit = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7FFFu + lowest_kept_bit) >> 16);
}

// ---- f16 ---------------------------------------------------------------------------------

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent_field = (bits >> 10) & 0x1F;
  const uint32_t mantissa = bits & 0x3FF;
  if (exponent_field == 0x1F) return float_of(sign | kF32Inf | (mantissa << 13));
  if (exponent_field == 0) {
    // Subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return float_of(sign | bits_of(magnitude));
  }
  return float_of(sign | ((exponent_field + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_f16(float value) {
  const uint32_t bits = bits_of(value);
  const uint16_t sign = static_cast<uint16_t>((bits & kF32SignMask) >> 16);
  const uint32_t magnitude_bits = bits & kF32AbsMask;
  if (magnitude_bits > kF32Inf) {
    return static_cast<uint16_t>(sign | 0x7C00 | 0x0200 | ((magnitude_bits >> 13) & 0x3FF));
  }
  if (magnitude_bits == kF32Inf) return static_cast<uint16_t>(sign | 0x7C00);
  const Rounded rounded = round_magnitude(float_of(magnitude_bits), kF16);
  if (rounded.overflow) return static_cast<uint16_t>(sign | 0x7C00);
  return static_cast<uint16_t>(sign | rounded.code);
}

// ---- fp8 e4m3fn --------------------------------------------------------------------------

float e4m3_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  if ((code & 0x7F) == 0x7F) return float_of(sign | kF32QuietNaN);
  const uint32_t exponent_field = (code >> 3) & 0xF;
  const uint32_t mantissa = code & 0x7;
  if (exponent_field == 0) {
    return float_of(sign | bits_of(static_cast<float>(mantissa) * 0x1p-9f));
  }
  return float_of(sign | ((exponent_field + 120) << 23) | (mantissa << 20));
}

uint8_t float_to_e4m3_saturate(float value) {
  const uint32_t bits = bits_of(value);
  const uint8_t sign = static_cast<uint8_t>(bits >> 24) & 0x80;
  const uint32_t magnitude_bits = bits & kF32AbsMask;
  if (magnitude_bits > kF32Inf) return sign | 0x7F;
  if (magnitude_bits == kF32Inf) return sign | 0x7E;
  return sign | static_cast<uint8_t>(round_magnitude(float_of(magnitude_bits), kE4M3).code);
}

uint8_t float_to_e4m3_cast(float value) {
  const uint32_t bits = bits_of(value);
  const uint8_t sign = static_cast<uint8_t>(bits >> 24) & 0x80;
  const uint32_t magnitude_bits = bits & kF32AbsMask;
  if (magnitude_bits >= kF32Inf) return sign | 0x7F;
  const Rounded rounded = round_magnitude(float_of(magnitude_bits), kE4M3);
  if (rounded.overflow) return sign | 0x7F;
  return sign | static_cast<uint8_t>(rounded.code);
}

// ---- fp8 e5m2: the top byte of an f16 ----------------------------------------------------

float e5m2_to_float(uint8_t code) {
  return f16_to_float(static_cast<uint16_t>(code << 8));
}

uint8_t float_to_e5m2(float value) {
  const uint32_t bits = bits_of(value);
  const uint8_t sign = static_cast<uint8_t>(bits >> 24) & 0x80;
  const uint32_t magnitude_bits = bits & kF32AbsMask;
  if (magnitude_bits > kF32Inf) return sign | 0x7F;
  if (magnitude_bits == kF32Inf) return sign | 0x7C;
  const Rounded rounded = round_magnitude(float_of(magnitude_bits), kE5M2);
  if (rounded.overflow) return sign | 0x7C;
  return sign | static_cast<uint8_t>(rounded.code);
}

uint8_t float_to_e5m2_saturate(float value) {
  const uint32_t bits = bits_of(value);
  const uint8_t sign = static_cast<uint8_t>(bits >> 24) & 0x80;
  const uint32_t magnitude_bits = bits & kF32AbsMask;
  if (magnitude_bits > kF32Inf) return sign | 0x7F;
  if (magnitude_bits == kF32Inf) return sign | 0x7B;
  return sign | static_cast<uint8_t>(round_magnitude(float_of(magnitude_bits), kE5M2).code);
}

// ---- ue8m0 -------------------------------------------------------------------------------

float e8m0_to_float(uint8_t code) {
  if (code == 0xFF) return float_of(kF32QuietNaN);
  if (code == 0) return 0x1p-127f;  // an f32 subnormal
  return float_of(static_cast<uint32_t>(code) << 23);
}

uint8_t e8m0_pow2_ceil(float value) {
  const uint32_t magnitude_bits = bits_of(value) & kF32AbsMask;
  const uint32_t exponent_field = magnitude_bits >> 23;
  if (exponent_field == 0xFF) return 0xFF;
  const uint32_t code = exponent_field + ((magnitude_bits & 0x7FFFFFu) != 0 ? 1 : 0);
  return static_cast<uint8_t>(code > 0xFF ? 0xFF : code);
}

uint8_t float_to_e8m0_cast(float value) {
  const uint32_t magnitude_bits = bits_of(value) & kF32AbsMask;
  uint32_t exponent_field = magnitude_bits >> 23;
  if (exponent_field == 0xFF) return 0xFF;
  // torch rounds on the f32 fraction: the first dropped bit decides, and an exact half rounds
  // up when the implicit leading bit (the "lsb" of the e8m0 result) is 1, i.e. for normals.
  const bool first_dropped = (magnitude_bits & 0x400000u) != 0;
  const bool rest_dropped = (magnitude_bits & 0x3FFFFFu) != 0;
  const bool implicit_bit = exponent_field != 0;
  if (first_dropped && (rest_dropped || implicit_bit)) ++exponent_field;
  return static_cast<uint8_t>(exponent_field);
}

// ---- fp4 e2m1 ----------------------------------------------------------------------------

float e2m1_to_float(uint8_t code) {
  const float magnitude = e2m1_magnitude(code & 0x7);
  return (code & 0x8) != 0 ? -magnitude : magnitude;
}

uint8_t float_to_e2m1(float value) {
  const uint32_t bits = bits_of(value);
  const uint8_t sign = (bits & kF32SignMask) != 0 ? 0x8 : 0x0;
  const uint32_t magnitude_bits = bits & kF32AbsMask;
  if (magnitude_bits > kF32Inf) return sign;
  if (magnitude_bits == kF32Inf) return sign | 0x7;
  return sign | static_cast<uint8_t>(round_magnitude(float_of(magnitude_bits), kE2M1).code);
}

// ---- bulk --------------------------------------------------------------------------------

void convert_to_f32(DType src_type, const void* src, float* dst, int64_t count) {
  if (count < 0) DI_THROW("convert_to_f32: negative count ", count);
  switch (src_type) {
    case DType::kF32:
      if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = float_of(static_cast<uint32_t>(in[i]) << 16);
      return;
    }
    case DType::kF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_float(in[i]);
      return;
    }
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0: {
      const DecodeTables& tables = decode_tables();
      const float* table = src_type == DType::kF8E4M3   ? tables.e4m3.data()
                           : src_type == DType::kF8E5M2 ? tables.e5m2.data()
                                                        : tables.e8m0.data();
      const auto* in = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = table[in[i]];
      return;
    }
    case DType::kF4E2M1x2: {
      const float* table = decode_tables().e2m1.data();
      const auto* in = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = table[(in[i / 2] >> ((i & 1) * 4)) & 0xF];
      return;
    }
    case DType::kI8: {
      const auto* in = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::kI32: {
      const auto* in = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::kI64: {
      const auto* in = static_cast<const int64_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::kBool: {
      const auto* in = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = in[i] != 0 ? 1.0f : 0.0f;
      return;
    }
  }
  DI_CHECK(false, "unhandled dtype");
}

void convert_from_f32(const float* src, DType dst_type, void* dst, int64_t count,
                      Overflow overflow) {
  if (count < 0) DI_THROW("convert_from_f32: negative count ", count);
  const bool saturate = overflow == Overflow::kSaturate;
  switch (dst_type) {
    case DType::kF32:
      if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = float_to_f16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        out[i] = saturate ? float_to_e4m3_saturate(src[i]) : float_to_e4m3_cast(src[i]);
      }
      return;
    }
    case DType::kF8E5M2: {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < count; ++i) {
        out[i] = saturate ? float_to_e5m2_saturate(src[i]) : float_to_e5m2(src[i]);
      }
      return;
    }
    case DType::kF4E2M1x2: {
      if (count % 2 != 0) DI_THROW("convert_from_f32: packed fp4 needs an even count, got ", count);
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < count; i += 2) {
        out[i / 2] = static_cast<uint8_t>(float_to_e2m1(src[i]) | (float_to_e2m1(src[i + 1]) << 4));
      }
      return;
    }
    case DType::kF8E8M0:
      DI_THROW(
          "convert_from_f32: e8m0 has two encoders (e8m0_pow2_ceil for DeepSeek scales, "
          "float_to_e8m0_cast for torch casts); call one explicitly");
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      DI_THROW("convert_from_f32: ", dtype_name(dst_type), " is not a float format");
  }
  DI_CHECK(false, "unhandled dtype");
}

void pack_fp4(const uint8_t* codes, uint8_t* packed, int64_t count) {
  if (count < 0 || count % 2 != 0) DI_THROW("pack_fp4: count must be even, got ", count);
  for (int64_t i = 0; i < count / 2; ++i) {
    packed[i] = static_cast<uint8_t>((codes[2 * i] & 0xF) | ((codes[2 * i + 1] & 0xF) << 4));
  }
}

void unpack_fp4(const uint8_t* packed, uint8_t* codes, int64_t count) {
  if (count < 0 || count % 2 != 0) DI_THROW("unpack_fp4: count must be even, got ", count);
  for (int64_t i = 0; i < count / 2; ++i) {
    codes[2 * i] = packed[i] & 0xF;
    codes[2 * i + 1] = packed[i] >> 4;
  }
}

void dequantize_blocks(DType value_type, const void* values, DType scale_type, const void* scales,
                       int64_t count, int64_t block_size, float* dst) {
  if (block_size <= 0) DI_THROW("dequantize_blocks: block size must be positive, got ", block_size);
  if (value_type == DType::kF4E2M1x2 && block_size % 2 != 0) {
    DI_THROW("dequantize_blocks: fp4 blocks must hold whole bytes, block size ", block_size);
  }
  if (scale_type != DType::kF8E8M0 && scale_type != DType::kF8E4M3 && scale_type != DType::kF32) {
    DI_THROW("dequantize_blocks: scales must be f8_e8m0, f8_e4m3 or f32, got ",
             dtype_name(scale_type));
  }
  const int64_t value_bits = dtype_bits(value_type);
  for (int64_t start = 0, block = 0; start < count; start += block_size, ++block) {
    const int64_t length = count - start < block_size ? count - start : block_size;
    float scale = 0.0f;
    convert_to_f32(scale_type,
                   static_cast<const std::byte*>(scales) + block * (dtype_bits(scale_type) / 8),
                   &scale, 1);
    const void* block_values = static_cast<const std::byte*>(values) + start * value_bits / 8;
    convert_to_f32(value_type, block_values, dst + start, length);
    for (int64_t i = 0; i < length; ++i) dst[start + i] *= scale;
  }
}

}  // namespace deepinfer
