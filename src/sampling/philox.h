// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel
// Random Numbers: As Easy as 1, 2, 3" (SC'11), written from the paper's description:
// a draw is a pure function of (counter, key), so a request's random numbers depend only on
// its own seed and position, never on which batch, thread or order produced them. The same
// function runs unchanged in a CUDA kernel (plain 32-bit integer arithmetic, no state).
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

namespace philox_detail {

// Round multipliers and Weyl key increments of Philox4x32 (paper, section 4.2).
inline constexpr uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
inline constexpr uint32_t kKeyIncrement0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kKeyIncrement1 = 0xBB67AE85u;  // sqrt(3) - 1

constexpr PhiloxCounter round(const PhiloxCounter& x, const PhiloxKey& key) {
  const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * x[0];
  const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * x[2];
  const auto hi0 = static_cast<uint32_t>(product0 >> 32);
  const auto lo0 = static_cast<uint32_t>(product0);
  const auto hi1 = static_cast<uint32_t>(product1 >> 32);
  const auto lo1 = static_cast<uint32_t>(product1);
  return {hi1 ^ x[1] ^ key[0], lo1, hi0 ^ x[3] ^ key[1], lo0};
}

}  // namespace philox_detail

// The bijection of `counter` selected by `key`, after `Rounds` rounds (10 is the
// Crush-resistant choice with safety margin that Random123 and cuRAND use).
template <int Rounds = 10>
constexpr PhiloxCounter philox4x32(PhiloxCounter counter, PhiloxKey key) {
  static_assert(Rounds >= 1 && Rounds <= 16);
  for (int r = 0; r < Rounds; ++r) {
    if (r > 0) {
      key[0] += philox_detail::kKeyIncrement0;
      key[1] += philox_detail::kKeyIncrement1;
    }
    counter = philox_detail::round(counter, key);
  }
  return counter;
}

// u32 -> float in [0, 1): the top 24 bits scaled by 2^-24, so every value is an exact
// multiple of 2^-24, evenly spaced, and 1.0 is never produced (max is 1 - 2^-24).
constexpr float unit_float_from_u32(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

// Two u32 -> double in [0, 1): 53 bits (32 from `high`, 21 from the top of `low`) scaled by
// 2^-53; max is 1 - 2^-53. The sampler uses this one, so that a token's chance is not
// quantised to 2^-24 when it walks a cumulative sum kept in double.
constexpr double unit_double_from_u32x2(uint32_t high, uint32_t low) {
  const uint64_t bits = (static_cast<uint64_t>(high) << 21) | (low >> 11);
  return static_cast<double>(bits) * 0x1p-53;
}

// What a draw is for, so that different uses of one request's seed never share numbers.
enum class RandomStream : uint32_t {
  kTokenSample = 0,        // the token drawn at an output position
  kSpeculativeAccept = 1,  // reserved: acceptance test of a drafted token at a position
};

// The stream layout: key = the 64-bit request seed; counter = (output position as 64 bits,
// completion index among the request's n, stream). Each (seed, position, sample, stream)
// owns one Philox block of four u32.
constexpr PhiloxCounter random_block(uint64_t seed, uint64_t position, uint32_t sample_index,
                                     RandomStream stream) {
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const PhiloxCounter counter = {static_cast<uint32_t>(position),
                                 static_cast<uint32_t>(position >> 32), sample_index,
                                 static_cast<uint32_t>(stream)};
  return philox4x32<10>(counter, key);
}

// The uniform in [0, 1) that picks the token at `position` of completion `sample_index`.
constexpr double token_uniform(uint64_t seed, uint64_t position, uint32_t sample_index) {
  const PhiloxCounter block =
      random_block(seed, position, sample_index, RandomStream::kTokenSample);
  return unit_double_from_u32x2(block[0], block[1]);
}

}  // namespace deepinfer::sampling
