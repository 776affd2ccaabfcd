#include "data/packing.h"

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {
namespace {

using ::testing::ElementsAre;

using Rows = std::vector<std::vector<int64_t>>;

TEST(BestFitDecreasingTest, PlacesEachLengthIntoTheTightestRowThatFitsIt) {
  EXPECT_EQ(BestFitDecreasing({5, 3, 2, 4}, 7), (Rows{{0, 2}, {3, 1}}));
  // 6 and 5 open rows with 2 and 3 left; 3 fills the row with 3 left, 2 the row with 2 left,
  // and 1 opens a row.
  EXPECT_EQ(BestFitDecreasing({6, 5, 1, 3, 2}, 8), (Rows{{0, 4}, {1, 3}, {2}}));
}

TEST(BestFitDecreasingTest, TiesGoInIndexOrderAndToTheRowThatHadTheSpaceFirst) {
  // Lengths 4 (indices 0, 2, 3) open three rows of space 2 each, in index order; the 2s go to
  // those rows in the order they opened.
  EXPECT_EQ(BestFitDecreasing({4, 2, 4, 4, 2, 2}, 6), (Rows{{0, 1}, {2, 4}, {3, 5}}));
}

TEST(BestFitDecreasingTest, TakesTheTightestRowNotTheFirstThatFits) {
  // 7 and 4 open rows with 3 and 6 left, the other 4 leaves the second row 2; the 1 goes
  // there, where first fit would put it into the first row.
  EXPECT_EQ(BestFitDecreasing({4, 7, 1, 4}, 10), (Rows{{1}, {0, 3, 2}}));
}

TEST(BestFitDecreasingTest, AFullRowTakesNothingMore) {
  EXPECT_EQ(BestFitDecreasing({3, 3, 1}, 3), (Rows{{0}, {1}, {2}}));
  EXPECT_EQ(BestFitDecreasing({}, 3), Rows{});
}

TEST(BestFitDecreasingTest, EveryIndexIsPlacedOnceAndNoRowOverflows) {
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 500; ++i) lengths.push_back(1 + (i * 7919) % 97);
  const Rows rows = BestFitDecreasing(lengths, 100);
  std::vector<int> placed(lengths.size(), 0);
  int64_t total = 0;
  for (const std::vector<int64_t>& row : rows) {
    int64_t used = 0;
    for (const int64_t index : row) {
      ++placed[index];
      used += lengths[index];
    }
    EXPECT_LE(used, 100);
    total += used;
  }
  EXPECT_THAT(placed, ::testing::Each(1));
  // Best fit leaves little room: fewer than 3% more rows than the tokens need.
  EXPECT_LE(static_cast<double>(rows.size()), 1.03 * static_cast<double>(total) / 100 + 1);
}

TEST(DocumentPositionsTest, RestartAtEachDocumentStartAndAtEachRow) {
  const at::Tensor inputs = torch::tensor({7, 1, 2, 0, 3, 0, 0, 4, 5, 6, 0, 8}).view({2, 6});
  const at::Tensor positions = DocumentPositions(inputs, 0);
  EXPECT_TRUE(
      at::equal(positions, torch::tensor({0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 1}).view({2, 6})))
      << positions;
}

}  // namespace
}  // namespace plait::data
