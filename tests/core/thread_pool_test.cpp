#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer {
namespace {

using Chunk = std::pair<int64_t, int64_t>;

// The chunks fn sees, sorted: must be {begin, begin+grain, ...} whatever the thread count.
std::set<Chunk> chunks_seen(ThreadPool& pool, int64_t begin, int64_t end, int64_t grain) {
  std::mutex mutex;
  std::set<Chunk> chunks;
  pool.parallel_for(begin, end, grain, [&](int64_t chunk_begin, int64_t chunk_end) {
    std::lock_guard lock(mutex);
    EXPECT_TRUE(chunks.insert({chunk_begin, chunk_end}).second) << "chunk ran twice";
  });
  return chunks;
}

std::set<Chunk> expected_chunks(int64_t begin, int64_t end, int64_t grain) {
  std::set<Chunk> chunks;
  for (int64_t b = begin; b < end; b += grain) chunks.insert({b, std::min(b + grain, end)});
  return chunks;
}

TEST(ThreadPool, ChunksDependOnlyOnTheRangeAndGrain) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (auto [begin, end, grain] : {std::tuple<int64_t, int64_t, int64_t>{0, 100, 7},
                                     {5, 6, 3},
                                     {-10, 10, 1},
                                     {0, 64, 64},
                                     {0, 1000, 13},
                                     {3, 3, 1}}) {
      EXPECT_EQ(chunks_seen(pool, begin, end, grain), expected_chunks(begin, end, grain))
          << threads << " threads, [" << begin << ", " << end << ") grain " << grain;
    }
  }
}

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(10000);
  for (int repeat = 0; repeat < 20; ++repeat) {
    pool.parallel_for(0, 10000, 37, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (auto& hit : hits) ASSERT_EQ(hit.load(), 20);
}

TEST(ThreadPool, ResultsAreIdenticalForAnyThreadCount) {
  // A per-chunk float reduction: the sums depend on the chunking, which must not move.
  std::vector<float> input(5000);
  for (size_t i = 0; i < input.size(); ++i) input[i] = 1.0f / static_cast<float>(i + 1);
  auto reduce = [&](int threads) {
    ThreadPool pool(threads);
    std::vector<float> partial((input.size() + 99) / 100);
    pool.parallel_for(0, static_cast<int64_t>(input.size()), 100, [&](int64_t b, int64_t e) {
      float sum = 0;
      for (int64_t i = b; i < e; ++i) sum += input[i];
      partial[b / 100] = sum;
    });
    return partial;
  };
  const auto one = reduce(1);
  EXPECT_EQ(reduce(2), one);
  EXPECT_EQ(reduce(3), one);
}

TEST(ThreadPool, CallerParticipates) {
  ThreadPool pool(3);
  const auto caller = std::this_thread::get_id();
  std::mutex mutex;
  std::set<std::thread::id> runners;
  std::vector<std::thread::id> first_chunk_runner(1);
  pool.parallel_for(0, 30, 1, [&](int64_t b, int64_t) {
    std::lock_guard lock(mutex);
    runners.insert(std::this_thread::get_id());
    if (b == 0) first_chunk_runner[0] = std::this_thread::get_id();
  });
  EXPECT_EQ(first_chunk_runner[0], caller);  // the caller's static share starts at chunk 0
  EXPECT_LE(runners.size(), 3u);
}

TEST(ThreadPool, ExceptionsPropagateAndThePoolSurvives) {
  ThreadPool pool(4);
  std::atomic<int> ran{0};
  try {
    pool.parallel_for(0, 1000, 10, [&](int64_t b, int64_t) {
      ran.fetch_add(1);
      if (b == 500) throw std::runtime_error("chunk 500 failed");
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "chunk 500 failed");
  }
  EXPECT_LE(ran.load(), 100);
  // An exception thrown on the caller's own share (chunk 0) propagates too.
  EXPECT_THROW(pool.parallel_for(0, 100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b == 0) DI_THROW("first chunk");
                                 }),
               Error);
  std::atomic<int64_t> total{0};
  pool.parallel_for(0, 100, 1, [&](int64_t b, int64_t) { total.fetch_add(b); });
  EXPECT_EQ(total.load(), 4950);
}

TEST(ThreadPool, NestedCallsRunInlineOnTheSameThread) {
  ThreadPool pool(3);
  std::atomic<int> inner_chunks{0};
  std::atomic<bool> same_thread{true};
  pool.parallel_for(0, 6, 1, [&](int64_t, int64_t) {
    const auto outer = std::this_thread::get_id();
    int64_t previous_end = 0;
    pool.parallel_for(0, 10, 3, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != outer) same_thread = false;
      EXPECT_EQ(b, previous_end);  // in order, same boundaries
      previous_end = e;
      inner_chunks.fetch_add(1);
    });
  });
  EXPECT_TRUE(same_thread.load());
  EXPECT_EQ(inner_chunks.load(), 6 * 4);
}

TEST(ThreadPool, ConcurrentOutsideCallersTakeTurns) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum_a{0};
  std::atomic<int64_t> sum_b{0};
  std::thread other([&] {
    for (int i = 0; i < 50; ++i) {
      pool.parallel_for(0, 100, 5, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) sum_b.fetch_add(k);
      });
    }
  });
  for (int i = 0; i < 50; ++i) {
    pool.parallel_for(0, 100, 5, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) sum_a.fetch_add(k);
    });
  }
  other.join();
  EXPECT_EQ(sum_a.load(), 50 * 4950);
  EXPECT_EQ(sum_b.load(), 50 * 4950);
}

TEST(ThreadPool, RejectsBadArguments) {
  ThreadPool pool(2);
  int calls = 0;
  pool.parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  pool.parallel_for(5, 1, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  EXPECT_THROW(pool.parallel_for(0, 10, 0, [](int64_t, int64_t) {}), Error);
  EXPECT_THROW(ThreadPool(-1), Error);
}

TEST(ThreadPool, ThreadCountFromEnvironment) {
  const char* saved = std::getenv("DEEPINFER_NUM_THREADS");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("DEEPINFER_NUM_THREADS", "3", 1);
  EXPECT_EQ(ThreadPool::resolve_num_threads(0), 3);
  EXPECT_EQ(ThreadPool::resolve_num_threads(5), 5);  // an explicit count wins
  for (const char* bad : {"0", "-2", "four", "3x", "99999"}) {
    setenv("DEEPINFER_NUM_THREADS", bad, 1);
    try {
      ThreadPool::resolve_num_threads(0);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DEEPINFER_NUM_THREADS"), std::string::npos);
    }
  }
  unsetenv("DEEPINFER_NUM_THREADS");
  EXPECT_GE(ThreadPool::resolve_num_threads(0), 1);
  if (saved != nullptr) setenv("DEEPINFER_NUM_THREADS", saved_value.c_str(), 1);
}

}  // namespace
}  // namespace deepinfer
