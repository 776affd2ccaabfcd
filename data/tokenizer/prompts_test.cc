// Prompts from JSONL: text encoded with the tokenizer's special tokens, ids as given, the
// line's other fields kept, and each bad line named.
#include "data/tokenizer/prompts.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/tokenizer/load_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> Tiny() {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/data/tokenizer/testdata/tiny"));
  EXPECT_THAT(tokenizer, IsOk());
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

absl::StatusOr<std::vector<Prompt>> Read(const std::string& text) {
  const std::string path = base::testing::TestPath("prompts.jsonl");
  EXPECT_THAT(base::WriteFileAtomically(path, text), IsOk());
  return ReadPrompts(path, *Tiny());
}

TEST(ReadPromptsTest, EncodesTextKeepsIdsAndTheOtherFields) {
  absl::StatusOr<std::vector<Prompt>> prompts = Read(
      "{\"prompt\": \"Q: What is 2 + 2?\\nA:\", \"answer\": \"4\"}\n\n"
      "{\"prompt_ids\": [1, 17, 400]}\n");
  ASSERT_THAT(prompts, IsOk());
  ASSERT_EQ(prompts->size(), 2u);
  absl::StatusOr<std::vector<int32_t>> encoded =
      Tiny()->Encode("Q: What is 2 + 2?\nA:", /*add_special_tokens=*/true);
  ASSERT_THAT(encoded, IsOk());
  EXPECT_EQ((*prompts)[0].ids, std::vector<int64_t>(encoded->begin(), encoded->end()));
  EXPECT_EQ((*prompts)[0].example.at("answer"), "4");
  EXPECT_THAT((*prompts)[1].ids, ElementsAre(1, 17, 400));
}

TEST(ReadPromptsTest, NamesTheFileAndLineOfABadOne) {
  EXPECT_THAT(Read("{\"prompt_ids\": [1]}\n{\"text\": \"hi\"}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompts.jsonl:2: give \"prompt\" (text) or \"prompt_ids\"")));
  EXPECT_THAT(Read("[1, 2]\n"), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("prompts.jsonl:1: not a JSON object")));
  EXPECT_THAT(Read("{\"prompt_ids\": [1, \"x\"]}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompts.jsonl:1: prompt_ids[1]: expected an integer")));
  EXPECT_THAT(Read("{\"prompt_ids\": []}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompts.jsonl:1: the prompt is empty")));
}

}  // namespace
}  // namespace plait::data::tokenizer
