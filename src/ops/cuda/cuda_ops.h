// The CUDA implementation of the op layer (ops/ops.h): the same functions and semantics as
// ops/cpu, over views in device memory. Every op is asynchronous on cuda::current_stream();
// host std::span metadata (positions, ids) is copied to the device inside the op. Index
// problems that only the data reveals (a window range or engram id out of bounds) are reported
// by the next cuda::synchronize().
#pragma once

#include "ops/ops.h"

namespace deepinfer::ops::cuda {
#include "ops/backend_ops.inc"
}  // namespace deepinfer::ops::cuda
