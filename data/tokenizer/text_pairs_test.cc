// Text SFT examples and preference pairs against the ids TRL trains on. The goldens
// (testdata/goldens/text_pairs.json) were written by testdata/make_pair_goldens.py, which runs
// the examples through TRL 1.16.0's own SFTTrainer._prepare_dataset and
// DPOTrainer._prepare_dataset with transformers 5.17.0, for the test tokenizers of
// testdata/README.md (GPT-2's, MIT; Qwen3's, Apache-2.0; the tiny one trained here with Llama
// 3's pre-tokenizer and BOS template).
#include "data/tokenizer/text_pairs.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/data.pb.h"
#include "data/pairs.h"
#include "data/tokenizer/load_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr int64_t kSeqLen = 256;

std::string Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string WriteTest(const std::string& name, const std::string& text) {
  return Write(TestPath(name), text);
}

// The caches beside `path`.
std::vector<std::string> Caches(const std::string& path) {
  const std::filesystem::path text(path);
  std::vector<std::string> caches;
  for (const auto& entry : std::filesystem::directory_iterator(text.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(text.filename().string() + ".", 0) == 0) caches.push_back(entry.path());
  }
  return caches;
}

ino_t Inode(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(stat(path.c_str(), &info), 0) << path;
  return info.st_ino;
}

// The test tokenizer `name`, loaded once: Qwen3's takes seconds to load unoptimised.
const Tokenizer& TestTokenizer(const std::string& name) {
  static auto* const tokenizers = new std::map<std::string, std::unique_ptr<Tokenizer>>();
  std::unique_ptr<Tokenizer>& tokenizer = (*tokenizers)[name];
  if (tokenizer == nullptr) {
    tokenizer = LoadTokenizer(absl::StrCat("data/tokenizer/testdata/", name)).value();
  }
  return *tokenizer;
}

std::vector<int64_t> Ids(const nlohmann::json& ids) { return ids.get<std::vector<int64_t>>(); }

class TrlGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  nlohmann::json goldens_ = nlohmann::json::parse(
      base::ReadFile("data/tokenizer/testdata/goldens/text_pairs.json").value())[GetParam()];
  const Tokenizer& tokenizer_ = TestTokenizer(GetParam());
};

// The prompt's ids end where TRL's completion mask starts, and prompt + completion are the ids
// of the whole text, its EOS included: those of SFTTrainer.
TEST_P(TrlGoldenTest, SftExamplesAreTheIdsOfSftTrainer) {
  std::string text;
  for (const nlohmann::json& example : goldens_["sft"]) {
    absl::StrAppend(
        &text,
        nlohmann::json{{"prompt", example["prompt"]}, {"completion", example["completion"]}}.dump(),
        "\n");
  }
  const std::string path = WriteTest(absl::StrCat(GetParam(), "_sft.jsonl"), text);
  absl::StatusOr<PairExamples> pairs =
      ReadTextPairFile(path, PairKind::kSft, PairFiles(), tokenizer_, kSeqLen);
  ASSERT_THAT(pairs, IsOk());
  ASSERT_THAT(pairs->examples, SizeIs(goldens_["sft"].size()));
  for (size_t i = 0; i < pairs->examples.size(); ++i) {
    const nlohmann::json& golden = goldens_["sft"][i];
    const std::vector<int64_t> ids = Ids(golden["input_ids"]);
    const int64_t start = golden["completion_start"].get<int64_t>();
    SCOPED_TRACE(golden.dump());
    EXPECT_THAT(pairs->examples[i].prompt, ElementsAreArray(ids.begin(), ids.begin() + start));
    EXPECT_THAT(pairs->examples[i].chosen, ElementsAreArray(ids.begin() + start, ids.end()));
  }
}

TEST_P(TrlGoldenTest, PreferencePairsAreTheIdsOfDpoTrainer) {
  std::string text;
  for (const nlohmann::json& example : goldens_["dpo"]) {
    absl::StrAppend(&text,
                    nlohmann::json{{"prompt", example["prompt"]},
                                   {"chosen", example["chosen"]},
                                   {"rejected", example["rejected"]}}
                        .dump(),
                    "\n");
  }
  const std::string path = WriteTest(absl::StrCat(GetParam(), "_dpo.jsonl"), text);
  absl::StatusOr<PairExamples> pairs =
      ReadTextPairFile(path, PairKind::kPreference, PairFiles(), tokenizer_, kSeqLen);
  ASSERT_THAT(pairs, IsOk());
  ASSERT_THAT(pairs->examples, SizeIs(goldens_["dpo"].size()));
  for (size_t i = 0; i < pairs->examples.size(); ++i) {
    const nlohmann::json& golden = goldens_["dpo"][i];
    SCOPED_TRACE(golden.dump());
    EXPECT_THAT(pairs->examples[i].prompt, ElementsAreArray(Ids(golden["prompt_ids"])));
    EXPECT_THAT(pairs->examples[i].chosen, ElementsAreArray(Ids(golden["chosen_ids"])));
    EXPECT_THAT(pairs->examples[i].rejected, ElementsAreArray(Ids(golden["rejected_ids"])));
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TrlGoldenTest, ::testing::Values("gpt2", "qwen3", "tiny"));

class TextPairsTest : public ::testing::Test {
 protected:
  absl::StatusOr<PairExamples> ReadSft(const std::string& path, const PairFiles& files = {},
                                       int64_t seq_len = kSeqLen) {
    return ReadTextPairFile(path, PairKind::kSft, files, tokenizer_, seq_len);
  }

  // The tiny tokenizer adds its BOS to every sequence and ends each completion with its EOS.
  const Tokenizer& tokenizer_ = TestTokenizer("tiny");
};

TEST_F(TextPairsTest, ErrorsNameTheTextFileItsLineAndTheField) {
  const auto error = [&](const std::string& name, const std::string& text, PairKind kind) {
    return ReadTextPairFile(WriteTest(name, text), kind, PairFiles(), tokenizer_, kSeqLen).status();
  };
  const std::string good = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  EXPECT_THAT(
      error("bad_json.jsonl", good + "\n{\"prompt\": \"a\"\n", PairKind::kSft),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad_json.jsonl:3: not valid JSON")));
  EXPECT_THAT(
      error("number.jsonl", good + "{\"prompt\": \"a\", \"completion\": 5}\n", PairKind::kSft),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("number.jsonl:2: completion: expected a string, got 5")));
  EXPECT_THAT(
      error("missing.jsonl", "{\"prompt\": \"a\", \"chosen\": \"b\"}\n", PairKind::kPreference),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("missing.jsonl:1: rejected: is required and missing")));
  EXPECT_THAT(error("empty.jsonl", good + good + "{\"prompt\": \"a\", \"completion\": \"\"}\n",
                    PairKind::kSft),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty.jsonl:3: completion: is empty")));
  EXPECT_THAT(error("array.jsonl", "[1, 2]\n", PairKind::kSft),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("array.jsonl:1: expected a JSON object")));
  EXPECT_THAT(
      error("blank.jsonl", "\n  \n", PairKind::kSft),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("blank.jsonl: holds no example")));
  EXPECT_THAT(ReadSft(TestPath("absent.jsonl")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent.jsonl")));
  // A line longer than the bound is refused before it is parsed or tokenized.
  EXPECT_THAT(ReadTextPairFile(WriteTest("long.jsonl", good + good), PairKind::kSft, PairFiles(),
                               tokenizer_, kSeqLen, /*max_line_bytes=*/good.size() - 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("long.jsonl:1: longer than 33 bytes, the most a JSONL line may "
                                 "hold")));
}

// The plan's policy for a prompt too long for seq_len, with the text file's line, whether the
// ids were tokenized now or read from the cache.
TEST_F(TextPairsTest, APromptTooLongForSeqLenFollowsThePolicy) {
  const std::string path = WriteTest(
      "long.jsonl",
      "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n"
      "{\"prompt\": \"The quick brown fox jumps over the lazy dog\", \"completion\": \"!\"}\n");
  for (int read = 0; read < 2; ++read) {
    EXPECT_THAT(ReadSft(path, PairFiles(), 6),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("long.jsonl:3: prompt: its 21 tokens leave no completion "
                                   "token within seq_len 6")));
  }
  PairFiles skip;
  skip.set_skip_long_prompts(true);
  absl::StatusOr<PairExamples> pairs = ReadSft(path, skip, 6);
  ASSERT_THAT(pairs, IsOk());
  EXPECT_THAT(pairs->examples, SizeIs(1));
  EXPECT_EQ(pairs->skipped, 1);
  PairFiles cut;
  cut.set_max_prompt_length(4);
  pairs = ReadSft(path, cut, 6);
  ASSERT_THAT(pairs, IsOk());
  EXPECT_THAT(pairs->examples, SizeIs(2));
}

TEST_F(TextPairsTest, TheCacheIsReadUntilTheTextOrTheTokenizerChanges) {
  const std::string dir = FreshTestDir("cache");
  std::filesystem::create_directories(dir);
  const std::string path =
      Write(dir + "/sft.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  const PairExamples first = ReadSft(path).value();
  const std::vector<std::string> caches = Caches(path);
  ASSERT_THAT(caches, ElementsAre(HasSubstr(absl::StrCat("sft.jsonl.", tokenizer_.hash(), "-"))));
  EXPECT_THAT(caches[0], HasSubstr(".ids.jsonl"));
  // Read, not written again: the file is the one the first read wrote.
  const ino_t inode = Inode(caches[0]);
  EXPECT_THAT(ReadSft(path).value().examples[0].chosen, ElementsAreArray(first.examples[0].chosen));
  EXPECT_EQ(Inode(caches[0]), inode);

  // A changed text has a cache of its own.
  Write(path, "{\"prompt\": \"a\", \"completion\": \"c\"}\n");
  const PairExamples changed = ReadSft(path).value();
  EXPECT_NE(changed.examples[0].chosen, first.examples[0].chosen);
  EXPECT_THAT(Caches(path), SizeIs(2));

  // So does another tokenizer (here Qwen3's, which adds no BOS).
  absl::StatusOr<PairExamples> by_qwen =
      ReadTextPairFile(path, PairKind::kSft, PairFiles(), TestTokenizer("qwen3"), kSeqLen);
  ASSERT_THAT(by_qwen, IsOk());
  EXPECT_NE(by_qwen->examples[0].prompt, changed.examples[0].prompt);
  EXPECT_THAT(Caches(path), SizeIs(3));
}

// A cache that does not match its header (a torn or edited file) is rebuilt, never read.
TEST_F(TextPairsTest, ACorruptCacheIsRebuilt) {
  const std::string dir = FreshTestDir("corrupt");
  std::filesystem::create_directories(dir);
  const std::string path = Write(dir + "/sft.jsonl",
                                 "{\"prompt\": \"Hello\", \"completion\": \" world\"}\n"
                                 "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  const PairExamples first = ReadSft(path).value();
  const std::string cache = Caches(path).at(0);
  const std::string good = base::ReadFile(cache).value();
  const std::string edited = absl::StrReplaceAll(
      good, {{absl::StrCat("\"prompt\":[", first.examples[1].prompt[0]), "\"prompt\":[5"}});
  ASSERT_NE(edited, good);
  for (const std::string& bad :
       {edited, good.substr(0, good.size() / 2), std::string("{}\n"), std::string()}) {
    Write(cache, bad);
    absl::StatusOr<PairExamples> pairs = ReadSft(path);
    ASSERT_THAT(pairs, IsOk());
    EXPECT_THAT(pairs->examples[1].prompt, ElementsAreArray(first.examples[1].prompt));
    EXPECT_EQ(base::ReadFile(cache).value(), good);
  }
}

// TRL appends the tokenizer's EOS to every completion; a tokenizer without one is an error.
TEST_F(TextPairsTest, ATokenizerWithoutEosIsAnError) {
  const std::string dir = FreshTestDir("no_eos");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file("data/tokenizer/testdata/tiny/tokenizer.json",
                             dir + "/tokenizer.json");
  const std::unique_ptr<Tokenizer> no_eos = LoadTokenizer(dir).value();
  ASSERT_FALSE(no_eos->eos_id().has_value());
  EXPECT_THAT(
      ReadTextPairFile(WriteTest("eos.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n"),
                       PairKind::kSft, PairFiles(), *no_eos, kSeqLen),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no EOS token")));
}

}  // namespace
}  // namespace plait::data::tokenizer
