#include "kernel_trace.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace deepinfer::model_bench {
namespace {

#define TRACE_CUPTI_CHECK(expression)                                       \
  do {                                                                      \
    if (const CUptiResult status = (expression); status != CUPTI_SUCCESS) { \
      const char* message = nullptr;                                        \
      cuptiGetResultString(status, &message);                               \
      DI_THROW("CUPTI error in ", #expression, ": ", message);              \
    }                                                                       \
  } while (false)

struct Interval {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string name;
};

struct Collected {
  std::mutex mutex;
  std::vector<Interval> kernels;
  std::vector<Interval> copies;  // name: "HtoD pageable", "DtoD", ...
  std::vector<Interval> memsets;
  std::vector<Interval> runtime_calls;
  uint64_t dropped = 0;
};

// CUPTI calls back into free functions, so the records land in one process-wide collection
// (one trace at a time).
Collected& collected() {
  static Collected instance;
  return instance;
}

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  // Whole: kernels of one name in different namespaces differ only in their argument types.
  return result;
}

const char* memory_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE:
      return "pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
      return "pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
      return "device";
    default:
      return "other";
  }
}

const char* copy_direction(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    default:
      return "other";
  }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Collected& out = collected();
  {
    const std::lock_guard lock(out.mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          out.kernels.push_back({kernel->start, kernel->end, demangled(kernel->name)});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          std::string name = copy_direction(copy->copyKind);
          if (copy->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD)
            name += std::string(" ") + memory_kind(copy->srcKind);
          if (copy->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH)
            name += std::string(" ") + memory_kind(copy->dstKind);
          out.copies.push_back({copy->start, copy->end, name});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* memset = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          out.memsets.push_back({memset->start, memset->end, "memset"});
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
          const auto* call = reinterpret_cast<const CUpti_ActivityAPI*>(record);
          const char* name = nullptr;
          cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, call->cbid, &name);
          out.runtime_calls.push_back({call->start, call->end, name != nullptr ? name : "?"});
          break;
        }
        default:
          break;
      }
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
    out.dropped += dropped;
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
                                         CUPTI_ACTIVITY_KIND_RUNTIME};

// Total length of the union of the intervals (GPU work on several streams may overlap).
double busy_us(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  uint64_t busy = 0, reach = 0;
  for (const Interval& interval : intervals) {
    const uint64_t from = std::max(interval.start, reach);
    if (interval.end > from) busy += interval.end - from;
    reach = std::max(reach, interval.end);
  }
  return static_cast<double>(busy) * 1e-3;
}

// Intervals grouped by name: count, total and largest time in µs, largest total first.
nlohmann::json by_name(const std::vector<Interval>& intervals, size_t top) {
  struct Group {
    int64_t count = 0;
    double total_us = 0, max_us = 0;
  };
  std::map<std::string, Group> groups;
  for (const Interval& interval : intervals) {
    Group& group = groups[interval.name];
    const double us = static_cast<double>(interval.end - interval.start) * 1e-3;
    group.count += 1;
    group.total_us += us;
    group.max_us = std::max(group.max_us, us);
  }
  std::vector<std::pair<std::string, Group>> sorted(groups.begin(), groups.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.total_us > b.second.total_us; });
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < sorted.size() && i < top; ++i) {
    out.push_back({{"name", sorted[i].first},
                   {"count", sorted[i].second.count},
                   {"total_us", sorted[i].second.total_us},
                   {"max_us", sorted[i].second.max_us}});
  }
  return out;
}

// The stretches without device work between the first and the last item, each with the work
// before and after it and the host runtime call that overlaps it most (CUPTI stamps device and
// host activity on one clock): where a step waits for its host, and on what.
struct Gap {
  uint64_t start = 0, end = 0;
  const Interval* before = nullptr;
  const Interval* after = nullptr;
  const Interval* host = nullptr;
  uint64_t nanoseconds() const { return end - start; }  // CUPTI stamps in ns
};

std::vector<Gap> find_gaps(std::vector<Interval>& work, const std::vector<Interval>& calls) {
  std::sort(work.begin(), work.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Gap> gaps;
  uint64_t reach = 0;
  const Interval* reaching = nullptr;
  for (const Interval& interval : work) {
    if (reaching != nullptr && interval.start > reach) {
      gaps.push_back({reach, interval.start, reaching, &interval, nullptr});
    }
    if (reaching == nullptr || interval.end > reach) {
      reach = interval.end;
      reaching = &interval;
    }
  }
  for (Gap& gap : gaps) {
    uint64_t host_overlap = 0;
    for (const Interval& call : calls) {
      const uint64_t from = std::max(call.start, gap.start);
      const uint64_t to = std::min(call.end, gap.end);
      if (to > from && to - from > host_overlap) {
        host_overlap = to - from;
        gap.host = &call;
      }
    }
  }
  std::sort(gaps.begin(), gaps.end(),
            [](const Gap& a, const Gap& b) { return a.nanoseconds() > b.nanoseconds(); });
  return gaps;
}

nlohmann::json largest_gaps(const std::vector<Gap>& gaps, uint64_t first_start, size_t top) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < gaps.size() && i < top; ++i) {
    const Gap& gap = gaps[i];
    out.push_back(
        {{"us", static_cast<double>(gap.nanoseconds()) * 1e-3},
         {"at_us", static_cast<double>(gap.start - first_start) * 1e-3},
         {"before", gap.before->name},
         {"after", gap.after->name},
         {"host_call", gap.host != nullptr ? gap.host->name : ""},
         {"host_call_us", gap.host != nullptr
                              ? static_cast<double>(gap.host->end - gap.host->start) * 1e-3
                              : 0.0}});
  }
  return out;
}

// All the idle time, summed by the host call that overlaps each gap most ("" where none does)
// and by the work that ends the gap: the largest gaps alone miss many short ones of one cause.
nlohmann::json idle_by(const std::vector<Gap>& gaps, bool by_host_call, size_t top) {
  std::map<std::string, std::pair<double, int>> sums;
  for (const Gap& gap : gaps) {
    const std::string& key =
        by_host_call ? (gap.host != nullptr ? gap.host->name : std::string()) : gap.after->name;
    auto& [us, count] = sums[key];
    us += static_cast<double>(gap.nanoseconds()) * 1e-3;
    ++count;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> sorted(sums.begin(), sums.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < sorted.size() && i < top; ++i) {
    out.push_back({{by_host_call ? "host_call" : "after", sorted[i].first},
                   {"us", sorted[i].second.first},
                   {"gaps", sorted[i].second.second}});
  }
  return out;
}

}  // namespace

struct KernelTrace::Records {
  bool running = false;
};

KernelTrace::KernelTrace() : records_(std::make_unique<Records>()) {
  static const bool registered = [] {
    TRACE_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    return true;
  }();
  (void)registered;
}

KernelTrace::~KernelTrace() {
  if (!records_->running) return;
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  cuptiActivityFlushAll(1);
}

void KernelTrace::start() {
  DI_CHECK(!records_->running, "the kernel trace is already recording");
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(1);
  {
    Collected& out = collected();
    const std::lock_guard lock(out.mutex);
    out.kernels.clear();
    out.copies.clear();
    out.memsets.clear();
    out.runtime_calls.clear();
    out.dropped = 0;
  }
  for (CUpti_ActivityKind kind : kKinds) TRACE_CUPTI_CHECK(cuptiActivityEnable(kind));
  records_->running = true;
}

nlohmann::json KernelTrace::stop(int top_kernels) {
  DI_CHECK(records_->running, "the kernel trace is not recording");
  cudaDeviceSynchronize();
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  TRACE_CUPTI_CHECK(cuptiActivityFlushAll(1));
  records_->running = false;
  Collected& in = collected();
  const std::lock_guard lock(in.mutex);
  std::vector<Interval> device_work = in.kernels;
  device_work.insert(device_work.end(), in.copies.begin(), in.copies.end());
  device_work.insert(device_work.end(), in.memsets.begin(), in.memsets.end());
  nlohmann::json out;
  if (device_work.empty()) {
    out["error"] = "no device activity was recorded";
    return out;
  }
  uint64_t first = UINT64_MAX, last = 0;
  for (const Interval& interval : device_work) {
    first = std::min(first, interval.start);
    last = std::max(last, interval.end);
  }
  const double span_us = static_cast<double>(last - first) * 1e-3;
  const double busy = busy_us(device_work);
  double kernel_sum = 0;
  for (const Interval& kernel : in.kernels)
    kernel_sum += static_cast<double>(kernel.end - kernel.start) * 1e-3;
  double runtime_sum = 0;
  for (const Interval& call : in.runtime_calls)
    runtime_sum += static_cast<double>(call.end - call.start) * 1e-3;
  out["span_us"] = span_us;
  out["gpu_busy_us"] = busy;
  out["gpu_idle_us"] = span_us - busy;
  out["kernel_count"] = in.kernels.size();
  out["kernel_sum_us"] = kernel_sum;
  out["copy_count"] = in.copies.size();
  out["memset_count"] = in.memsets.size();
  out["runtime_call_count"] = in.runtime_calls.size();
  out["runtime_call_host_us"] = runtime_sum;
  out["dropped_records"] = in.dropped;
  out["kernels"] = by_name(in.kernels, static_cast<size_t>(top_kernels));
  out["copies"] = by_name(in.copies, 16);
  out["runtime_calls"] = by_name(in.runtime_calls, 16);
  const std::vector<Gap> gaps = find_gaps(device_work, in.runtime_calls);
  out["largest_gaps"] = largest_gaps(gaps, first, 12);
  out["idle_by_host_call"] = idle_by(gaps, /*by_host_call=*/true, 12);
  out["idle_by_next_work"] = idle_by(gaps, /*by_host_call=*/false, 12);
  return out;
}

}  // namespace deepinfer::model_bench
