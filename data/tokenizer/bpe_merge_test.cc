#include "data/tokenizer/bpe_merge.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Ids of a toy vocabulary: a b c, then what merges make of them.
constexpr int32_t kA = 0, kB = 1, kC = 2, kAb = 3, kBc = 4, kAbc = 5, kAa = 6;

std::vector<int32_t> Merged(const MergeTable& merges, const std::vector<int32_t>& initial) {
  std::vector<int32_t> ids = {-7};  // Merge appends
  merges.Merge(initial, ids);
  ids.erase(ids.begin());
  return ids;
}

TEST(MergeTableTest, LowestRankFirstThenWhatItMakes) {
  MergeTable merges;
  merges.Add(kB, kC, 0, kBc);
  merges.Add(kA, kB, 1, kAb);
  merges.Add(kAb, kC, 2, kAbc);
  // b+c goes first, so a+b never can; ab+c is never formed.
  EXPECT_THAT(Merged(merges, {kA, kB, kC}), ElementsAre(kA, kBc));
  merges = MergeTable();
  merges.Add(kA, kB, 0, kAb);
  merges.Add(kB, kC, 1, kBc);
  merges.Add(kAb, kC, 2, kAbc);
  EXPECT_THAT(Merged(merges, {kA, kB, kC, kA}), ElementsAre(kAbc, kA));
}

TEST(MergeTableTest, LeftmostOfEqualRanksFirst) {
  MergeTable merges;
  merges.Add(kA, kA, 0, kAa);
  EXPECT_THAT(Merged(merges, {kA, kA, kA}), ElementsAre(kAa, kA));
  EXPECT_THAT(Merged(merges, {kA, kA, kA, kA}), ElementsAre(kAa, kAa));
}

TEST(MergeTableTest, APairAddedTwiceKeepsItsFirstRank) {
  MergeTable merges;
  merges.Add(kA, kB, 0, kAb);
  merges.Add(kB, kC, 1, kBc);
  merges.Add(kA, kB, 2, kAb);
  EXPECT_THAT(Merged(merges, {kA, kB, kC}), ElementsAre(kAb, kC));
}

TEST(MergeTableTest, NothingToMerge) {
  MergeTable merges;
  EXPECT_THAT(Merged(merges, {}), IsEmpty());
  EXPECT_THAT(Merged(merges, {kC, kB, kA}), ElementsAre(kC, kB, kA));
}

}  // namespace
}  // namespace plait::data::tokenizer
