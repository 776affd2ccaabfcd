#include "plan/validate.h"

#include <dirent.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/own_output.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/estimates.h"
#include "parallel/device.h"
#include "plan/plan.h"
#include "wrap/rules.h"

namespace plait::plan {
namespace {

using ::plait::base::ResolvedPath;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path);
}

// The parse error, or else the validation error, of a plan file on a 2-rank world.
absl::Status LoadAndValidate(const std::string& path) {
  absl::StatusOr<Plan> plan = LoadPlan(path);
  if (!plan.ok()) return plan.status();
  return Resolve(*plan, 2).status();
}

TEST(ResolveTest, FsdpTwiceIsRejectedNamingTheFieldAndTheRule) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "tiny" }
                  mesh { dims { name: "dp" size: 2 } }
                  prepare { fsdp { mesh_dim: "dp" } }
                  prepare { fsdp { mesh_dim: "dp" } }
                  optimizer { adamw {} }
                  schedule {
                    lr: 1e-3
                    constant {}
                  }
                  training { steps: 10 micro_batch: 4 seq_len: 16 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(Resolve(*plan, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 per "
                                 "model (rule fsdp_at_most_once)")));
}

TEST(ResolveTest, ReportsEveryViolation) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "nope" }
                  mesh { dims { name: "dp" size: 2 } }
                  prepare { ddp { mesh_dim: "dp" } }
                  prepare { fsdp { mesh_dim: "dp" } }
                  training { steps: 0 micro_batch: 0 seq_len: 16 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  const std::vector<Violation> violations = CheckPlan(*plan, 4, **wrap::BuiltinRules());
  std::vector<std::string> fields;
  for (const Violation& v : violations) fields.push_back(v.field);
  EXPECT_THAT(fields, ::testing::IsSupersetOf(
                          {"plan.model.preset", "plan.mesh", "plan.prepare[1].fsdp.mesh_dim",
                           "plan.optimizer", "plan.training.steps", "plan.training.micro_batch"}));
}

// Hybrid sharding inside tensor parallelism: three dimensions, each used, the batch split over
// the two of hybrid sharding (8 sequences: 2 on each of 4 data-parallel ranks).
TEST(ResolveTest, HybridShardingComposesWithTensorParallelism) {
  absl::StatusOr<Plan> plan = ParsePlan(
      R"pb(
        model { preset: "tiny" }
        mesh {
          dims { name: "dp_replicate" size: 2 }
          dims { name: "dp_shard" size: 2 }
          dims { name: "tp" size: 2 }
        }
        prepare { tensor_parallel { mesh_dim: "tp" } }
        prepare { fsdp { mesh_dim: "dp_shard" replicate_mesh_dim: "dp_replicate" } }
        optimizer { adamw {} }
        schedule {
          lr: 1e-3
          constant {}
        }
        training { steps: 10 micro_batch: 2 global_batch: 8 seq_len: 16 eval_batches: 1 }
      )pb",
      "plan");
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(Resolve(*plan, 8), IsOk());
}

// testdata/tp_vocab_not_dividing.textproto's vocabulary of 257 over 2 tensor-parallel ranks,
// refused there, is valid padded to 258.
TEST(ResolveTest, APaddedVocabularyNeedNotDivide) {
  absl::StatusOr<Plan> plan = LoadPlan(Runfile("plan/testdata/tp_vocab_not_dividing.textproto"));
  ASSERT_THAT(plan, IsOk());
  plan->mutable_prepare(0)->mutable_tensor_parallel()->set_pad_vocab_to_multiple(true);
  EXPECT_THAT(Resolve(*plan, 2), IsOk());
}

TEST(ResolveTest, ShippedPlansAreValid) {
  for (const auto& [name, ranks] :
       std::vector<std::pair<std::string, int>>{{"llama_fsdp", 2},
                                                {"llama_ddp", 2},
                                                {"llama_single", 1},
                                                {"llama_tp", 2},
                                                {"llama_2d", 4},
                                                {"llama_hsdp", 4},
                                                {"qwen_dpo_fsdp", 2},
                                                {"qwen_lora_dpo_fsdp", 2}}) {
    absl::StatusOr<Plan> plan = LoadPlan(Runfile("plan/examples/" + name + ".textproto"));
    ASSERT_THAT(plan, IsOk()) << name;
    EXPECT_THAT(Resolve(*plan, ranks), IsOk()) << name;
  }
}

// A plan asks for CUDA where this binary or machine cannot give it: refused before anything
// starts, naming plan.device and what is missing.
TEST(ResolveForMachineTest, CudaIsRefusedWhereItCannotRun) {
  absl::StatusOr<Plan> plan = LoadPlan(Runfile("plan/examples/llama_single.textproto"));
  ASSERT_THAT(plan, IsOk());
  ASSERT_THAT(ApplyOverride("device=DEVICE_CUDA", *plan), IsOk());
  const int devices = parallel::CudaDeviceCount();
  if (!parallel::BuiltForCuda()) {
    EXPECT_THAT(ResolveForMachine(*plan, 1, 1, /*skip_memory_check=*/true),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("plan.device: DEVICE_CUDA needs a binary built with "
                                   "--config=gpu")));
  } else if (devices == 0) {
    EXPECT_THAT(ResolveForMachine(*plan, 1, 1, /*skip_memory_check=*/true),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("sees no GPU")));
  }
  // More ranks on this machine than it has GPUs.
  EXPECT_THAT(ResolveForMachine(*plan, 1, devices + 1, /*skip_memory_check=*/true),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("plan.device: ")));
  ASSERT_THAT(ApplyOverride("device=DEVICE_CPU", *plan), IsOk());
  EXPECT_THAT(ResolveForMachine(*plan, 1, 1, /*skip_memory_check=*/true), IsOk());
}

// Every plan under plan/testdata/ is invalid; its `# expect: ` lines are substrings of
// the error it must get (parse error or validation error on 2 ranks).
TEST(ResolveTest, EveryInvalidTestdataPlanIsRejectedNamingTheField) {
  const std::string dir = Runfile("plan/testdata");
  DIR* listing = opendir(dir.c_str());
  ASSERT_NE(listing, nullptr) << dir;
  int checked = 0;
  while (dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (!absl::EndsWith(name, ".textproto")) continue;
    std::ifstream file(dir + "/" + name);
    std::vector<std::string> expected;
    for (std::string line; std::getline(file, line);) {
      absl::string_view rest = line;
      if (absl::ConsumePrefix(&rest, "# expect: ")) expected.emplace_back(rest);
    }
    ASSERT_FALSE(expected.empty()) << name << " has no `# expect: ` line";
    const absl::Status status = LoadAndValidate(dir + "/" + name);
    EXPECT_FALSE(status.ok()) << name;
    for (const std::string& substring : expected) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(substring)) << name;
    }
    ++checked;
  }
  closedir(listing);
  EXPECT_GE(checked, 10);
}

// Every quantity a run derives from its plan, derived by Resolve.
TEST(ResolveTest, FillsInTheDefaultsTheDataParallelWidthAndTheGlobalBatch) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "tiny" }
                  mesh {
                    dims { name: "tp" size: 2 }
                    dims { name: "dp" size: 2 }
                  }
                  prepare { tensor_parallel { mesh_dim: "tp" } }
                  prepare { ddp { mesh_dim: "dp" } }
                  optimizer { adamw {} }
                  schedule {
                    lr: 1e-3
                    cosine {}
                  }
                  training { steps: 10 micro_batch: 4 seq_len: 16 eval_batches: 3 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<ResolvedPlan> resolved = Resolve(*plan, 4);
  ASSERT_THAT(resolved, IsOk());
  EXPECT_EQ(resolved->model.hidden_size(), 256);
  EXPECT_EQ(resolved->schedule.total_steps(), 10);
  EXPECT_EQ(resolved->grad_accumulation, 1);
  EXPECT_EQ(resolved->log_every, 10);
  EXPECT_EQ(resolved->max_skipped_steps, 5);
  EXPECT_EQ(resolved->data_parallel_dims, std::vector<std::string>{"dp"});
  EXPECT_EQ(resolved->data_parallel_size, 2);
  EXPECT_EQ(resolved->global_batch, 8);
  EXPECT_EQ(resolved->eval_micro_batches, 3);
  EXPECT_TRUE(resolved->data.has_synthetic());

  // Accumulating 2 micro-batches: each evaluation reads 3 global batches, 6 micro-batches a
  // rank.
  plan->mutable_training()->set_grad_accumulation(2);
  resolved = Resolve(*plan, 4);
  ASSERT_THAT(resolved, IsOk());
  EXPECT_EQ(resolved->global_batch, 16);
  EXPECT_EQ(resolved->eval_micro_batches, 6);
}

// A DPO step runs each pair's chosen and rejected rows through the policy, and through the
// reference unless its log-probabilities were precomputed: tokens/s and MFU count them.
TEST(ResolveTest, CountsTheRowsAndFlopsTheObjectiveRuns) {
  absl::StatusOr<Plan> plan = LoadPlan(Runfile("plan/examples/qwen_dpo_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<ResolvedPlan> live = Resolve(*plan, 2);
  ASSERT_THAT(live, IsOk());
  const int64_t seq_len = plan->training().seq_len();
  const double policy = models::TrainingFlopsPerToken(live->model, seq_len);
  EXPECT_EQ(live->tokens_per_step, 2.0 * live->global_batch * seq_len);
  EXPECT_DOUBLE_EQ(live->flops_per_token,
                   policy + models::ForwardFlopsPerToken(live->frozen[0], seq_len));
  ASSERT_THAT(ApplyOverride("objective.dpo.precompute_reference=true", *plan), IsOk());
  absl::StatusOr<ResolvedPlan> precomputed = Resolve(*plan, 2);
  ASSERT_THAT(precomputed, IsOk());
  EXPECT_EQ(precomputed->tokens_per_step, live->tokens_per_step);
  EXPECT_DOUBLE_EQ(precomputed->flops_per_token, policy);

  // Against the policy without its adapters, the policy's own forward is counted instead.
  absl::StatusOr<Plan> lora = LoadPlan(Runfile("plan/examples/qwen_lora_dpo_fsdp.textproto"));
  ASSERT_THAT(lora, IsOk());
  absl::StatusOr<ResolvedPlan> without_adapters = Resolve(*lora, 2);
  ASSERT_THAT(without_adapters, IsOk());
  EXPECT_EQ(without_adapters->tokens_per_step, live->tokens_per_step);
  EXPECT_DOUBLE_EQ(without_adapters->flops_per_token,
                   policy + models::ForwardFlopsPerToken(without_adapters->model, seq_len));
  ASSERT_THAT(ApplyOverride("objective.dpo.precompute_reference=true", *lora), IsOk());
  absl::StatusOr<ResolvedPlan> precomputed_without_adapters = Resolve(*lora, 2);
  ASSERT_THAT(precomputed_without_adapters, IsOk());
  EXPECT_DOUBLE_EQ(precomputed_without_adapters->flops_per_token, policy);

  absl::StatusOr<Plan> causal = LoadPlan(Runfile("plan/examples/llama_fsdp.textproto"));
  ASSERT_THAT(causal, IsOk());
  absl::StatusOr<ResolvedPlan> resolved = Resolve(*causal, 2);
  ASSERT_THAT(resolved, IsOk());
  EXPECT_EQ(resolved->tokens_per_step, 16.0 * 64);
}

// A plan without eval_batches evaluates nothing, and may not ask for periodic evaluations.
TEST(ResolveTest, NoEvalBatchesIsNoEvaluation) {
  absl::StatusOr<Plan> plan = ParsePlan(R"pb(
                                          model { preset: "tiny" }
                                          optimizer { adamw {} }
                                          schedule {
                                            lr: 1e-3
                                            constant {}
                                          }
                                          training { steps: 10 micro_batch: 4 seq_len: 16 }
                                        )pb",
                                        "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<ResolvedPlan> resolved = Resolve(*plan, 1);
  ASSERT_THAT(resolved, IsOk());
  EXPECT_EQ(resolved->eval_micro_batches, 0);
  plan->mutable_training()->set_eval_every(5);
  EXPECT_THAT(Resolve(*plan, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.training.eval_every: 5 asks for an evaluation every 5 "
                                 "steps, but plan.training.eval_batches is 0")));
}

// Text pair files without a tokenizer read the one of the model's Hugging Face folder.
TEST(ResolveTest, TextPairsReadTheTokenizerBesideTheModelsConfig) {
  Plan plan = *ParsePlan(
      "model { hf_config_path: \"models/qwen/config.json\" }\n"
      "data { sft_files { train_path: \"a.jsonl\" format: PAIR_FORMAT_TEXT } }",
      "plan.textproto");
  EXPECT_EQ(ResolveData(plan).sft_files().tokenizer(), "models/qwen");
  plan.mutable_model()->set_hf_config_path("config.json");
  EXPECT_EQ(ResolveData(plan).sft_files().tokenizer(), ".");
  data::PairFiles& files = *plan.mutable_data()->mutable_sft_files();
  files.set_tokenizer("named");
  EXPECT_EQ(ResolveData(plan).sft_files().tokenizer(), "named");
  files.clear_tokenizer();
  files.set_format(data::PAIR_FORMAT_IDS);
  EXPECT_EQ(ResolveData(plan).sft_files().tokenizer(), "");
  files.set_format(data::PAIR_FORMAT_TEXT);
  plan.mutable_model()->set_preset("tiny");
  EXPECT_EQ(ResolveData(plan).sft_files().tokenizer(), "");
}

// What a run writes is checked apart before it trains: an adapter saved over the one it starts
// from (spelled another way), an adapter and a model saved to one folder (one of them through a
// link to nothing yet), a metrics file inside the model's folder, a data file written over.
TEST(ResolveTest, OutputsThatMeetEachOtherOrAnInputAreRefusedNamingBothFields) {
  const std::string dir = FreshTestDir("outputs_apart");
  std::filesystem::create_directories(dir + "/adapter");
  std::filesystem::create_symlink(dir + "/model", dir + "/dangling");
  Plan plan = *ParsePlan(R"pb(
                           model { preset: "tiny" }
                           prepare { lora { rank: 4 alpha: 8 target: "*q_proj" } }
                           optimizer { adamw {} }
                           schedule {
                             lr: 1e-3
                             constant {}
                           }
                           training { steps: 2 micro_batch: 2 seq_len: 16 }
                         )pb",
                         "plan");
  plan.mutable_prepare(0)->mutable_lora()->set_initial_adapter_dir(dir + "/adapter");
  plan.mutable_training()->set_save_adapter_dir(dir + "/./adapter");
  EXPECT_THAT(
      Resolve(plan, 1),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("plan.training.save_adapter_dir: \"" + dir + "/./adapter\" (resolved: \"" +
                         ResolvedPath(dir) +
                         "/adapter\") is also plan.prepare[0].lora.initial_adapter_dir (\"" + dir +
                         "/adapter\"), an input: writing there would overwrite it")));

  plan.mutable_prepare(0)->mutable_lora()->clear_initial_adapter_dir();
  plan.mutable_training()->set_save_hf_dir(dir + "/model");
  plan.mutable_training()->set_save_adapter_dir(dir + "/dangling");
  EXPECT_THAT(Resolve(plan, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.training.save_adapter_dir: \"" + dir + "/dangling\" (" +
                                 "resolved: \"" + ResolvedPath(dir) +
                                 "/model\") is also plan.training.save_hf_dir (\"" + dir +
                                 "/model\"), an output too")));

  // Alone, a link to nothing is no folder an export can be created through.
  plan.mutable_training()->clear_save_adapter_dir();
  plan.mutable_training()->set_save_hf_dir(dir + "/dangling");
  EXPECT_THAT(Resolve(plan, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("plan.training.save_hf_dir: \"" + dir +
                                                   "/dangling\" cannot be "
                                                   "created: \"" +
                                                   dir + "/dangling\" is a symbolic link to \"" +
                                                   dir + "/model\", which does not exist")));

  plan.mutable_training()->set_save_hf_dir(dir + "/model");
  plan.mutable_training()->set_metrics_file(dir + "/model/metrics.jsonl");
  EXPECT_THAT(Resolve(plan, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.training.metrics_file: \"" + dir +
                                 "/model/metrics.jsonl\" lies inside plan.training.save_hf_dir")));

  plan.mutable_training()->clear_save_hf_dir();
  const std::string tokens = dir + "/tokens.bin";
  std::ofstream(tokens) << "tokens";
  plan.mutable_data()->mutable_token_files()->set_train_path(tokens);
  plan.mutable_training()->set_metrics_file(tokens);
  EXPECT_THAT(Resolve(plan, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("plan.training.metrics_file: \"" + tokens +
                                                   "\" is also plan.data.token_files.train_path")));
}

}  // namespace
}  // namespace plait::plan
