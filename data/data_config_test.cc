#include "data/data_config.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;

// Matches a violation of the data config.
auto Problem(const std::string& field, const std::string& message) {
  return AllOf(Field(&base::Violation::field, field), Field(&base::Violation::message, message));
}

TEST(ResolvedDataConfigTest, NoSourceIsTheDefaultSyntheticSource) {
  const DataConfig data = ResolvedDataConfig(DataConfig());
  ASSERT_TRUE(data.has_synthetic());
  EXPECT_EQ(data.synthetic().seed(), 0u);
  EXPECT_EQ(data.synthetic().num_states(), kDefaultNumStates);
  EXPECT_EQ(data.synthetic().branching(), kDefaultBranching);
  EXPECT_EQ(data.synthetic().peak(), kDefaultPeak);
}

TEST(ResolvedDataConfigTest, SetValuesAndTokenFilesAreKept) {
  DataConfig synthetic;
  synthetic.mutable_synthetic()->set_seed(7);
  synthetic.mutable_synthetic()->set_branching(2);
  const DataConfig resolved = ResolvedDataConfig(synthetic);
  EXPECT_EQ(resolved.synthetic().seed(), 7u);
  EXPECT_EQ(resolved.synthetic().branching(), 2);
  EXPECT_EQ(resolved.synthetic().num_states(), kDefaultNumStates);

  DataConfig files;
  files.mutable_token_files()->set_train_path("train.bin");
  files.mutable_token_files()->set_format(TOKEN_FORMAT_LLMC);
  EXPECT_EQ(ResolvedDataConfig(files).ShortDebugString(), files.ShortDebugString());
}

TEST(CheckDataConfigTest, DefaultsAndExistingFilesAreValid) {
  EXPECT_TRUE(CheckDataConfig(DataConfig(), 4096, "plan.data").empty());
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/tokens.bin";
  std::ofstream(path) << "tokens";
  DataConfig files;
  files.mutable_token_files()->set_train_path(path);
  files.mutable_token_files()->set_eval_path(path);
  files.mutable_token_files()->set_format(TOKEN_FORMAT_UINT16);
  EXPECT_TRUE(CheckDataConfig(files, 4096, "plan.data").empty());
}

TEST(CheckDataConfigTest, SyntheticValuesOutOfRangeNameTheCallersField) {
  DataConfig data;
  data.mutable_synthetic()->set_num_states(300);
  data.mutable_synthetic()->set_branching(301);
  data.mutable_synthetic()->set_peak(0.5);
  EXPECT_THAT(
      CheckDataConfig(data, 256, "cfg.data"),
      ElementsAre(Problem("cfg.data.synthetic.num_states", "300; must be in [2, vocab_size = 256]"),
                  Problem("cfg.data.synthetic.branching", "301; must be in [1, num_states = 300]"),
                  Problem("cfg.data.synthetic.peak", "0.5; must be >= 1")));
  // Without a vocabulary size only the lower bound of num_states is checked.
  data.mutable_synthetic()->set_num_states(1);
  data.mutable_synthetic()->set_branching(1);
  data.mutable_synthetic()->set_peak(1.0);
  EXPECT_THAT(
      CheckDataConfig(data, std::nullopt, "cfg.data"),
      ElementsAre(Problem("cfg.data.synthetic.num_states", "1; must be in [2, vocab_size]")));
}

TEST(CheckDataConfigTest, TokenFilesNeedAFormatAndFilesThatExist) {
  DataConfig data;
  data.mutable_token_files()->set_eval_path("/nonexistent/plait/val.bin");
  EXPECT_THAT(
      CheckDataConfig(data, 4096, "plan.data"),
      ElementsAre(Problem("plan.data.token_files.format",
                          "is not set; set TOKEN_FORMAT_LLMC, TOKEN_FORMAT_UINT16 or "
                          "TOKEN_FORMAT_UINT32"),
                  Problem("plan.data.token_files.train_path", "is empty; name a token file"),
                  Problem("plan.data.token_files.eval_path",
                          "\"/nonexistent/plait/val.bin\" does not exist")));
  // A folder or device where a file belongs is named for what it is, not "does not exist".
  data.mutable_token_files()->set_format(TOKEN_FORMAT_LLMC);
  data.mutable_token_files()->set_train_path("/tmp");
  data.mutable_token_files()->set_eval_path("/dev/null");
  EXPECT_THAT(CheckDataConfig(data, 4096, "plan.data"),
              ElementsAre(Problem("plan.data.token_files.train_path",
                                  "\"/tmp\" is a directory, not a token file"),
                          Problem("plan.data.token_files.eval_path",
                                  "\"/dev/null\" is a device, not a token file")));
}

TEST(CheckDataConfigTest, TextExamplesNeedATokenizerThatExists) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/sft.jsonl";
  std::ofstream(path) << "{}";
  DataConfig data;
  PairFiles& files = *data.mutable_sft_files();
  files.set_train_path(path);
  files.set_eval_path(path);
  files.set_format(PAIR_FORMAT_TEXT);
  EXPECT_THAT(CheckDataConfig(data, 4096, "plan.data"),
              ElementsAre(Problem("plan.data.sft_files.tokenizer",
                                  "is empty; text examples need the model's tokenizer: name its "
                                  "folder (with tokenizer.json or tokenizer.model) or file, or "
                                  "read the model from a Hugging Face folder, whose tokenizer is "
                                  "then used")));
  files.set_tokenizer("no/such/folder");
  EXPECT_THAT(
      CheckDataConfig(data, 4096, "plan.data"),
      ElementsAre(Problem("plan.data.sft_files.tokenizer", "\"no/such/folder\" does not exist")));
  files.set_tokenizer(std::getenv("TEST_TMPDIR"));
  EXPECT_TRUE(CheckDataConfig(data, 4096, "plan.data").empty());
  // A tokenizer for id examples is a plan that forgot the text format.
  files.set_format(PAIR_FORMAT_IDS);
  EXPECT_THAT(CheckDataConfig(data, 4096, "plan.data"),
              ElementsAre(Field(&base::Violation::field, "plan.data.sft_files.tokenizer")));
}

}  // namespace
}  // namespace plait::data
