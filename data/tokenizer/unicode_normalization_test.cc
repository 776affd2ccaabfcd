#include "data/tokenizer/unicode_normalization.h"

#include <string>

#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

// U+0301 COMBINING ACUTE ACCENT (class 230), U+0316 COMBINING GRAVE ACCENT BELOW (220), and
// NAG MUNDARI SIGN MUHOR U+1E4EC (232) and SIGN SUTUH U+1E4EF (230), Unicode 15.0.
constexpr char kAcute[] = "\xCC\x81";
constexpr char kGraveBelow[] = "\xCC\x96";
constexpr char kMuhor[] = "\xF0\x9E\x93\xAC";
constexpr char kSutuh[] = "\xF0\x9E\x93\xAF";

TEST(NormalizeAsTokenizersTest, NormalizesWhatUnicode9Knows) {
  // e + acute composes; acute + grave below reorder by combining class.
  EXPECT_EQ(NormalizeAsTokenizers(std::string("e") + kAcute, NormalizationForm::kNfc), "\xC3\xA9");
  EXPECT_EQ(NormalizeAsTokenizers("\xC3\xA9", NormalizationForm::kNfd), std::string("e") + kAcute);
  EXPECT_EQ(NormalizeAsTokenizers(std::string("a") + kAcute + kGraveBelow, NormalizationForm::kNfd),
            std::string("a") + kGraveBelow + kAcute);
  // NFKC: the ligature fi is two letters; NFC keeps it.
  EXPECT_EQ(NormalizeAsTokenizers("\xEF\xAC\x81", NormalizationForm::kNfkc), "fi");
  EXPECT_EQ(NormalizeAsTokenizers("\xEF\xAC\x81", NormalizationForm::kNfc), "\xEF\xAC\x81");
  EXPECT_EQ(NormalizeAsTokenizers("plain ASCII", NormalizationForm::kNfkd), "plain ASCII");
}

TEST(NormalizeAsTokenizersTest, CodePointsAssignedAfterUnicode9PassThroughAndBlock) {
  for (const NormalizationForm form : {NormalizationForm::kNfc, NormalizationForm::kNfd,
                                       NormalizationForm::kNfkc, NormalizationForm::kNfkd}) {
    // utf8proc 2.8 alone would put SUTUH (230) before MUHOR (232).
    const std::string marks = std::string("x") + kMuhor + kSutuh;
    EXPECT_EQ(NormalizeAsTokenizers(marks, form), marks);
    // Nothing reorders across MUHOR, and the run after it is normalized on its own: grave
    // below still goes before acute there.
    EXPECT_EQ(NormalizeAsTokenizers(std::string("a") + kAcute + kMuhor + kAcute + kGraveBelow,
                                    NormalizationForm::kNfd),
              std::string("a") + kAcute + kMuhor + kGraveBelow + kAcute);
  }
  // e + acute still composes on both sides of one.
  EXPECT_EQ(NormalizeAsTokenizers(std::string("e") + kAcute + kMuhor + "e" + kAcute,
                                  NormalizationForm::kNfc),
            std::string("\xC3\xA9") + kMuhor + "\xC3\xA9");
}

}  // namespace
}  // namespace plait::data::tokenizer
