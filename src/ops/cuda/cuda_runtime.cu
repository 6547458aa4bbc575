// Device allocator, streams, copies and the kernel error word.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "ops/cuda/branch_streams.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"

namespace deepinfer::cuda {
namespace {

thread_local StreamHandle t_current_stream = nullptr;
// True while this thread records ops into a graph (GraphRecorder::begin .. end).
thread_local bool t_recording = false;

// Host-side description of a view as `rows` rows of `row_bytes` bytes, `pitch` bytes apart.
struct RowLayout {
  size_t rows = 0;
  size_t row_bytes = 0;
  size_t pitch = 0;
};

RowLayout row_layout(const TensorView& view, const char* what) {
  RowLayout layout;
  if (view.is_contiguous() || view.rank() <= 1) {
    DI_CHECK(view.is_contiguous(), what, " must be contiguous: ", view.to_string());
    layout.rows = 1;
    layout.row_bytes = view.nbytes();
    layout.pitch = layout.row_bytes;
    return layout;
  }
  int64_t inner = 1;
  for (int d = view.rank() - 1; d >= 1; --d) {
    if (view.size(d) != 1 && view.stride(d) != inner) {
      DI_THROW(what, " must be contiguous or dense rows to be copied: ", view.to_string());
    }
    inner *= view.size(d);
  }
  layout.rows = static_cast<size_t>(view.size(0));
  layout.row_bytes = dtype_storage_bytes(view.dtype(), inner);
  layout.pitch = dtype_storage_bytes(view.dtype(), view.stride(0));
  return layout;
}

// Host-to-device copies of host metadata go through one pinned ring per GPU. From pageable
// memory cudaMemcpyAsync may wait for the stream before it stages the bytes, so every upload in
// a step would drain the GPU queue and leave it idle while the host enqueues the next ops; from
// pinned memory the copy is queued like a kernel and the host runs ahead. A region of the ring
// is reused only after the event recorded behind its copy has fired.
class PinnedStaging {
 public:
  static constexpr size_t kCapacity = size_t{16} << 20;
  // Copies above this go the pageable way (weights and other large one-off copies).
  static constexpr size_t kLargest = kCapacity / 4;

  ~PinnedStaging() {
    // Process exit: the CUDA context may be gone already, so nothing here may throw or wait.
    for (const InFlight& copy : in_flight_) cudaEventDestroy(copy.done);
    for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
    if (ring_ != nullptr) cudaFreeHost(ring_);
  }

  void copy_to_device(void* dst, const void* host, size_t bytes, StreamHandle stream) {
    const std::lock_guard lock(mutex_);
    if (ring_ == nullptr) {
      void* ring = nullptr;
      DI_CUDA_CHECK(cudaHostAlloc(&ring, kCapacity, cudaHostAllocPortable));
      ring_ = static_cast<std::byte*>(ring);
    }
    const size_t length = (bytes + 255) / 256 * 256;
    // Copies that are done give their events back (else the deque would hold one per upload
    // until the ring wraps, creating an event for each).
    while (!in_flight_.empty()) {
      const cudaError_t state = cudaEventQuery(in_flight_.front().done);
      if (state == cudaErrorNotReady) {
        cudaGetLastError();  // "not ready" is no error: keep it from the next launch check
        break;
      }
      DI_CUDA_CHECK(state);
      spare_events_.push_back(in_flight_.front().done);
      in_flight_.pop_front();
    }
    if (head_ + length > kCapacity) head_ = 0;
    // Regions are handed out in ring order, so the oldest copy in flight is the first one the
    // new region can overlap.
    while (!in_flight_.empty() && in_flight_.front().begin < head_ + length &&
           head_ < in_flight_.front().end) {
      DI_CUDA_CHECK(cudaEventSynchronize(in_flight_.front().done));
      spare_events_.push_back(in_flight_.front().done);
      in_flight_.pop_front();
    }
    std::memcpy(ring_ + head_, host, bytes);
    DI_CUDA_CHECK(cudaMemcpyAsync(dst, ring_ + head_, bytes, cudaMemcpyHostToDevice, stream));
    cudaEvent_t done = nullptr;
    if (spare_events_.empty()) {
      DI_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = spare_events_.back();
      spare_events_.pop_back();
    }
    DI_CUDA_CHECK(cudaEventRecord(done, stream));
    in_flight_.push_back({head_, head_ + length, done});
    head_ += length;
  }

 private:
  struct InFlight {
    size_t begin = 0;
    size_t end = 0;
    cudaEvent_t done = nullptr;
  };
  std::mutex mutex_;
  std::byte* ring_ = nullptr;
  size_t head_ = 0;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
};

// DEEPINFER_PINNED_UPLOADS=0: cudaMemcpyAsync straight from the pageable source (the path before
// the staging ring; the host then waits for each copy), kept to rule the ring out when debugging.
RuntimeSwitch kPinnedUploads{"DEEPINFER_PINNED_UPLOADS", true};

bool pinned_uploads_enabled() {
  return kPinnedUploads.enabled();
}

}  // namespace

void upload_bytes(void* device_dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  // A recorded copy would replay from the staging slot of the recording, which later uploads
  // overwrite: ops with per-call host data must stay outside recorded segments.
  if (t_recording) {
    DI_THROW("an op uploads ", bytes, " bytes of host data inside a recorded op sequence (CUDA ",
             "graph): it must run outside the recorded segments");
  }
  if (!pinned_uploads_enabled() || bytes > PinnedStaging::kLargest) {
    DI_CUDA_CHECK(
        cudaMemcpyAsync(device_dst, host, bytes, cudaMemcpyHostToDevice, current_stream()));
    return;
  }
  constexpr int kMaxDevices = 16;
  static std::array<PinnedStaging, kMaxDevices> staging;
  int device = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  DI_CHECK(device >= 0 && device < kMaxDevices, "CUDA ordinal ", device);
  staging[static_cast<size_t>(device)].copy_to_device(device_dst, host, bytes, current_stream());
}

void* DeviceAllocator::allocate(size_t bytes, size_t alignment) {
  if (bytes == 0) return nullptr;
  if (alignment > kArenaAlignment) {
    DI_THROW("device allocations are ", kArenaAlignment, "-byte aligned; ", alignment,
             " was requested");
  }
  int previous = 0;
  DI_CUDA_CHECK(cudaGetDevice(&previous));
  DI_CUDA_CHECK(cudaSetDevice(ordinal_));
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  DI_CUDA_CHECK(cudaSetDevice(previous));
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    DI_THROW("cannot allocate ", bytes, " bytes on cuda:", ordinal_, " (", free_bytes, " free of ",
             total_bytes, "): ", cudaGetErrorString(status));
  }
  return ptr;
}

void DeviceAllocator::deallocate(void* ptr, size_t, size_t) {
  if (ptr != nullptr) cudaFree(ptr);  // never throws: called from destructors
}

int64_t free_memory(int ordinal) {
  device_allocator(ordinal);  // the GPU checks, with their errors
  int previous = 0;
  DI_CUDA_CHECK(cudaGetDevice(&previous));
  DI_CUDA_CHECK(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
  DI_CUDA_CHECK(cudaSetDevice(previous));
  DI_CUDA_CHECK(status);
  return static_cast<int64_t>(free_bytes);
}

bool device_has_wgmma() {
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> known{};  // 0: not queried, 1: no, 2: yes
  int device = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  const auto query = [device] {
    int major = 0;
    int minor = 0;
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
  };
  if (device >= kCachedDevices) return query();
  int state = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (state == 0) {
    state = query() ? 2 : 1;
    known[static_cast<size_t>(device)].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

int multiprocessor_count() {
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> counts{};  // 0: not yet queried
  int device = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kCachedDevices) {
    int count = 0;
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }
  int count = counts[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (count == 0) {
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    counts[static_cast<size_t>(device)].store(count, std::memory_order_relaxed);
  }
  return count;
}

namespace {

// StreamBuffer's stream-ordered allocations come from the device's default memory pool, which by
// default hands its unused memory back to the system at every synchronization, so each decode
// step's first allocations mapped memory again: 130-250 us of host time in cudaMallocAsync, the
// longest idle gaps of a traced step (cuda_model_bench's largest_gaps, H200 2026-12-02: 320 us at
// the start of a b256 step, 156 us in a b64 one). The pool keeps up to this many MiB between
// synchronizations (DEEPINFER_CUDA_POOL_KEEP_MB; 0: the driver's default, keep nothing), as a
// caching allocator would: that much of a step's scratch stays reserved for the next step.
deepinfer::cuda::RuntimeSetting kPoolKeepMb{"DEEPINFER_CUDA_POOL_KEEP_MB", 4096, 0, 1 << 20};

void keep_pool_memory(int ordinal) {
  cudaMemPool_t pool = nullptr;
  DI_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal));
  uint64_t keep = static_cast<uint64_t>(kPoolKeepMb.value()) << 20;
  DI_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

}  // namespace

Allocator& device_allocator(int ordinal) {
  constexpr int kMaxDevices = 16;
  static std::array<std::unique_ptr<DeviceAllocator>, kMaxDevices> allocators;
  static std::mutex mutex;
  DI_CHECK(ordinal >= 0 && ordinal < kMaxDevices, "CUDA ordinal ", ordinal);
  std::lock_guard<std::mutex> lock(mutex);
  if (!allocators[static_cast<size_t>(ordinal)]) {
    require_supported_device(ordinal);
    keep_pool_memory(ordinal);
    allocators[static_cast<size_t>(ordinal)] = std::make_unique<DeviceAllocator>(ordinal);
  }
  return *allocators[static_cast<size_t>(ordinal)];
}

Stream::Stream() {
  cudaStream_t stream = nullptr;
  DI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  handle_ = stream;
}

Stream::~Stream() {
  if (handle_ != nullptr) cudaStreamDestroy(handle_);
}

void Stream::synchronize() const {
  DI_CUDA_CHECK(cudaStreamSynchronize(handle_));
}

StreamHandle current_stream() {
  return t_current_stream;
}

StreamScope::StreamScope(const Stream& stream) : previous_(t_current_stream) {
  t_current_stream = stream.handle();
}

StreamScope::~StreamScope() {
  t_current_stream = previous_;
}

namespace {

// The branch stream and its two events, per thread and device (created on a branch's first
// use, which the model's eager first sighting of a segment makes before any recording).
struct BranchStreams {
  static constexpr int kMaxDevices = 16;
  struct PerDevice {
    cudaStream_t stream = nullptr;
    cudaEvent_t forked = nullptr;
    cudaEvent_t done = nullptr;
  };
  std::array<PerDevice, kMaxDevices> devices{};
  PerDevice* open = nullptr;     // the open branch's device, null when none is open
  StreamHandle trunk = nullptr;  // the stream the open branch forked from
  bool inside = false;           // the branch's stream is current
  ~BranchStreams() {
    // Thread or process exit: the context may be gone already, so nothing here may throw.
    for (PerDevice& device : devices) {
      if (device.stream != nullptr) cudaStreamDestroy(device.stream);
      if (device.forked != nullptr) cudaEventDestroy(device.forked);
      if (device.done != nullptr) cudaEventDestroy(device.done);
    }
  }
};

BranchStreams& branch_streams() {
  thread_local BranchStreams streams;
  return streams;
}

// false: ops::ConcurrentBranch runs its ops in place on the current stream (the A/B of
// docs/CUDA.md, "Concurrent branches").
RuntimeSwitch kConcurrentBranches{"DEEPINFER_CONCURRENT_BRANCHES", true};

}  // namespace

bool branches_enabled() {
  return kConcurrentBranches.enabled();
}

void open_branch() {
  BranchStreams& branches = branch_streams();
  DI_CHECK(branches.open == nullptr, "a concurrent branch is already open on this thread");
  int device = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  DI_CHECK(device >= 0 && device < BranchStreams::kMaxDevices, "CUDA ordinal ", device);
  BranchStreams::PerDevice& branch = branches.devices[static_cast<size_t>(device)];
  if (branch.stream == nullptr) {
    DI_CUDA_CHECK(cudaStreamCreateWithFlags(&branch.stream, cudaStreamNonBlocking));
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&branch.forked, cudaEventDisableTiming));
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&branch.done, cudaEventDisableTiming));
  }
  // Recorded on a stream that is being captured, the event and the wait put the branch's stream
  // into the same capture: its ops become the graph's parallel nodes.
  DI_CUDA_CHECK(cudaEventRecord(branch.forked, t_current_stream));
  DI_CUDA_CHECK(cudaStreamWaitEvent(branch.stream, branch.forked, 0));
  branches.open = &branch;
  branches.trunk = t_current_stream;
}

void enter_branch() {
  BranchStreams& branches = branch_streams();
  DI_CHECK(branches.open != nullptr && !branches.inside && t_current_stream == branches.trunk,
           "enter_branch needs an open branch entered from the stream it forked from");
  t_current_stream = branches.open->stream;
  branches.inside = true;
}

void leave_branch() noexcept {
  BranchStreams& branches = branch_streams();
  if (!branches.inside) return;
  t_current_stream = branches.trunk;
  branches.inside = false;
}

void join_branch() {
  BranchStreams& branches = branch_streams();
  DI_CHECK(branches.open != nullptr && !branches.inside && t_current_stream == branches.trunk,
           "join_branch needs an open branch, joined from the stream it forked from");
  BranchStreams::PerDevice& branch = *branches.open;
  branches.open = nullptr;
  DI_CUDA_CHECK(cudaEventRecord(branch.done, branch.stream));
  DI_CUDA_CHECK(cudaStreamWaitEvent(branches.trunk, branch.done, 0));
}

void copy(const TensorView& src, const TensorView& dst) {
  if (src.dtype() != dst.dtype() || !(src.shape() == dst.shape())) {
    DI_THROW("cuda::copy needs equal dtype and shape: ", src.to_string(), " -> ", dst.to_string());
  }
  if (src.numel() == 0) return;
  if (t_recording && (src.device().is_cpu() || dst.device().is_cpu())) {
    DI_THROW("a copy between host and device inside a recorded op sequence (CUDA graph) would ",
             "replay from or into the host address of the recording: ", src.to_string(), " -> ",
             dst.to_string());
  }
  const RowLayout from = row_layout(src, "copy source");
  const RowLayout to = row_layout(dst, "copy destination");
  DI_CHECK(from.rows * from.row_bytes == to.rows * to.row_bytes, "copy layouts disagree");
  if (from.rows == 1 && to.rows == 1 && src.device().is_cpu() && dst.device().is_cuda()) {
    upload_bytes(dst.raw_data(), src.raw_data(), from.row_bytes);
    return;
  }
  if (from.rows == 1 && to.rows == 1) {
    DI_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), from.row_bytes, cudaMemcpyDefault,
                                  current_stream()));
    return;
  }
  // One side may be a single contiguous run: describe it with the other side's rows.
  const size_t rows = std::max(from.rows, to.rows);
  const size_t row_bytes = std::min(from.row_bytes, to.row_bytes);
  const size_t src_pitch = from.rows == 1 ? row_bytes : from.pitch;
  const size_t dst_pitch = to.rows == 1 ? row_bytes : to.pitch;
  DI_CUDA_CHECK(cudaMemcpy2DAsync(dst.raw_data(), dst_pitch, src.raw_data(), src_pitch, row_bytes,
                                  rows, cudaMemcpyDefault, current_stream()));
}

Tensor to_device(const TensorView& host, int ordinal) {
  Tensor result = Tensor::empty(host.dtype(), host.shape(), device_allocator(ordinal));
  copy(host, result.view());
  return result;
}

Tensor to_host(const TensorView& device_view) {
  Tensor result = Tensor::empty(device_view.dtype(), device_view.shape());
  copy(device_view, result.view());
  DI_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  return result;
}

void fill_bytes(const TensorView& view, uint8_t byte) {
  DI_CHECK(view.device().is_cuda() && view.is_contiguous(), "fill_bytes needs a contiguous device ",
           "view: ", view.to_string());
  if (view.numel() == 0) return;
  DI_CUDA_CHECK(cudaMemsetAsync(view.raw_data(), byte, view.nbytes(), current_stream()));
}

int* kernel_error_word() {
  static int* word = [] {
    int* ptr = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&ptr, sizeof(int)));
    DI_CUDA_CHECK(cudaMemset(ptr, 0, sizeof(int)));
    return ptr;
  }();
  return word;
}

void synchronize() {
  DI_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  int code = 0;
  DI_CUDA_CHECK(cudaMemcpy(&code, kernel_error_word(), sizeof(int), cudaMemcpyDeviceToHost));
  if (code == kKernelOk) return;
  // Cleared in the compute stream's order, before any later kernel may report again.
  DI_CUDA_CHECK(cudaMemsetAsync(kernel_error_word(), 0, sizeof(int), current_stream()));
  DI_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  switch (code) {
    case kWindowRangeOutOfBounds:
      DI_THROW("sink_attention: a window range lies outside the window cache");
    case kCompressedIndexOutOfBounds:
      DI_THROW("sink_attention: a compressed index is past the compressed cache");
    case kEngramIdOutOfBounds:
      DI_THROW("engram_gather: a hash id is outside the engram table");
    case kMoeExpertOutOfBounds:
      DI_THROW("moe_experts: a routed expert id is outside the expert list");
    default:
      DI_THROW("a CUDA kernel reported error code ", code);
  }
}

const void* resident_copy(const void* host, size_t bytes) {
  struct Entry {
    std::vector<std::byte> content;
    void* device = nullptr;
  };
  static std::mutex mutex;
  static std::vector<Entry> entries;
  const std::lock_guard lock(mutex);
  const auto* first = static_cast<const std::byte*>(host);
  for (const Entry& entry : entries) {
    if (entry.content.size() == bytes && std::memcmp(entry.content.data(), host, bytes) == 0) {
      return entry.device;
    }
  }
  Entry entry;
  entry.content.assign(first, first + bytes);
  DI_CUDA_CHECK(cudaMalloc(&entry.device, std::max<size_t>(bytes, 1)));
  // From pageable memory cudaMemcpy may return before the DMA lands, and the legacy stream it
  // runs on does not order the non-blocking compute streams: a kernel could read the table before
  // it arrives. The stream synchronization waits for the copy itself.
  DI_CUDA_CHECK(
      cudaMemcpyAsync(entry.device, host, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
  DI_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  entries.push_back(std::move(entry));
  return entries.back().device;
}

StreamBuffer::StreamBuffer(size_t bytes) : stream_(current_stream()) {
  if (bytes == 0) return;
  DI_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream_));
}

StreamBuffer::~StreamBuffer() {
  if (data_ != nullptr) cudaFreeAsync(data_, stream_);
}

namespace {

// One instantiated graph; destroying it while a launch is in flight is allowed (the runtime
// releases it when the launch completes).
class GraphExec final : public ops::RecordedOps {
 public:
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  ~GraphExec() override { cudaGraphExecDestroy(exec_); }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  void replay() override { DI_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream())); }

 private:
  cudaGraphExec_t exec_;
};

// Records with stream capture in relaxed mode (the ops' first calls may allocate; the model
// runs every segment once uncaptured first, so one-time setup never happens inside a capture).
class GraphRecorder final : public ops::OpRecorder {
 public:
  GraphRecorder() { ops::detail::gpu_op_recorder() = this; }

  void begin_step() override {
    StepStreams& streams = step_streams();
    streams.previous.push_back(t_current_stream);
    if (t_current_stream != nullptr) return;
    // The legacy default stream cannot be captured. A blocking stream (default flags) waits for
    // the legacy stream's earlier work and the legacy stream waits for its work, so callers that
    // queue on the legacy stream see the step in order.
    int device = 0;
    DI_CUDA_CHECK(cudaGetDevice(&device));
    DI_CHECK(device >= 0 && device < kMaxDevices, "CUDA ordinal ", device);
    cudaStream_t& stream = streams.blocking[static_cast<size_t>(device)];
    if (stream == nullptr) DI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
    t_current_stream = stream;
  }

  void end_step() noexcept override {
    StepStreams& streams = step_streams();
    if (streams.previous.empty()) return;
    t_current_stream = streams.previous.back();
    streams.previous.pop_back();
  }

  void begin() override {
    DI_CHECK(!t_recording, "a recording is already open on this thread");
    DI_CHECK(t_current_stream != nullptr,
             "ops cannot be recorded on the legacy default stream (call begin_step first)");
    DI_CUDA_CHECK(cudaStreamBeginCapture(t_current_stream, cudaStreamCaptureModeRelaxed));
    t_recording = true;
  }

  std::unique_ptr<ops::RecordedOps> end() override {
    DI_CHECK(t_recording, "no recording is open on this thread");
    t_recording = false;
    cudaGraph_t graph = nullptr;
    DI_CUDA_CHECK(cudaStreamEndCapture(t_current_stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    DI_CUDA_CHECK(status);
    return std::make_unique<GraphExec>(exec);
  }

  void abandon() noexcept override {
    if (!t_recording) return;
    t_recording = false;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(t_current_stream, &graph) == cudaSuccess && graph != nullptr) {
      cudaGraphDestroy(graph);
    }
    cudaGetLastError();  // an invalidated capture's error belongs to the op that threw
  }

 private:
  static constexpr int kMaxDevices = 16;
  struct StepStreams {
    std::vector<StreamHandle> previous;
    std::array<cudaStream_t, kMaxDevices> blocking{};
    ~StepStreams() {
      // Thread or process exit: the context may be gone already, so nothing here may throw.
      for (cudaStream_t stream : blocking) {
        if (stream != nullptr) cudaStreamDestroy(stream);
      }
    }
  };
  static StepStreams& step_streams() {
    thread_local StepStreams streams;
    return streams;
  }
};

GraphRecorder graph_recorder;

}  // namespace

}  // namespace deepinfer::cuda
