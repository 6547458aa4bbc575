#include "core/thread_pool.h"

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace deepinfer {
namespace {

// True on pool workers and on a caller while it runs its own share: nested calls go inline.
thread_local bool tls_inside_parallel_region = false;

void run_chunks_inline(int64_t begin, int64_t end, int64_t grain,
                       void (*fn)(void*, int64_t, int64_t), void* context) {
  for (int64_t chunk_begin = begin; chunk_begin < end;) {
    const int64_t chunk_end = end - chunk_begin > grain ? chunk_begin + grain : end;
    fn(context, chunk_begin, chunk_end);
    chunk_begin = chunk_end;
  }
}

}  // namespace

int ThreadPool::resolve_num_threads(int requested) {
  if (requested < 0) DI_THROW("thread pool size must be >= 0 (0 = default), got ", requested);
  if (requested > 0) return requested;
  if (const char* env = std::getenv("DEEPINFER_NUM_THREADS"); env != nullptr && *env != '\0') {
    const std::string_view text(env);
    int value = 0;
    const auto [rest, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || rest != text.data() + text.size() || value <= 0 || value > 4096) {
      DI_THROW("DEEPINFER_NUM_THREADS='", text, "' is not a thread count (expected 1..4096)");
    }
    return value;
  }
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int>(hardware) : 1;
}

ThreadPool::ThreadPool(int num_threads) {
  const int total = resolve_num_threads(num_threads);
  workers_.reserve(static_cast<size_t>(total - 1));
  for (int participant = 1; participant < total; ++participant) {
    workers_.emplace_back([this, participant] { worker_loop(participant); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

void ThreadPool::record_exception(std::exception_ptr error) {
  std::lock_guard lock(mutex_);
  if (!failed_.load(std::memory_order_relaxed)) {
    first_error_ = std::move(error);
    failed_.store(true, std::memory_order_relaxed);
  }
}

// Participant p runs chunks [p * C / P, (p + 1) * C / P): contiguous, fixed by the job alone.
void ThreadPool::run_share(const Job& job, int participant) {
  const int64_t first = job.num_chunks * participant / job.num_participants;
  const int64_t last = job.num_chunks * (participant + 1) / job.num_participants;
  try {
    for (int64_t chunk = first; chunk < last; ++chunk) {
      if (failed_.load(std::memory_order_relaxed)) return;
      const int64_t chunk_begin = job.begin + chunk * job.grain;
      const int64_t chunk_end =
          job.end - chunk_begin > job.grain ? chunk_begin + job.grain : job.end;
      job.fn(job.context, chunk_begin, chunk_end);
    }
  } catch (...) {
    record_exception(std::current_exception());
  }
}

void ThreadPool::worker_loop(int participant) {
  tls_inside_parallel_region = true;
  uint64_t seen_generation = 0;
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      job = job_;
    }
    if (participant < job.num_participants) run_share(job, participant);
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, void* context) {
  if (grain <= 0) DI_THROW("parallel_for: grain must be positive, got ", grain);
  if (end <= begin) return;
  const int64_t num_chunks = (end - begin - 1) / grain + 1;
  if (tls_inside_parallel_region || workers_.empty() || num_chunks == 1) {
    run_chunks_inline(begin, end, grain, fn, context);
    return;
  }

  std::lock_guard submit(submit_mutex_);
  Job job;
  job.fn = fn;
  job.context = context;
  job.begin = begin;
  job.end = end;
  job.grain = grain;
  job.num_chunks = num_chunks;
  job.num_participants = static_cast<int>(num_chunks < num_threads() ? num_chunks : num_threads());
  {
    std::lock_guard lock(mutex_);
    job_ = job;
    failed_.store(false, std::memory_order_relaxed);
    first_error_ = nullptr;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_ready_.notify_all();

  tls_inside_parallel_region = true;
  run_share(job, 0);
  tls_inside_parallel_region = false;

  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    work_done_.wait(lock, [&] { return pending_ == 0; });
    error = std::exchange(first_error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace deepinfer
