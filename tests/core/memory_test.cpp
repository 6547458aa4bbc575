#include "core/memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer {
namespace {

uintptr_t address(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr);
}

TEST(HostAllocator, AlignsAndHandlesZeroBytes) {
  Allocator& host = host_allocator();
  EXPECT_EQ(host.device(), Device::cpu());
  EXPECT_EQ(host.allocate(0), nullptr);
  host.deallocate(nullptr, 0);
  for (size_t alignment : {size_t{1}, size_t{16}, size_t{64}, size_t{4096}}) {
    void* ptr = host.allocate(100, alignment);
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(address(ptr) % std::max<size_t>(alignment, kDefaultAlignment), 0u) << alignment;
    std::memset(ptr, 0xAB, 100);
    host.deallocate(ptr, 100, alignment);
  }
  // Large blocks are huge-page aligned.
  const size_t big = size_t{3} << 20;
  void* ptr = host.allocate(big);
  EXPECT_EQ(address(ptr) % (size_t{2} << 20), 0u);
  host.deallocate(ptr, big);
  EXPECT_THROW(host.allocate(64, 48), Error);
}

TEST(HostAllocator, OutOfMemoryNamesTheSize) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on impossible allocations instead of failing them";
#endif
  try {
    host_allocator().allocate(SIZE_MAX / 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(SIZE_MAX / 2)), std::string::npos)
        << e.what();
  }
}

TEST(Buffer, ReturnsItsMemoryExactlyOnce) {
  CountingAllocator counting(host_allocator());
  {
    Buffer a(counting, 1000);
    EXPECT_EQ(a.size(), 1000u);
    EXPECT_EQ(counting.live_bytes(), 1000u);
    Buffer b = std::move(a);
    EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
    Buffer c(counting, 10);
    c = std::move(b);  // frees c's old 10 bytes
    EXPECT_EQ(counting.deallocations(), 1);
    EXPECT_EQ(counting.live_bytes(), 1000u);
  }
  EXPECT_EQ(counting.allocations(), 2);
  EXPECT_EQ(counting.deallocations(), 2);
  EXPECT_EQ(counting.live_bytes(), 0u);
}

TEST(Arena, BumpsWithAlignmentAndTracksHighWater) {
  Arena arena(host_allocator(), 1024, "test scratch");
  EXPECT_EQ(arena.capacity(), 1024u);
  void* a = arena.allocate(10, 1);
  void* b = arena.allocate(8, 64);
  EXPECT_EQ(address(a) % kArenaAlignment, 0u);
  EXPECT_EQ(address(b) - address(a), 64u);
  EXPECT_EQ(arena.used(), 72u);
  void* c = arena.allocate(0);
  EXPECT_EQ(address(c) % 64, 0u);
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.high_water(), 128u);  // the zero-byte request still aligned the offset
  EXPECT_EQ(arena.allocate(1), a);      // memory is reused after reset
  EXPECT_THROW(arena.allocate(8, 512), Error);
  EXPECT_THROW(arena.allocate(8, 3), Error);
}

TEST(Arena, ExhaustionSaysWhatWasAskedAndTheCapacity) {
  Arena arena(host_allocator(), 256, "decode scratch");
  arena.allocate(200);
  try {
    arena.allocate(100);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("decode scratch"), std::string::npos) << message;
    EXPECT_NE(message.find("asked for 100 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("200 of 256 bytes"), std::string::npos) << message;
  }
  EXPECT_EQ(arena.used(), 200u);  // a failed request changes nothing
  EXPECT_NO_THROW(arena.allocate(56, 1));
  EXPECT_THROW(arena.allocate(1, 1), Error);
}

TEST(Arena, SteadyStateStepsMakeNoSystemAllocations) {
  CountingAllocator counting(host_allocator());
  Arena arena(counting, size_t{1} << 16, "step scratch");
  EXPECT_EQ(counting.allocations(), 1);
  for (int step = 0; step < 100; ++step) {
    arena.reset();
    // A "step": a few temporaries whose sizes vary with the batch.
    const int64_t tokens = 1 + step % 7;
    TensorView hidden = arena_tensor(arena, DType::kBF16, {tokens, 256});
    TensorView logits = arena_tensor(arena, DType::kF32, {tokens, 512});
    TensorView packed = arena_tensor(arena, DType::kF4E2M1x2, {tokens, 64});
    ASSERT_EQ(hidden.nbytes(), static_cast<size_t>(tokens) * 512);
    ASSERT_TRUE(logits.is_contiguous());
    ASSERT_EQ(packed.nbytes(), static_cast<size_t>(tokens) * 32);
    logits.at<float>(tokens - 1, 511) = 1.0f;
  }
  EXPECT_EQ(counting.allocations(), 1);
  EXPECT_EQ(counting.deallocations(), 0);
  EXPECT_LE(arena.high_water(), arena.capacity());
}

}  // namespace
}  // namespace deepinfer
