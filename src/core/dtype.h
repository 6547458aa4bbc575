// Element types of tensors and checkpoints. Conversions live in core/dtype_convert.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3,    // fp8 e4m3fn: no inf, NaN = S.1111.111, max 448
  kF8E5M2,    // fp8 e5m2: IEEE-like, has inf
  kF8E8M0,    // ue8m0: unsigned power-of-two scale 2^(code-127), 0xFF = NaN
  kF4E2M1x2,  // fp4 e2m1, two values per byte, low nibble first
  kI8,
  kI32,
  kI64,
  kBool,
};

// Bits per element (4 for packed fp4; everything else is whole bytes).
int dtype_bits(DType dtype);
// Bytes for `count` elements; throws Error when fp4 count is odd.
size_t dtype_storage_bytes(DType dtype, int64_t count);
std::string_view dtype_name(DType dtype);
// safetensors dtype strings: F32, BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0, I8, I32, I64, BOOL.
// The released DeepSeek checkpoints store packed fp4 as I8 (two e2m1 per byte) next to
// ue8m0 scales; callers reinterpret those as kF4E2M1x2 by tensor role, not by this name.
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
std::string_view dtype_safetensors_name(DType dtype);

// Storage types for the dtypes C++ has no type for: raw bits, no arithmetic. They keep
// TensorView::data<T>() honest (bf16 and f16 are both 16 bits but not interchangeable).
// Values are converted with core/dtype_convert.h.
struct BFloat16 {
  uint16_t bits;
  friend constexpr bool operator==(BFloat16, BFloat16) = default;
};
struct Float16 {
  uint16_t bits;
  friend constexpr bool operator==(Float16, Float16) = default;
};
struct Float8E4M3 {
  uint8_t bits;
  friend constexpr bool operator==(Float8E4M3, Float8E4M3) = default;
};
struct Float8E5M2 {
  uint8_t bits;
  friend constexpr bool operator==(Float8E5M2, Float8E5M2) = default;
};
struct Float8E8M0 {
  uint8_t bits;
  friend constexpr bool operator==(Float8E8M0, Float8E8M0) = default;
};
// Two e2m1 values in one byte: element 2k in bits 0-3, element 2k+1 in bits 4-7.
struct Float4E2M1x2 {
  uint8_t bits;
  friend constexpr bool operator==(Float4E2M1x2, Float4E2M1x2) = default;
};

// The DType whose elements are stored as T (DTypeOf<float>::value == DType::kF32).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<Float8E4M3> {
  static constexpr DType value = DType::kF8E4M3;
};
template <>
struct DTypeOf<Float8E5M2> {
  static constexpr DType value = DType::kF8E5M2;
};
template <>
struct DTypeOf<Float8E8M0> {
  static constexpr DType value = DType::kF8E8M0;
};
template <>
struct DTypeOf<Float4E2M1x2> {
  static constexpr DType value = DType::kF4E2M1x2;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kI8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

}  // namespace deepinfer
