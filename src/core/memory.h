// Memory: the Allocator interface every device implements, the host allocator, an owning
// Buffer, and the per-step scratch Arena.
//
// Nothing is allocated in the step loop: long-lived state comes from allocators at start-up,
// per-step temporaries come from an Arena whose block is reserved once and reset every step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace deepinfer {

// 64 bytes: one cache line, and enough for any AVX-512 load.
inline constexpr size_t kDefaultAlignment = 64;
// Arena blocks are aligned for the strictest consumer (CUDA allocations are 256-byte aligned).
inline constexpr size_t kArenaAlignment = 256;

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

// Per-step scratch: a block reserved once from an allocator, handed out by bumping an offset and
// reclaimed all at once by reset(). A steady-state step therefore makes no system allocation.
// Not thread-safe: give each thread (or each step owner) its own arena.
class Arena {
 public:
  // Reserves `capacity` bytes now; `name` appears in errors ("decode scratch").
  Arena(Allocator& allocator, size_t capacity, std::string name = "arena");
  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `bytes` bytes aligned to `alignment` (a power of two, at most the block's alignment),
  // valid until the next reset(). Throws Error naming the request, the bytes in use and the
  // capacity when the block is exhausted. allocate(0) returns a valid, non-dereferenceable
  // pointer.
  void* allocate(size_t bytes, size_t alignment = kDefaultAlignment);
  // Frees everything allocated since the last reset (the high-water mark stays).
  void reset() { used_ = 0; }

  size_t capacity() const { return block_.size(); }
  size_t used() const { return used_; }
  // The most bytes ever in use at once: size the arena from it after a warm-up step.
  size_t high_water() const { return high_water_; }
  Device device() const { return block_.device(); }
  const std::string& name() const { return name_; }

 private:
  Buffer block_;
  size_t block_alignment_ = kArenaAlignment;
  size_t used_ = 0;
  size_t high_water_ = 0;
  std::string name_;
};

}  // namespace deepinfer
