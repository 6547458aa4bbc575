// Shared by the CUDA kernels: error checking, device views as row matrices, scratch memory
// ordered on the stream, block reductions, and the scalar numerics of the storage formats
// (bit-exact with ops/cpu/numerics.h).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"

#define DI_CUDA_CHECK(expression)                                                           \
  do {                                                                                      \
    if (const cudaError_t di_cuda_status = (expression); di_cuda_status != cudaSuccess) {   \
      DI_THROW("CUDA error in ", #expression, ": ", cudaGetErrorName(di_cuda_status), " (", \
               cudaGetErrorString(di_cuda_status), ")");                                    \
    }                                                                                       \
  } while (false)

// After a <<<...>>> launch: reports a bad configuration at the call that made it.
#define DI_CUDA_LAUNCHED(kernel_name) DI_CUDA_CHECK(cudaGetLastError())

namespace deepinfer::cuda {

// What kernels record in the device error word (first problem wins).
enum KernelError : int {
  kKernelOk = 0,
  kWindowRangeOutOfBounds = 1,
  kCompressedIndexOutOfBounds = 2,
  kEngramIdOutOfBounds = 3,
  kMoeExpertOutOfBounds = 4,
};

// The device word kernels record problems into (allocated on first use, one per process).
int* kernel_error_word();

template <typename T>
struct DeviceRows {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between row starts
  __host__ __device__ T* row(int64_t r) const { return data + r * stride; }
};

// A device view as rows: the first dimension is the row, everything after it dense.
template <typename T>
DeviceRows<T> device_rows(const TensorView& view, const char* what) {
  DI_CHECK(view.device().is_cuda(), what, " is not in device memory: ", view.to_string());
  DI_CHECK(view.dtype() == DTypeOf<std::remove_const_t<T>>::value, what, " has dtype ",
           dtype_name(view.dtype()));
  DI_CHECK(view.rank() >= 1, what, " must have a row dimension");
  DeviceRows<T> result;
  result.rows = view.size(0);
  result.cols = 1;
  for (int d = view.rank() - 1; d >= 1; --d) {
    DI_CHECK(view.size(d) == 1 || view.stride(d) == result.cols, what,
             " must be dense after its first dimension: ", view.to_string());
    result.cols *= view.size(d);
  }
  result.stride = view.stride(0);
  result.data = result.rows * result.cols == 0 ? nullptr : view.data<std::remove_const_t<T>>();
  return result;
}

// A contiguous device view as a flat pointer.
template <typename T>
T* device_flat(const TensorView& view, const char* what) {
  DI_CHECK(view.device().is_cuda(), what, " is not in device memory: ", view.to_string());
  DI_CHECK(view.dtype() == DTypeOf<std::remove_const_t<T>>::value, what, " has dtype ",
           dtype_name(view.dtype()));
  DI_CHECK(view.is_contiguous(), what, " must be contiguous: ", view.to_string());
  return view.numel() == 0 ? nullptr : view.data<std::remove_const_t<T>>();
}

// Device memory for one op's temporaries, allocated and freed in stream order (no host sync).
// Part 2 replaces these with the step's activation arena.
class StreamBuffer {
 public:
  explicit StreamBuffer(size_t bytes);
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  StreamHandle stream_ = nullptr;  // freed on the stream it was allocated on
};

// A device copy of `bytes` host bytes shared by every call with the same content and kept for
// the process's life: long-lived tables (rope frequencies, expert weight descriptors) upload
// once instead of once per call. Content must hold no padding bytes.
const void* resident_copy(const void* host, size_t bytes);

// Copies `bytes` host bytes to device memory in stream order, through a pinned staging ring
// (so the host does not wait for the GPU; DEEPINFER_PINNED_UPLOADS=0: straight from the
// pageable source). `host` may be reused as soon as this returns.
void upload_bytes(void* device_dst, const void* host, size_t bytes);

// Copies host metadata (positions, ids, tables) to the device in stream order.
template <typename T>
T* upload(StreamBuffer& buffer, const T* host, size_t count) {
  upload_bytes(buffer.as<T>(), host, count * sizeof(T));
  return buffer.as<T>();
}

inline unsigned blocks_for(int64_t work, int threads) {
  return static_cast<unsigned>((work + threads - 1) / threads);
}

inline bool aligned_to(const void* pointer, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// Bad arguments are the caller's error (Error naming them), not an internal one.
template <typename... Parts>
void require(bool condition, const Parts&... parts) {
  if (!condition) DI_THROW(parts...);
}

// ---- device numerics --------------------------------------------------------------------

__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ float e4m3_to_float(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = __int_as_float(0x7fc00000);
  } else if (exponent == 0) {
    magnitude = ldexpf(static_cast<float>(mantissa), -9);
  } else {
    magnitude = ldexpf(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return (bits >> 7) ? -magnitude : magnitude;
}

// Two e4m3 codes (the low byte first) -> two floats, exactly: the hardware's e4m3x2 -> f16x2
// conversion (every e4m3 value, subnormals included, is an f16 normal; NaN stays NaN), then f16 ->
// f32. A few instructions for two weights, where decoding the fields costs a dozen per weight.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_codes) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(static_cast<uint16_t>(two_codes)));
  float low, high;
  asm("cvt.f32.f16 %0, %1;" : "=f"(low) : "h"(static_cast<uint16_t>(halves & 0xFFFF)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(high) : "h"(static_cast<uint16_t>(halves >> 16)));
  return make_float2(low, high);
}

// 2^(bits - 127) placed straight into the exponent field (ldexpf costs a call per decode, and
// the GEMMs decode a scale per 32 weights); code 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_float(uint8_t bits) {
  if (bits == 0xFF) return __int_as_float(0x7fc00000);
  return bits == 0 ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(bits) << 23);
}

__device__ __forceinline__ float e2m1_to_float(uint8_t code) {
  const uint8_t magnitude = code & 0x7;
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6
  const float value = magnitude < 4 ? 0.5f * magnitude
                                    : static_cast<float>(1 << ((magnitude >> 1) - 1)) *
                                          ((magnitude & 1) ? 1.5f : 1.0f);
  return (code & 0x8) ? -value : value;
}

// Nearest e4m3 value (ties to even) for |x| <= 448.
__device__ __forceinline__ float round_to_e4m3(float x) {
  if (x == 0.0f || !isfinite(x)) return x;
  const int exponent = max(ilogbf(x), -6);
  const float quantum = ldexpf(1.0f, exponent - 3);
  return rintf(x / quantum) * quantum;
}

// Nearest e2m1 value (ties to even) for |x| <= 6.
__device__ __forceinline__ float round_to_e2m1(float x) {
  const float magnitude = fabsf(x);
  const float quantum = magnitude < 2.0f ? 0.5f : (magnitude < 4.0f ? 1.0f : 2.0f);
  return copysignf(rintf(magnitude / quantum) * quantum, x);
}

// 2^ceil(log2(t)) for t > 0 from the IEEE bits, as the reference's ue8m0 rounding.
__device__ __forceinline__ float pow2_ceil(float t) {
  const uint32_t bits = __float_as_uint(t);
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0);
  return ldexpf(1.0f, exponent);
}

// The ue8m0 scale of an fp8 block with this amax.
__device__ __forceinline__ float fp8_block_scale(float amax) {
  return pow2_ceil(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
}

__device__ __forceinline__ float fp8_fake_quant(float v, float scale) {
  return round_to_e4m3(fminf(fmaxf(v / scale, -448.0f), 448.0f)) * scale;
}

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ float sigmoidf(float v) {
  return 1.0f / (1.0f + expf(-v));
}

// ---- reductions ----------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over the block (every thread gets the result). `scratch` holds 32 floats; the block size
// is a multiple of 32. Reuses scratch, so it synchronizes before returning.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float total = -INFINITY;
  for (int w = 0; w < warps; ++w) total = fmaxf(total, scratch[w]);
  __syncthreads();
  return total;
}

__device__ __forceinline__ void record_error(int* word, int code) {
  atomicCAS(word, 0, code);
}

}  // namespace deepinfer::cuda

namespace deepinfer::cuda {

// One warp quantizes `length` values (any length) as one fp8 block: e4m3 times the ue8m0 scale
// of the block's amax. `in` and `out` may be the same.
__device__ __forceinline__ void warp_fake_quant_fp8_block(const float* in, float* out,
                                                          int64_t length) {
  const int lane = threadIdx.x & 31;
  float amax = 0.0f;
  for (int64_t k = lane; k < length; k += 32) amax = fmaxf(amax, fabsf(in[k]));
  const float scale = fp8_block_scale(warp_max(amax));
  for (int64_t k = lane; k < length; k += 32) out[k] = fp8_fake_quant(in[k], scale);
}

}  // namespace deepinfer::cuda

// ---- programmatic dependent launch ----------------------------------------------------------
//
// A decode step is some 390 small kernels in a row, each a few microseconds; between two of them
// the next one's launch and prologue cost about a microsecond the GPU spends idle. Launched as a
// programmatic dependent of the kernel before it in the stream, a kernel's blocks may start as
// soon as that kernel lets them (allow_dependent_grids, or its end) and wait on the device
// (wait_for_prior_grids) instead. The arithmetic and its order are untouched.
namespace deepinfer::ops::cuda {

// Whether the decode tiles (linear.cuh) launch as programmatic dependents (DEEPINFER_DECODE_PDL,
// on), and whether launch_dependent does (that switch and DEEPINFER_DEPENDENT_LAUNCH, on; linear.cu
// says what was checked). Off: plain stream order, the same bits. A dependent reads what the
// kernels before it wrote through L2 (__ldcg, ld.global.cg), never the non-coherent path.
bool decode_pdl_enabled();
bool dependent_launch_enabled();
// A diagnostic for bisecting the dependent launches: with DEEPINFER_DEPENDENT_LAUNCH_ONLY set to
// comma-separated pieces of kernel names, only kernels whose (mangled) name contains one of them
// launch as dependents; unset, every kernel does.
bool dependent_launch_selected(const void* kernel);

// griddepcontrol: the PTX of programmatic dependent launch (sm_90+); both are no-ops in a grid
// not launched with it or without dependents.
// Waits until every prerequisite grid has completed and its memory is visible to this thread.
__device__ __forceinline__ void wait_for_prior_grids() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Lets the next kernel of the stream, if launched as a dependent, start before this one ends.
__device__ __forceinline__ void allow_dependent_grids() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// `kernel` on `stream` as a programmatic dependent of the kernel before it when
// dependent_launch_enabled(), else in plain stream order. The contract: a thread executes
// wait_for_prior_grids() before it reads anything a kernel may write (activations, routing, tile
// lists, caches: only weights and tables that no step writes may be read before it) and before it
// writes any global memory; a thread that leaves early must touch no memory at all. Its blocks
// may run beside the kernel before until they wait; and the kernel after it, if also dependent,
// waits for this grid only, so this grid must not finish before the one it depends on (every
// kernel launched this way waits). It runs the same under a plain <<<...>>> launch (the waits are
// then no-ops).
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  if (dependent_launch_enabled() &&
      dependent_launch_selected(reinterpret_cast<const void*>(kernel))) {
    config.attrs = &dependent;
    config.numAttrs = 1;
  }
  DI_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace deepinfer::ops::cuda

// Every op file launches through these helpers; naming them once here keeps the files' own
// using-lists to what is particular to them.
namespace deepinfer::ops::cuda {
using deepinfer::cuda::aligned_to;
using deepinfer::cuda::blocks_for;
using deepinfer::cuda::current_stream;
using deepinfer::cuda::device_rows;
using deepinfer::cuda::DeviceRows;
using deepinfer::cuda::require;
using deepinfer::cuda::RuntimeSetting;
using deepinfer::cuda::RuntimeSwitch;
using deepinfer::cuda::StreamBuffer;
}  // namespace deepinfer::ops::cuda
