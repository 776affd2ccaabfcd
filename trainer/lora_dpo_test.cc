// DPO of LoRA adapters whose reference is the policy with its adapters off
// (objective.dpo.policy_without_adapters, //trainer:qwen_lora_dpo_fsdp's plan) trains as the
// same plan with a frozen copy of the base as its reference does, step by step: on one
// process, with the policy under FSDP on 2 ranks (the reference's no-grad forward gathers and
// frees the same units just before the training forward), under DDP, with activation
// checkpointing, and with the reference precomputed before the first step; and without the
// copy a rank holds less. A QLoRA policy's reference is its quantized base, on one process and
// under FSDP.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "plan/plan.h"
#include "plan/plan.pb.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"
#include "wrap/wrap.pb.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::trainer::testing::ExpectSameSteps;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::testing::HasSubstr;

// qwen_lora_dpo_fsdp's plan, shortened, with the policy prepared as `layout` says: "fsdp" (as
// shipped), "ddp" (2 ranks), "single" (one process, the same global batch), or
// "checkpointed_fsdp" (full activation checkpointing, then FSDP).
plan::Plan LoraDpoPlan(const std::string& layout) {
  plan::Plan plan = ShortShippedPlan("qwen_lora_dpo_fsdp");
  if (layout == "fsdp") return plan;
  const wrap::PrepareStep lora = plan.prepare(0);
  const wrap::PrepareStep fsdp = plan.prepare(1);
  plan.clear_prepare();
  *plan.add_prepare() = lora;
  if (layout == "ddp") {
    plan.add_prepare()->mutable_ddp()->set_mesh_dim("dp");
  } else if (layout == "checkpointed_fsdp") {
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
        "activation_checkpointing { policy: FULL }", plan.add_prepare()));
    *plan.add_prepare() = fsdp;
  } else {
    plan.clear_mesh();
    EXPECT_THAT(plan::ApplyOverride("training.micro_batch=16", plan), IsOk());
  }
  return plan;
}

// The same plan with a frozen copy of the policy's base as its reference: the same model,
// seed and weights, prepared by the policy's steps but its adapters'.
plan::Plan WithAFrozenCopyOfTheBase(plan::Plan plan) {
  plan::FrozenModel* frozen = plan.add_frozen();
  frozen->set_name("base");
  *frozen->mutable_model() = plan.model();
  frozen->set_hf_weights_dir(plan.hf_weights_dir());
  for (const wrap::PrepareStep& step : plan.prepare()) {
    if (!step.has_lora()) *frozen->add_prepare() = step;
  }
  plan.mutable_objective()->mutable_dpo()->set_reference("base");
  return plan;
}

// The most tensor bytes a rank held in a step after the first.
int64_t PeakBytes(const TrainReport& report) {
  int64_t peak = 0;
  for (const int64_t bytes : report.peak_tensor_bytes) peak = std::max(peak, bytes);
  return peak;
}

// The largest difference of two runs' losses over their steps, relative.
double LargestLossDifference(const TrainReport& run, const TrainReport& expected) {
  double largest = 0.0;
  for (size_t i = 0; i < std::min(run.steps.size(), expected.steps.size()); ++i) {
    largest = std::max(largest, std::abs(run.steps[i].loss - expected.steps[i].loss) /
                                    std::abs(expected.steps[i].loss));
  }
  return largest;
}

TEST(LoraDpoTest, ThePolicyWithoutAdaptersIsAFrozenCopyOfTheBase) {
  for (const auto& [layout, ranks] : {std::pair<std::string, int>{"single", 1},
                                      {"fsdp", 2},
                                      {"ddp", 2},
                                      {"checkpointed_fsdp", 2}}) {
    const TrainReport frozen_copy =
        TrainOnRanks(WithAFrozenCopyOfTheBase(LoraDpoPlan(layout)), ranks);
    ASSERT_EQ(frozen_copy.steps.size(), 10u);
    // The adapters start at B = 0: the policy is its base, and z = 0.
    EXPECT_FLOAT_EQ(frozen_copy.steps[0].loss, std::log(2.0)) << layout;
    EXPECT_LT(frozen_copy.steps.back().loss, frozen_copy.steps.front().loss) << layout;
    const TrainReport run = TrainOnRanks(LoraDpoPlan(layout), ranks);
    ExpectSameSteps(run, frozen_copy, layout);
    std::cout << layout << ": losses within " << LargestLossDifference(run, frozen_copy)
              << " (relative) of the frozen copy's; peak tensor bytes per rank "
              << PeakBytes(frozen_copy) << " with the frozen copy, " << PeakBytes(run)
              << " without\n";
    // Without the copy (its parameters or FSDP shard, and its gathered units) a rank holds
    // less.
    EXPECT_LT(PeakBytes(run), PeakBytes(frozen_copy)) << layout;
  }
}

// Precomputed before the first step, the policy without its adapters is the same model as at
// every later step: its base is frozen.
TEST(LoraDpoTest, APrecomputedReferenceTrainsAsTheLiveOne) {
  const plan::Plan live = LoraDpoPlan("fsdp");
  plan::Plan precomputed = live;
  ASSERT_THAT(plan::ApplyOverride("objective.dpo.precompute_reference=true", precomputed), IsOk());
  std::ostringstream log;
  TrainOptions options;
  options.log = &log;
  ExpectSameSteps(TrainOnRanks(precomputed, 2, options), TrainOnRanks(live, 2), "precomputed",
                  1e-6);
  EXPECT_THAT(log.str(),
              HasSubstr("precomputed the reference log-probabilities of 176 sequences on "
                        "rank 0 (10 training and 1 eval micro-batches per rank)"));
  EXPECT_THAT(log.str(), HasSubstr("with the policy's adapters off"));
}

// With a QLoRA policy (its base held in NF4), the adapters off still compute with the
// dequantized base: at step 1 (B = 0) the policy is its reference, z = 0; the adapters then
// train, under FSDP (which shards the NF4 bytes) as on one process.
TEST(LoraDpoTest, AQLoraPolicyWithoutItsAdaptersIsItsQuantizedBase) {
  const auto qlora = [](const std::string& layout) {
    plan::Plan plan = LoraDpoPlan(layout);
    plan.mutable_prepare(0)->mutable_lora()->set_base_quantization(wrap::LoraConfig::NF4);
    return plan;
  };
  const TrainReport single = TrainOnRanks(qlora("single"), 1);
  ASSERT_EQ(single.steps.size(), 10u);
  EXPECT_FLOAT_EQ(single.steps[0].loss, std::log(2.0));
  EXPECT_LT(single.steps.back().loss, single.steps.front().loss - 0.05);
  // Within 1e-4: the rewards, near 0 in the first steps, carry the fp32 noise of FSDP's
  // reduction order in the adapters at about 3e-7.
  ExpectSameSteps(TrainOnRanks(qlora("fsdp"), 2), single, "fsdp", 1e-4);
}

}  // namespace
}  // namespace plait::trainer
