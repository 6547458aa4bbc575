// The device side of the whole-model benchmark (model_bench.cpp): random fills that run where
// the tensor lives (the V4.1-Flash experts are ~7 GB a layer; drawing them on the host would
// cost minutes of GPU lease), the HBM read roofline, and GPU-timeline event marks. Every fill
// also runs on the host with the same per-element function, so `--device cpu` checks the
// device's values too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace deepinfer::model_bench {

enum class FillKind : uint8_t {
  kNormal,      // f32 / bf16: mean + stddev * N(0, 1)
  kE4m3,        // e4m3 codes of stddev * N(0, 1), saturated at +-448
  kE4m3Values,  // f32 / bf16: the value of kE4m3's code (bf16-exact, as the model's cached rows)
  kE2m1Packed,  // two e2m1 codes of stddev * N(0, 1) a byte (low nibble first), saturated at +-6
  kByte,        // every byte = `byte` (ue8m0 scale codes)
  kIndex,       // i32 uniform in [0, index_bound)
};

struct FillSpec {
  FillKind kind = FillKind::kNormal;
  float mean = 0.0f;
  float stddev = 1.0f;
  uint8_t byte = 0;
  int32_t index_bound = 1;
};

// Fills a contiguous view on its own device (the current stream on a GPU; no wait).
void fill_tensor(const TensorView& view, const FillSpec& spec, uint64_t seed);

// The encoders the fills use, exposed so the host run can check them against core's.
uint8_t encode_e4m3_for_test(float value);
float decode_e4m3_for_test(uint8_t code);
uint8_t encode_e2m1_for_test(float value);

// Median GB/s of a streaming 16-byte read over `bytes` of device memory (GPU 0).
double measure_read_bandwidth_gbps(size_t bytes);
// Free device memory of GPU 0.
size_t device_free_bytes();
// Device memory the CUDA graphs' allocations hold (current and high-water), GPU 0.
struct GraphMemory {
  uint64_t reserved_bytes = 0;
  uint64_t reserved_high_bytes = 0;
};
GraphMemory graph_memory();

// GPU-timeline marks on the current stream: record(i) into slot i, then after wait() the
// elapsed milliseconds between two slots.
class EventMarks {
 public:
  explicit EventMarks(int slots);
  ~EventMarks();
  EventMarks(const EventMarks&) = delete;
  EventMarks& operator=(const EventMarks&) = delete;
  void record(int slot);
  void wait();  // for the last recorded slot
  double elapsed_ms(int from, int to) const;

 private:
  void** events_ = nullptr;
  int slots_ = 0;
  int last_ = 0;
};

}  // namespace deepinfer::model_bench
