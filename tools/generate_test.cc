// //tools:generate on a tiny model's Hugging Face folder and the tiny test tokenizer: what it
// writes for text and id prompts (the same completions as generation::Generate), the run
// folders and checkpoints it takes as the model, and what it refuses.
#include "generation/generate.h"

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/tokenizer/load_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "nlohmann/json.hpp"
#include "parallel/testdata/subprocess.h"
#include "plan/plan.h"
#include "trainer/testing_ranks.h"

namespace plait::tools {
namespace {

using ::plait::base::testing::IsOk;
using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path);
}

class GenerateToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = base::testing::FreshTestDir("generate");
    std::filesystem::create_directories(dir_ + "/hf");
    models::InitConfig init;
    init.set_seed(3);
    absl::StatusOr<std::shared_ptr<models::CausalLM>> model =
        models::CausalLM::Create(*models::PresetConfig("tiny"), init);
    ASSERT_THAT(model, IsOk());
    model_ = *model;
    ASSERT_THAT(models::SaveHfModel(*model_, dir_ + "/hf"), IsOk());
    ASSERT_THAT(base::WriteFileAtomically(dir_ + "/prompts.jsonl",
                                          "{\"prompt\": \"Q: What is 8 + 5?\\nA:\"}\n"
                                          "{\"prompt_ids\": [1, 17, 400, 9]}\n"),
                IsOk());
  }

  // Runs the tool with `args`; its exit status, with its stderr in stderr_.
  int Run(const std::vector<std::string>& args) {
    parallel::testdata::SubprocessOptions options;
    options.argv = {Runfile("tools/generate"), "--model=" + dir_ + "/hf",
                    "--tokenizer=" + Runfile("data/tokenizer/testdata/tiny"),
                    "--prompts=" + dir_ + "/prompts.jsonl"};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.stdout_path = dir_ + "/tool.out";
    options.stderr_path = dir_ + "/tool.err";
    absl::StatusOr<pid_t> pid = parallel::testdata::StartSubprocess(options);
    EXPECT_THAT(pid, IsOk());
    absl::StatusOr<int> status = parallel::testdata::WaitForSubprocess(*pid, absl::Seconds(120));
    EXPECT_THAT(status, IsOk());
    stderr_ = base::ReadFile(options.stderr_path).value_or("");
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }

  std::string dir_;
  std::shared_ptr<models::CausalLM> model_;
  std::string stderr_;
};

// Greedy, two samples a prompt: each line is one completion, with its text, ids and
// log-probabilities, the ids those generation::Generate draws for the same prompt ids.
TEST_F(GenerateToolTest, WritesACompletionALine) {
  const std::string out = dir_ + "/completions.jsonl";
  ASSERT_EQ(Run({"--out=" + out, "--temperature=0", "--max_new_tokens=5", "--num_samples=2"}), 0)
      << stderr_;
  EXPECT_THAT(stderr_, HasSubstr("generate: 2 of 2 prompts"));
  EXPECT_THAT(stderr_, HasSubstr("tokens/s"));
  absl::StatusOr<std::string> text = base::ReadFile(out);
  ASSERT_THAT(text, IsOk());
  const std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);

  absl::StatusOr<std::unique_ptr<data::tokenizer::Tokenizer>> tokenizer =
      data::tokenizer::LoadTokenizer(Runfile("data/tokenizer/testdata/tiny"));
  ASSERT_THAT(tokenizer, IsOk());
  absl::StatusOr<std::vector<int32_t>> encoded =
      (*tokenizer)->Encode("Q: What is 8 + 5?\nA:", /*add_special_tokens=*/true);
  ASSERT_THAT(encoded, IsOk());
  generation::SamplingConfig config;
  config.set_max_new_tokens(5);
  absl::StatusOr<std::vector<generation::Completion>> expected =
      generation::Generate(*model_, {{encoded->begin(), encoded->end()}, {1, 17, 400, 9}}, config,
                           {.end_of_sequence = {*(*tokenizer)->eos_id()}});
  ASSERT_THAT(expected, IsOk());
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json line = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(line["prompt_index"], i / 2);
    EXPECT_EQ(line["sample"], i % 2);
    const auto ids = line["token_ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(ids, (*expected)[i / 2].tokens) << lines[i];
    EXPECT_EQ(line["logprobs"].size(), ids.size());
    EXPECT_EQ(line["sampling_logprobs"].size(), ids.size());
    EXPECT_EQ(line["stop_reason"], generation::StopReasonName((*expected)[i / 2].stop));
    // The tiny model's 4,096 ids pass the tokenizer's 1,000: those add no text.
    std::vector<int32_t> known;
    for (const int64_t id : ids) {
      if (id < (*tokenizer)->vocab_size()) known.push_back(static_cast<int32_t>(id));
    }
    absl::StatusOr<std::string> decoded = (*tokenizer)->Decode(known);
    ASSERT_THAT(decoded, IsOk());
    EXPECT_EQ(line["text"], *decoded);
  }
}

// A finished file is never written over, and a bad prompt line is named.
TEST_F(GenerateToolTest, RefusesAnExistingOutputAndNamesABadPromptLine) {
  const std::string out = dir_ + "/kept.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(out, "finished\n"), IsOk());
  EXPECT_EQ(Run({"--out=" + out}), 1);
  EXPECT_THAT(stderr_, HasSubstr("kept.jsonl exists"));
  EXPECT_EQ(base::ReadFile(out).value_or(""), "finished\n");

  ASSERT_THAT(base::WriteFileAtomically(dir_ + "/prompts.jsonl",
                                        "{\"prompt_ids\": [1, 2]}\n{\"text\": \"hi\"}\n"),
              IsOk());
  EXPECT_EQ(Run({"--out=" + dir_ + "/new.jsonl"}), 1);
  EXPECT_THAT(stderr_, HasSubstr("prompts.jsonl:2: give \"prompt\" (text) or \"prompt_ids\""));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/new.jsonl"));

  ASSERT_THAT(base::WriteFileAtomically(dir_ + "/prompts.jsonl", "{\"prompt_ids\": [1, \"x\"]}\n"),
              IsOk());
  EXPECT_EQ(Run({"--out=" + dir_ + "/new.jsonl"}), 1);
  EXPECT_THAT(stderr_, HasSubstr("prompts.jsonl:1: prompt_ids[1]: expected an integer, got \"x\""));
}

// --model takes a run's folder (the Hugging Face folder it saved), its run_dir (the latest
// run's) and its checkpoint (exported first, then removed): each gives the completions of the
// run's trained model. A run's folder with two models asks which.
TEST_F(GenerateToolTest, TakesARunsFolderItsRunDirAndItsCheckpoint) {
  absl::StatusOr<plan::Plan> plan = plan::LoadPlan(Runfile("plan/examples/llama_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  const std::string run = dir_ + "/runs/20261207-120000";
  for (const std::string& assignment :
       {std::string("training.steps=2"), std::string("training.eval_every=0"),
        std::string("training.eval_batches=1"), std::string("training.metrics_file="),
        std::string("schedule.warmup.steps=1"), absl::StrCat("training.save_hf_dir=", run, "/hf"),
        absl::StrCat("training.checkpoint.dir=", dir_, "/ckpt")}) {
    ASSERT_THAT(plan::ApplyOverride(assignment, *plan), IsOk());
  }
  trainer::testing::TrainOnRanks(*plan, 2);
  std::filesystem::create_directory_symlink("20261207-120000", dir_ + "/runs/latest");

  std::vector<std::string> outputs;
  for (const std::string model : {run + "/hf", run, dir_ + "/runs", dir_ + "/ckpt/step-00000002"}) {
    const std::string out = absl::StrCat(dir_, "/from_", outputs.size(), ".jsonl");
    ASSERT_EQ(Run({"--model=" + model, "--out=" + out, "--temperature=0", "--max_new_tokens=6"}), 0)
        << model << ": " << stderr_;
    outputs.push_back(base::ReadFile(out).value_or(""));
    EXPECT_EQ(outputs.back(), outputs.front()) << model;
  }
  EXPECT_THAT(outputs.front(), HasSubstr("\"token_ids\""));
  // The checkpoint's export is gone.
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr("plait-generate-")));
  }

  ASSERT_THAT(models::SaveHfModel(*model_, run + "/hf_again"), IsOk());
  EXPECT_EQ(Run({"--model=" + run, "--out=" + dir_ + "/two.jsonl"}), 1);
  EXPECT_THAT(stderr_, HasSubstr("is a run's folder with 2 Hugging Face folders; name one: "));
  EXPECT_EQ(Run({"--model=" + dir_ + "/ckpt", "--out=" + dir_ + "/none.jsonl"}), 1);
  EXPECT_THAT(stderr_, HasSubstr("holds no model"));
}

}  // namespace
}  // namespace plait::tools
