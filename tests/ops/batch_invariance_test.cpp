// The op layer's batch-invariance policy: set, scoped and restored; EngineArgs resolves an unset
// batch_invariant from it (on the CPU it is always on).
#include "ops/batch_invariance.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "deepinfer/engine_args.h"

namespace deepinfer::ops {
namespace {

TEST(BatchInvariance, ScopedPolicyIsRestoredAtScopeEndAlsoOnThrow) {
  const bool before = batch_invariant();
  {
    const ScopedBatchInvariance off(false);
    EXPECT_FALSE(batch_invariant());
    {
      const ScopedBatchInvariance on(true);
      EXPECT_TRUE(batch_invariant());
    }
    EXPECT_FALSE(batch_invariant());
  }
  EXPECT_EQ(batch_invariant(), before);
  try {
    const ScopedBatchInvariance off(!before);
    throw std::runtime_error("leave the scope");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(batch_invariant(), before);
}

TEST(BatchInvariance, EngineArgsTakeThePolicyWhenUnsetAndTheCpuIsAlwaysInvariant) {
  const ScopedBatchInvariance off(false);
  EngineArgs args;
  args.accelerator = Accelerator::kNvidia;
  EXPECT_EQ(args.resolved().batch_invariant, false);
  args.batch_invariant = true;
  EXPECT_EQ(args.resolved().batch_invariant, true);
  args.batch_invariant.reset();
  args.accelerator = Accelerator::kCpu;
  EXPECT_EQ(args.resolved().batch_invariant, true);
}

}  // namespace
}  // namespace deepinfer::ops
