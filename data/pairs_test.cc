#include "data/pairs.h"

#include <string>

#include "ATen/core/Tensor.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string WriteJsonl(const std::string& name, const std::string& text) {
  const std::string path = base::testing::TestPath(name);
  EXPECT_THAT(base::WriteFileAtomically(path, text), IsOk());
  return path;
}

std::vector<int64_t> Row(const at::Tensor& tensor, int64_t row) {
  const at::Tensor r = tensor[row].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

TEST(PairsTest, ReadsPreferencePairsAndScoresOnlyTheirCompletions) {
  const std::string path =
      WriteJsonl("pairs.jsonl",
                 "{\"prompt\": [1, 2], \"chosen\": [3, 4], \"rejected\": [5]}\n\n"
                 "{\"prompt\": [6], \"chosen\": [7, 8, 9, 10, 11], \"rejected\": [12, 13]}\n");
  auto pairs = ReadPairFile(path, PairKind::kPreference, PairFiles(), 100, 4);
  ASSERT_THAT(pairs, IsOk());
  ASSERT_EQ(pairs->examples.size(), 2u);
  const Batch batch =
      PairRows({&pairs->examples[0], &pairs->examples[1]}, PairKind::kPreference, PairFiles(), 4);
  ASSERT_EQ(batch.inputs.size(0), 4);
  // Chosen rows first, right-padded with 0; the last is cut to 4 tokens keeping the start.
  EXPECT_THAT(Row(batch.inputs, 0), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(Row(batch.targets, 0), ElementsAre(-100, 3, 4, -100));
  EXPECT_THAT(Row(batch.inputs, 1), ElementsAre(6, 7, 8, 9));
  EXPECT_THAT(Row(batch.targets, 1), ElementsAre(7, 8, 9, -100));
  EXPECT_THAT(Row(batch.inputs, 2), ElementsAre(1, 2, 5, 0));
  EXPECT_THAT(Row(batch.targets, 2), ElementsAre(-100, 5, -100, -100));
  EXPECT_THAT(Row(batch.inputs, 3), ElementsAre(6, 12, 13, 0));
  EXPECT_THAT(Row(batch.targets, 3), ElementsAre(12, 13, -100, -100));
}

TEST(PairsTest, KeepEndAndMaxPromptLengthCutFromTheLeft) {
  PairFiles files;
  files.set_max_prompt_length(2);
  PairExample example{{1, 2, 3, 4}, {5, 6}, {}};
  Batch batch = PairRows({&example}, PairKind::kSft, files, 8);
  EXPECT_THAT(Row(batch.inputs, 0), ElementsAre(3, 4, 5, 6, 0, 0, 0, 0));
  EXPECT_THAT(Row(batch.targets, 0), ElementsAre(-100, 5, 6, -100, -100, -100, -100, -100));
  files.set_max_prompt_length(0);
  files.set_truncation(TRUNCATION_KEEP_END);
  batch = PairRows({&example}, PairKind::kSft, files, 3);
  EXPECT_THAT(Row(batch.inputs, 0), ElementsAre(4, 5, 6));
  EXPECT_THAT(Row(batch.targets, 0), ElementsAre(5, 6, -100));
  EXPECT_EQ(ScoredTokens(example.prompt, example.chosen, files, 3), 2);
}

// SequenceLength is the length of the sequence PairRows writes, however it is cut.
TEST(PairsTest, SequenceLengthIsTheCutSequencesLength) {
  const PairExample example{{1, 2, 3, 4, 5}, {6, 7, 8}, {}};
  for (const Truncation truncation : {TRUNCATION_KEEP_START, TRUNCATION_KEEP_END}) {
    for (const int64_t max_prompt_length : {0, 2, 9}) {
      for (const int64_t seq_len : {3, 6, 8, 12}) {
        PairFiles files;
        files.set_truncation(truncation);
        files.set_max_prompt_length(max_prompt_length);
        const Batch row = PairRows({&example}, PairKind::kSft, files, seq_len);
        // The row's tokens are 1 to 8, its padding 0.
        EXPECT_EQ(SequenceLength(example.prompt, example.chosen, files, seq_len),
                  (row.inputs != 0).sum().item<int64_t>())
            << truncation << " " << max_prompt_length << " " << seq_len;
      }
    }
  }
}

TEST(PairsTest, BadLinesAreNamedByFileLineAndField) {
  const auto error = [](const std::string& line, PairKind kind = PairKind::kPreference) {
    const std::string path = WriteJsonl("bad.jsonl",
                                        "{\"prompt\": [1], \"chosen\": [2], "
                                        "\"rejected\": [3], \"completion\": [4]}\n" +
                                            line + "\n");
    return ReadPairFile(path, kind, PairFiles(), 100, 4).status();
  };
  EXPECT_THAT(error("{\"prompt\": [1], \"chosen\": "),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad.jsonl:2: not valid JSON")));
  EXPECT_THAT(
      error("{\"prompt\": [1], \"chosen\": [2]}"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad.jsonl:2: rejected: is missing")));
  EXPECT_THAT(error("{\"prompt\": [1], \"chosen\": [2, 100], \"rejected\": [3]}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.jsonl:2: chosen[1]: 100 is not below the vocabulary size "
                                 "100")));
  EXPECT_THAT(
      error("{\"prompt\": [1], \"completion\": []}", PairKind::kSft),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad.jsonl:2: completion: is empty")));
  EXPECT_THAT(error("{\"prompt\": [1, 2, 3, 4], \"chosen\": [2], \"rejected\": [3]}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.jsonl:2: prompt: its 4 tokens leave no chosen token within "
                                 "seq_len 4")));
  // Text where ids belong: a plan that forgot PAIR_FORMAT_TEXT.
  EXPECT_THAT(error("{\"prompt\": \"Hi\", \"chosen\": [2], \"rejected\": [3]}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.jsonl:2: prompt: is text, not a list of token ids; set "
                                 "format: PAIR_FORMAT_TEXT")));
  // Values nested far deeper than any real file are described, never written out (which
  // would recurse once per level and overflow the stack); ids past 2^63 - 1 are not wrapped.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THAT(error("{\"prompt\": [1], \"chosen\": [" + deep + "], \"rejected\": [3]}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.jsonl:2: chosen[0]: an array is not a token id")));
  std::string deep_object;
  for (int level = 0; level < 100000; ++level) deep_object += "{\"a\":";
  deep_object += "1" + std::string(100000, '}');
  EXPECT_THAT(error("{\"prompt\": [1], \"chosen\": [2], \"rejected\": " + deep_object + "}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.jsonl:2: rejected: an object is not a list of token ids")));
  EXPECT_THAT(
      error("{\"prompt\": [18446744073709551615], \"chosen\": [2], \"rejected\": [3]}"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("bad.jsonl:2: prompt[0]: 18446744073709551615 is not a token id")));
}

// A line longer than the bound is refused before it is parsed; one of the bound is read.
TEST(PairsTest, ALineOverTheBoundIsNamedBeforeItIsParsed) {
  const std::string line = "{\"prompt\": [1], \"completion\": [2]}";
  const std::string path = WriteJsonl("bound.jsonl", line + "\n" + line + " \n");
  EXPECT_THAT(ReadPairFile(path, PairKind::kSft, PairFiles(), 100, 4, line.size() + 1), IsOk());
  EXPECT_THAT(ReadPairFile(path, PairKind::kSft, PairFiles(), 100, 4, line.size()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bound.jsonl:2: longer than 34 bytes, the most a JSONL line may "
                                 "hold")));
}

TEST(PairsTest, LongPromptsAreSkippedAndCountedWhenAsked) {
  const std::string path = WriteJsonl("long.jsonl",
                                      "{\"prompt\": [1, 2, 3, 4], \"completion\": [5]}\n"
                                      "{\"prompt\": [1], \"completion\": [5]}\n");
  PairFiles files;
  files.set_skip_long_prompts(true);
  auto pairs = ReadPairFile(path, PairKind::kSft, files, 100, 4);
  ASSERT_THAT(pairs, IsOk());
  EXPECT_EQ(pairs->examples.size(), 1u);
  EXPECT_EQ(pairs->skipped, 1);
}

}  // namespace
}  // namespace plait::data
