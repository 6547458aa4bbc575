// The shared-memory maps of the routed experts' wgmma decode tile (moe_prefill_wgmma.cu,
// decode_a) that its copies and its reads must agree on: where a K step's raw fp4 chunks and
// ue8m0 codes of a weight row land, and which addresses a thread's loads give. Host and device
// both, so moe_wgmma_test checks the maps against each other on the host (ldmatrix's
// lane-to-row rule emulated there), where a mistake would otherwise show only as wrong bits on
// the GPU.
//
// Internal to the CUDA backend; plain integer arithmetic, no CUDA headers.
#pragma once

#if defined(__CUDACC__)
#define DEEPINFER_DECODE_MAP __host__ __device__ constexpr
#else
#define DEEPINFER_DECODE_MAP constexpr
#endif

namespace deepinfer::ops::cuda::decode_map {

inline constexpr int kRows = 64;      // weight rows of a work item (one warpgroup's M)
inline constexpr int kRowBytes = 64;  // a row's 128 fp4 values of one K step
inline constexpr int kBlocks = 4;     // 32-blocks (16-byte chunks) of a row's step
inline constexpr int kStepRawBytes = kRows * kRowBytes;
inline constexpr int kSecondHalfRows = 8;  // a thread's two rows: g and g + 8 of its warp's 16

// Chunk c of row r inside a step's raw block (register_a::raw_chunk's map, which both decode
// steps keep): row r's 64 bytes start at bank 16 (r % 2), and the chunk's xor with (r / 2) % 4
// puts the 8 rows g = 0..7 of any chunk in 8 different 16-byte bank groups.
DEEPINFER_DECODE_MAP int raw_offset(int r, int c) {
  return r * kRowBytes + ((c ^ ((r >> 1) & 3)) << 4);
}

// The word a thread (lane = 4 g + q of warp w) converts for its row half h (row 16 w + g + 8 h)
// and 32-block b: word q of the chunk, the mma.sync A fragment's K slots of that block.
DEEPINFER_DECODE_MAP int raw_word(int warp, int lane, int half, int block) {
  return raw_offset(16 * warp + (lane >> 2) + kSecondHalfRows * half, block) + 4 * (lane & 3);
}

// The row address lane i of warp w gives ldmatrix.x4 for half 0: matrix m = i / 8 is 32-block m,
// its row i % 8 the warp's row i % 8. Half 1 adds kSecondHalfRows rows, which is
// kSecondHalfRows * kRowBytes bytes (the xor depends on (r / 2) % 4, the same for r and r + 8).
DEEPINFER_DECODE_MAP int matrix_row(int warp, int lane) {
  return raw_offset(16 * warp + (lane & 7), lane >> 3);
}
inline constexpr int kMatrixSecondHalf = kSecondHalfRows * kRowBytes;

// What ldmatrix (.m8n8.x4.b16, no transpose) gives lane t in register m: the 4 bytes at
// 4 (t % 4) of the row address that lane 8 m + t / 4 gave.
DEEPINFER_DECODE_MAP int matrix_word(int warp, int lane, int half, int m) {
  return matrix_row(warp, 8 * m + (lane >> 2)) + kMatrixSecondHalf * half + 4 * (lane & 3);
}

// The weight copies (lean's line-wide map): thread t's copy i of a two-step slot reads 16
// bytes of row t / 8 + 16 i at byte 64 step + 16 chunk of the slot's 128 (step = (t % 8) / 4,
// chunk = t % 4), so 8 threads read one row's whole 128-byte line.
inline constexpr int kCopyThreadsPerRow = 8;
inline constexpr int kCopyRowStep = 16;
DEEPINFER_DECODE_MAP int copy_row(int thread, int i) {
  return thread / kCopyThreadsPerRow + kCopyRowStep * i;
}
DEEPINFER_DECODE_MAP int copy_step(int thread) {
  return (thread % kCopyThreadsPerRow) / 4;
}
DEEPINFER_DECODE_MAP int copy_chunk(int thread) {
  return thread & 3;
}

// A step's codes (4 bytes a row): lean keeps them in row order; lean3 pairs row g and row g + 8
// of each warp's 16, so one 8-byte load gives a thread both rows' codes.
DEEPINFER_DECODE_MAP int paired_codes(int r) {
  return 4 * ((r & ~15) + 2 * (r & 7) + ((r >> 3) & 1));
}
DEEPINFER_DECODE_MAP int paired_codes_read(int warp, int lane) {
  return 4 * (16 * warp + 2 * (lane >> 2));
}

}  // namespace deepinfer::ops::cuda::decode_map

#undef DEEPINFER_DECODE_MAP
