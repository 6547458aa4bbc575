#include "core/dtype.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace deepinfer {

TEST(DType, StorageBytesPacksFp4TwoPerByte) {
  EXPECT_EQ(dtype_storage_bytes(DType::kF4E2M1x2, 5120), 2560u);
  EXPECT_EQ(dtype_storage_bytes(DType::kBF16, 3), 6u);
  EXPECT_THROW(dtype_storage_bytes(DType::kF4E2M1x2, 3), Error);
}

TEST(DType, SafetensorsNamesRoundTrip) {
  for (auto name : {"F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "I32", "I64",
                    "BOOL"}) {
    auto dtype = dtype_from_safetensors_name(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(dtype_safetensors_name(*dtype), name);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("F128").has_value());
}

}  // namespace deepinfer
