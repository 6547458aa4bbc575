#include "model/deepseek_v41/engram_hash.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer::deepseek_v41 {
namespace {

// 128-bit arithmetic for PCG64 and Lemire's method (a GCC/Clang extension).
__extension__ typedef unsigned __int128 u128;

// ---- numpy's SeedSequence (numpy/random/bit_generator.pyx) ----
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

struct SeedSequence {
  uint32_t pool[kPoolSize];

  explicit SeedSequence(uint64_t seed) {
    // The entropy integer as little-endian 32-bit words (at least one).
    std::vector<uint32_t> entropy;
    do {
      entropy.push_back(static_cast<uint32_t>(seed & 0xFFFFFFFFu));
      seed >>= 32;
    } while (seed != 0);
    uint32_t hash_const = kInitA;
    auto hashmix = [&](uint32_t value) {
      value ^= hash_const;
      hash_const *= kMultA;
      value *= hash_const;
      value ^= value >> kXShift;
      return value;
    };
    auto mix = [](uint32_t x, uint32_t y) {
      uint32_t result = kMixMultL * x - kMixMultR * y;
      result ^= result >> kXShift;
      return result;
    };
    for (int i = 0; i < kPoolSize; ++i) {
      pool[i] =
          hashmix(static_cast<size_t>(i) < entropy.size() ? entropy[static_cast<size_t>(i)] : 0u);
    }
    for (int src = 0; src < kPoolSize; ++src) {
      for (int dst = 0; dst < kPoolSize; ++dst) {
        if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
      }
    }
    for (size_t src = kPoolSize; src < entropy.size(); ++src) {
      for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
    }
  }

  std::vector<uint64_t> generate_state_u64(int words64) const {
    uint32_t hash_const = kInitB;
    std::vector<uint32_t> words(static_cast<size_t>(2 * words64));
    for (size_t i = 0; i < words.size(); ++i) {
      uint32_t value = pool[i % kPoolSize];
      value ^= hash_const;
      hash_const *= kMultB;
      value *= hash_const;
      value ^= value >> kXShift;
      words[i] = value;
    }
    std::vector<uint64_t> state(static_cast<size_t>(words64));
    for (int i = 0; i < words64; ++i) {
      state[static_cast<size_t>(i)] =
          static_cast<uint64_t>(words[static_cast<size_t>(2 * i)]) |
          (static_cast<uint64_t>(words[static_cast<size_t>(2 * i + 1)]) << 32);
    }
    return state;
  }
};

// ---- PCG64 (XSL-RR 128/64), seeded as numpy's PCG64 does ----
class Pcg64 {
 public:
  explicit Pcg64(const SeedSequence& seeds) {
    const std::vector<uint64_t> s = seeds.generate_state_u64(4);
    const u128 initstate = (static_cast<u128>(s[0]) << 64) | s[1];
    const u128 initseq = (static_cast<u128>(s[2]) << 64) | s[3];
    state_ = 0;
    increment_ = (initseq << 1) | 1;
    step();
    state_ += initstate;
    step();
  }

  uint64_t next() {
    step();
    const uint64_t folded = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
    const unsigned rotation = static_cast<unsigned>(state_ >> 122);
    return (folded >> rotation) | (folded << ((64 - rotation) & 63));
  }

 private:
  void step() {
    const u128 multiplier =
        (static_cast<u128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;
    state_ = state_ * multiplier + increment_;
  }
  u128 state_ = 0;
  u128 increment_ = 0;
};

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2) {
    if (n % d == 0) return false;
  }
  return true;
}

}  // namespace

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int64_t count) {
  DI_CHECK(high > (int64_t{1} << 32), "only ranges above 2^32 are reproduced, got ", high);
  Pcg64 generator{SeedSequence(seed)};
  const uint64_t range_exclusive = static_cast<uint64_t>(high);  // rng + 1 with low = 0
  std::vector<int64_t> values;
  for (int64_t i = 0; i < count; ++i) {
    // Lemire's multiply-and-reject, as numpy's bounded_lemire_uint64.
    u128 product = static_cast<u128>(generator.next()) * range_exclusive;
    uint64_t leftover = static_cast<uint64_t>(product);
    if (leftover < range_exclusive) {
      const uint64_t threshold =
          (std::numeric_limits<uint64_t>::max() - (range_exclusive - 1)) % range_exclusive;
      while (leftover < threshold) {
        product = static_cast<u128>(generator.next()) * range_exclusive;
        leftover = static_cast<uint64_t>(product);
      }
    }
    values.push_back(static_cast<int64_t>(product >> 64));
  }
  return values;
}

std::vector<int32_t> read_engram_token_map(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) DI_THROW("cannot open engram token map ", path.string());
  try {
    return nlohmann::json::parse(file).get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception& error) {
    DI_THROW(path.string(), ": an engram token map must be a JSON array of compressed ids (",
             error.what(), ")");
  }
}

EngramHasher::EngramHasher(const DeepseekV41TextConfig& config, std::vector<int32_t> token_map)
    : layer_ids_(config.engram_layer_ids),
      max_ngram_(config.engram_max_ngram_size),
      heads_(config.engram_n_heads),
      columns_((config.engram_max_ngram_size - 1) * config.engram_n_heads),
      token_map_(std::move(token_map)) {
  if (max_ngram_ < 2 || heads_ < 1) {
    DI_THROW("engram needs engram_max_ngram_size >= 2 and engram_n_heads >= 1, got ", max_ngram_,
             " and ", heads_);
  }
  std::set<int32_t> distinct(token_map_.begin(), token_map_.end());
  if (static_cast<int64_t>(distinct.size()) != config.engram_compressed_vocab_size) {
    DI_THROW("the engram token map has ", distinct.size(),
             " distinct compressed ids but engram_compressed_vocab_size is ",
             config.engram_compressed_vocab_size, "; the hash multipliers would not match");
  }
  if (config.engram_pad_id < 0 || config.engram_pad_id >= static_cast<int64_t>(token_map_.size())) {
    DI_THROW("engram_pad_id ", config.engram_pad_id, " is outside the token map of ",
             token_map_.size(), " tokens");
  }
  pad_id_ = token_map_[static_cast<size_t>(config.engram_pad_id)];

  std::set<int64_t> seen;
  const int64_t bound = std::max<int64_t>(
      1, (std::numeric_limits<int64_t>::max() / config.engram_compressed_vocab_size) / 2);
  for (size_t layer = 0; layer < layer_ids_.size(); ++layer) {
    std::vector<int64_t> primes;
    for (int64_t n = 0; n + 1 < max_ngram_; ++n) {
      int64_t current = config.engram_vocab_size - 1;
      for (int64_t h = 0; h < heads_; ++h) {
        int64_t candidate = current + 1;
        while (!is_prime(candidate) || seen.count(candidate)) ++candidate;
        seen.insert(candidate);
        primes.push_back(candidate);
        current = candidate;
      }
    }
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int64_t p : primes) {
      offsets.push_back(total);
      total += p;
    }
    primes_.push_back(std::move(primes));
    offsets_.push_back(std::move(offsets));
    table_rows_.push_back(total);
    std::vector<int64_t> multipliers = numpy_default_rng_integers(
        static_cast<uint64_t>(10007 * layer_ids_[layer]), bound, max_ngram_);
    for (int64_t& m : multipliers) m = m * 2 + 1;
    multipliers_.push_back(std::move(multipliers));
  }
}

int32_t EngramHasher::compressed_id(int32_t token) const {
  if (token < 0 || token >= static_cast<int32_t>(token_map_.size())) {
    DI_THROW("token id ", token, " is outside the engram token map of ", token_map_.size(),
             " tokens");
  }
  return token_map_[static_cast<size_t>(token)];
}

void EngramHasher::hash(std::span<const int32_t> window, std::span<int64_t> out) const {
  DI_CHECK(static_cast<int64_t>(window.size()) == max_ngram_ &&
           static_cast<int64_t>(out.size()) == layers() * columns_);
  // Look-back stops at the sequence start (and, once blocked, stays blocked).
  std::vector<int64_t> tokens(static_cast<size_t>(max_ngram_));
  bool blocked = false;
  for (int64_t s = 0; s < max_ngram_; ++s) {
    blocked = blocked || window[static_cast<size_t>(s)] < 0;
    tokens[static_cast<size_t>(s)] = blocked ? pad_id_ : window[static_cast<size_t>(s)];
  }
  for (size_t layer = 0; layer < layer_ids_.size(); ++layer) {
    const auto& mult = multipliers_[layer];
    int64_t rolling = tokens[0] * mult[0];
    for (int64_t n = 1; n < max_ngram_; ++n) {
      rolling ^= tokens[static_cast<size_t>(n)] * mult[static_cast<size_t>(n)];
      for (int64_t h = 0; h < heads_; ++h) {
        const size_t column = static_cast<size_t>((n - 1) * heads_ + h);
        out[layer * static_cast<size_t>(columns_) + column] =
            rolling % primes_[layer][column] + offsets_[layer][column];
      }
    }
  }
}

}  // namespace deepinfer::deepseek_v41
