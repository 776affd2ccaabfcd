#include "plan/explain.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"

namespace plait::plan {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::plan::testing::Resolved;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ExplainPlanTest, DescribesTheFsdpPipelineInOrder) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
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

// The samples a plan draws, what generating them holds on a rank, and the FSDP term it holds
// then: every unit gathered once, since that and the KV cache fit in a step's peak.
TEST(ExplainPlanTest, DescribesTheSamplesAndTheirMemory) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_sft_text.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("samples: 3 prompts x 1 sample of up to 4 new tokens after every 20 "
                               "steps and the last, into "));
  EXPECT_THAT(*text, HasSubstr("samples.jsonl; each of 2 data-parallel ranks decodes its share "
                               "with a "));
  EXPECT_THAT(*text, HasSubstr(" KV cache, the weights gathered once for the phase (19.1 MiB)"));
  EXPECT_THAT(*text, HasSubstr("; 19.1 MiB every unit gathered, while a generation phase keeps "
                               "them"));
  EXPECT_THAT(*text, HasSubstr(", generating samples "));
}

// A pipeline's stage map, its schedule, and the memory of each of its ranks, which keep
// different stages.
TEST(ExplainPlanTest, ExplainsThePipelineStageByStage) {
  absl::StatusOr<Plan> plan =
      LoadPlan(absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_pp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("prepare[0]: pipeline over \"pp\" (2 stages), schedule 1F1B over 4 "
                               "micro-batches, bubble 20.0%"));
  EXPECT_THAT(*text, HasSubstr("  stage 0 (rank 0 of pp): blocks 0..1, 2.5M parameters"));
  EXPECT_THAT(*text, HasSubstr("  stage 1 (rank 1 of pp): blocks 2..3, 2.5M parameters"));
  EXPECT_THAT(*text, HasSubstr("memory per rank (estimate), as their shares differ:\n"
                               "  the ranks at pp=0, stage 0: 9.5 MiB parameters"));
  EXPECT_THAT(*text, HasSubstr("\n  the ranks at pp=1, stage 1: 9.5 MiB parameters"));
}

// Context parallelism: each rank's slice of the sequences, and the ring's bytes per block.
TEST(ExplainPlanTest, ExplainsTheContextParallelRing) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "tiny" }
                  mesh { dims { name: "cp" size: 2 } }
                  prepare { context_parallel { mesh_dim: "cp" } }
                  optimizer { adamw {} }
                  schedule {
                    lr: 1e-3
                    constant {}
                  }
                  training { steps: 10 micro_batch: 8 seq_len: 64 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  // 8 sequences x 32 tokens x 2 key/value heads x 64 x 4 bytes, keys and values.
  EXPECT_THAT(*text, HasSubstr("prepare[0]: context_parallel over cp (2 ranks): each rank computes "
                               "2 of the 4 chunks of every sequence (256 tokens of a "
                               "micro-batch)"));
  EXPECT_THAT(*text, HasSubstr("  per block, forward: 1 hop of the rank's keys and values "
                               "(256.0 KiB) around the ring"));
  EXPECT_THAT(*text, HasSubstr("  per block, backward: 1 hop of keys and values again and 2 hops "
                               "of their fp32 gradients (256.0 KiB)"));
  // A block's fp32 gradients of its queries, keys and values, 8 x 16 x (4 + 2 + 2) heads x 64
  // x 4 bytes, and one thread's 2 x 64 rows of 16 fp32 scores.
  EXPECT_THAT(*text, HasSubstr("  ring attention in the fused CPU kernels: 264.0 KiB at once "
                               "beside what the backward keeps (a block's fp32 gradients and "
                               "the rows of scores of 1 thread)"));
}

// At 16,384 tokens on 2 ranks: on the CPU, 1 x 4096 x 8 heads x 64 x 4 bytes of gradients and
// 2 x 64 rows of 4096 fp32 scores; elsewhere a chunk's scores outgrow a tile, of 1 x 2 x 2048 x
// 4096 fp32 scores (64 MiB, twice), beside the gradients and 3 grouped copies of the 4 query
// heads' rows (12 MiB).
TEST(ExplainPlanTest, ExplainsTheRingOfALongSequence) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_long.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("  ring attention in the fused CPU kernels: 10.0 MiB at once"));
  plan->set_device(parallel::DEVICE_CUDA);
  text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("  ring attention in tiles of 2048 of a chunk's 4096 query rows: "
                               "148.0 MiB at once beside what the backward keeps (two tiles of "
                               "fp32 scores, a block's fp32 copies and gradients)"));
}

// A tensor-parallel step inside FSDP: the per-rank shape of each kind of parameter, and the
// activations it communicates per block.
TEST(ExplainPlanTest, ExplainsTheTwoDimensionalTensorParallelPlan) {
  absl::StatusOr<Plan> plan =
      LoadPlan(absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_2d.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 4));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("mesh: dp=2 x tp=2 (4 ranks)"));
  // 8 sequences x 64 tokens x 256 hidden x 4 bytes = 0.5 MiB, sent once by a ring all-reduce
  // over 2 ranks.
  EXPECT_THAT(*text, HasSubstr("prepare[0]: tensor_parallel over tp (2 ranks): heads, MLP "
                               "columns and the vocabulary split, each rank keeps about 1/2 of "
                               "5.0M parameters; per block 2 all-reduces of 0.5 MiB "
                               "activations forward and 2 backward (0.5 MiB sent each)"));
  EXPECT_THAT(*text, HasSubstr("  model.layers.0.self_attn.q_proj.weight [256, 256] -> [128, 256] "
                               "(column-parallel)"));
  EXPECT_THAT(*text, HasSubstr("  model.layers.0.self_attn.k_proj.weight [128, 256] -> [64, 256] "
                               "(key/value heads)"));
  EXPECT_THAT(*text, HasSubstr("  model.layers.0.mlp.down_proj.weight [256, 688] -> [256, 344] "
                               "(row-parallel)"));
  EXPECT_THAT(*text, HasSubstr("  lm_head.weight [4096, 256] -> [2048, 256] "
                               "(vocabulary-parallel)"));
  EXPECT_THAT(*text, HasSubstr("  model.norm.weight [256] -> [256] (replicated)"));
  EXPECT_THAT(*text, HasSubstr("prepare[1]: fsdp over dp (2 ranks)"));
  EXPECT_THAT(*text, HasSubstr("communication per rank (estimate, ring collectives):"));
}

// LoRA on q_proj before FSDP: the optimizer's group holds the adapters alone, A and B of 4
// blocks, 4 x 8 x (256 + 256) = 16.4K values, half of them on each rank.
TEST(ExplainPlanTest, TheOptimizerOfALoraPlanHoldsTheAdapters) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  plan->mutable_prepare()->Add();
  for (int i = plan->prepare_size() - 1; i > 0; --i) {
    plan->mutable_prepare()->SwapElements(i, i - 1);
  }
  wrap::LoraConfig& lora = *plan->mutable_prepare(0)->mutable_lora();
  lora.set_rank(8);
  lora.set_alpha(16);
  lora.add_target("*q_proj");
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("group default: 8 tensors, 16.4K parameters (8.2K per rank)"));
}

// Hybrid sharding: FSDP over dp_shard, the shards replicated across dp_replicate. A rank keeps
// and trains 1/2 of the 5.0M parameters (fp32 parameters, gradients and 2 Adam slots: 16
// bytes each, 38.1 MiB), reads its own 4 of the 16 sequences, and sends per step the FSDP
// ring volume over 2 ranks (1/2 x 4 bytes x 5.0M for each of 2 gathers and 1 reduce-scatter)
// plus an all-reduce of its gradient shard (2 x 1/2 x 4 bytes x 2.5M): 8 bytes a parameter.
TEST(ExplainPlanTest, DescribesHybridSharding) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_hsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 4));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("mesh: dp_replicate=2 x dp_shard=2 (4 ranks)"));
  EXPECT_THAT(*text, HasSubstr("prepare[0]: fsdp over dp_shard (2 ranks): 5 units (4 blocks and "
                               "the root), each rank keeps 1/2 of 5.0M parameters and gathers one "
                               "unit at a time (prefetching the next); hybrid sharding: the shards "
                               "replicated over dp_replicate (2 ranks), each unit's gradient "
                               "shards all-reduced across it after their reduce-scatter "
                               "[RESHARDS]"));
  EXPECT_THAT(*text, HasSubstr("group default: 39 tensors, 5.0M parameters (2.5M per rank)"));
  EXPECT_THAT(*text, HasSubstr("training: 100 steps of 16 examples x 64 tokens (micro-batch 4 x "
                               "4 ranks x 1 accumulation), 1024 tokens per step\n"));
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
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 8));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("vocab 128256, bf16: 8.0B parameters"));
  // 32 layers x 2 norms + the final norm, 4096 elements each.
  EXPECT_THAT(*text, HasSubstr("group no_decay: 65 tensors, 266.2K parameters"));
  EXPECT_THAT(*text, HasSubstr("group default: 226 tensors, 8.0B parameters (1.0B per rank)"));
  EXPECT_THAT(*text, HasSubstr("3.74 GiB parameters, 7.48 GiB optimizer state (2 slots), "));
}

// The learning rate at the quarters of the run, each step named once however short the run.
TEST(ExplainPlanTest, NamesEachStepOfTheScheduleOnce) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "tiny" }
                  optimizer { adamw {} }
                  schedule {
                    lr: 1e-5
                    constant {}
                  }
                  training { steps: 2 micro_batch: 4 seq_len: 64 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 1));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("over 2 steps; lr at step 0: 1e-05, step 1: 1e-05\n"));
}

// A mixture of experts' parameters, and those a token uses (its chosen experts'): Mixtral
// 8x7B's published 46.7B and 12.9B.
TEST(ExplainPlanTest, CountsTheActiveParametersOfAMixtureOfExperts) {
  absl::StatusOr<Plan> plan =
      ParsePlan(R"pb(
                  model { preset: "mixtral-8x7b" dtype: DTYPE_BFLOAT16 }
                  mesh { dims { name: "dp" size: 8 } }
                  prepare { fsdp { mesh_dim: "dp" } }
                  optimizer { adamw {} }
                  schedule {
                    lr: 1e-4
                    constant {}
                  }
                  training { steps: 10 micro_batch: 1 seq_len: 128 eval_batches: 1 }
                )pb",
                "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 8));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("vocab 32000, bf16: 46.7B parameters, 8 experts (2 a token): "
                               "12.9B of them active"));
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
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("prepare[0]: activation checkpointing (SELECTIVE): each of 4 "
                               "blocks keeps"));
  EXPECT_THAT(*text, HasSubstr("recomputes the rest in backward [KEEPS]"));
  // Each step's memory terms, by name, below it.
  const size_t saved = text->find(
      "  memory on a rank: saves 3.5 MiB of activations recomputed in backward, when a "
      "micro-batch's backward starts\n");
  const size_t gathered = text->find(" gathered units, at the peak of each step\n");
  ASSERT_NE(saved, std::string::npos) << *text;
  ASSERT_NE(gathered, std::string::npos) << *text;
  EXPECT_LT(text->find("prepare[0]"), saved);
  EXPECT_LT(saved, text->find("prepare[1]"));
  EXPECT_LT(text->find("prepare[1]"), gathered);
}

// Tensor parallelism over 4 ranks with sequence parallelism on the tiny Llama (hidden 256, 4
// layers, 4 heads of 64, 2 key/value heads, vocabulary 4097 padded to 4100), 4 x 64 tokens
// per micro-batch in fp32: every collective of a block and outside the blocks with its
// bytes, the per-rank shapes and what a rank holds.
TEST(ExplainPlanTest, ExplainsEveryCollectiveOfATensorParallelPlan) {
  absl::StatusOr<Plan> plan = ParsePlan(
      R"pb(
        model {
          config {
            model_type: "llama"
            hidden_size: 256
            intermediate_size: 688
            num_hidden_layers: 4
            num_attention_heads: 4
            num_key_value_heads: 2
            rms_norm_eps: 1e-5
            rope_theta: 10000
            vocab_size: 4097
            max_position_embeddings: 2048
          }
        }
        mesh { dims { name: "tp" size: 4 } }
        prepare {
          tensor_parallel { mesh_dim: "tp" sequence_parallel: true pad_vocab_to_multiple: true }
        }
        optimizer { adamw {} }
        schedule {
          lr: 1e-3
          constant {}
        }
        training { steps: 10 micro_batch: 4 seq_len: 64 eval_batches: 1 }
      )pb",
      "plan");
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 4));
  ASSERT_THAT(text, IsOk());
  // 4 x 64 tokens x 256 x 4 bytes of activations, 256 KiB: a ring all-gather or
  // reduce-scatter over 4 ranks sends 3/4 of it, an all-reduce twice that.
  EXPECT_THAT(*text,
              HasSubstr("\n  per block, forward: all-gathers of the 256.0 KiB activations along "
                        "the sequence into q/k/v and into gate/up, reduce-scatters of the partial "
                        "outputs of o_proj and of down_proj (192.0 KiB sent each)\n"));
  EXPECT_THAT(*text, HasSubstr("\n  per block, backward: their conjugates, reduce-scatters of the "
                               "input gradients of q/k/v and of gate/up, all-gathers of the output "
                               "gradients of o_proj and of down_proj (192.0 KiB sent each)\n"));
  // k_proj and v_proj, [128, 256] each: 256 KiB.
  EXPECT_THAT(*text, HasSubstr("\n  per block, backward: the k_proj and v_proj gradients of the 2 "
                               "key/value heads, each held by 2 ranks, summed: an all-reduce of "
                               "256.0 KiB (384.0 KiB sent)\n"));
  // Two norm weights of 256, summed once a step.
  EXPECT_THAT(*text,
              HasSubstr("\n  per step, per block: the gradients of the parameters every rank "
                        "holds whole (norm weights), computed from each rank's slice of the "
                        "sequence, summed once the step's backward passes are over: an "
                        "all-reduce of 2.0 KiB (3.0 KiB sent)\n"));
  EXPECT_THAT(*text, HasSubstr("\n  outside the blocks: the embedding's output forward and the "
                               "output projection's input gradient backward (384.0 KiB sent "
                               "each), and per step the final norm's weight gradient summed (1.5 "
                               "KiB sent); the loss's all-reduces of each token's maximum logit, "
                               "sum of exponentials and target logit (4.5 KiB sent)\n"));
  // Per micro-batch (4 x 4 + 2) x 384 KiB + 4 x 384 KiB + 4.5 KiB = 8452.5 KiB, and per step
  // 4 x 3 KiB + 1.5 KiB = 13.5 KiB.
  EXPECT_THAT(*text, HasSubstr("\n  per micro-batch: 8.3 MiB sent; per step: 13.5 KiB more\n"));
  EXPECT_THAT(*text,
              HasSubstr("\n    model.layers.0.self_attn.k_proj.weight [128, 256] -> [64, 256] "
                        "(key/value heads, shared)\n"));
  EXPECT_THAT(*text, HasSubstr("\n    lm_head.weight [4097, 256] -> [1025, 256] "
                               "(vocabulary-parallel, padded)\n"));
  EXPECT_THAT(*text, HasSubstr("\n  tensor parallelism leaves each rank 1.3M of the 5.0M "
                               "parameters (0.264 of them), 5.0 MiB\n"));
  EXPECT_THAT(*text, HasSubstr("communication per rank (estimate, ring collectives): 8.3 MiB "
                               "sent per step"));
}

// A DPO plan: the policy and its reference, each with its weights, preparation and memory per
// rank, and what the objective does with the reference.
TEST(ExplainPlanTest, DescribesBothModelsOfADpoPlan) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/qwen_dpo_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("model: qwen2 (preset \"qwen2-tiny\")"));
  EXPECT_THAT(*text, HasSubstr("prepare[0]: fsdp over dp (2 ranks)"));
  EXPECT_THAT(*text, HasSubstr("objective: dpo { reference: \"reference\" beta: 0.1 }"));
  EXPECT_THAT(*text, HasSubstr("data: synthetic_pairs {"));
  // Each pair runs its chosen and its rejected row.
  EXPECT_THAT(*text, HasSubstr("training: 60 steps of 16 examples x 32 tokens (micro-batch 8 x 2 "
                               "ranks x 1 accumulation), 1024 tokens per step (2 rows an "
                               "example)"));
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

  ASSERT_THAT(ApplyOverride("objective.dpo.precompute_reference=true", *plan), IsOk());
  text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("  role: the DPO reference: before the first step it scores every "
                               "batch the run will read"));
}

// A DPO plan whose reference is the policy without its adapters: no frozen model, and what
// the objective runs the policy for besides training it.
TEST(ExplainPlanTest, SaysTheReferenceIsThePolicyWithoutItsAdapters) {
  absl::StatusOr<Plan> plan = LoadPlan(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/plait/plan/examples/qwen_lora_dpo_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(Resolved(*plan, 2));
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("objective: dpo { beta: 0.1 policy_without_adapters: true }\n"
                               "  the DPO reference is the policy with its adapters off, no frozen "
                               "copy of the model is held: before the training forward of every "
                               "micro-batch, the policy scores its 2 x micro-batch chosen and "
                               "rejected sequences once more"));
  EXPECT_THAT(*text, Not(HasSubstr("frozen models")));
  EXPECT_THAT(*text, Not(HasSubstr("frozen[")));
}

}  // namespace
}  // namespace plait::plan
