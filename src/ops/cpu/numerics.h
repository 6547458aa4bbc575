// Scalar conversions and roundings for the storage formats the kernels read and the
// quantization semantics they reproduce. Everything here is exact except where a function says
// it rounds, and then it rounds to nearest, ties to even, like the reference's casts.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace deepinfer::ops::cpu {

inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// e4m3fn: bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN, max 448.
inline float e4m3_to_float(uint8_t bits) {
  const int sign = bits >> 7;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return sign ? -magnitude : magnitude;
}

// ue8m0: 2^(bits - 127); 0xFF is NaN.
inline float e8m0_to_float(uint8_t bits) {
  if (bits == 0xFF) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

// e2m1 code (sign in bit 3) -> value.
inline float e2m1_to_float(uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0xF];
}

// Nearest e4m3 value of x (ties to even), for |x| <= 448 (callers clamp first).
inline float round_to_e4m3(float x) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  const int exponent = std::max(std::ilogb(x), -6);  // below 2^-6 the grid is the subnormal one
  const float quantum = std::ldexp(1.0f, exponent - 3);
  return std::nearbyint(x / quantum) * quantum;
}

// Nearest e2m1 value of x (ties to even), for |x| <= 6 (callers clamp first).
inline float round_to_e2m1(float x) {
  const float magnitude = std::fabs(x);
  const float quantum = magnitude < 2.0f ? 0.5f : (magnitude < 4.0f ? 1.0f : 2.0f);
  return std::copysign(std::nearbyint(magnitude / quantum) * quantum, x);
}

// 2^ceil(log2(t)) for t > 0, from the IEEE bits (exponent field - 127, plus one when any
// mantissa bit is set) -- the ue8m0 scale rounding of the reference kernels.
inline float pow2_ceil(float t) {
  const uint32_t bits = std::bit_cast<uint32_t>(t);
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0);
  return std::ldexp(1.0f, exponent);
}

// Dot product in a fixed order: eight interleaved partial sums, combined as a fixed tree, then
// the tail in order. Compilers vectorize the lanes; the result never depends on the caller.
inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[k + l] * b[k + l];
  }
  float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
              ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

}  // namespace deepinfer::ops::cpu
