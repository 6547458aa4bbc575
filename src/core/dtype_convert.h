// Exact scalar and bulk conversions between f32 and the narrow float formats of DeepSeek-V4.1:
// bf16, f16, fp8 e4m3fn, fp8 e5m2, ue8m0 (e8m0fnu) scales and fp4 e2m1. All encoders round to
// nearest, ties to even (RNE); they differ in what happens past the largest finite value.
// docs/CORE.md lists every rule with its source.
//
// Which encoder the model uses (matching DeepSeek's reference inference code and HF):
//  - fp8 activations / window KV: float_to_e4m3_saturate (the reference clamps to +-448 first);
//  - e4m3 *scales* of the compressed KV (amax/6 rounded to fp8): float_to_e4m3_saturate, as the
//    release's kernel casts with satfinite; HF's `.to(float8_e4m3fn)` is float_to_e4m3_cast.
//    They differ only when amax > 6 * 464, where HF produces NaN;
//  - ue8m0 block scales: e8m0_pow2_ceil(max(amax, floor) * inverse_max) -- rounds UP;
//  - fp4 values: float_to_e2m1 (RNE, saturating at +-6).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;
// 1/448 and 1/6 rounded to f32: the reference multiplies amax by these (not divides).
inline constexpr float kE4M3MaxInverse = 1.0f / 448.0f;
inline constexpr float kE2M1MaxInverse = 1.0f / 6.0f;

// ---- bf16: f32 with the low 16 mantissa bits dropped -------------------------------------
float bf16_to_float(uint16_t bits);
// RNE; overflow rounds to inf; NaN stays NaN (sign and top payload bits kept, quiet bit set).
uint16_t float_to_bf16(float value);

// ---- f16 (IEEE binary16) -----------------------------------------------------------------
float f16_to_float(uint16_t bits);
// RNE including subnormals; overflow to inf; NaN stays NaN (quiet, top payload bits kept).
uint16_t float_to_f16(float value);

// ---- fp8 e4m3fn: bias 7, no inf, S.1111.111 = NaN, max 448, min subnormal 2^-9 -----------
float e4m3_to_float(uint8_t code);
// DeepSeek's quantizers: clamp to [-448, 448] (inf saturates too), then RNE; NaN -> NaN.
uint8_t float_to_e4m3_saturate(float value);
// torch's x.to(torch.float8_e4m3fn): RNE; a result whose magnitude rounds past 448 (input
// > 464, or inf) becomes NaN with the input's sign; NaN -> NaN.
uint8_t float_to_e4m3_cast(float value);

// ---- fp8 e5m2: IEEE-like, bias 15, has inf, max 57344, min subnormal 2^-16 ---------------
float e5m2_to_float(uint8_t code);
// IEEE / torch cast: RNE, overflow to inf, NaN -> NaN.
uint8_t float_to_e5m2(float value);
// RNE, finite overflow and inf clamp to +-57344; NaN -> NaN.
uint8_t float_to_e5m2_saturate(float value);

// ---- ue8m0 (float8_e8m0fnu): unsigned power of two 2^(code-127); 0xFF = NaN -------------
float e8m0_to_float(uint8_t code);
// DeepSeek's fast_round_scale, bit for bit: code = exponent field of |x| + (mantissa != 0),
// i.e. 2^ceil(log2 x) for positive normal x. Callers clamp amax first (the reference clamps
// to 1e-4 for fp8 and 6*2^-126 for the fp4 indexer). Non-finite x -> 0xFF; zero -> 0; a
// result past 2^127 -> 0xFF (the reference's 2^128 = inf, which casts to NaN).
uint8_t e8m0_pow2_ceil(float value);
// torch's x.to(torch.float8_e8m0fnu): the sign is ignored; RNE on the exponent with the
// mantissa as the fraction (>= 1.5 * 2^e rounds up for normal x); inf/NaN -> 0xFF.
uint8_t float_to_e8m0_cast(float value);

// ---- fp4 e2m1: values {0, 0.5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3 -----------------------
float e2m1_to_float(uint8_t code);  // uses the low 4 bits
// RNE onto the grid (ties 0.25, 1.25, 2.5, 5 go down; 0.75, 1.75, 3.5 go up), saturating at
// +-6; -0 and small negatives give code 8 (-0). NaN gives code 0/8 by its sign bit, as HF's
// threshold rule does (the reference clamps first, so NaN never reaches it in practice).
uint8_t float_to_e2m1(float value);

// ---- bulk helpers (contiguous spans) -----------------------------------------------------

// What an encoder does past the format's largest finite value.
enum class Overflow {
  kSaturate,  // clamp to +-max (e4m3: DeepSeek's quantizers; e2m1 always)
  kCast,      // torch cast semantics: e4m3 -> NaN, e5m2/f16/bf16 -> inf
};

// dst[i] = value of element i of `src` (of dtype `src_type`); for kF4E2M1x2 element i is
// nibble i (low nibble first). Integer and bool types convert by value.
void convert_to_f32(DType src_type, const void* src, float* dst, int64_t count);
// Encodes `count` floats. bf16/f16 always overflow to inf; kF8E8M0 is refused (pick
// e8m0_pow2_ceil or float_to_e8m0_cast explicitly); kF4E2M1x2 writes count/2 bytes (count
// must be even) and always saturates.
void convert_from_f32(const float* src, DType dst_type, void* dst, int64_t count,
                      Overflow overflow = Overflow::kSaturate);

// Packs 4-bit codes two per byte: element 2k in the low nibble, 2k+1 in the high nibble.
// `count` (the number of codes) must be even; only the low 4 bits of each code are used.
void pack_fp4(const uint8_t* codes, uint8_t* packed, int64_t count);
void unpack_fp4(const uint8_t* packed, uint8_t* codes, int64_t count);

// dst[i] = value(values[i]) * scale(scales[i / block_size]) for a run of `count` elements,
// with one scale per block of `block_size` elements (count need not be a whole number of
// blocks). value_type: any float format (fp8, fp4 packed, bf16, ...). scale_type: kF8E8M0
// (2^(code-127)), kF8E4M3 or kF32. The product is one f32 multiply, like the reference.
void dequantize_blocks(DType value_type, const void* values, DType scale_type, const void* scales,
                       int64_t count, int64_t block_size, float* dst);

}  // namespace deepinfer
