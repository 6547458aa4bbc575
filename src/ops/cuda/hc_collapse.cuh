// One output channel of hc_collapse, the one expression every collapse kernel
// (hyper_connection.cu) and the fused collapse-and-norm kernel (elementwise.cu) compute, so their
// bits agree.
#pragma once

namespace deepinfer::ops::cuda {

// sum over the streams j ascending of weights[j] * value(j), from 0 (the CPU's order).
template <int kHc, class StreamValue>
__device__ __forceinline__ float hc_collapse_channel(const float (&weights)[kHc],
                                                     StreamValue value) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kHc; ++j) sum += weights[j] * value(j);
  return sum;
}

}  // namespace deepinfer::ops::cuda
