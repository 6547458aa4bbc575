// The CUDA backend's runtime pieces that host code uses: the device allocator, streams, copies
// of tensor views between host and device, and the synchronization point that reports errors
// kernels found in their inputs. No CUDA header is needed to include this file.
#pragma once

#include <cstdint>

#include "core/memory.h"
#include "core/tensor.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace deepinfer::cuda {

using StreamHandle = CUstream_st*;

// cudaMalloc-backed memory on one GPU (256-byte aligned; larger alignments are refused).
// Long-lived: weights, state pools, and the block an activation Arena carves up.
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int ordinal) : ordinal_(ordinal) {}
  void* allocate(size_t bytes, size_t alignment = kDefaultAlignment) override;
  void deallocate(void* ptr, size_t bytes, size_t alignment = kDefaultAlignment) override;
  Device device() const override { return Device::cuda(ordinal_); }

 private:
  int ordinal_;
};

// The process-wide allocator of GPU `ordinal` (checks that the GPU is supported on first use).
Allocator& device_allocator(int ordinal = 0);

// An owned, non-blocking CUDA stream.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle handle() const { return handle_; }
  void synchronize() const;

 private:
  StreamHandle handle_ = nullptr;
};

// The stream ops::cuda launches on for this thread (the legacy default stream unless set).
StreamHandle current_stream();
// Makes `stream` current for this thread while it lives, then restores the previous one.
class StreamScope {
 public:
  explicit StreamScope(const Stream& stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  StreamHandle previous_;
};

// Copies src into dst (same dtype and shape; host or device on either side), ordered on the
// current stream. Both views must be contiguous, or dense rows with a row stride (a column
// slice of a wider matrix). A host source may be reused as soon as this returns.
void copy(const TensorView& src, const TensorView& dst);
// A new device tensor holding a copy of `host`.
Tensor to_device(const TensorView& host, int ordinal = 0);
// A new host tensor holding a copy of `device_view` (waits for the copy).
Tensor to_host(const TensorView& device_view);
// Sets every byte of a contiguous device view (tests fill outputs with a NaN sentinel).
void fill_bytes(const TensorView& view, uint8_t byte);

// Free bytes on GPU `ordinal` (cudaMemGetInfo); checks the GPU as device_allocator does.
int64_t free_memory(int ordinal);

// The current device's streaming multiprocessors (cudaDevAttrMultiProcessorCount, queried once a
// device): the persistent kernels' grid sizes.
int multiprocessor_count();

// Whether the current device runs sm_90a's warpgroup MMA (compute capability 9.0; queried once a
// device): the wgmma kernels' host-side gate, so another part (SM100's tcgen05 has no wgmma)
// keeps the kernels built for it.
bool device_has_wgmma();

// Waits for the current stream, then throws Error if any kernel since the last call met an
// index outside its table (kernels cannot throw: they record the first such problem, skip the
// bad entry, and report it here).
void synchronize();

}  // namespace deepinfer::cuda
