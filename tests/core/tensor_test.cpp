#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace deepinfer {
namespace {

// A 2x3x4 f32 tensor holding 0..23 in row-major order: the value at (i, j, k) is its linear
// index, so every view's expected contents follow from index arithmetic alone.
Tensor iota_2x3x4() {
  Tensor tensor = Tensor::empty(DType::kF32, {2, 3, 4});
  std::iota(tensor.data<float>(), tensor.data<float>() + 24, 0.0f);
  return tensor;
}

float linear(int64_t i, int64_t j, int64_t k) {
  return static_cast<float>(i * 12 + j * 4 + k);
}

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Dims, InlineStorageAndRankLimit) {
  Shape shape{2, 3, 4};
  EXPECT_EQ(shape.size(), 3);
  EXPECT_EQ(shape.product(), 24);
  EXPECT_EQ(shape.to_string(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.product(), 1);
  EXPECT_NE((Shape{2, 3}), (Shape{2, 3, 1}));
  EXPECT_THROW((Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
  EXPECT_THROW((Shape{INT64_MAX, 2}.product()), Error);
}

TEST(Tensor, EmptyIsContiguousAndAligned) {
  Tensor tensor = iota_2x3x4();
  const TensorView& view = tensor;
  EXPECT_EQ(view.numel(), 24);
  EXPECT_EQ(view.nbytes(), 96u);
  EXPECT_EQ(view.strides(), (Strides{12, 4, 1}));
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view.raw_data()) % kDefaultAlignment, 0u);
  EXPECT_EQ(view.device(), Device::cpu());
  EXPECT_EQ(tensor.at<float>(1, 2, 3), 23.0f);
}

TEST(Tensor, TypedAccessChecksDType) {
  Tensor tensor = Tensor::zeros(DType::kBF16, {4});
  EXPECT_NO_THROW(tensor.data<BFloat16>());
  const std::string message = error_of([&] { tensor.data<Float16>(); });
  EXPECT_NE(message.find("holds bf16"), std::string::npos) << message;
  EXPECT_NE(message.find("accessed as f16"), std::string::npos) << message;
  EXPECT_EQ(tensor.at<BFloat16>(3), BFloat16{0});
}

TEST(Tensor, AtChecksBoundsAndRank) {
  Tensor tensor = iota_2x3x4();
  EXPECT_THROW(tensor.at<float>(2, 0, 0), Error);
  EXPECT_THROW(tensor.at<float>(0, 0, -1), Error);
  EXPECT_THROW(tensor.at<float>(0, 0), Error);
}

TEST(Tensor, MoveTransfersOwnership) {
  CountingAllocator counting(host_allocator());
  {
    Tensor a = Tensor::empty(DType::kI32, {8}, counting);
    void* data = a.view().raw_data();
    Tensor b = std::move(a);
    EXPECT_EQ(b.view().raw_data(), data);
    EXPECT_EQ(a.numel(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(counting.allocations(), 1);
  }
  EXPECT_EQ(counting.deallocations(), 1);
  EXPECT_EQ(counting.live_bytes(), 0u);
}

TEST(TensorView, NarrowAndSelectAddressTheRightElements) {
  Tensor tensor = iota_2x3x4();
  TensorView middle = tensor.view().narrow(1, 1, 2);  // [2, 2, 4]
  EXPECT_EQ(middle.shape(), (Shape{2, 2, 4}));
  EXPECT_FALSE(middle.is_contiguous());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(middle.at<float>(i, j, k), linear(i, j + 1, k));

  TensorView row = tensor.view().select(0, 1).select(-2, 2);  // (1, 2, :)
  EXPECT_EQ(row.shape(), (Shape{4}));
  EXPECT_TRUE(row.is_contiguous());
  EXPECT_EQ(row.byte_offset(), (12 + 8) * 4);
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(row.at<float>(k), linear(1, 2, k));

  EXPECT_THROW(tensor.view().narrow(2, 3, 2), Error);
  EXPECT_THROW(tensor.view().select(0, 2), Error);
  EXPECT_THROW(tensor.view().select(3, 0), Error);
  EXPECT_EQ(tensor.view().narrow(2, 4, 0).numel(), 0);
}

TEST(TensorView, TransposeAndPermute) {
  Tensor tensor = iota_2x3x4();
  TensorView t = tensor.view().transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Strides{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  TensorView p = tensor.view().permute({1, 2, 0});  // [3, 4, 2]
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(t.at<float>(k, j, i), linear(i, j, k));
        EXPECT_EQ(p.at<float>(j, k, i), linear(i, j, k));
      }
  EXPECT_THROW(tensor.view().permute({0, 0, 1}), Error);
  EXPECT_THROW(tensor.view().permute({0, 1}), Error);
}

TEST(TensorView, ViewSplitsAndMergesCompatibleDimensions) {
  Tensor tensor = iota_2x3x4();
  TensorView flat = tensor.view().view({-1});
  EXPECT_EQ(flat.shape(), (Shape{24}));
  for (int64_t n = 0; n < 24; ++n) EXPECT_EQ(flat.at<float>(n), static_cast<float>(n));

  // Narrowing the outer dimension keeps the inner ones mergeable.
  TensorView rows = tensor.view().narrow(1, 1, 2).view({2, 8});
  EXPECT_EQ(rows.strides(), (Strides{12, 1}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t n = 0; n < 8; ++n) EXPECT_EQ(rows.at<float>(i, n), linear(i, 1 + n / 4, n % 4));

  // A transposed view can split a dimension without copying ...
  TensorView t = tensor.view().transpose(0, 1);  // [3, 2, 4] strides [4, 12, 1]
  TensorView split = t.view({3, 2, 2, 2});
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t k = 0; k < 4; ++k)
        EXPECT_EQ(split.at<float>(j, i, k / 2, k % 2), linear(i, j, k));
  // ... but cannot merge dimensions that are not adjacent in memory.
  const std::string message = error_of([&] { t.view({6, 4}); });
  EXPECT_NE(message.find("without a copy"), std::string::npos) << message;
  EXPECT_THROW(tensor.view().view({5, 5}), Error);
  EXPECT_THROW(tensor.view().view({-1, -1}), Error);
}

TEST(TensorView, UnsqueezeAndScalar) {
  Tensor tensor = iota_2x3x4();
  TensorView u = tensor.view().unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3, 4}));
  EXPECT_TRUE(u.is_contiguous());
  EXPECT_EQ(u.at<float>(1, 0, 2, 1), linear(1, 2, 1));
  EXPECT_EQ(tensor.view().unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  TensorView scalar = tensor.view().select(0, 1).select(0, 1).select(0, 1);
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.at<float>(), linear(1, 1, 1));
  EXPECT_EQ(scalar.view({1, 1}).at<float>(0, 0), linear(1, 1, 1));
}

TEST(TensorView, ConstructorRejectsOutOfBoundsLayouts) {
  std::vector<float> storage(10);
  EXPECT_NO_THROW(TensorView(storage.data(), 40, 0, DType::kF32, {2, 5}, {5, 1}));
  EXPECT_NO_THROW(TensorView(storage.data(), 40, 4, DType::kF32, {3, 3}, {3, 1}));
  const std::string message = error_of([&] {
    TensorView(storage.data(), 40, 8, DType::kF32, {3, 3}, {3, 1});
  });
  EXPECT_NE(message.find("storage holds 40 bytes"), std::string::npos) << message;
  EXPECT_THROW(TensorView(storage.data(), 40, 0, DType::kF32, {2, 5}, {-5, 1}), Error);
  EXPECT_THROW(TensorView(storage.data(), 40, 0, DType::kF32, {2, 5}, {5}), Error);
  // Broadcast (stride 0) views are allowed and are not contiguous.
  TensorView broadcast(storage.data(), 40, 0, DType::kF32, {4, 10}, {0, 1});
  EXPECT_FALSE(broadcast.is_contiguous());
}

TEST(TensorView, NonHostViewsRefuseElementAccess) {
  std::vector<float> storage(4);
  TensorView cuda = TensorView::contiguous(storage.data(), DType::kF32, {4}, Device::cuda(1));
  EXPECT_EQ(cuda.device().to_string(), "cuda:1");
  EXPECT_NO_THROW(cuda.data<float>());
  EXPECT_THROW(cuda.at<float>(0), Error);
}

// Packed fp4: shape counts values; 2 values per byte.
TEST(TensorView, PackedFp4Layout) {
  Tensor tensor = Tensor::zeros(DType::kF4E2M1x2, {4, 8});
  EXPECT_EQ(tensor.view().nbytes(), 16u);
  EXPECT_EQ(tensor.view().strides(), (Strides{8, 1}));
  // Row 2 starts at byte 8; columns 4..7 start at byte 2 of the row.
  EXPECT_EQ(tensor.view().select(0, 2).byte_offset(), 8);
  EXPECT_EQ(tensor.view().narrow(1, 4, 4).byte_offset(), 2);
  EXPECT_EQ(tensor.view().view({2, 16}).strides(), (Strides{16, 1}));
  EXPECT_EQ(tensor.view().view({4, 2, 4}).strides(), (Strides{8, 4, 1}));

  EXPECT_THROW(Tensor::empty(DType::kF4E2M1x2, {4, 3}), Error);
  EXPECT_THROW(tensor.view().narrow(1, 1, 2), Error);  // starts mid-byte
  EXPECT_THROW(tensor.view().narrow(1, 2, 3), Error);  // ends mid-byte
  EXPECT_THROW(tensor.view().select(1, 0), Error);     // splits a byte
  EXPECT_THROW(tensor.view().transpose(0, 1), Error);  // packed dim must stay last
  EXPECT_THROW(tensor.view().view({4, 8, 1}), Error);  // odd last dimension
  EXPECT_THROW(tensor.view().at<Float4E2M1x2>(0, 0), Error);
  EXPECT_THROW(tensor.view().view({16, 2}).narrow(0, 1, 2).view({2, 2, 1}), Error);
  // Odd strides on outer dimensions would start rows mid-byte.
  std::vector<uint8_t> bytes(16);
  EXPECT_THROW(TensorView(bytes.data(), 16, 0, DType::kF4E2M1x2, {3, 4}, {5, 1}), Error);
}

TEST(TensorView, ReinterpretBytesAsPackedFp4) {
  Tensor bytes = Tensor::zeros(DType::kI8, {3, 5});
  TensorView fp4 = bytes.view().reinterpret(DType::kF4E2M1x2);
  EXPECT_EQ(fp4.shape(), (Shape{3, 10}));
  EXPECT_EQ(fp4.strides(), (Strides{10, 1}));
  TensorView back = fp4.narrow(0, 1, 2).reinterpret(DType::kI8);
  EXPECT_EQ(back.shape(), (Shape{2, 5}));
  EXPECT_EQ(back.byte_offset(), 5);
  EXPECT_EQ(bytes.view().reinterpret(DType::kF8E4M3).dtype(), DType::kF8E4M3);
  EXPECT_THROW(bytes.view().reinterpret(DType::kF32), Error);
}

}  // namespace
}  // namespace deepinfer
