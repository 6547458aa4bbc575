// Memory: the Allocator interface every device implements, the host allocator, an owning
// Buffer, and the per-step scratch Arena.
//
// Nothing is allocated in the step loop: long-lived state comes from allocators at start-up,
// per-step temporaries come from an Arena whose block is reserved once and reset every step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace deepinfer {

// 64 bytes: one cache line, and enough for any AVX-512 load.
inline constexpr size_t kDefaultAlignment = 64;

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns `bytes` bytes aligned to `alignment` (a power of two). allocate(0) returns nullptr.
  // Throws Error when the memory is not available, naming the size.
  virtual void* allocate(size_t bytes, size_t alignment = kDefaultAlignment) = 0;
  // Returns memory from allocate() with the same size and alignment; nullptr is a no-op.
  virtual void deallocate(void* ptr, size_t bytes, size_t alignment = kDefaultAlignment) = 0;
  // Where the memory lives (the device a kernel must run on to touch it).
  virtual Device device() const = 0;
};

// Host memory with at least 64-byte alignment. Allocations of 2 MiB or more are aligned to
// 2 MiB and advised as transparent-huge-page candidates (weights, KV pools, arenas), which
// cuts TLB misses on large sequential scans.
class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, size_t alignment = kDefaultAlignment) override;
  void deallocate(void* ptr, size_t bytes, size_t alignment = kDefaultAlignment) override;
  Device device() const override { return Device::cpu(); }
};

// The process-wide host allocator (stateless, thread-safe).
Allocator& host_allocator();

// Forwards to another allocator and counts calls and live bytes; tests use it to prove that a
// steady-state step allocates nothing. Not thread-safe.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator& inner) : inner_(&inner) {}
  void* allocate(size_t bytes, size_t alignment = kDefaultAlignment) override;
  void deallocate(void* ptr, size_t bytes, size_t alignment = kDefaultAlignment) override;
  Device device() const override { return inner_->device(); }

  int64_t allocations() const { return allocations_; }
  int64_t deallocations() const { return deallocations_; }
  size_t live_bytes() const { return live_bytes_; }

 private:
  Allocator* inner_;
  int64_t allocations_ = 0;
  int64_t deallocations_ = 0;
  size_t live_bytes_ = 0;
};

// Owns `bytes` bytes from an allocator; move-only. The allocator must outlive the buffer.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& allocator, size_t bytes, size_t alignment = kDefaultAlignment);
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }
  bool empty() const { return bytes_ == 0; }

 private:
  void release() noexcept;

  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t alignment_ = kDefaultAlignment;
  Device device_ = Device::cpu();
};

}  // namespace deepinfer
