#include "trainer/explain.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/plan.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::testing::HasSubstr;

TEST(ExplainPlanTest, DescribesTheFsdpPipelineInOrder) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/plans/llama_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 2);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("model: llama (preset \"tiny\")"));
  EXPECT_THAT(*text, HasSubstr("mesh: dp=2 (2 ranks)"));
  EXPECT_THAT(*text, HasSubstr("prepare[0]: fsdp over dp (2 ranks): 5 units (4 blocks and the "
                               "root), each rank keeps 1/2 of 5.0M parameters"));
  EXPECT_THAT(*text, HasSubstr("optimizer: built after prepare[0], the last step that replaces "
                               "or re-shards parameters"));
  EXPECT_THAT(*text, HasSubstr("group default:"));
  EXPECT_THAT(*text, HasSubstr("memory per rank (estimate):"));
  EXPECT_LT(text->find("model:"), text->find("prepare[0]"));
  EXPECT_LT(text->find("prepare[0]"), text->find("optimizer:"));
}

// A tensor-parallel step inside FSDP: the per-rank shape of each kind of parameter, and the
// activations it communicates per block.
TEST(ExplainPlanTest, ExplainsTheTwoDimensionalTensorParallelPlan) {
  absl::StatusOr<Plan> plan =
      LoadPlan(absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/plans/llama_2d.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 4);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("mesh: dp=2 x tp=2 (4 ranks)"));
  // 8 sequences x 64 tokens x 256 hidden x 4 bytes = 0.5 MiB, sent once by a ring all-reduce
  // over 2 ranks.
  EXPECT_THAT(*text, HasSubstr("prepare[0]: tensor_parallel over tp (2 ranks): heads, MLP "
                               "columns and the vocabulary split, each rank keeps about 1/2 of "
                               "5.0M parameters; per block 2 all-reduces of 0.5 MiB "
                               "activations forward and 2 backward (0.5 MiB sent each)"));
  EXPECT_THAT(*text, HasSubstr("  model.layers.0.self_attn.q_proj.weight [256, 256] -> [128, 256] "
                               "per rank (column-parallel)"));
  EXPECT_THAT(*text, HasSubstr("  model.layers.0.self_attn.k_proj.weight [128, 256] -> [64, 256] "
                               "per rank (key/value heads)"));
  EXPECT_THAT(*text, HasSubstr("  model.layers.0.mlp.down_proj.weight [256, 688] -> [256, 344] "
                               "per rank (row-parallel)"));
  EXPECT_THAT(*text, HasSubstr("  lm_head.weight [4096, 256] -> [2048, 256] per rank "
                               "(vocabulary-parallel)"));
  EXPECT_THAT(*text, HasSubstr("  model.norm.weight [256] -> [256] per rank (replicated)"));
  EXPECT_THAT(*text, HasSubstr("prepare[1]: fsdp over dp (2 ranks)"));
  EXPECT_THAT(*text, HasSubstr("communication per rank (estimate, ring collectives):"));
}

// Hybrid sharding: FSDP over dp_shard, the shards replicated across dp_replicate. A rank keeps
// and trains 1/2 of the 5.0M parameters (fp32 parameters, gradients and 2 Adam slots: 16
// bytes each, 38.1 MiB), reads its own 4 of the 16 sequences, and sends per step the FSDP
// ring volume over 2 ranks (1/2 x 4 bytes x 5.0M for each of 2 gathers and 1 reduce-scatter)
// plus an all-reduce of its gradient shard (2 x 1/2 x 4 bytes x 2.5M): 8 bytes a parameter.
TEST(ExplainPlanTest, DescribesHybridSharding) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/plans/llama_hsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 4);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("mesh: dp_replicate=2 x dp_shard=2 (4 ranks)"));
  EXPECT_THAT(*text, HasSubstr("prepare[0]: fsdp over dp_shard (2 ranks): 5 units (4 blocks and "
                               "the root), each rank keeps 1/2 of 5.0M parameters and gathers one "
                               "unit at a time (prefetching the next); hybrid sharding: the shards "
                               "replicated over dp_replicate (2 ranks), each unit's gradient "
                               "shards all-reduced across it after their reduce-scatter "
                               "[RESHARDS]"));
  EXPECT_THAT(*text, HasSubstr("group default: 39 tensors, 5.0M parameters (2.5M per rank)"));
  EXPECT_THAT(*text, HasSubstr("training: 100 steps of 16 sequences x 64 tokens (micro-batch 4 x "
                               "4 ranks x 1 accumulation)"));
  EXPECT_THAT(*text, HasSubstr("memory per rank (estimate): 9.5 MiB parameters, 19.1 MiB "
                               "optimizer state (2 slots), 9.5 MiB gradients"));
  EXPECT_THAT(*text, HasSubstr("communication per rank (estimate, ring collectives): 38.1 MiB "
                               "sent per step"));
}

// Groups are counted from the parameter shapes, so an 8B model is explained without being
// built; FSDP keeps a bf16 model's shards in fp32, and they are the optimizer's masters.
TEST(ExplainPlanTest, CountsTheGroupsOfALargeBf16ModelWithoutBuildingIt) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "llama3.1-8b" dtype: DTYPE_BFLOAT16 }
                  mesh { dims { name: "dp" size: 8 } }
                  prepare { fsdp { mesh_dim: "dp" } }
                  optimizer {
                    adamw {}
                    weight_decay: 0.1
                    param_groups { name: "no_decay" glob: "*norm*" weight_decay: 0 }
                  }
                  schedule {
                    lr: 1e-4
                    constant {}
                  }
                  training { steps: 10 micro_batch: 1 seq_len: 128 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 8);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("vocab 128256, bf16: 8.0B parameters"));
  // 32 layers x 2 norms + the final norm, 4096 elements each.
  EXPECT_THAT(*text, HasSubstr("group no_decay: 65 tensors, 266.2K parameters"));
  EXPECT_THAT(*text, HasSubstr("group default: 226 tensors, 8.0B parameters (1.0B per rank)"));
  EXPECT_THAT(*text, HasSubstr("3.74 GiB parameters, 7.48 GiB optimizer state (2 slots), "));
}

// Activation checkpointing is a step of its own, on no mesh dimension, keeping the parameters.
TEST(ExplainPlanTest, DescribesActivationCheckpointing) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "tiny" }
                  mesh { dims { name: "dp" size: 2 } }
                  prepare { activation_checkpointing { policy: SELECTIVE } }
                  prepare { fsdp { mesh_dim: "dp" } }
                  optimizer { adamw {} }
                  schedule {
                    lr: 1e-3
                    constant {}
                  }
                  training { steps: 10 micro_batch: 4 seq_len: 64 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 2);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("prepare[0]: activation checkpointing (SELECTIVE): each of 4 "
                               "blocks keeps"));
  EXPECT_THAT(*text, HasSubstr("recomputes the rest in backward [KEEPS]"));
}

// A DPO plan: the policy and its reference, each with its weights, preparation and memory per
// rank, and what the objective does with the reference.
TEST(ExplainPlanTest, DescribesBothModelsOfADpoPlan) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/plans/qwen_dpo_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 2);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("model: qwen2 (preset \"qwen2-tiny\")"));
  EXPECT_THAT(*text, HasSubstr("prepare[0]: fsdp over dp (2 ranks)"));
  EXPECT_THAT(*text, HasSubstr("objective: dpo { reference: \"reference\" beta: 0.1 }"));
  EXPECT_THAT(*text, HasSubstr("data: synthetic_pairs {"));
  EXPECT_THAT(*text, HasSubstr("frozen models"));
  EXPECT_THAT(*text,
              HasSubstr("frozen[0] \"reference\": qwen2 (preset \"qwen2-tiny\"), 4 layers, hidden "
                        "112, vocab 4096, auto (bf16 where the device computes it natively, "
                        "else fp32): 1.4M parameters\n"
                        "  weights: seeded initialisation (seed 1)\n"
                        "  prepared after the trained model, by its own steps below; no optimizer, "
                        "no gradients\n"
                        "  prepare[0]: fsdp over dp (2 ranks): 5 units"));
  // Half of the 1.4M fp32 parameters on each rank, and one gathered unit at a time.
  EXPECT_THAT(*text, HasSubstr("  memory per rank (estimate): 2.7 MiB parameters, "));
  EXPECT_THAT(*text, HasSubstr("  role: the DPO reference: it scores the 2 x micro-batch"));

  plan->mutable_objective()->mutable_dpo()->set_precompute_reference(true);
  text = ExplainPlan(*plan, 2);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("  role: the DPO reference: before the first step it scores every "
                               "batch the run will read"));
}

}  // namespace
}  // namespace plait::trainer
