#include "data/tokenizer/piece_cache.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(PieceCacheTest, AppendsTheIdsOfInsertedPiecesOnly) {
  PieceCache cache;
  std::vector<int32_t> ids = {7};
  EXPECT_FALSE(cache.Append("hello", ids));
  EXPECT_THAT(ids, ElementsAre(7));
  const std::vector<int32_t> hello = {1, 2};
  cache.Insert("hello", hello);
  EXPECT_TRUE(cache.Append("hello", ids));
  EXPECT_THAT(ids, ElementsAre(7, 1, 2));
  EXPECT_FALSE(cache.Append("hell", ids));
}

TEST(PieceCacheTest, AppendOrMergeMergesAPieceOnceUnlessItIsTooLongToCache) {
  PieceCache cache;
  int merges = 0;
  const auto merge = [&](absl::string_view piece, std::vector<int32_t>& ids) {
    ++merges;
    ids.push_back(static_cast<int32_t>(piece.size()));
  };
  std::vector<int32_t> ids;
  cache.AppendOrMerge("word", ids, merge);
  cache.AppendOrMerge("word", ids, merge);
  EXPECT_EQ(merges, 1);
  const std::string long_piece(kMaxCachedPiece + 1, 'x');
  cache.AppendOrMerge(long_piece, ids, merge);
  cache.AppendOrMerge(long_piece, ids, merge);
  EXPECT_EQ(merges, 3);
  EXPECT_THAT(ids, ElementsAre(4, 4, kMaxCachedPiece + 1, kMaxCachedPiece + 1));
}

TEST(PieceCacheTest, StaysBoundedAndCorrectPastItsCapacity) {
  PieceCache cache;
  constexpr int kPieces = 1 << 19;  // more than all shards hold
  for (int i = 0; i < kPieces; ++i) cache.Insert(std::to_string(i), std::vector<int32_t>{i});
  int found = 0;
  for (int i = 0; i < kPieces; ++i) {
    std::vector<int32_t> ids;
    if (!cache.Append(std::to_string(i), ids)) {
      EXPECT_THAT(ids, IsEmpty());
      continue;
    }
    ++found;
    EXPECT_THAT(ids, ElementsAre(i));
  }
  EXPECT_GT(found, 0);
  EXPECT_LT(found, kPieces);
}

}  // namespace
}  // namespace plait::data::tokenizer
