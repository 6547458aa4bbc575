// Row-parallel loops for the CPU kernels. Work is split into contiguous index ranges; what a
// thread computes for one index never depends on which thread runs it or how the range was cut,
// so results are identical for any thread count (the kernels keep their reductions inside one
// index).
#pragma once

#include <cstdint>
#include <functional>

namespace deepinfer::ops::cpu {

// Calls body(begin, end) over [0, count) in chunks of at least `grain` indices, on the kernel
// thread pool. Runs inline when the work is small or a pool thread is already inside a loop.
void parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Threads the kernels use (DEEPINFER_CPU_THREADS, default: hardware concurrency).
int kernel_threads();

}  // namespace deepinfer::ops::cpu
