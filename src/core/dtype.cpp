#include "core/dtype.h"

#include "core/error.h"

namespace deepinfer {

int dtype_bits(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 32;
    case DType::kBF16: return 16;
    case DType::kF16: return 16;
    case DType::kF8E4M3: return 8;
    case DType::kF8E5M2: return 8;
    case DType::kF8E8M0: return 8;
    case DType::kF4E2M1x2: return 4;
    case DType::kI8: return 8;
    case DType::kI32: return 32;
    case DType::kI64: return 64;
    case DType::kBool: return 8;
  }
  DI_CHECK(false, "unhandled dtype");
  return 0;
}

size_t dtype_storage_bytes(DType dtype, int64_t count) {
  if (count < 0) DI_THROW("negative element count ", count, " for dtype ", dtype_name(dtype));
  const int bits = dtype_bits(dtype);
  if (bits == 4) {
    if (count % 2 != 0) {
      DI_THROW("packed fp4 (e2m1) holds two values per byte; element count ", count, " is odd");
    }
    return static_cast<size_t>(count / 2);
  }
  return static_cast<size_t>(count) * static_cast<size_t>(bits / 8);
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "f8_e4m3";
    case DType::kF8E5M2: return "f8_e5m2";
    case DType::kF8E8M0: return "f8_e8m0";
    case DType::kF4E2M1x2: return "f4_e2m1x2";
    case DType::kI8: return "i8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

namespace {
struct SafetensorsName {
  std::string_view name;
  DType dtype;
};
constexpr SafetensorsName kSafetensorsNames[] = {
    {"F32", DType::kF32},         {"BF16", DType::kBF16},       {"F16", DType::kF16},
    {"F8_E4M3", DType::kF8E4M3},  {"F8_E5M2", DType::kF8E5M2},  {"F8_E8M0", DType::kF8E8M0},
    {"F4", DType::kF4E2M1x2},     {"I8", DType::kI8},           {"I32", DType::kI32},
    {"I64", DType::kI64},         {"BOOL", DType::kBool},
};
}  // namespace

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (const auto& entry : kSafetensorsNames) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::string_view dtype_safetensors_name(DType dtype) {
  for (const auto& entry : kSafetensorsNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  DI_CHECK(false, "dtype without a safetensors name");
  return {};
}

}  // namespace deepinfer
