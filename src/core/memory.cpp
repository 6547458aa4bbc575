#include "core/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <utility>

#include "core/error.h"

namespace deepinfer {
namespace {

constexpr size_t kHugePageBytes = size_t{2} << 20;

bool is_power_of_two(size_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

size_t effective_host_alignment(size_t bytes, size_t alignment) {
  if (!is_power_of_two(alignment)) {
    DI_THROW("allocation alignment must be a power of two, got ", alignment);
  }
  if (alignment < kDefaultAlignment) alignment = kDefaultAlignment;
  if (bytes >= kHugePageBytes && alignment < kHugePageBytes) alignment = kHugePageBytes;
  return alignment;
}

}  // namespace

void* HostAllocator::allocate(size_t bytes, size_t alignment) {
  if (bytes == 0) return nullptr;
  const size_t align = effective_host_alignment(bytes, alignment);
  if (bytes > SIZE_MAX - align) DI_THROW("host allocation of ", bytes, " bytes is too large");
  // aligned_alloc requires the size to be a multiple of the alignment.
  void* ptr = std::aligned_alloc(align, round_up(bytes, align));
  if (ptr == nullptr) {
    DI_THROW("out of host memory: could not allocate ", bytes, " bytes (alignment ", align, ")");
  }
#ifdef MADV_HUGEPAGE
  // Advice only: failure (no THP support) is harmless.
  if (align >= kHugePageBytes) (void)madvise(ptr, round_up(bytes, align), MADV_HUGEPAGE);
#endif
  return ptr;
}

void HostAllocator::deallocate(void* ptr, size_t /*bytes*/, size_t /*alignment*/) {
  std::free(ptr);
}

Allocator& host_allocator() {
  static HostAllocator allocator;
  return allocator;
}

void* CountingAllocator::allocate(size_t bytes, size_t alignment) {
  void* ptr = inner_->allocate(bytes, alignment);
  ++allocations_;
  live_bytes_ += bytes;
  return ptr;
}

void CountingAllocator::deallocate(void* ptr, size_t bytes, size_t alignment) {
  if (ptr == nullptr) return;
  inner_->deallocate(ptr, bytes, alignment);
  ++deallocations_;
  live_bytes_ -= bytes;
}

Buffer::Buffer(Allocator& allocator, size_t bytes, size_t alignment)
    : allocator_(&allocator),
      data_(allocator.allocate(bytes, alignment)),
      bytes_(bytes),
      alignment_(alignment),
      device_(allocator.device()) {}

Buffer::Buffer(Buffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      alignment_(other.alignment_),
      device_(other.device_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    allocator_ = std::exchange(other.allocator_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    alignment_ = other.alignment_;
    device_ = other.device_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->deallocate(data_, bytes_, alignment_);
  allocator_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace deepinfer

namespace deepinfer {

Arena::Arena(Allocator& allocator, size_t capacity, std::string name)
    : block_(allocator, capacity, kArenaAlignment), name_(std::move(name)) {}

void* Arena::allocate(size_t bytes, size_t alignment) {
  if (!is_power_of_two(alignment) || alignment > block_alignment_) {
    DI_THROW("arena '", name_, "': alignment ", alignment, " must be a power of two of at most ",
             block_alignment_);
  }
  const size_t start = round_up(used_, alignment);
  if (start > block_.size() || bytes > block_.size() - start) {
    DI_THROW("arena '", name_, "' exhausted: asked for ", bytes, " bytes (alignment ", alignment,
             ") with ", used_, " of ", block_.size(),
             " bytes in use; raise its capacity (high-water mark so far ", high_water_, " bytes)");
  }
  used_ = start + bytes;
  if (used_ > high_water_) high_water_ = used_;
  return static_cast<std::byte*>(block_.data()) + start;
}

}  // namespace deepinfer
