// A fixed pool of threads for CPU kernels.
//
// parallel_for(begin, end, grain, fn) cuts [begin, end) into chunks of exactly `grain` indices
// (the last one shorter) and calls fn(chunk_begin, chunk_end) once per chunk. The chunk
// boundaries depend only on (begin, end, grain) -- not on the thread count and not on timing --
// so a kernel that computes each output from its own chunk gives bit-identical results with 1
// or 64 threads (batch invariance). Chunks are assigned statically: thread t (the caller is
// thread 0) runs the t-th contiguous run of chunks.
//
// Rules:
//  - The calling thread participates; parallel_for returns when every chunk has run.
//  - If fn throws, the remaining chunks are skipped and the first exception caught is rethrown
//    in the caller (which one is first when several chunks throw is timing-dependent).
//  - Nested parallel_for (called from inside fn) runs inline on the current thread, chunk by
//    chunk with the same boundaries. Concurrent calls from different outside threads take
//    turns.
//  - No allocation per call: fn is passed by reference, not as a std::function.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace deepinfer {

class ThreadPool {
 public:
  // `num_threads` counts the caller. 0 means: DEEPINFER_NUM_THREADS if set (a positive
  // integer; anything else is an Error), otherwise std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  template <typename Fn>
  void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
    using FnType = std::remove_reference_t<Fn>;
    run(
        begin, end, grain,
        [](void* context, int64_t chunk_begin, int64_t chunk_end) {
          (*static_cast<FnType*>(context))(chunk_begin, chunk_end);
        },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // The process-wide pool, created on first use with the default thread count.
  static ThreadPool& global();

  // The thread count a pool built with `requested` threads gets (see the constructor).
  static int resolve_num_threads(int requested);

 private:
  using ChunkFn = void (*)(void* context, int64_t chunk_begin, int64_t chunk_end);

  struct Job {
    ChunkFn fn = nullptr;
    void* context = nullptr;
    int64_t begin = 0;
    int64_t end = 0;
    int64_t grain = 1;
    int64_t num_chunks = 0;
    int num_participants = 0;
  };

  void run(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, void* context);
  void run_share(const Job& job, int participant);
  void worker_loop(int participant);
  void record_exception(std::exception_ptr error);

  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // one job at a time from outside threads

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  Job job_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::atomic<bool> failed_{false};  // lets the other participants skip their remaining chunks
  std::exception_ptr first_error_;
};

}  // namespace deepinfer
