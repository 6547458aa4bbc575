// The routed experts' prefill kernels' work walk, shared by the mma.sync tile
// (moe_grouped_gemm.cu) and the wgmma tiles (moe_prefill_wgmma.cu).
#pragma once

#include <cstdint>

#include "ops/cuda/moe_prefill_wgmma.h"

namespace deepinfer::ops::cuda {

// Persistent blocks (one per SM) walk the work items (token tile, `tile_rows` weight rows) in list
// order, weight rows fastest: the items in flight at any time are a few consecutive tiles, so an
// expert's weights are read from HBM about once. run(tile, row_tile) does one item; the barrier
// after it keeps the next item's first copies from overwriting what slow warps may still read.
template <typename RunItem>
__device__ __forceinline__ void for_each_prefill_item(int64_t n, int tile_rows,
                                                      const PrefillTokenTile* tiles,
                                                      const int* tile_count, const RunItem& run) {
  const int row_tiles = static_cast<int>(n / tile_rows);
  const int64_t items = static_cast<int64_t>(*tile_count) * row_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PrefillTokenTile tile = tiles[item / row_tiles];
    run(tile, static_cast<int>(item % row_tiles));
    __syncthreads();
  }
}

}  // namespace deepinfer::ops::cuda
