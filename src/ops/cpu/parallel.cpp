#include "ops/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace deepinfer::ops::cpu {
namespace {

thread_local bool inside_parallel_region = false;

// A fixed set of workers that run one parallel_for at a time; the caller takes part too.
class KernelPool {
 public:
  explicit KernelPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~KernelPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& worker : workers_) worker.join();
  }
  KernelPool(const KernelPool&) = delete;
  KernelPool& operator=(const KernelPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int64_t chunks, const std::function<void(int64_t)>& chunk_body) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);  // one loop at a time
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &chunk_body;
      next_.store(0);
      total_ = chunks;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    body_ = nullptr;
    if (std::exception_ptr error = std::exchange(first_error_, nullptr)) {
      std::rethrow_exception(error);
    }
  }

 private:
  // A chunk that throws stops the loop (no chunk starts after it) and its exception reaches the
  // caller once every worker is out of the body: an exception must neither escape a worker thread
  // (std::terminate) nor leave workers running a body the caller has already unwound.
  void drain() {
    inside_parallel_region = true;
    try {
      for (int64_t chunk = next_.fetch_add(1); chunk < total_; chunk = next_.fetch_add(1)) {
        (*body_)(chunk);
      }
    } catch (...) {
      next_.store(total_);
      std::lock_guard<std::mutex> lock(mutex_);
      if (first_error_ == nullptr) first_error_ = std::current_exception();
    }
    inside_parallel_region = false;
  }

  void work() {
    uint64_t seen = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      drain();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
      }
      done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t)>* body_ = nullptr;
  std::atomic<int64_t> next_{0};
  int64_t total_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr first_error_;  // guarded by mutex_
};

int configured_threads() {
  if (const char* text = std::getenv("DEEPINFER_CPU_THREADS")) {
    const int value = std::atoi(text);
    if (value > 0) return value;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

KernelPool& pool() {
  static KernelPool instance(configured_threads());
  return instance;
}

}  // namespace

int kernel_threads() {
  return pool().size();
}

void parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  KernelPool& workers = pool();
  if (inside_parallel_region || workers.size() == 1 || count <= grain) {
    body(0, count);
    return;
  }
  const int64_t max_chunks = static_cast<int64_t>(workers.size()) * 4;
  const int64_t chunks = std::min(max_chunks, (count + grain - 1) / grain);
  const int64_t per_chunk = (count + chunks - 1) / chunks;
  workers.run(chunks, [&](int64_t chunk) {
    const int64_t begin = chunk * per_chunk;
    const int64_t end = std::min(count, begin + per_chunk);
    if (begin < end) body(begin, end);
  });
}

}  // namespace deepinfer::ops::cpu
