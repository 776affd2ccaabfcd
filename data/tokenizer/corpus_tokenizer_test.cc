#include "data/tokenizer/corpus_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/token_file.h"
#include "data/tokenizer/load_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string Write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  return LoadTokenizer(absl::StrCat("data/tokenizer/testdata/", name)).value();
}

// The ids of `files`, concatenated, read back through the loader's TokenFile.
std::vector<int32_t> ReadShards(const std::vector<std::string>& files, TokenFormat format,
                                int64_t vocab_size) {
  std::vector<int32_t> ids;
  for (const std::string& path : files) {
    absl::StatusOr<TokenFile> file = TokenFile::Open(path, format, vocab_size);
    EXPECT_THAT(file, IsOk());
    if (!file.ok()) return ids;
    const at::Tensor tokens = file->Read(0, file->size()).value();
    for (int64_t i = 0; i < tokens.size(0); ++i) ids.push_back(tokens[i].item<int64_t>());
  }
  return ids;
}

std::vector<std::string> Matching(const std::vector<std::string>& files, const std::string& part) {
  std::vector<std::string> matching;
  for (const std::string& file : files) {
    if (file.find(part) != std::string::npos) matching.push_back(file);
  }
  return matching;
}

class CorpusTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("corpus");
    std::filesystem::create_directories(dir_);
    documents_ = {"First document.", "Café 你好 🤗",   "third <|end_of_text|> one",
                  "bad \xFF byte",   "fifth\n\nwith lines", "sixth",
                  "seventh: 12345"};
    std::string jsonl;
    for (size_t i = 0; i < 5; ++i) {
      // JSON escapes, but the ill-formed byte is written raw, as a broken file has it.
      jsonl += i == 3 ? "{\"text\": \"bad \xFF byte\", \"id\": 3}\n" : nlohmann_line(documents_[i]);
      if (i == 1) jsonl += "\n";  // empty lines are skipped
    }
    inputs_ = {Write(dir_, "a.jsonl", jsonl),
               Write(dir_, "b.txt", absl::StrCat(documents_[5], "\n===\n", documents_[6]))};
  }

  static std::string nlohmann_line(const std::string& text) {
    std::string escaped;
    for (char c : text) {
      if (c == '\n') {
        escaped += "\\n";
      } else {
        escaped += c;
      }
    }
    return absl::StrCat("{\"text\": \"", escaped, "\"}\n");
  }

  CorpusOptions Options(int threads) const {
    CorpusOptions options;
    options.inputs = inputs_;
    options.output_prefix = absl::StrCat(dir_, "/out", threads);
    options.split_text_at = "\n===\n";
    options.val_fraction = 0.3;
    options.shard_tokens = 20;
    options.threads = threads;
    options.replace_invalid_utf8 = true;  // document 3 has an ill-formed byte
    return options;
  }

  // [EOS] + ids with BOS of each document whose index is (or is not) held out.
  std::vector<int32_t> Expected(const Tokenizer& tokenizer, bool val) const {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < documents_.size(); ++i) {
      const bool held_out = static_cast<int>((i + 1) * 0.3) > static_cast<int>(i * 0.3);
      if (held_out != val) continue;
      ids.push_back(*tokenizer.eos_id());
      const std::vector<int32_t> document =
          tokenizer.Encode(ReplaceInvalidUtf8(documents_[i]), true).value();
      ids.insert(ids.end(), document.begin(), document.end());
    }
    return ids;
  }

  std::string dir_;
  std::vector<std::string> documents_;
  std::vector<std::string> inputs_;
};

TEST_F(CorpusTokenizerTest, WritesEachDocumentAfterAnEosInInputOrder) {
  const std::unique_ptr<Tokenizer> tokenizer = Load("tiny");
  for (const int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    absl::StatusOr<CorpusSummary> summary = TokenizeCorpus(*tokenizer, Options(threads), nullptr);
    ASSERT_THAT(summary, IsOk());
    EXPECT_EQ(summary->format, TOKEN_FORMAT_LLMC);
    EXPECT_EQ(summary->documents, 7);
    EXPECT_EQ(summary->val_documents, 2);  // documents 3 and 6
    EXPECT_EQ(summary->invalid_utf8_documents, 1);
    const std::vector<std::string> train = Matching(summary->files, "_train_");
    const std::vector<std::string> val = Matching(summary->files, "_val_");
    EXPECT_GT(train.size(), 1u);  // 20 tokens a shard
    EXPECT_EQ(train.size() + val.size(), summary->files.size());
    EXPECT_THAT(ReadShards(train, TOKEN_FORMAT_LLMC, 1000),
                ElementsAreArray(Expected(*tokenizer, false)));
    EXPECT_THAT(ReadShards(val, TOKEN_FORMAT_LLMC, 1000),
                ElementsAreArray(Expected(*tokenizer, true)));
    EXPECT_EQ(summary->tokens, Expected(*tokenizer, false).size() + summary->val_tokens);
  }
}

// Over 65,536 tokens, the shards hold uint32 ids under llm.c's Llama 3 header, which the token
// file reader checks.
TEST_F(CorpusTokenizerTest, LargeVocabulariesGetUint32Shards) {
  const std::unique_ptr<Tokenizer> tokenizer = Load("qwen3");
  CorpusOptions options = Options(2);
  options.eos_token = "<|endoftext|>";  // Qwen3's config names <|im_end|>, a chat turn's end
  options.shard_tokens = 1000;
  absl::StatusOr<CorpusSummary> summary = TokenizeCorpus(*tokenizer, options, nullptr);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->format, TOKEN_FORMAT_LLMC);
  const std::vector<std::string> files = Matching(summary->files, "_train_");
  ASSERT_FALSE(files.empty());
  std::ifstream shard(files[0], std::ios::binary);
  int32_t header[3];
  shard.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], kLlmcUint32Magic);
  EXPECT_EQ(header[1], kLlmcUint32Version);
  const std::vector<int32_t> train = ReadShards(files, TOKEN_FORMAT_LLMC, 151669);
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train[0], 151643);  // <|endoftext|>
  EXPECT_EQ(train.size(), summary->tokens - summary->val_tokens);
}

TEST_F(CorpusTokenizerTest, ErrorsNameTheLineAndLeaveNoShard) {
  const std::unique_ptr<Tokenizer> tokenizer = Load("tiny");
  CorpusOptions options = Options(2);
  options.inputs = {Write(dir_, "broken.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"cut\n")};
  EXPECT_THAT(
      TokenizeCorpus(*tokenizer, options, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("broken.jsonl:2: not valid JSON")));
  options.inputs = {Write(dir_, "other.jsonl", "{\"content\": \"x\"}\n")};
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("other.jsonl:1: text: is required and missing")));
  // A line longer than the bound is refused before it is held whole or tokenized.
  options.inputs = {
      Write(dir_, "long.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"far too long\"}\n")};
  options.max_jsonl_line_bytes = 20;
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("long.jsonl:2: longer than 20 bytes, the most a JSONL line may "
                                 "hold")));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    if (entry.path().filename().string().rfind("out", 0) == 0) left.push_back(entry.path());
  }
  EXPECT_THAT(left, ElementsAre());
}

// The files under `prefix`'s folder whose names start with its stem, sorted.
std::vector<std::string> FilesUnder(const std::string& prefix) {
  const std::filesystem::path path(prefix);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path())) {
    if (entry.path().filename().string().rfind(path.filename().string(), 0) == 0) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A rerun under a prefix replaces the shards its list names and removes those it no longer
// writes; a file named as a shard that no run of tokenize wrote is refused, before any work.
TEST_F(CorpusTokenizerTest, RerunsReplaceOnlyTheirOwnShards) {
  const std::unique_ptr<Tokenizer> tokenizer = Load("tiny");
  CorpusOptions options = Options(1);
  const std::string prefix = options.output_prefix;
  absl::StatusOr<CorpusSummary> first = TokenizeCorpus(*tokenizer, options, nullptr);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->replaced_files, 0);
  std::vector<std::string> listed = first->files;
  listed.push_back(prefix + "_shards.json");
  std::sort(listed.begin(), listed.end());
  EXPECT_THAT(FilesUnder(prefix), ElementsAreArray(listed));

  options.shard_tokens = 1000;  // one shard a split
  absl::StatusOr<CorpusSummary> second = TokenizeCorpus(*tokenizer, options, nullptr);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->replaced_files, static_cast<int64_t>(first->files.size()));
  EXPECT_THAT(FilesUnder(prefix), ElementsAre(prefix + "_shards.json", prefix + "_train_000000.bin",
                                              prefix + "_val_000000.bin"));
  EXPECT_THAT(ReadShards({prefix + "_train_000000.bin"}, TOKEN_FORMAT_LLMC, 1000),
              ElementsAreArray(Expected(*tokenizer, false)));

  const std::string foreign = Write(dir_, "out1_train_000001.bin", "the user's");
  const std::string kept = base::ReadFile(prefix + "_train_000000.bin").value();
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + foreign + "\" exists and tokenize did not write it")));
  EXPECT_EQ(base::ReadFile(foreign).value(), "the user's");
  EXPECT_EQ(base::ReadFile(prefix + "_train_000000.bin").value(), kept);
  std::filesystem::remove(foreign);

  Write(dir_, "out1_shards.json", "{\"files\": []}");  // not a list tokenize wrote
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("out1_shards.json\" exists and tokenize did not write it")));
}

TEST_F(CorpusTokenizerTest, OptionsAreChecked) {
  const std::unique_ptr<Tokenizer> tokenizer = Load("tiny");
  CorpusOptions options = Options(1);
  options.val_fraction = 1;
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("val_fraction: 1")));
  options = Options(1);
  options.eos_token = "<|nope|>";
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eos_token: \"<|nope|>\"")));
  options = Options(1);
  options.replace_invalid_utf8 = false;  // as an SFT run reads text: the ill-formed byte named
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a.jsonl:5: not valid UTF-8 at byte 14")));
  options = Options(1);
  options.inputs = {Write(dir_, "empty.jsonl", "\n\n")};
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty.jsonl hold no document (empty, or blank lines only)")));
  options = Options(1);
  options.inputs.push_back(absl::StrCat(dir_, "/missing.txt"));
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.txt")));
  // The output folder is checked before any input is read (the input here is missing too).
  options.output_prefix = absl::StrCat(dir_, "/no_such_folder/corpus");
  EXPECT_THAT(TokenizeCorpus(*tokenizer, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("output: ", dir_, "/no_such_folder/corpus: the folder ", dir_,
                                    "/no_such_folder does not exist; create it")));
}

}  // namespace
}  // namespace plait::data::tokenizer
