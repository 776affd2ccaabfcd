#include "data/tokenizer/unicode_categories.h"

#include <pcre2.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The first match of `pattern` (compiled as the BPE tokenizer compiles it) in `text`, or
// "<none>".
std::string FirstMatch(const std::string& pattern, const std::string& text) {
  int error;
  PCRE2_SIZE offset;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr),
      pcre2_code_free);
  EXPECT_NE(code, nullptr) << pattern << " at " << offset;
  if (code == nullptr) return "<no pattern>";
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  if (pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0,
                  data.get(), nullptr) < 0) {
    return "<none>";
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
  return text.substr(ovector[0], ovector[1] - ovector[0]);
}

// Unicode 15.0's NAG MUNDARI LETTER O (Lo) and DIGIT ZERO..TWO (Nd); Unicode 16.0's GARAY
// DIGIT ZERO (Nd) and GARAY SMALL LETTER A (Ll), in UTF-8.
constexpr char kNagMundariO[] = "\xF0\x9E\x93\x90";
constexpr char kNagMundariDigits[] = "\xF0\x9E\x93\xB0\xF0\x9E\x93\xB1\xF0\x9E\x93\xB2";
constexpr char kGarayZero[] = "\xF0\x90\xB5\x80";
constexpr char kGaraySmallA[] = "\xF0\x90\xB5\xB0";

TEST(WidenToUnicode16Test, LettersAndDigitsAssignedSinceUnicode14MatchTheirCategories) {
  const std::string letters = WidenToUnicode16(R"(\p{L}+)");
  EXPECT_EQ(FirstMatch(letters, std::string("a") + kNagMundariO + kGaraySmallA + "b!"),
            std::string("a") + kNagMundariO + kGaraySmallA + "b");
  const std::string digits = WidenToUnicode16(R"(\p{N}{1,3})");
  EXPECT_EQ(FirstMatch(digits, std::string("x") + kNagMundariDigits + "7"), kNagMundariDigits);
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\p{Nd})"), kGarayZero), kGarayZero);
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\pN)"), kGarayZero), kGarayZero);
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\p{ l_l })"), kGaraySmallA), kGaraySmallA);
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\p{L&})"), kGaraySmallA), kGaraySmallA);
  // Not a lower-case letter, a letter nonetheless.
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\p{Ll})"), kNagMundariO), "<none>");
}

TEST(WidenToUnicode16Test, NegatedClassesLoseTheAddedCodePoints) {
  // Llama 3's "[^\r\n\p{L}\p{N}]?\p{L}+": the optional prefix must not take a new letter.
  const std::string llama3 = WidenToUnicode16(R"([^\r\n\p{L}\p{N}]?\p{L}+)");
  EXPECT_EQ(FirstMatch(llama3, std::string(" ") + kNagMundariO + kNagMundariO),
            std::string(" ") + kNagMundariO + kNagMundariO);
  EXPECT_EQ(FirstMatch(llama3, std::string(kGarayZero) + kNagMundariO), kNagMundariO);
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\P{N}+)"), std::string("ab") + kGarayZero), "ab");
  EXPECT_EQ(FirstMatch(WidenToUnicode16(R"(\p{^N}+)"), std::string("ab") + kGarayZero), "ab");
  // Plain PCRE2 (Unicode 14) takes the Garay digit for a non-number: the test can fail.
  EXPECT_EQ(FirstMatch(R"(\P{N}+)", std::string("ab") + kGarayZero),
            std::string("ab") + kGarayZero);
}

TEST(WidenToUnicode16Test, LeavesWhatItDoesNotWiden) {
  for (const char* pattern :
       {R"(\s+(?!\S)|\s+)", R"(\p{Han}+|\p{C}|\p{Cn}|\d\w)", R"([\P{L}x])", R"(\p)",
        R"(\Q\p{L}[\E)", R"((?#\p{L}[)a)", R"(\c[\p{Han})", "", "(?i:'s|'t)"}) {
    EXPECT_EQ(WidenToUnicode16(pattern), pattern);
  }
}

TEST(WidenToUnicode16Test, KnowsWhereACharacterClassEnds) {
  // "]" first in a class, "[:alpha:]" and an escaped "]" are inside it; \p{N} after the class
  // is outside it and gets a class of its own.
  for (const char* pattern :
       {R"([]\p{L}]\p{N})", R"([[:alpha:]\p{L}]\p{N})", R"([\]\p{L}]\p{N})"}) {
    const std::string widened = WidenToUnicode16(pattern);
    EXPECT_THAT(widened, HasSubstr(R"(\p{L}\x{)")) << pattern;
    EXPECT_THAT(widened, HasSubstr(R"(][\p{N}\x{)")) << pattern;
    EXPECT_EQ(FirstMatch(widened, std::string("!") + kNagMundariO + kGarayZero),
              std::string(kNagMundariO) + kGarayZero)
        << pattern;
  }
  const std::string negated = WidenToUnicode16(R"([^]\p{L}]\p{N})");
  EXPECT_EQ(FirstMatch(negated, std::string(kNagMundariO) + kGarayZero + "!" + kGarayZero),
            std::string("!") + kGarayZero);
  EXPECT_THAT(WidenToUnicode16(R"([\p{L}])"), StartsWith(R"([\p{L}\x{)"));
  EXPECT_THAT(WidenToUnicode16(R"([\p{L}])"), Not(HasSubstr("[[")));
}

}  // namespace
}  // namespace plait::data::tokenizer
