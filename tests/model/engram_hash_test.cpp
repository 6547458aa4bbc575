// Engram hashing against numpy/sympy: the expected values below were printed by the reference
// algorithm (inference/engram.py) run in Python with numpy 2.4 and sympy 1.14:
//   bound = (iinfo(int64).max // V) // 2
//   np.random.default_rng(10007 * layer).integers(0, bound, size=(n,), dtype=np.int64) * 2 + 1
// and the prime layout / rolling-XOR hash of EngramLayout / NgramHashState.
#include <gtest/gtest.h>

#include "model/deepseek_v41/engram_hash.h"
#include "random_model.h"

namespace deepinfer::deepseek_v41 {
namespace {

TEST(EngramHashTest, MultipliersMatchNumpyDefaultRng) {
  const int64_t bound_released = 46539438283891;  // V = 99092, a release-sized vocab
  EXPECT_EQ(numpy_default_rng_integers(10007 * 1, bound_released, 4),
            (std::vector<int64_t>{38316048023122, 2419938046656, 17979836159674, 36993668729195}));
  EXPECT_EQ(numpy_default_rng_integers(10007 * 14, bound_released, 4),
            (std::vector<int64_t>{33858405369630, 25755403400457, 15460673601360, 41309613242795}));
  const int64_t bound_small = 23058430092136939;  // V = 200
  EXPECT_EQ(numpy_default_rng_integers(0, bound_small, 3),
            (std::vector<int64_t>{14687336538471342, 6220858079111564, 944785137311245}));
}

TEST(EngramHashTest, LayoutAndHashesMatchTheReference) {
  DeepseekV41TextConfig config = testing::tiny_config(
      R"({"engram_layer_ids": [1, 3], "engram_num_embeddings": [0, 0], "engram_vocab_size": 40,
          "engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_compressed_vocab_size": 200,
          "engram_pad_id": 2})");
  std::vector<int32_t> map(300);
  for (int32_t i = 0; i < 300; ++i) map[i] = (i + 5) % 200;  // pad id 2 -> compressed 7
  EngramHasher hasher(config, map);
  EXPECT_EQ(hasher.pad_id(), 7);
  // Primes [[41, 43], [47, 53]] and [[59, 61], [67, 71]]: rows are their sums.
  EXPECT_EQ(hasher.table_rows(0), 41 + 43 + 47 + 53);
  EXPECT_EQ(hasher.table_rows(1), 59 + 61 + 67 + 71);
  EXPECT_EQ(hasher.multipliers(0),
            (std::vector<int64_t>{37968138307073165, 2397965009193117, 17816579247344819}));
  std::vector<int64_t> out(8);
  const std::vector<int32_t> full = {5, 199, 3};
  hasher.hash(full, out);
  EXPECT_EQ(out, (std::vector<int64_t>{16, 68, 111, 143, 20, 79, 152, 228}));
  const std::vector<int32_t> gap = {5, -1, 3};  // look-back stops at the first missing token
  hasher.hash(gap, out);
  EXPECT_EQ(out, (std::vector<int64_t>{13, 48, 102, 181, 21, 90, 137, 216}));
  const std::vector<int32_t> start = {0, 0, -1};
  hasher.hash(start, out);
  EXPECT_EQ(out, (std::vector<int64_t>{0, 41, 110, 171, 0, 59, 121, 211}));
}

TEST(EngramHashTest, TokenMapMustMatchTheCompressedVocabSize) {
  DeepseekV41TextConfig config = testing::tiny_config();
  std::vector<int32_t> map(300, 0);
  EXPECT_THROW(EngramHasher(config, map), Error);
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
