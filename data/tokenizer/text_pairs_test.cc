#include "data/tokenizer/text_pairs.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/data.pb.h"
#include "data/pairs.h"
#include "data/tokenizer/load_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = TestPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<int64_t> Ids(const Tokenizer& tokenizer, const std::string& text, bool prompt) {
  std::vector<int32_t> ids = tokenizer.Encode(text, /*add_special_tokens=*/prompt).value();
  if (!prompt) ids.push_back(*tokenizer.eos_id());
  return std::vector<int64_t>(ids.begin(), ids.end());
}

class TextPairsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> tokenizer_ = LoadTokenizer("data/tokenizer/testdata/tiny").value();
};

TEST_F(TextPairsTest, PreferencePairsBecomeTheIdsPairsReads) {
  const std::string path =
      Write("prefs.jsonl",
            "{\"prompt\": \"Which is blue?\", \"chosen\": \"The sky.\", \"rejected\": \"Grass\"}\n"
            "\n"
            "{\"prompt\": \"你好\", \"chosen\": \"Hello 🤗\", \"rejected\": \"Bye\"}\n");
  absl::StatusOr<std::string> ids_path =
      TokenizedPairFile(path, PairKind::kPreference, *tokenizer_);
  ASSERT_THAT(ids_path, IsOk());
  EXPECT_THAT(*ids_path, HasSubstr(absl::StrCat("prefs.jsonl.", tokenizer_->hash(), "-")));
  absl::StatusOr<PairExamples> pairs =
      ReadPairFile(*ids_path, PairKind::kPreference, PairFiles(), tokenizer_->vocab_size(), 64);
  ASSERT_THAT(pairs, IsOk());
  ASSERT_EQ(pairs->examples.size(), 2u);
  const PairExample& second = pairs->examples[1];
  EXPECT_THAT(second.prompt, ElementsAreArray(Ids(*tokenizer_, "你好", true)));
  EXPECT_EQ(second.prompt[0], *tokenizer_->bos_id());
  EXPECT_THAT(second.chosen, ElementsAreArray(Ids(*tokenizer_, "Hello 🤗", false)));
  EXPECT_THAT(second.rejected, ElementsAreArray(Ids(*tokenizer_, "Bye", false)));
}

TEST_F(TextPairsTest, SftExamplesHaveACompletion) {
  const std::string path =
      Write("sft.jsonl", "{\"prompt\": \"2 + 2 =\", \"completion\": \" 4\"}\n");
  absl::StatusOr<std::string> ids_path = TokenizedPairFile(path, PairKind::kSft, *tokenizer_);
  ASSERT_THAT(ids_path, IsOk());
  absl::StatusOr<PairExamples> pairs =
      ReadPairFile(*ids_path, PairKind::kSft, PairFiles(), tokenizer_->vocab_size(), 64);
  ASSERT_THAT(pairs, IsOk());
  EXPECT_THAT(pairs->examples[0].chosen, ElementsAreArray(Ids(*tokenizer_, " 4", false)));
}

TEST_F(TextPairsTest, TheCacheIsReusedUntilTheTextChanges) {
  const std::string path = Write("cached.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  const std::string first = TokenizedPairFile(path, PairKind::kSft, *tokenizer_).value();
  // A cache that is there is read, not made again: mark it and see the mark survive.
  std::ofstream(first, std::ios::app) << "\n";
  const std::string marked = base::ReadFile(first).value();
  EXPECT_EQ(TokenizedPairFile(path, PairKind::kSft, *tokenizer_).value(), first);
  EXPECT_EQ(base::ReadFile(first).value(), marked);
  Write("cached.jsonl", "{\"prompt\": \"a\", \"completion\": \"c\"}\n");
  EXPECT_THAT(TokenizedPairFile(path, PairKind::kSft, *tokenizer_), IsOkAndHolds(Not(first)));
}

TEST_F(TextPairsTest, ErrorsNameTheLineAndField) {
  EXPECT_THAT(TokenizedPairFile(Write("bad1.jsonl",
                                      "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                                      "{\"prompt\": \"a\", \"completion\": 5}\n"),
                                PairKind::kSft, *tokenizer_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad1.jsonl:2: completion: expected a string, got 5")));
  EXPECT_THAT(TokenizedPairFile(Write("bad2.jsonl", "{\"prompt\": \"a\", \"chosen\": \"b\"}\n"),
                                PairKind::kPreference, *tokenizer_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad2.jsonl:1: rejected: expected a string, got nothing")));
  EXPECT_THAT(
      TokenizedPairFile(Write("bad3.jsonl", "{\"prompt\": \"a\"\n"), PairKind::kSft, *tokenizer_),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad3.jsonl:1: not valid JSON")));
}

}  // namespace
}  // namespace plait::data::tokenizer
