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
  kF8E4M3,   // fp8 e4m3fn: no inf, NaN = S.1111.111, max 448
  kF8E5M2,   // fp8 e5m2: IEEE-like, has inf
  kF8E8M0,   // ue8m0: unsigned power-of-two scale 2^(code-127), 0xFF = NaN
  kF4E2M1x2, // fp4 e2m1, two values per byte, low nibble first
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

}  // namespace deepinfer
