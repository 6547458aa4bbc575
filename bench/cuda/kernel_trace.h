// A kernel timeline of one stretch of GPU work, from CUPTI's activity records (Nsight Systems
// does not run on the GPU machines we are lent; CUPTI ships with the CUDA toolkit). It answers
// what a decode step spends its time on: how long the GPU is busy versus idle between kernels,
// which kernels take the time, and which runtime calls hold the host.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

namespace deepinfer::model_bench {

class KernelTrace {
 public:
  KernelTrace();
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Records kernels, copies, memsets and CUDA runtime calls from now on.
  void start();
  // Waits for the device, stops recording and summarizes what was recorded: the GPU's busy time
  // against the span from the first to the last record, the kernels grouped by name (top
  // `top_kernels` by total time), the copies by direction and host memory kind, and the runtime
  // calls by name with their host time, and the 12 longest idle gaps (where, between which work,
  // and the runtime call that overlaps each most: what the GPU waited on).
  nlohmann::json stop(int top_kernels = 25);

 private:
  struct Records;
  std::unique_ptr<Records> records_;
};

}  // namespace deepinfer::model_bench
