// Malformed and unsupported SentencePiece models: each a change to Mistral 7B v0.1's
// tokenizer.model (testdata/mistral) that must fail with an error naming the field; and the
// word-by-word, cached merges against the merges of the whole text. The ids of the unchanged
// model are checked against Google's sentencepiece in tokenizer_golden_test.
#include "data/tokenizer/sentencepiece_tokenizer.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "data/tokenizer/sentencepiece_model.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ModelProto = sentencepiece::ModelProto;

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseChanged(
    const std::function<void(ModelProto&)>& change) {
  ModelProto model;
  EXPECT_TRUE(model.ParseFromString(
      base::ReadFile("data/tokenizer/testdata/mistral/tokenizer.model").value()));
  change(model);
  return ParseSentencePieceTokenizer("tokenizer.model", model.SerializeAsString());
}

TEST(SentencePieceTokenizerTest, TheUnchangedModelLoads) {
  EXPECT_THAT(ParseChanged([](ModelProto&) {}), IsOk());
}

TEST(SentencePieceTokenizerTest, NotAModelIsNamed) {
  EXPECT_THAT(ParseSentencePieceTokenizer("tokenizer.model", "{\"model\": {}}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokenizer.model: not a SentencePiece model")));
}

TEST(SentencePieceTokenizerTest, UnsupportedSettingsAreNamed) {
  const struct {
    std::function<void(ModelProto&)> change;
    const char* message;
  } cases[] = {
      {[](ModelProto& m) {
         m.mutable_trainer_spec()->set_model_type(sentencepiece::TrainerSpec::UNIGRAM);
       },
       "trainer_spec.model_type: UNIGRAM is not supported"},
      {[](ModelProto& m) { m.mutable_trainer_spec()->set_byte_fallback(false); },
       "trainer_spec.byte_fallback: false"},
      {[](ModelProto& m) { m.mutable_normalizer_spec()->set_precompiled_charsmap("rules"); },
       "normalizer_spec.precompiled_charsmap"},
      {[](ModelProto& m) { m.mutable_normalizer_spec()->set_remove_extra_whitespaces(true); },
       "normalizer_spec.remove_extra_whitespaces: true"},
      {[](ModelProto& m) {
         m.mutable_pieces(500)->set_type(ModelProto::SentencePiece::USER_DEFINED);
       },
       "pieces[500].type: USER_DEFINED pieces are not supported"},
      {[](ModelProto& m) {
         // U+E000, a private-use character, is no piece of Mistral's.
         ModelProto::SentencePiece* piece = m.add_pieces();
         piece->set_piece("a\xEE\x80\x80");
         piece->set_score(-1e9);
       },
       "pieces[32000]: \"a\xEE\x80\x80\" holds \"\xEE\x80\x80\", which is no NORMAL piece"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ParseChanged(c.change),
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr(c.message)));
  }
}

TEST(SentencePieceTokenizerTest, ByteFallbackNeedsEveryByte) {
  EXPECT_THAT(ParseChanged([](ModelProto& m) {
                // Mistral's byte pieces are ids 3..258: <0x00> .. <0xFF>.
                m.mutable_pieces(3 + 0x41)->set_piece("<0x4G>");
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pieces[68]: \"<0x4G>\" is a BYTE piece not written <0xNN>")));
}

// Models sentencepiece 0.2 refuses to load ("piece must not be empty.", "▁U is already
// defined.", "unk is already defined."), checked with its Python module.
TEST(SentencePieceTokenizerTest, EmptyAndDuplicatePiecesAreRefusedAsSentencepieceRefusesThem) {
  const struct {
    std::function<void(ModelProto&)> change;
    std::string message;
  } cases[] = {
      {[](ModelProto& m) { m.mutable_pieces(501)->set_piece(""); }, "pieces[501]: is empty"},
      {[](ModelProto& m) { m.mutable_pieces(1)->set_piece(""); }, "pieces[1]: is empty"},
      {[](ModelProto& m) { m.mutable_pieces(501)->set_piece(m.pieces(500).piece()); },
       "pieces[501]: \"\xE2\x96\x81U\" is pieces[500] too"},
      // Of another type too: a control piece spelled as a normal one.
      {[](ModelProto& m) { m.mutable_pieces(2)->set_piece(m.pieces(500).piece()); },
       "pieces[500]: \"\xE2\x96\x81U\" is pieces[2] too"},
      {[](ModelProto& m) { m.mutable_pieces(4)->set_piece(m.pieces(3).piece()); },
       "pieces[4]: \"<0x00>\" is pieces[3] too"},
      {[](ModelProto& m) { m.mutable_pieces(1)->set_type(ModelProto::SentencePiece::UNKNOWN); },
       "pieces[1]: a second UNKNOWN piece (pieces[0] is one)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ParseChanged(c.change),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("tokenizer.model: ", c.message,
                                                "; sentencepiece refuses such a model"))));
  }
}

// Mistral's pieces never hold a space after a non-space, so its tokenizer merges word by word,
// through a cache; one piece more that does ("q▁q", never in the text, so no id changes) makes
// it merge the whole text, as SentencePiece does. Both must give the same ids, cold and cached,
// whatever the runs of spaces.
TEST(SentencePieceTokenizerTest, WordByWordMergesAreThoseOfTheWholeText) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> by_words = ParseChanged([](ModelProto&) {});
  absl::StatusOr<std::unique_ptr<Tokenizer>> whole = ParseChanged([](ModelProto& m) {
    ModelProto::SentencePiece* piece = m.add_pieces();
    piece->set_piece("q\xE2\x96\x81q");
    piece->set_score(-1e9);
  });
  ASSERT_THAT(by_words, IsOk());
  ASSERT_THAT(whole, IsOk());
  const std::string text =
      "  The quick  brown fox,   jumps over\tthe lazy dog.\n\n    int main() { return 0; }  "
      "\xE2\x96\x81\xE2\x96\x81"
      "escaped already \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
      "and an unusually long word: "
      "Donaudampfschifffahrtselektrizitaetenhauptbetriebswerkbauunterbeamtengesellschaft   ";
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "cold" : "cached");
    const absl::StatusOr<std::vector<int32_t>> expected = (*whole)->Encode(text);
    ASSERT_THAT(expected, IsOk());
    EXPECT_THAT((*by_words)->Encode(text), IsOkAndHolds(ElementsAreArray(*expected)));
  }
}

}  // namespace
}  // namespace plait::data::tokenizer
