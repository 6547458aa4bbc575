#include "model_bench_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_runtime.h"
#include "roofline.cuh"

namespace deepinfer::model_bench {
namespace {

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// N(0, 1) for element `index` of the stream `seed`: a pure function of both, so host and
// device fills agree and no RNG state is carried between threads.
__host__ __device__ inline float normal_at(uint64_t seed, uint64_t index) {
  const uint64_t bits = splitmix64(seed ^ splitmix64(index));
  const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>((bits >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

__host__ __device__ inline uint32_t uniform_index(uint64_t seed, uint64_t index, int32_t bound) {
  return static_cast<uint32_t>(splitmix64(seed ^ splitmix64(index)) % static_cast<uint64_t>(bound));
}

// Nearest e4m3fn code (ties to even), saturating at +-448; finite input.
__host__ __device__ inline uint8_t encode_e4m3(float value) {
  const uint8_t sign = value < 0.0f ? 0x80 : 0x00;
  const float magnitude = fabsf(value);
  if (magnitude >= 448.0f) return sign | 0x7E;
  if (magnitude < 0.0009765625f) return sign;  // below half the smallest subnormal 2^-9
  int exponent = 0;
  frexpf(magnitude, &exponent);
  exponent -= 1;  // magnitude in [2^exponent, 2^(exponent + 1))
  if (exponent < -6) {
    // Subnormals (and the rounding up into 2^-6, code 8): multiples of 2^-9.
    return sign | static_cast<uint8_t>(rintf(magnitude * 512.0f));
  }
  int steps = static_cast<int>(rintf(ldexpf(magnitude, 3 - exponent)));  // in [8, 16]
  if (steps == 16) {
    steps = 8;
    exponent += 1;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | (steps - 8));
}

// The value of an e4m3fn code (finite codes: encode_e4m3 never makes the NaNs 0x7F / 0xFF).
__host__ __device__ inline float decode_e4m3(uint8_t code) {
  const float sign = (code & 0x80) != 0 ? -1.0f : 1.0f;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0) return sign * ldexpf(static_cast<float>(mantissa), -9);
  return sign * ldexpf(static_cast<float>(8 + mantissa), exponent - 10);
}

// Nearest e2m1 code (ties to even), saturating at +-6.
__host__ __device__ inline uint8_t encode_e2m1(float value) {
  const uint8_t sign = value < 0.0f ? 0x8 : 0x0;
  const float magnitude = fminf(fabsf(value), 6.0f);
  const float quantum = magnitude < 2.0f ? 0.5f : (magnitude < 4.0f ? 1.0f : 2.0f);
  const float rounded = rintf(magnitude / quantum) * quantum;
  uint8_t code;
  if (rounded <= 2.0f) {
    code = static_cast<uint8_t>(rounded * 2.0f);  // 0, 0.5, 1, 1.5, 2 -> 0..4
  } else {
    code = rounded == 3.0f ? 5 : (rounded == 4.0f ? 6 : 7);
  }
  return sign | code;
}

__host__ __device__ inline uint16_t encode_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even (finite values)
  return static_cast<uint16_t>(bits >> 16);
}

// One element (one byte for packed fp4) of a fill.
__host__ __device__ inline void fill_element(void* data, bool bf16, FillSpec spec, uint64_t seed,
                                             uint64_t i) {
  switch (spec.kind) {
    case FillKind::kNormal: {
      const float v = spec.mean + spec.stddev * normal_at(seed, i);
      if (bf16) {
        static_cast<uint16_t*>(data)[i] = encode_bf16(v);
      } else {
        static_cast<float*>(data)[i] = v;
      }
      break;
    }
    case FillKind::kE4m3:
      static_cast<uint8_t*>(data)[i] = encode_e4m3(spec.stddev * normal_at(seed, i));
      break;
    case FillKind::kE4m3Values: {
      const float v = decode_e4m3(encode_e4m3(spec.stddev * normal_at(seed, i)));
      if (bf16) {
        static_cast<uint16_t*>(data)[i] = encode_bf16(v);  // exact: 4 significant bits
      } else {
        static_cast<float*>(data)[i] = v;
      }
      break;
    }
    case FillKind::kE2m1Packed: {
      const uint8_t low = encode_e2m1(spec.stddev * normal_at(seed, 2 * i));
      const uint8_t high = encode_e2m1(spec.stddev * normal_at(seed, 2 * i + 1));
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(low | (high << 4));
      break;
    }
    case FillKind::kByte:
      static_cast<uint8_t*>(data)[i] = spec.byte;
      break;
    case FillKind::kIndex:
      static_cast<int32_t*>(data)[i] =
          static_cast<int32_t>(uniform_index(seed, i, spec.index_bound));
      break;
  }
}

__global__ void fill_kernel(void* data, uint64_t count, bool bf16, FillSpec spec, uint64_t seed) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    fill_element(data, bf16, spec, seed, i);
  }
}

// Elements the fill writes one at a time: bytes for packed fp4, elements otherwise.
uint64_t fill_count(const TensorView& view, const FillSpec& spec) {
  if (spec.kind == FillKind::kE2m1Packed || spec.kind == FillKind::kE4m3 ||
      spec.kind == FillKind::kByte) {
    return view.nbytes();
  }
  return static_cast<uint64_t>(view.numel());
}

void check_fill(const TensorView& view, const FillSpec& spec) {
  DI_CHECK(view.is_contiguous(), "fill of a non-contiguous view ", view.to_string());
  switch (spec.kind) {
    case FillKind::kNormal:
    case FillKind::kE4m3Values:
      DI_CHECK(view.dtype() == DType::kF32 || view.dtype() == DType::kBF16, "normal fill of ",
               view.to_string());
      break;
    case FillKind::kIndex:
      DI_CHECK(view.dtype() == DType::kI32 && spec.index_bound > 0, "index fill of ",
               view.to_string());
      break;
    default:
      DI_CHECK(dtype_bits(view.dtype()) <= 8, "byte fill of ", view.to_string());
      break;
  }
}

}  // namespace

void fill_tensor(const TensorView& view, const FillSpec& spec, uint64_t seed) {
  if (view.numel() == 0) return;
  check_fill(view, spec);
  const uint64_t count = fill_count(view, spec);
  const bool bf16 = view.dtype() == DType::kBF16;
  if (view.device().is_cuda()) {
    const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((count + 255) / 256, 8192));
    fill_kernel<<<blocks, 256, 0, cuda::current_stream()>>>(view.raw_data(), count, bf16, spec,
                                                            seed);
    DI_CUDA_CHECK(cudaGetLastError());
    return;
  }
  for (uint64_t i = 0; i < count; ++i) fill_element(view.raw_data(), bf16, spec, seed, i);
}

uint8_t encode_e4m3_for_test(float value) {
  return encode_e4m3(value);
}
float decode_e4m3_for_test(uint8_t code) {
  return decode_e4m3(code);
}
uint8_t encode_e2m1_for_test(float value) {
  return encode_e2m1(value);
}

double measure_read_bandwidth_gbps(size_t bytes) {
  return bench::measure_hbm_read_gbps(bytes);
}

size_t device_free_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  DI_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

GraphMemory graph_memory() {
  unsigned long long current = 0, high = 0;  // the attributes are 64-bit counts
  DI_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &current));
  DI_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &high));
  return {static_cast<uint64_t>(current), static_cast<uint64_t>(high)};
}

EventMarks::EventMarks(int slots) : slots_(slots) {
  events_ = new void*[static_cast<size_t>(slots)];
  for (int i = 0; i < slots; ++i) {
    cudaEvent_t event;
    DI_CUDA_CHECK(cudaEventCreate(&event));
    events_[i] = event;
  }
}

EventMarks::~EventMarks() {
  for (int i = 0; i < slots_; ++i) cudaEventDestroy(static_cast<cudaEvent_t>(events_[i]));
  delete[] events_;
}

void EventMarks::record(int slot) {
  DI_CHECK(slot >= 0 && slot < slots_, "event slot ", slot, " of ", slots_);
  DI_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), cuda::current_stream()));
  last_ = slot;
}

void EventMarks::wait() {
  DI_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[last_])));
}

double EventMarks::elapsed_ms(int from, int to) const {
  float ms = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[from]),
                                     static_cast<cudaEvent_t>(events_[to])));
  return ms;
}

}  // namespace deepinfer::model_bench
