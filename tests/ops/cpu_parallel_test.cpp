// ops::cpu::parallel_for, the CPU kernels' loop: every index once, and a chunk that throws
// reaches the caller as that exception (not std::terminate from a worker, not a worker left in a
// body the caller has unwound), with the loop usable again afterwards.
#include "ops/cpu/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace deepinfer::ops::cpu {
namespace {

TEST(CpuParallelFor, EveryIndexOnce) {
  std::vector<std::atomic<int>> seen(10000);
  parallel_for(10000, 7, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
  });
  for (const auto& count : seen) ASSERT_EQ(count.load(), 1);
}

TEST(CpuParallelFor, AThrowingChunkReachesTheCallerAndTheLoopSurvives) {
  for (int round = 0; round < 20; ++round) {
    // Every chunk throws (whichever thread runs it), then only some.
    EXPECT_THROW(
        parallel_for(1000, 1, [&](int64_t, int64_t) { throw std::runtime_error("chunk failed"); }),
        std::runtime_error);
    EXPECT_THROW(parallel_for(1000, 1,
                              [&](int64_t begin, int64_t) {
                                if (begin % 3 == round % 3) throw std::invalid_argument("odd");
                              }),
                 std::invalid_argument);
    std::atomic<int64_t> sum{0};
    parallel_for(1000, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum.fetch_add(i);
    });
    ASSERT_EQ(sum.load(), 999 * 1000 / 2);
  }
}

}  // namespace
}  // namespace deepinfer::ops::cpu
