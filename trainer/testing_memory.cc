#include "trainer/testing_memory.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/allocation_counter.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "trainer/plan.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"
#include "trainer/validate.h"

namespace plait::trainer::testing {

using ::plait::base::testing::IsOk;

std::vector<MeasuredMemory> MeasureTrainingMemory(const Plan& plan, int ranks) {
  EXPECT_GE(plan.training().steps(), 2) << "the first step is not measured";
  EXPECT_THAT(ValidatePlan(plan, ranks), IsOk());
  std::vector<MeasuredMemory> measured(ranks);
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    base::AllocationCounter counter;
    MeasuredMemory& memory = measured[rank];
    TrainOptions options;
    options.before_step = [&](int64_t step) {
      // The counter's peak is the previous step's.
      if (step >= 2) memory.peak_bytes = std::max(memory.peak_bytes, counter.peak());
      memory.between_steps_bytes = counter.current();
      counter.ResetPeak();
    };
    {
      base::AllocationCounter::Scope counting(counter);
      ASSERT_THAT(Train(plan, mesh, options), IsOk());
    }
    memory.peak_bytes = std::max(memory.peak_bytes, counter.peak());  // the last step's
  });
  return measured;
}

namespace {

Plan Shortened(Plan plan) {
  for (const char* override :
       {"training.steps=3", "schedule.warmup.steps=1", "training.eval_every=0",
        "training.eval_batches=1", "training.metrics_file="}) {
    EXPECT_THAT(ApplyOverride(override, plan), IsOk());
  }
  return plan;
}

}  // namespace

std::vector<MemoryCheckPlan> MemoryCheckPlans() {
  std::vector<MemoryCheckPlan> plans;
  plans.push_back({"llama_fsdp", Shortened(LoadShippedPlan("llama_fsdp")), 2});
  plans.push_back({"llama_ddp", Shortened(LoadShippedPlan("llama_ddp")), 2});
  absl::StatusOr<Plan> medium = LoadPlan(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/plait/trainer/testdata/runs/medium_single.textproto"));
  EXPECT_THAT(medium, IsOk());
  plans.push_back({"medium", Shortened(medium.value_or(Plan())), 1});
  Plan bf16 = LoadShippedPlan("llama_fsdp");
  bf16.mutable_model()->set_dtype(base::DTYPE_BFLOAT16);
  plans.push_back({"llama_fsdp_bf16", Shortened(std::move(bf16)), 2});
  // Activation checkpointing before the plans' own steps: FULL on the medium shape (where
  // the gradients outgrow the activations kept), SELECTIVE under FSDP.
  for (const auto& [name, checkpointed, policy] :
       {std::tuple{"medium_full", plans[2], wrap::ActivationCheckpointingConfig::FULL},
        std::tuple{"llama_fsdp_selective", plans[0],
                   wrap::ActivationCheckpointingConfig::SELECTIVE}}) {
    MemoryCheckPlan check = checkpointed;
    check.name = name;
    check.plan.clear_prepare();
    check.plan.add_prepare()->mutable_activation_checkpointing()->set_policy(policy);
    check.plan.mutable_prepare()->MergeFrom(checkpointed.plan.prepare());
    plans.push_back(std::move(check));
  }
  return plans;
}

}  // namespace plait::trainer::testing
