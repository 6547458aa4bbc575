// Philox4x32 against the known-answer vectors published with Random123 (the authors'
// reference implementation of Salmon et al. 2011), here as reproduced by D. E. Shaw Research
// in Random123-Boost libs/random/test/test_philox.cpp, cut from Random123's kat_vectors.
#include "sampling/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace deepinfer::sampling {
namespace {

struct KnownAnswer {
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxCounter expected;
};

// The generator is constexpr: the reference vector also holds at compile time.
static_assert(philox4x32<10>({0, 0, 0, 0}, {0, 0}) ==
              PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});

TEST(Philox, Random123KnownAnswers10Rounds) {
  const std::vector<KnownAnswer> vectors = {
      {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
       {0x00000000u, 0x00000000u},
       {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const auto& v : vectors) EXPECT_EQ(philox4x32<10>(v.counter, v.key), v.expected);
}

// The 7-round vectors check the key schedule independently of the round count.
TEST(Philox, Random123KnownAnswers7Rounds) {
  const std::vector<KnownAnswer> vectors = {
      {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
       {0x00000000u, 0x00000000u},
       {0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}},
  };
  for (const auto& v : vectors) EXPECT_EQ(philox4x32<7>(v.counter, v.key), v.expected);
}

TEST(Philox, UnitFloatIsTop24BitsTimesTwoToMinus24) {
  EXPECT_EQ(unit_float_from_u32(0u), 0.0f);
  EXPECT_EQ(unit_float_from_u32(0xffu), 0.0f);  // the low 8 bits are dropped
  EXPECT_EQ(unit_float_from_u32(0x100u), std::ldexp(1.0f, -24));
  EXPECT_EQ(unit_float_from_u32(0x80000000u), 0.5f);
  EXPECT_EQ(unit_float_from_u32(0xffffffffu), 1.0f - std::ldexp(1.0f, -24));
  EXPECT_LT(unit_float_from_u32(0xffffffffu), 1.0f);
}

TEST(Philox, UnitDoubleUses53Bits) {
  EXPECT_EQ(unit_double_from_u32x2(0u, 0u), 0.0);
  EXPECT_EQ(unit_double_from_u32x2(0x80000000u, 0u), 0.5);
  EXPECT_EQ(unit_double_from_u32x2(0u, 0x800u), std::ldexp(1.0, -53));
  EXPECT_EQ(unit_double_from_u32x2(0u, 0x7ffu), 0.0);  // below the 53rd bit
  EXPECT_EQ(unit_double_from_u32x2(0xffffffffu, 0xffffffffu), 1.0 - std::ldexp(1.0, -53));
  EXPECT_LT(unit_double_from_u32x2(0xffffffffu, 0xffffffffu), 1.0);
}

// The documented stream layout: key = seed halves, counter = (position lo, position hi,
// sample index, stream).
TEST(Philox, StreamLayout) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t position = 0x0000000500000002ull;
  EXPECT_EQ(random_block(seed, position, 3, RandomStream::kTokenSample),
            philox4x32<10>({2u, 5u, 3u, 0u}, {0x89abcdefu, 0x01234567u}));
  EXPECT_EQ(random_block(seed, position, 3, RandomStream::kSpeculativeAccept),
            philox4x32<10>({2u, 5u, 3u, 1u}, {0x89abcdefu, 0x01234567u}));
  const PhiloxCounter block = philox4x32<10>({2u, 5u, 3u, 0u}, {0x89abcdefu, 0x01234567u});
  EXPECT_EQ(token_uniform(seed, position, 3), unit_double_from_u32x2(block[0], block[1]));
}

// A sanity check of the uniforms a request sees along its positions: 16 equal bins over
// 160000 positions; chi-square with 15 degrees of freedom stays far below the 1e-6 tail (~52).
TEST(Philox, TokenUniformsFillBinsEvenly) {
  constexpr int kBins = 16;
  constexpr int kDraws = 160000;
  std::vector<int> counts(kBins, 0);
  for (int i = 0; i < kDraws; ++i) {
    const double u = token_uniform(42, static_cast<uint64_t>(i), 0);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++counts[static_cast<size_t>(u * kBins)];
  }
  const double expected = static_cast<double>(kDraws) / kBins;
  double chi_square = 0.0;
  for (const int count : counts) chi_square += (count - expected) * (count - expected) / expected;
  EXPECT_LT(chi_square, 52.0);
}

}  // namespace
}  // namespace deepinfer::sampling
