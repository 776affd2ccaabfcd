#include "data/tokenizer/tokenizer.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::testing::Eq;
using ::testing::Optional;

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";

std::string Replaced(int count) {
  std::string text;
  for (int i = 0; i < count; ++i) absl::StrAppend(&text, kReplacement);
  return text;
}

TEST(Utf8Test, WellFormedTextIsValid) {
  EXPECT_EQ(FirstInvalidUtf8(""), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("plain ASCII text, longer than eight bytes"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("Café 你好 🤗 \xF4\x8F\xBF\xBF"),
            std::nullopt);  // up to U+10FFFF
  EXPECT_EQ(ReplaceInvalidUtf8("Café 你好 🤗"), "Café 你好 🤗");
}

TEST(Utf8Test, FindsTheFirstIllFormedByte) {
  EXPECT_THAT(FirstInvalidUtf8("abcdefghij\x80"), Optional(Eq(10u)));
  EXPECT_THAT(FirstInvalidUtf8("caf\xC3 and more"), Optional(Eq(3u)));
  EXPECT_THAT(FirstInvalidUtf8("\xED\xA0\x80"), Optional(Eq(0u)));     // a surrogate
  EXPECT_THAT(FirstInvalidUtf8("ok \xF0\x9F\x98"), Optional(Eq(3u)));  // truncated at the end
}

// The expected strings are what Python's bytes.decode("utf-8", errors="replace") gives.
TEST(Utf8Test, ReplacesEachMaximalSubpartOnce) {
  EXPECT_EQ(ReplaceInvalidUtf8("caf\xC3 and \xE4\xBD end"),
            absl::StrCat("caf", kReplacement, " and ", kReplacement, " end"));
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), Replaced(2));          // overlong: no valid lead
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), Replaced(3));      // surrogate
  EXPECT_EQ(ReplaceInvalidUtf8("\xE0\x80\x80"), Replaced(3));      // overlong 3-byte form
  EXPECT_EQ(ReplaceInvalidUtf8("\xF4\x90\x80\x80"), Replaced(4));  // above U+10FFFF
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x98"), Replaced(1));      // truncated emoji
  EXPECT_EQ(ReplaceInvalidUtf8("a\xFF"
                               "b"),
            absl::StrCat("a", kReplacement, "b"));
}

}  // namespace
}  // namespace plait::data::tokenizer
