#include "base/hash.h"

#include <string>

#include "gtest/gtest.h"

namespace plait::base {
namespace {

TEST(HashTest, Fnv1a64MatchesPublishedValues) {
  // FNV-1a 64 test vectors (Fowler, Noll, Vo: "FNV hash" reference tables).
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(HashTest, Fnv1a64WordsTakesTheTailByteByByte) {
  // Fewer than 8 bytes: exactly FNV-1a.
  EXPECT_EQ(Fnv1a64Words(kFnv1a64OffsetBasis, "foobar", 6), Fnv1a64("foobar"));
  // A changed byte in the word-sized part changes the hash.
  const std::string a = "0123456789abcdef!", b = "0123456789abcdeF!";
  EXPECT_NE(Fnv1a64Words(kFnv1a64OffsetBasis, a.data(), a.size()),
            Fnv1a64Words(kFnv1a64OffsetBasis, b.data(), b.size()));
}

TEST(HashTest, SplitMix64MatchesTheReferenceSequence) {
  // The first outputs of Vigna's splitmix64.c seeded with 0: state += golden gamma, then mix.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
}

}  // namespace
}  // namespace plait::base
