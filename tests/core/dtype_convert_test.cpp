// Every expected value here comes from the format definitions, computed independently of the
// implementation: decodes from the sign/exponent/mantissa fields with std::ldexp in double,
// roundings from midpoints of the sorted value sets, and a few literal anchors.
#include "core/dtype_convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"

namespace deepinfer {
namespace {

// value = (-1)^s * (E == 0 ? m / 2^M * 2^(1 - bias) : (1 + m / 2^M) * 2^(E - bias)).
double field_value(uint32_t code, int exponent_bits, int mantissa_bits, int bias) {
  const uint32_t mantissa = code & ((1u << mantissa_bits) - 1);
  const uint32_t exponent = (code >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const bool negative = ((code >> (mantissa_bits + exponent_bits)) & 1) != 0;
  const double fraction = std::ldexp(static_cast<double>(mantissa), -mantissa_bits);
  const double magnitude = exponent == 0
                               ? std::ldexp(fraction, 1 - bias)
                               : std::ldexp(1.0 + fraction, static_cast<int>(exponent) - bias);
  return negative ? -magnitude : magnitude;
}

float bits_to_float(uint32_t bits) {
  return std::bit_cast<float>(bits);
}
uint32_t float_to_bits(float value) {
  return std::bit_cast<uint32_t>(value);
}

struct CodedValue {
  uint32_t code;
  float value;
};

// Non-negative finite values of a format in increasing order, with their codes.
std::vector<CodedValue> sorted_non_negative(uint32_t code_count, float (*decode)(uint32_t)) {
  std::vector<CodedValue> values;
  for (uint32_t code = 0; code < code_count; ++code) {
    const float value = decode(code);
    if (std::isfinite(value) && !std::signbit(value)) values.push_back({code, value});
  }
  std::sort(values.begin(), values.end(),
            [](const CodedValue& a, const CodedValue& b) { return a.value < b.value; });
  return values;
}

// At each midpoint between adjacent representable values the tie goes to the even code; just
// above goes up and just below goes down. Negative inputs mirror with the sign bit set.
template <typename Encode>
void expect_round_to_nearest_even(const std::vector<CodedValue>& values, uint32_t sign_bit,
                                  Encode encode) {
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const CodedValue low = values[i];
    const CodedValue high = values[i + 1];
    const double exact_mid = (static_cast<double>(low.value) + high.value) / 2;
    const float mid = static_cast<float>(exact_mid);
    ASSERT_EQ(static_cast<double>(mid), exact_mid) << "midpoint not representable in f32";
    const uint32_t even = (low.code & 1) == 0 ? low.code : high.code;
    EXPECT_EQ(encode(mid), even) << "tie at " << mid;
    EXPECT_EQ(encode(std::nextafter(mid, INFINITY)), high.code) << "just above " << mid;
    EXPECT_EQ(encode(std::nextafter(mid, 0.0f)), low.code) << "just below " << mid;
    EXPECT_EQ(encode(-mid), even | sign_bit) << "tie at " << -mid;
    EXPECT_EQ(encode(-std::nextafter(mid, INFINITY)), high.code | sign_bit);
    EXPECT_EQ(encode(-std::nextafter(mid, 0.0f)), low.code | sign_bit);
  }
}

float decode_e4m3(uint32_t code) {
  return e4m3_to_float(static_cast<uint8_t>(code));
}
float decode_e5m2(uint32_t code) {
  return e5m2_to_float(static_cast<uint8_t>(code));
}
float decode_f16(uint32_t code) {
  return f16_to_float(static_cast<uint16_t>(code));
}
float decode_bf16(uint32_t code) {
  return bf16_to_float(static_cast<uint16_t>(code));
}
float decode_e2m1(uint32_t code) {
  return e2m1_to_float(static_cast<uint8_t>(code));
}

// ---- fp8 e4m3fn ----------------------------------------------------------------------------

TEST(E4M3, AllCodesDecodeToTheirFieldValues) {
  for (uint32_t code = 0; code < 256; ++code) {
    const float decoded = e4m3_to_float(static_cast<uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(decoded)) << code;  // S.1111.111 is the only NaN; no inf
      EXPECT_EQ(std::signbit(decoded), code >= 0x80);
      continue;
    }
    EXPECT_EQ(static_cast<double>(decoded), field_value(code, 4, 3, 7)) << "code " << code;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // E = 15 is a normal binade in the fn variant
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x80), 0.0f);
}

TEST(E4M3, EveryCodeReencodesToItself) {
  for (uint32_t code = 0; code < 256; ++code) {
    const float value = e4m3_to_float(static_cast<uint8_t>(code));
    EXPECT_EQ(float_to_e4m3_saturate(value), code) << code;
    EXPECT_EQ(float_to_e4m3_cast(value), code) << code;  // NaN codes re-encode as NaN too
  }
}

TEST(E4M3, RoundsToNearestEvenAtEveryMidpoint) {
  const auto values = sorted_non_negative(256, decode_e4m3);
  ASSERT_EQ(values.size(), 127u);  // 0 .. 448
  expect_round_to_nearest_even(values, 0x80, [](float x) { return float_to_e4m3_saturate(x); });
  expect_round_to_nearest_even(values, 0x80, [](float x) { return float_to_e4m3_cast(x); });
  // Below half the smallest subnormal everything flushes to (signed) zero.
  EXPECT_EQ(float_to_e4m3_saturate(std::ldexp(1.0f, -10)), 0x00);  // tie with 0: even
  EXPECT_EQ(float_to_e4m3_saturate(-std::ldexp(1.0f, -12)), 0x80);
  EXPECT_EQ(float_to_e4m3_saturate(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(E4M3, SaturatingAndCastOverflowDiffer) {
  // 464 is the midpoint between 448 (0x7E, even) and the would-be 480 (0x7F, the NaN slot).
  EXPECT_EQ(float_to_e4m3_saturate(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_cast(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_saturate(std::nextafter(464.0f, 1e9f)), 0x7E);
  EXPECT_EQ(float_to_e4m3_cast(std::nextafter(464.0f, 1e9f)), 0x7F);
  EXPECT_EQ(float_to_e4m3_cast(-500.0f), 0xFF);
  for (float big : {449.0f, 1e4f, 3.4e38f, INFINITY}) {
    EXPECT_EQ(float_to_e4m3_saturate(big), 0x7E) << big;
    EXPECT_EQ(float_to_e4m3_saturate(-big), 0xFE) << big;
    EXPECT_EQ(float_to_e4m3_cast(std::max(big, 480.0f)), 0x7F) << big;
  }
  EXPECT_EQ(float_to_e4m3_cast(INFINITY), 0x7F);
  EXPECT_EQ(float_to_e4m3_cast(-INFINITY), 0xFF);
  EXPECT_EQ(float_to_e4m3_saturate(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_e4m3_cast(-NAN), 0xFF);
}

// ---- fp8 e5m2 ------------------------------------------------------------------------------

TEST(E5M2, AllCodesDecodeToTheirFieldValues) {
  for (uint32_t code = 0; code < 256; ++code) {
    const float decoded = e5m2_to_float(static_cast<uint8_t>(code));
    const uint32_t exponent = (code >> 2) & 0x1F;
    if (exponent == 0x1F) {
      if ((code & 3) == 0) {
        EXPECT_TRUE(std::isinf(decoded)) << code;
        EXPECT_EQ(std::signbit(decoded), code >= 0x80);
      } else {
        EXPECT_TRUE(std::isnan(decoded)) << code;
      }
      continue;
    }
    EXPECT_EQ(static_cast<double>(decoded), field_value(code, 5, 2, 15)) << "code " << code;
  }
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_float(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_float(0xFC), -INFINITY);
}

TEST(E5M2, EveryCodeReencodesToItself) {
  for (uint32_t code = 0; code < 256; ++code) {
    const float value = e5m2_to_float(static_cast<uint8_t>(code));
    if (std::isnan(value)) {
      EXPECT_EQ(float_to_e5m2(value) & 0x7F, 0x7F) << code;  // NaN stays NaN (canonical)
      EXPECT_EQ(float_to_e5m2(value) & 0x80, code & 0x80) << code;
      continue;
    }
    EXPECT_EQ(float_to_e5m2(value), code) << code;
    if (!std::isinf(value)) {
      EXPECT_EQ(float_to_e5m2_saturate(value), code) << code;
    }
  }
}

TEST(E5M2, RoundsToNearestEvenAndOverflows) {
  const auto values = sorted_non_negative(256, decode_e5m2);
  ASSERT_EQ(values.size(), 124u);  // 0 .. 57344
  expect_round_to_nearest_even(values, 0x80, [](float x) { return float_to_e5m2(x); });
  expect_round_to_nearest_even(values, 0x80, [](float x) { return float_to_e5m2_saturate(x); });
  // 61440 is the midpoint between 57344 (0x7B, odd) and 65536: IEEE rounds the tie to inf.
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7C);
  EXPECT_EQ(float_to_e5m2(std::nextafter(61440.0f, 0.0f)), 0x7B);
  EXPECT_EQ(float_to_e5m2(-1e6f), 0xFC);
  EXPECT_EQ(float_to_e5m2_saturate(61440.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2_saturate(-INFINITY), 0xFB);
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -17)), 0x00);  // tie with 0
  EXPECT_EQ(float_to_e5m2(std::nextafter(std::ldexp(1.0f, -17), 1.0f)), 0x01);
}

// ---- fp4 e2m1 ------------------------------------------------------------------------------

TEST(E2M1, AllSixteenCodes) {
  const float expected[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (uint32_t code = 0; code < 16; ++code) {
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(code)), expected[code]) << code;
    EXPECT_EQ(static_cast<double>(e2m1_to_float(static_cast<uint8_t>(code))),
              field_value(code, 2, 1, 1));
    EXPECT_EQ(std::signbit(e2m1_to_float(static_cast<uint8_t>(code))), code >= 8);
    EXPECT_EQ(float_to_e2m1(expected[code]), code);
  }
  EXPECT_EQ(e2m1_to_float(0xF7), 6.0f);  // only the low nibble counts
}

TEST(E2M1, RoundsToNearestEvenLikeHfThresholds) {
  const auto values = sorted_non_negative(16, decode_e2m1);
  ASSERT_EQ(values.size(), 8u);
  expect_round_to_nearest_even(values, 0x8, [](float x) { return float_to_e2m1(x); });
  // HF _e2m1_codes: ties at 0.25, 1.25, 2.5, 5.0 go down; at 0.75, 1.75, 3.5 go up.
  const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t tie_code[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(float_to_e2m1(tie[i]), tie_code[i]) << tie[i];
}

TEST(E2M1, SaturatesAtSixAndKeepsSign) {
  for (float big : {6.5f, 7.0f, 1e9f, INFINITY}) {
    EXPECT_EQ(float_to_e2m1(big), 0x7) << big;
    EXPECT_EQ(float_to_e2m1(-big), 0xF) << big;
  }
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1(-0.1f), 0x8);
  EXPECT_EQ(float_to_e2m1(NAN), 0x0);
  EXPECT_EQ(float_to_e2m1(-NAN), 0x8);
}

// ---- ue8m0 ---------------------------------------------------------------------------------

TEST(E8M0, AllCodesArePowersOfTwo) {
  for (uint32_t code = 0; code < 255; ++code) {
    EXPECT_EQ(static_cast<double>(e8m0_to_float(static_cast<uint8_t>(code))),
              std::ldexp(1.0, static_cast<int>(code) - 127))
        << code;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
}

TEST(E8M0, Pow2CeilMatchesCeilLog2) {
  for (uint32_t code = 1; code < 255; ++code) {
    const float power = std::ldexp(1.0f, static_cast<int>(code) - 127);
    EXPECT_EQ(e8m0_pow2_ceil(power), code) << code;
    EXPECT_EQ(e8m0_pow2_ceil(std::nextafter(power, 0.0f)), code) << code;
    if (code < 254) {
      EXPECT_EQ(e8m0_pow2_ceil(std::nextafter(power, INFINITY)), code + 1) << code;
    }
  }
  // Pseudo-random normal floats against ceil(log2 x) computed in double.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 200000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits =
        static_cast<uint32_t>(state >> 33) % (0x7F000000u - 0x00800000u) + 0x00800000u;
    const float x = bits_to_float(bits);
    const double expected = std::ceil(std::log2(static_cast<double>(x))) + 127;
    ASSERT_EQ(e8m0_pow2_ceil(x), static_cast<uint32_t>(expected)) << x;
  }
  // The reference's fp8 activation scale: amax 448 -> 2^0; amax just above -> 2^1.
  EXPECT_EQ(e8m0_pow2_ceil(448.0f * kE4M3MaxInverse), 127);
  EXPECT_EQ(e8m0_pow2_ceil(std::nextafter(448.0f, 1e9f) * kE4M3MaxInverse), 128);
  EXPECT_EQ(e8m0_pow2_ceil(1e-4f * kE4M3MaxInverse), 127 - 22);  // 2.2e-7 -> 2^-22
  EXPECT_EQ(e8m0_pow2_ceil(std::ldexp(1.5f, 127)), 0xFF);        // 2^128 does not exist
  EXPECT_EQ(e8m0_pow2_ceil(INFINITY), 0xFF);
  EXPECT_EQ(e8m0_pow2_ceil(NAN), 0xFF);
}

TEST(E8M0, CastRoundsOnTheLinearFraction) {
  // Independent statement of torch's rule for normal x = (1 + f) * 2^e: up iff f >= 1/2.
  uint64_t state = 12345;
  for (int i = 0; i < 100000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits =
        static_cast<uint32_t>(state >> 33) % (0x7F000000u - 0x00800000u) + 0x00800000u;
    const float x = bits_to_float(bits);
    int exponent = 0;
    const double mantissa = std::frexp(static_cast<double>(x), &exponent);  // [0.5, 1)
    const int floor_log2 = exponent - 1;
    const int expected = floor_log2 + (2 * mantissa - 1 >= 0.5 ? 1 : 0) + 127;
    ASSERT_EQ(float_to_e8m0_cast(x), expected) << x;
  }
  EXPECT_EQ(float_to_e8m0_cast(1.5f), 128);
  EXPECT_EQ(float_to_e8m0_cast(std::nextafter(1.5f, 0.0f)), 127);
  EXPECT_EQ(float_to_e8m0_cast(-4.0f), 129);  // the sign is dropped
  EXPECT_EQ(float_to_e8m0_cast(0.0f), 0);
  EXPECT_EQ(float_to_e8m0_cast(INFINITY), 0xFF);
  EXPECT_EQ(float_to_e8m0_cast(std::ldexp(1.75f, 127)), 0xFF);
}

// ---- f16 -----------------------------------------------------------------------------------

TEST(F16, AllCodesDecodeToTheirFieldValues) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float decoded = f16_to_float(static_cast<uint16_t>(code));
    const uint32_t exponent = (code >> 10) & 0x1F;
    if (exponent == 0x1F) {
      EXPECT_EQ(std::isinf(decoded), (code & 0x3FF) == 0) << code;
      EXPECT_EQ(std::isnan(decoded), (code & 0x3FF) != 0) << code;
      EXPECT_EQ(std::signbit(decoded), code >= 0x8000);
      continue;
    }
    ASSERT_EQ(static_cast<double>(decoded), field_value(code, 5, 10, 15)) << code;
  }
  EXPECT_EQ(f16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x3C00), 1.0f);
}

TEST(F16, EveryFiniteCodeReencodesAndTiesGoToEven) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float value = f16_to_float(static_cast<uint16_t>(code));
    if (!std::isnan(value)) {
      ASSERT_EQ(float_to_f16(value), code) << code;
    }
  }
  expect_round_to_nearest_even(sorted_non_negative(65536, decode_f16), 0x8000,
                               [](float x) { return float_to_f16(x); });
}

TEST(F16, OverflowSubnormalsAndSpecials) {
  EXPECT_EQ(float_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);  // tie with 65536: 0x7BFF is odd -> inf
  EXPECT_EQ(float_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta: tie, 2 is even
  // NaN stays NaN: quiet bit set, top payload bits kept, sign kept. A signalling NaN whose
  // payload lives only in the low bits must not collapse into inf.
  EXPECT_EQ(float_to_f16(bits_to_float(0x7F800001u)), 0x7E00);
  EXPECT_EQ(float_to_f16(bits_to_float(0xFFBFE000u)), 0xFFFF);
  EXPECT_EQ(float_to_f16(bits_to_float(0x7FC02000u)), 0x7E01);
  // Widening keeps the payload.
  EXPECT_EQ(float_to_bits(f16_to_float(0x7D01)), 0x7FA02000u);
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(BF16, EveryFiniteCodeReencodesAndTiesGoToEven) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float value = bf16_to_float(static_cast<uint16_t>(code));
    const uint32_t exponent = (code >> 7) & 0xFF;
    if (exponent != 0xFF) {
      ASSERT_EQ(static_cast<double>(value), field_value(code, 8, 7, 127)) << code;
    }
    if (!std::isnan(value)) {
      ASSERT_EQ(float_to_bf16(value), code) << code;
    }
  }
  auto values = sorted_non_negative(65536, decode_bf16);
  expect_round_to_nearest_even(values, 0x8000, [](float x) { return float_to_bf16(x); });
}

TEST(BF16, OverflowAndSpecials) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7F7F8000u)), 0x7F80);  // tie, 0x7F7F odd -> inf
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x00018000u)), 0x0002);  // subnormal tie to even
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7F800001u)), 0x7FC0);  // sNaN stays NaN
  EXPECT_EQ(float_to_bf16(bits_to_float(0xFFC12345u)), 0xFFC1);  // payload and sign kept
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7F81)));
}

// ---- bulk helpers --------------------------------------------------------------------------

TEST(BulkConvert, MatchesScalarConversions) {
  std::vector<float> input;
  for (int i = -300; i <= 300; ++i) input.push_back(static_cast<float>(i) * 0.37f);
  input.push_back(1e6f);
  input.push_back(-1e6f);
  const int64_t n = static_cast<int64_t>(input.size());
  std::vector<uint8_t> bytes(2 * input.size());
  std::vector<float> back(input.size());

  convert_from_f32(input.data(), DType::kF8E4M3, bytes.data(), n);
  convert_to_f32(DType::kF8E4M3, bytes.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bytes[i], float_to_e4m3_saturate(input[i]));
    ASSERT_EQ(float_to_bits(back[i]), float_to_bits(e4m3_to_float(bytes[i])));
  }
  convert_from_f32(input.data(), DType::kF8E4M3, bytes.data(), n, Overflow::kCast);
  EXPECT_EQ(bytes[n - 2], 0x7F);

  std::vector<uint16_t> halves(input.size());
  convert_from_f32(input.data(), DType::kBF16, halves.data(), n);
  convert_to_f32(DType::kBF16, halves.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], bf16_to_float(float_to_bf16(input[i])));
  convert_from_f32(input.data(), DType::kF16, halves.data(), n);
  convert_to_f32(DType::kF16, halves.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], f16_to_float(float_to_f16(input[i])));
  EXPECT_EQ(back[n - 1], -INFINITY);

  EXPECT_THROW(convert_from_f32(input.data(), DType::kF8E8M0, bytes.data(), 1), Error);
  EXPECT_THROW(convert_from_f32(input.data(), DType::kF4E2M1x2, bytes.data(), 3), Error);
}

TEST(BulkConvert, Fp4PacksEvenElementInTheLowNibble) {
  const uint8_t codes[6] = {0x1, 0x2, 0xF, 0x8, 0x7, 0x0};
  uint8_t packed[3] = {};
  pack_fp4(codes, packed, 6);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0x8F);
  EXPECT_EQ(packed[2], 0x07);
  uint8_t unpacked[6] = {};
  unpack_fp4(packed, unpacked, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(unpacked[i], codes[i]);

  float values[6];
  convert_to_f32(DType::kF4E2M1x2, packed, values, 6);
  const float expected[6] = {0.5f, 1.0f, -6.0f, -0.0f, 6.0f, 0.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(values[i], expected[i]) << i;

  const float input[4] = {0.75f, -2.4f, 100.0f, 0.2f};  // -> codes 2, C, 7, 0
  uint8_t out[2] = {};
  convert_from_f32(input, DType::kF4E2M1x2, out, 4);
  EXPECT_EQ(out[0], 0xC2);
  EXPECT_EQ(out[1], 0x07);
  EXPECT_THROW(pack_fp4(codes, packed, 5), Error);
}

TEST(BulkConvert, DequantizeBlocksAppliesOneScalePerBlock) {
  // fp8 values with ue8m0 scales 2^-1, 2^3 and NaN, blocks of 2 (the last one partial).
  const uint8_t values[5] = {0x38, 0xC0, 0x7E, 0x01, 0x38};  // 1, -2, 448, 2^-9, 1
  const uint8_t scales[3] = {126, 130, 0xFF};
  float out[5];
  dequantize_blocks(DType::kF8E4M3, values, DType::kF8E8M0, scales, 5, 2, out);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[2], 3584.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(out[4]));

  // Packed fp4 with e4m3 scales (the compressed-KV layout: one scale per 16 values).
  std::vector<uint8_t> packed(16);
  for (int i = 0; i < 16; ++i) packed[i] = static_cast<uint8_t>(0x10 * (i % 16) + (i % 16));
  const uint8_t e4m3_scales[2] = {0x30, 0x40};  // 0.5, 2
  std::vector<float> fp4_out(32);
  dequantize_blocks(DType::kF4E2M1x2, packed.data(), DType::kF8E4M3, e4m3_scales, 32, 16,
                    fp4_out.data());
  for (int i = 0; i < 32; ++i) {
    const float scale = i < 16 ? 0.5f : 2.0f;
    EXPECT_EQ(fp4_out[i], e2m1_to_float(static_cast<uint8_t>((i / 2) % 16)) * scale) << i;
  }
  EXPECT_THROW(dequantize_blocks(DType::kF8E4M3, values, DType::kBF16, scales, 5, 2, out), Error);
}

}  // namespace
}  // namespace deepinfer
