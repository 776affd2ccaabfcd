#include "plan/memory_estimate.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "base/torch_compat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "plan/validate.h"
#include "wrap/wrappable.h"

namespace plait::plan {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::plan::testing::Resolved;
using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kGiB = 1 << 30;

Plan ParseOrDie(const std::string& text) {
  absl::StatusOr<Plan> plan = ParsePlan(text, "plan");
  EXPECT_THAT(plan, IsOk());
  return plan.value_or(Plan());
}

// The 8B model in fp32 with AdamW on one rank: 16 bytes per parameter before activations.
Plan EightBillionOnOneRank() {
  return ParseOrDie(R"pb(
    model { preset: "llama3.1-8b" }
    optimizer { adamw {} }
    schedule {
      lr: 1e-4
      constant {}
    }
    training { steps: 10 micro_batch: 1 seq_len: 128 eval_batches: 1 }
  )pb");
}

// The tiny Llama trained with AdamW, FSDP-sharded over 2 ranks.
constexpr char kTinyOnTwoFsdpRanks[] = R"pb(
  model { preset: "tiny" }
  mesh { dims { name: "dp" size: 2 } }
  prepare { fsdp { mesh_dim: "dp" } }
  optimizer { adamw {} }
  schedule {
    lr: 1e-3
    constant {}
  }
  training { steps: 10 micro_batch: 4 seq_len: 64 eval_batches: 1 }
)pb";

double TinyParameters() {
  return static_cast<double>(models::NumParameters(*models::PresetConfig("tiny")));
}

TEST(EstimateMemoryTest, CountsParametersGradientsAndAdamStateOfTheShard) {
  const Plan plan = ParseOrDie(kTinyOnTwoFsdpRanks);
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 2));
  ASSERT_THAT(estimate, IsOk());
  EXPECT_EQ(estimate->preparation.parameter_fraction, 0.5);
  EXPECT_EQ(estimate->optimizer_slots, 2);
  EXPECT_FALSE(estimate->fp32_masters);
  // Half the parameters, each with an fp32 value, gradient and two Adam moments.
  EXPECT_THAT(estimate->parameter_bytes, DoubleNear(TinyParameters() / 2 * 4, 1));
  EXPECT_THAT(estimate->optimizer_state_bytes, DoubleNear(TinyParameters() / 2 * 8, 1));
  EXPECT_THAT(estimate->gradient_bytes, DoubleNear(TinyParameters() / 2 * 4, 1));
  EXPECT_EQ(estimate->buffer_bytes, 0);
  EXPECT_GT(estimate->preparation.Sum(wrap::MemoryTerm::Part::kGathered), 0);
  EXPECT_GT(estimate->activation_bytes, 0);
  EXPECT_EQ(estimate->frozen_bytes, 0);
}

// Samples hold the KV cache of a rank's rows, ceil(3 prompts / ranks) of up to the longest
// prompt's 9 bytes, 2 special tokens and 7 new tokens, over 4 layers of 2 key/value heads 64
// wide in fp32; and every unit gathered once where that fits in what a step adds at its peak
// (on 2 ranks, whose step holds half the gradients), else the units a step gathers (on 4
// ranks of a step of 8 tokens).
TEST(EstimateMemoryTest, SamplesHoldTheirKvCacheAndTheWeightsGatheredWhereTheyFit) {
  Plan plan = ParseOrDie(kTinyOnTwoFsdpRanks);
  generation::SamplesConfig& samples = *plan.mutable_training()->mutable_samples();
  for (const char* prompt : {"Q: 1 + 1?", "Q: 2?", "Q: 3?"}) samples.add_prompts(prompt);
  samples.set_tokenizer("data/tokenizer/testdata/tiny");
  samples.mutable_sampling()->set_max_new_tokens(7);
  for (const int ranks : {2, 4}) {
    plan.mutable_mesh()->mutable_dims(0)->set_size(ranks);
    plan.mutable_training()->set_micro_batch(ranks == 2 ? 4 : 1);
    plan.mutable_training()->set_seq_len(ranks == 2 ? 64 : 8);
    absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, ranks));
    ASSERT_THAT(estimate, IsOk());
    ASSERT_TRUE(estimate->generation.has_value());
    const MemoryEstimate::Generation& generation = *estimate->generation;
    const double rows = ranks == 2 ? 2 : 1;
    EXPECT_EQ(generation.kv_cache_bytes, 2.0 * 4 * rows * (9 + 2 + 7) * 2 * 64 * 4);
    const double whole = TinyParameters() * 4;
    EXPECT_EQ(generation.keep_gathered, ranks == 2);
    EXPECT_EQ(generation.keep_gathered,
              whole + generation.kv_cache_bytes <= estimate->step_bytes());
    EXPECT_EQ(generation.gathered_bytes,
              ranks == 2 ? whole : estimate->preparation.Sum(wrap::MemoryTerm::Part::kGathered));
    EXPECT_EQ(estimate->total_bytes(), estimate->between_steps_bytes() +
                                           std::max(estimate->step_bytes(), generation.bytes()));
  }
}

// Hybrid sharding over dp_replicate=2 x dp_shard=4: a rank keeps 1/4 of the parameters (the
// shard group's share), not 1/8; the replicas hold the same shard.
TEST(EstimateMemoryTest, HybridShardingKeepsTheShardGroupsShare) {
  const Plan plan = ParseOrDie(R"pb(
    model { preset: "tiny" }
    mesh {
      dims { name: "dp_replicate" size: 2 }
      dims { name: "dp_shard" size: 4 }
    }
    prepare { fsdp { mesh_dim: "dp_shard" replicate_mesh_dim: "dp_replicate" } }
    optimizer { adamw {} }
    schedule {
      lr: 1e-3
      constant {}
    }
    training { steps: 10 micro_batch: 2 seq_len: 64 eval_batches: 1 }
  )pb");
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 8));
  ASSERT_THAT(estimate, IsOk());
  EXPECT_EQ(estimate->preparation.parameter_fraction, 0.25);
  EXPECT_THAT(
      estimate->parameter_bytes + estimate->optimizer_state_bytes + estimate->gradient_bytes,
      DoubleNear(TinyParameters() / 4 * 16, 1));
  // Per micro-batch: the ring volume over 4 ranks (3/4 x 4 bytes for each of 2 gathers and 1
  // reduce-scatter) and an all-reduce of the quarter shard across 2 (2 x 1/2 x 4 bytes).
  ASSERT_EQ(estimate->preparation.steps.size(), 1u);
  const std::vector<wrap::Transfer>& transfers = estimate->preparation.steps[0].transfers;
  ASSERT_EQ(transfers.size(), 2u);
  EXPECT_EQ(transfers[0].mesh_dim, "dp_shard");
  EXPECT_THAT(transfers[0].bytes_per_micro_batch, DoubleNear(TinyParameters() * 0.75 * 12, 1));
  EXPECT_EQ(transfers[1].mesh_dim, "dp_replicate");
  EXPECT_THAT(transfers[1].bytes_per_micro_batch, DoubleNear(TinyParameters() * 4.0 / 4, 1));
}

// Past 15% off, the warning names the ranks, what they held and the estimate's largest term.
TEST(CompareWithMeasuredTest, NamesTheRanksOffTheEstimateAndItsLargestTerm) {
  MemoryEstimate estimate;
  estimate.parameter_bytes = 100 << 20;
  estimate.optimizer_state_bytes = 200 << 20;
  estimate.activation_bytes = 300 << 20;  // the step's peak: the activations
  const int64_t total = 600 << 20;
  EXPECT_EQ(CompareWithMeasured({estimate, estimate}, {total, total * 114 / 100}), std::nullopt);
  const std::optional<std::string> warning =
      CompareWithMeasured({estimate, estimate, estimate}, {total, total * 130 / 100, total / 2});
  ASSERT_TRUE(warning.has_value());
  EXPECT_THAT(*warning, AllOf(HasSubstr("rank 1 780.0 MiB (+30%), rank 2 300.0 MiB (-50%)"),
                              HasSubstr("the estimate for rank 1 (every rank): "),
                              HasSubstr("about 600.0 MiB"),
                              HasSubstr("its largest term: activations, 300.0 MiB")));
  EXPECT_THAT(*warning, Not(HasSubstr("rank 0")));
}

// A bf16 model keeps fp32 masters in its optimizer, unless FSDP keeps its shards in fp32
// (they are the masters); FSDP's gradient shards are fp32 (reduce_dtype), DDP's gradients are
// the model's and its buckets hold a second copy of them.
TEST(EstimateMemoryTest, CountsMastersShardsAndBucketsInTheirDtypes) {
  auto estimate = [](const std::string& step) {
    Plan plan = ParseOrDie(kTinyOnTwoFsdpRanks);
    plan.mutable_model()->set_dtype(base::DTYPE_BFLOAT16);
    *plan.mutable_prepare() = ParseOrDie(step).prepare();
    absl::StatusOr<MemoryEstimate> result = EstimateMemory(Resolved(plan, 2));
    EXPECT_THAT(result, IsOk());
    return result.value_or(MemoryEstimate());
  };
  const double p = TinyParameters();
  const MemoryEstimate fsdp = estimate(R"pb(prepare { fsdp { mesh_dim: "dp" } })pb");
  EXPECT_FALSE(fsdp.fp32_masters);
  EXPECT_THAT(fsdp.parameter_bytes, DoubleNear(p / 2 * 4, 1));
  EXPECT_THAT(fsdp.optimizer_state_bytes, DoubleNear(p / 2 * 8, 1));
  EXPECT_THAT(fsdp.gradient_bytes, DoubleNear(p / 2 * 4, 1));
  const MemoryEstimate ddp = estimate(R"pb(prepare { ddp { mesh_dim: "dp" } })pb");
  EXPECT_TRUE(ddp.fp32_masters);
  EXPECT_THAT(ddp.parameter_bytes, DoubleNear(p * 2, 1));
  EXPECT_THAT(ddp.optimizer_state_bytes, DoubleNear(p * 12, 1));
  EXPECT_THAT(ddp.gradient_bytes, DoubleNear(p * 2, 1));
  EXPECT_THAT(ddp.buffer_bytes, DoubleNear(p * 2, 1));
  EXPECT_THAT(DescribeMemory(ddp), HasSubstr("gradient buckets"));
}

// LoRA before FSDP: a rank keeps half of the base and of the adapters, and gradients and
// AdamW state for its half of the adapters alone.
TEST(EstimateMemoryTest, LoraLeavesGradientsAndOptimizerStateToTheAdapters) {
  Plan plan = ParseOrDie(kTinyOnTwoFsdpRanks);
  *plan.mutable_prepare() = ParseOrDie(R"pb(
                              prepare { lora { rank: 8 alpha: 16 target: "*q_proj" } }
                              prepare { fsdp { mesh_dim: "dp" } }
                            )pb")
                                .prepare();
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 2));
  ASSERT_THAT(estimate, IsOk());
  const double adapters = 4 * 8 * (256 + 256);  // 4 blocks, q_proj 256 x 256
  EXPECT_EQ(estimate->preparation.added_parameters, adapters);
  ASSERT_TRUE(estimate->preparation.trainable_parameters.has_value());
  EXPECT_EQ(estimate->preparation.trainable_parameters->size(), 4u * 2u);  // A and B of 4 q_proj
  EXPECT_THAT(estimate->parameter_bytes, DoubleNear((TinyParameters() + adapters) / 2 * 4, 1));
  EXPECT_THAT(estimate->optimizer_state_bytes, DoubleNear(adapters / 2 * 8, 1));
  EXPECT_THAT(estimate->gradient_bytes, DoubleNear(adapters / 2 * 4, 1));
  // FSDP reduce-scatters the adapters' gradients alone: its bytes per micro-batch are those of
  // two gathers of the model and one reduce-scatter of the adapters.
  const wrap::Transfer& fsdp = estimate->preparation.steps[1].transfers.at(0);
  EXPECT_THAT(fsdp.bytes_per_micro_batch,
              DoubleNear(0.5 * ((TinyParameters() + adapters) * 2 * 4 + adapters * 4), 1));
}

// QLoRA before DDP: the targeted weights take their NF4 bytes (0.5 byte a weight plus a
// 4-byte maximum per 64) instead of 4 bytes a weight; before FSDP over 2 ranks, a rank keeps
// half of those bytes, as it keeps half of the fp32 shards.
TEST(EstimateMemoryTest, AnNf4BaseTakesItsNf4Bytes) {
  const auto parameter_bytes = [](const std::string& quantization, const std::string& dp) {
    Plan plan = ParseOrDie(kTinyOnTwoFsdpRanks);
    *plan.mutable_prepare() =
        ParseOrDie(absl::StrCat(R"pb(prepare { lora { rank: 8 alpha: 16 target: "*q_proj")pb",
                                quantization, "} } prepare { ", dp, " { mesh_dim: \"dp\" } }"))
            .prepare();
    absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 2));
    EXPECT_THAT(estimate, IsOk());
    return estimate.value_or(MemoryEstimate()).parameter_bytes;
  };
  const double weights = 4 * 256 * 256;  // 4 blocks' q_proj
  const double saved = weights * 4 - (weights / 2 + weights / 64 * 4);
  EXPECT_THAT(parameter_bytes("", "ddp") - parameter_bytes("base_quantization: NF4", "ddp"),
              DoubleNear(saved, 1e-6));
  EXPECT_THAT(parameter_bytes("", "fsdp") - parameter_bytes("base_quantization: NF4", "fsdp"),
              DoubleNear(saved / 2, 1e-6));
}

// Activation checkpointing (before FSDP) keeps less of each block's forward: full keeps a
// block's input, selective its projections' outputs too, so its estimate lies in between.
TEST(EstimateMemoryTest, ActivationCheckpointingLowersTheActivations) {
  auto activations = [](const std::string& checkpointing) {
    const Plan plan = ParseOrDie(absl::StrCat(checkpointing, kTinyOnTwoFsdpRanks));
    absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 2));
    EXPECT_THAT(estimate, IsOk());
    return estimate->activation_bytes;
  };
  const double none = activations("");
  const double full = activations("prepare { activation_checkpointing { policy: FULL } }");
  const double selective =
      activations("prepare { activation_checkpointing { policy: SELECTIVE } }");
  EXPECT_GT(full, 0);
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
}

// Llama-3.1-8B (hidden 4096, 32 layers of 32 heads of 128 and 8 key/value heads, MLP 14336,
// vocabulary 128256) over 8 GPUs of tensor parallelism, one sequence of 8192 tokens in bf16
// with AdamW. A rank keeps 1/8 of the 8.03B parameters at 16 bytes each (bf16 value and
// gradient, fp32 master and two moments): 16.1 GB. Of the activations it keeps what the GPU's
// generic ops save for its 4 heads (512 query columns, one key/value head of 128), its 1792 of
// the MLP's columns and its 16032 of the vocabulary; per token and block, in bytes, with
// LibTorch 2.x's fused attention (1.13's composite attention, in brackets, keeps its [T, T]
// probabilities, and 1.13's mean its input's square):
//   the 2 norms' fp32 copies of their input (and squares), normalised inputs and rstd:
//     2 x (4 x 4096 [x 2] + 2 x 4096 + 4) = 49160 [81928], which every rank computes whole
//     unless sequence parallelism splits them 8 ways: 6145 [10241];
//   the column-parallel projections' inputs, the norms' outputs or under sequence parallelism
//     the sequence all-gathered (one sequence: no copy of their own): 2 x 4096 x 2 = 16384;
//   SwiGLU's gate, up, silu(gate) and product: 4 x 1792 x 2 = 14336;
//   q, k, v, the attention's output (which o_proj reads in place) and its fp32 log-sum-exp:
//     2 x 512 x 2 + 2 x 128 x 2 + 4 x 4 = 2576 [q, k, v, the output and probabilities
//     2 x (2 x 512 + 2 x 128) + 4 x 8192 x 2 = 68096].
// The final norm keeps one norm's share and the output projection's input: 24580 [40964] /
// 8 under sequence parallelism, + 8192. The loss: the logits and their gradient, 2 x 16032 x 2,
// a log-sum-exp of 4, and one fp32 chunk of 4185 rows x 16032 (256 MiB). That is 22.7 GB
// without sequence parallelism and 11.2 GB with it (1.13: 48.6 and 29.5 GB), where the whole
// model's activations are 57.4 GB (1.13: 203.5 GB); with the rest, each plan fits an 80 GB GPU.
TEST(EstimateMemoryTest, TensorParallelRanksKeepTheirShareOfTheActivations) {
  const double per_block = base::kHasCausalSdpa ? 16384 + 14336 + 2576 : 16384 + 14336 + 68096;
  const double norm = base::kMeanKeepsItsInput ? 40964 : 24580;
  const double loss = 8192.0 * (2 * 16032 * 2 + 4) + 4185.0 * 16032 * 4;
  for (const bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
    Plan plan = ParseOrDie(R"pb(
      model { preset: "llama3.1-8b" dtype: DTYPE_BFLOAT16 }
      device: DEVICE_CUDA
      mesh { dims { name: "tp" size: 8 } }
      prepare { tensor_parallel { mesh_dim: "tp" } }
      optimizer { adamw {} }
      schedule {
        lr: 1e-4
        constant {}
      }
      training { steps: 10 micro_batch: 1 seq_len: 8192 eval_batches: 1 }
    )pb");
    plan.mutable_prepare(0)->mutable_tensor_parallel()->set_sequence_parallel(sequence_parallel);
    absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 8));
    ASSERT_THAT(estimate, IsOk());
    const double parameters =
        static_cast<double>(models::NumParameters(*models::PresetConfig("llama3.1-8b")));
    // A rank keeps 1/8 of the split parameters and the norm weights whole (two of 4096 in
    // each of the 32 blocks, and the final norm).
    const double replicated = (2 * 32 + 1) * 4096.0;
    EXPECT_THAT(estimate->between_steps_bytes() + estimate->gradient_bytes,
                DoubleNear(((parameters - replicated) / 8 + replicated) * 16, 1));
    const double norms = sequence_parallel ? norm / 8 : norm;
    EXPECT_DOUBLE_EQ(estimate->activation_bytes,
                     8192.0 * (32 * (2 * norms + per_block) + norms + 8192) + loss);
    EXPECT_THAT(CheckMemoryFits(*estimate, 1, int64_t{80'000'000'000}), IsOk());
  }
}

// The tiny Qwen3-MoE (8 experts of each layer) on `mesh_and_steps`, trained with AdamW for
// 10 steps of 2 x 64 tokens.
Plan TinyMoePlan(const std::string& mesh_and_steps) {
  return ParseOrDie(absl::StrCat(R"pb(
                                   model { preset: "qwen3-moe-tiny" }
                                   optimizer { adamw {} }
                                   schedule {
                                     lr: 1e-3
                                     constant {}
                                   }
                                   training { steps: 10 micro_batch: 2 seq_len: 64 eval_batches: 1 }
                                 )pb",
                                 mesh_and_steps));
}

// Whether the expert parameter `name` is one of the 4 of its layer's 8 that the first of 2
// expert-parallel ranks keeps.
bool KeptByExpertRank0(const std::string& name) {
  const int64_t index = wrap::ExpertIndexOf(name);
  return index >= 0 && index < 4;
}

// Expert parallelism over ep=2 then tensor parallelism over tp=2 (sequence parallel) of the
// tiny Qwen3-MoE: a rank keeps 4 of each layer's 8 experts whole and half of every
// attention projection, embedding and output row, and each step's estimate sees what the
// steps before it left: the tensor-parallel sums of the gradients computed from each rank's
// slice of the sequence carry the rank's experts, not all of them.
TEST(EstimateMemoryTest, ExpertThenTensorParallelRanksKeepTheirExpertsAndSlices) {
  const Plan plan = TinyMoePlan(R"pb(
    mesh {
      dims { name: "ep" size: 2 }
      dims { name: "tp" size: 2 }
    }
    prepare { expert_parallel { mesh_dim: "ep" } }
    prepare { tensor_parallel { mesh_dim: "tp" sequence_parallel: true } }
  )pb");
  const models::ModelConfig config = *models::PresetConfig("qwen3-moe-tiny");
  double total = 0;
  double kept = 0;    // on a rank
  double summed = 0;  // whole on every rank of tp, the gradient from each one's slice
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    const double count = static_cast<double>(parameter.numel());
    total += count;
    const std::string& name = parameter.name;
    if (absl::StrContains(name, ".experts.")) {
      if (KeptByExpertRank0(name)) {
        kept += count;
        summed += count;
      }
    } else if (absl::StrContains(name, "_proj.") || absl::StrContains(name, "embed_tokens") ||
               absl::StrContains(name, "lm_head")) {
      kept += count / 2;  // q, k, v, o (2 key/value heads, one a rank), the vocabulary rows
    } else {
      kept += count;  // norms, routers
      summed += count;
    }
  }
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 4));
  ASSERT_THAT(estimate, IsOk());
  EXPECT_DOUBLE_EQ(estimate->preparation.parameter_fraction * total, kept);
  const std::vector<wrap::Transfer>& tp = estimate->preparation.steps.at(1).transfers;
  ASSERT_EQ(tp.size(), 1u);
  EXPECT_DOUBLE_EQ(tp[0].bytes_per_step, 2.0 * 1 / 2 * summed * 4);  // an fp32 all-reduce
}

// Expert parallelism over ep=2, then FSDP over dp=2 sharding the dense parts over dp and ep
// too (torchtitan's layout): a rank keeps 1/4 of the attention, norms, routers and embeddings
// and 1/2 of its 4 experts of each layer; expert parallelism averages no gradient over ep, and
// FSDP's collectives carry each part over its own group.
TEST(EstimateMemoryTest, DenseShardedOverExpertsKeepsAQuarterOfThem) {
  const Plan plan = TinyMoePlan(R"pb(
    mesh {
      dims { name: "dp" size: 2 }
      dims { name: "ep" size: 2 }
    }
    prepare { expert_parallel { mesh_dim: "ep" } }
    prepare { fsdp { mesh_dim: "dp" shard_dense_over_mesh_dim: "ep" } }
  )pb");
  const models::ModelConfig config = *models::PresetConfig("qwen3-moe-tiny");
  double total = 0;
  double dense = 0;
  double experts = 0;  // those a rank keeps, whole
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    const double count = static_cast<double>(parameter.numel());
    total += count;
    const std::string& name = parameter.name;
    if (!absl::StrContains(name, ".experts.")) {
      dense += count;
    } else if (KeptByExpertRank0(name)) {
      experts += count;
    }
  }
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 4));
  ASSERT_THAT(estimate, IsOk());
  EXPECT_DOUBLE_EQ(estimate->preparation.parameter_fraction * total, dense / 4 + experts / 2);
  const std::vector<wrap::Transfer>& ep = estimate->preparation.steps.at(0).transfers;
  ASSERT_EQ(ep.size(), 1u);  // the routed rows only
  EXPECT_EQ(ep[0].bytes_per_step, 0.0);
  const std::vector<wrap::Transfer>& fsdp = estimate->preparation.steps.at(1).transfers;
  ASSERT_EQ(fsdp.size(), 2u);
  // Per micro-batch: each part gathered twice (fp32) and its gradients reduce-scattered (fp32).
  EXPECT_EQ(fsdp[0].mesh_dim, "dp");
  EXPECT_DOUBLE_EQ(fsdp[0].bytes_per_micro_batch, 1.0 / 2 * experts * 3 * 4);
  EXPECT_EQ(fsdp[1].mesh_dim, "dp,ep");
  EXPECT_DOUBLE_EQ(fsdp[1].bytes_per_micro_batch, 3.0 / 4 * dense * 3 * 4);
}

// The frozen reference model of preference training takes memory too: its parameters, sharded
// as its own steps say, and the units FSDP gathers for its forward.
TEST(EstimateMemoryTest, CountsFrozenModels) {
  const Plan plan = ParseOrDie(absl::StrCat(kTinyOnTwoFsdpRanks, R"pb(
    frozen {
      name: "reference"
      model { preset: "tiny" dtype: DTYPE_BFLOAT16 }
      prepare { fsdp { mesh_dim: "dp" } }
    }
  )pb"));
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(plan, 2));
  ASSERT_THAT(estimate, IsOk());
  const double frozen_shard = TinyParameters() / 2 * 2;  // bf16
  EXPECT_GT(estimate->frozen_bytes, frozen_shard);
  EXPECT_LT(estimate->frozen_bytes, frozen_shard + TinyParameters() * 2);  // + gathered units
  EXPECT_THAT(DescribeMemory(*estimate), HasSubstr("frozen models"));
}

// The ranks of a pipeline keep different stages, so each has its own estimate: with the
// first stage cut after block 0 of the tiny Llama's 4 and GPIPE over 4 micro-batches, the
// first keeps the embedding and one block, and 4 micro-batches of that block's activations;
// the second the 3 other blocks, the final norm and the output head, and 4 micro-batches of
// their activations and of the loss's. FSDP then shards each stage over "dp".
TEST(EstimateMemoryTest, EachPipelineRankHasTheEstimateOfItsStage) {
  const Plan plan = ParseOrDie(R"pb(
    model { preset: "tiny" }
    mesh {
      dims { name: "pp" size: 2 }
      dims { name: "dp" size: 2 }
    }
    prepare { pipeline { mesh_dim: "pp" schedule: "GPIPE" stage_starts: 1 } }
    prepare { fsdp { mesh_dim: "dp" } }
    optimizer { adamw {} }
    schedule {
      lr: 1e-3
      constant {}
    }
    training { steps: 10 micro_batch: 2 grad_accumulation: 4 seq_len: 64 eval_batches: 1 }
  )pb");
  const models::ModelConfig config = *models::PresetConfig("tiny");
  ASSERT_EQ(config.num_hidden_layers(), 4);
  double embedding = 0, block = 0, last = 0;  // last: the final norm and the output head
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    const double count = static_cast<double>(parameter.numel());
    if (parameter.name == "model.embed_tokens.weight") {
      embedding += count;
    } else if (absl::StartsWith(parameter.name, "model.layers.0.")) {
      block += count;
    } else if (!absl::StartsWith(parameter.name, "model.layers.")) {
      last += count;
    }
  }
  absl::StatusOr<std::vector<MemoryEstimate>> shares = EstimateMemoryOfEachShare(Resolved(plan, 4));
  ASSERT_THAT(shares, IsOk());
  ASSERT_EQ(shares->size(), 2u);
  const MemoryEstimate& first = (*shares)[0];
  const MemoryEstimate& second = (*shares)[1];
  EXPECT_EQ(DescribeShare(first), "the ranks at pp=0, stage 0");
  EXPECT_EQ(DescribeShare(second), "the ranks at pp=1, stage 1");
  // FSDP's units are the blocks a rank holds and the root, not its blocks' activations of the
  // 4 micro-batches it keeps in flight.
  EXPECT_THAT(first.preparation.steps[1].description, HasSubstr(" 2 units (1 block and the root)"));
  EXPECT_THAT(second.preparation.steps[1].description,
              HasSubstr(" 4 units (3 blocks and the root)"));
  // fp32 shards of half of each stage.
  EXPECT_THAT(first.parameter_bytes, DoubleNear((embedding + block) / 2 * 4, 1));
  EXPECT_THAT(second.parameter_bytes, DoubleNear((3 * block + last) / 2 * 4, 1));
  const double block_activations = first.activation_bytes / 4;
  EXPECT_GT(block_activations, 0);
  EXPECT_GT(second.activation_bytes, 3 * first.activation_bytes);  // and the loss's
  // The plan's estimate is the rank that needs the most; each rank gets its stage's.
  absl::StatusOr<MemoryEstimate> largest = EstimateMemory(Resolved(plan, 4));
  ASSERT_THAT(largest, IsOk());
  EXPECT_DOUBLE_EQ(largest->total_bytes(), std::max(first.total_bytes(), second.total_bytes()));
  absl::StatusOr<std::vector<MemoryEstimate>> ranks = EstimateMemoryOfEachRank(Resolved(plan, 4));
  ASSERT_THAT(ranks, IsOk());
  ASSERT_EQ(ranks->size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ((*ranks)[rank].preparation.share, rank / 2) << "rank " << rank;  // pp, then dp
  }
}

TEST(CheckMemoryFitsTest, RefusesWhatTheLocalRanksCannotHoldGivingEstimateAndLimit) {
  absl::StatusOr<MemoryEstimate> estimate = EstimateMemory(Resolved(EightBillionOnOneRank(), 1));
  ASSERT_THAT(estimate, IsOk());
  EXPECT_GT(estimate->total_bytes(), 8e9 * 16);
  EXPECT_THAT(CheckMemoryFits(*estimate, 1, 1024 * kGiB), IsOk());
  EXPECT_THAT(
      CheckMemoryFits(*estimate, 1, 24 * kGiB),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("needs about 1"), HasSubstr("24.00 GiB available"),
                     HasSubstr("optimizer state (2 slots)"), HasSubstr("--skip_memory_check"))));
  EXPECT_THAT(CheckMemoryFits(*estimate, 8, 512 * kGiB),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("for the 8 ranks")));
}

// Against this machine: no machine holds 64 ranks of an unsharded 8B model (8 TB); the flag
// lets it through, and the tiny plan fits anywhere.
TEST(ResolveForMachineTest, RefusesAPlanLargerThanTheMachineUnlessTold) {
  EXPECT_THAT(ResolveForMachine(EightBillionOnOneRank(), 1, 64, false),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("available")));
  EXPECT_THAT(ResolveForMachine(EightBillionOnOneRank(), 1, 64, true), IsOk());
  Plan tiny = EightBillionOnOneRank();
  tiny.mutable_model()->set_preset("tiny");
  EXPECT_THAT(ResolveForMachine(tiny, 1, 1, false), IsOk());
}

}  // namespace
}  // namespace plait::plan
