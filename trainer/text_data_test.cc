// Training from text examples end to end: //trainer:llama_sft_text's plan (SFT examples in
// text, the tokenizer named in the plan) and a DPO plan whose models and tokenizer come from
// one Hugging Face folder, through the trainer on CPU ranks. data/tokenizer/text_pairs_test.cc
// checks the ids against TRL's.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "nlohmann/json.hpp"
#include "parallel/device_mesh.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "plan/validate.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::plan::testing::Resolved;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// The shipped example trains on 2 FSDP ranks: the loss falls well below its start. It draws
// its samples after steps 5 and 10 (every 5 steps here), a greedy completion of each prompt,
// into the samples file its summary names, which a fresh run then refuses to write over.
TEST(TextDataTest, TheTextSftExampleTrainsAndDrawsSamples) {
  plan::Plan plan = ShortShippedPlan("llama_sft_text");
  const std::string folder = base::testing::FreshTestDir("text_sft_samples");
  std::filesystem::create_directories(folder);
  const std::string path = folder + "/samples.jsonl";
  plan.mutable_training()->mutable_samples()->set_every_steps(5);
  plan.mutable_training()->mutable_samples()->set_file(path);
  const TrainReport run = TrainOnRanks(plan, 2);
  ASSERT_EQ(run.steps.size(), 10u);
  EXPECT_LT(run.steps.back().loss, 0.5 * run.steps.front().loss);
  EXPECT_LT(*run.steps.back().eval_loss, *run.steps[4].eval_loss);

  EXPECT_EQ(run.samples_file, path);
  absl::StatusOr<std::string> text = base::ReadFile(path);
  ASSERT_THAT(text, IsOk());
  std::vector<std::pair<int64_t, int64_t>> drawn;  // (step, prompt_index)
  for (const absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    const nlohmann::json sample = nlohmann::json::parse(line);
    drawn.emplace_back(sample.at("step").get<int64_t>(), sample.at("prompt_index").get<int64_t>());
    const auto tokens = sample.at("token_ids").get<std::vector<int64_t>>();
    EXPECT_GE(tokens.size(), 1u);
    EXPECT_LE(tokens.size(), 4u);
    EXPECT_EQ(sample.at("logprobs").size(), tokens.size());
    const std::string stop = sample.at("stop_reason").get<std::string>();
    EXPECT_TRUE(stop == "end_of_sequence" || (stop == "max_new_tokens" && tokens.size() == 4u))
        << line;
    EXPECT_FALSE(sample.at("text").get<std::string>().empty()) << line;
  }
  EXPECT_THAT(drawn, ElementsAre(Pair(5, 0), Pair(5, 1), Pair(5, 2), Pair(10, 0), Pair(10, 1),
                                 Pair(10, 2)));

  const plan::ResolvedPlan resolved = Resolved(plan, 2);
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    if (rank == 0) {
      EXPECT_THAT(Train(resolved, mesh, {}),
                  StatusIs(absl::StatusCode::kAlreadyExists,
                           HasSubstr("plan.training.samples.file: " + path + " exists")));
    } else {
      EXPECT_THAT(Train(resolved, mesh, {}),
                  StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 0 failed")));
    }
  });
}

TEST(TextDataTest, TextWithoutATokenizerIsAPlanError) {
  plan::Plan plan = ShortShippedPlan("llama_sft_text");
  plan.mutable_data()->mutable_sft_files()->clear_tokenizer();
  EXPECT_THAT(plan::Resolve(plan, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.data.sft_files.tokenizer: is empty; text examples need "
                                 "the model's tokenizer")));
}

// A Hugging Face folder (here written from a seeded model, with the tiny test tokenizer as its
// own) gives the DPO policy, its reference and the tokenizer of the text pairs.
class TextDpoFromHfFolderTest : public ::testing::Test {
 protected:
  // A model's folder as Hugging Face's save_pretrained leaves it: the export, then the
  // tokenizer's files beside it.
  void SetUp() override {
    std::filesystem::remove_all(folder_);
    plan_ = ShortShippedPlan("qwen_dpo_fsdp_hf");
    auto config = models::ResolveModelSpec(ShortShippedPlan("qwen_dpo_fsdp").model(), "plan.model");
    ASSERT_THAT(config, IsOk());
    auto model = models::CausalLM::Create(*config, plan_.model().init());
    ASSERT_THAT(model, IsOk());
    ASSERT_THAT(models::SaveHfModel(**model, folder_), IsOk());
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(absl::StrCat("data/tokenizer/testdata/tiny/", file),
                                 absl::StrCat(folder_, "/", file));
    }
    const std::string config_path = absl::StrCat(folder_, "/config.json");
    plan_.mutable_model()->set_hf_config_path(config_path);
    plan_.set_hf_weights_dir(folder_);
    plan_.mutable_frozen(0)->mutable_model()->set_hf_config_path(config_path);
    plan_.mutable_frozen(0)->set_hf_weights_dir(folder_);
    data::PairFiles& files = *plan_.mutable_data()->mutable_preference_files();
    files.set_train_path(Copied("dpo_train.jsonl"));
    files.set_eval_path(Copied("dpo_eval.jsonl"));
    files.set_format(data::PAIR_FORMAT_TEXT);
  }

  // The example file `name` in the test's folder, where its cache is written.
  static std::string Copied(const std::string& name) {
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
    std::filesystem::copy_file(absl::StrCat("plan/examples/text/", name), path,
                               std::filesystem::copy_options::overwrite_existing);
    return path;
  }

  const std::string folder_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/qwen2_text_dpo");
  plan::Plan plan_;
};

TEST_F(TextDpoFromHfFolderTest, TrainsWithTheTokenizerBesideConfigJson) {
  EXPECT_EQ(plan::ResolveData(plan_).preference_files().tokenizer(), folder_);
  const TrainReport run = TrainOnRanks(plan_, 2);
  ASSERT_EQ(run.steps.size(), 10u);
  // The policy starts as its reference. The 80 training pairs are 5 steps of 16: steps 6 to
  // 10 read the pairs of steps 1 to 5 again, now preferring their right sums.
  EXPECT_FLOAT_EQ(run.steps[0].loss, std::log(2.0));
  double second_pass = 0.0;
  std::string losses;
  for (size_t i = 0; i < run.steps.size(); ++i) {
    if (i >= 5) second_pass += run.steps[i].loss / 5;
    absl::StrAppend(&losses, " ", run.steps[i].loss);
  }
  EXPECT_LT(second_pass, std::log(2.0)) << "losses:" << losses;
}

TEST_F(TextDpoFromHfFolderTest, AFolderWithoutATokenizerNamesTheField) {
  std::filesystem::remove(absl::StrCat(folder_, "/tokenizer.json"));
  const plan::ResolvedPlan resolved = Resolved(plan_, 2);
  WithMesh(plan_, 2, [&](int, const parallel::DeviceMesh& mesh) {
    EXPECT_THAT(Train(resolved, mesh, TrainOptions()),
                StatusIs(absl::StatusCode::kNotFound,
                         HasSubstr(absl::StrCat("plan.data.preference_files.tokenizer: ", folder_,
                                                ": has neither tokenizer.json nor "
                                                "tokenizer.model"))));
  });
}

}  // namespace
}  // namespace plait::trainer
