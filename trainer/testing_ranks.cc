#include "trainer/testing_ranks.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "parallel/test_ranks.h"
#include "trainer/plan.h"
#include "trainer/validate.h"

namespace plait::trainer::testing {

using ::plait::base::testing::IsOk;

Plan LoadShippedPlan(const std::string& name) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/plans/", name, ".textproto"));
  EXPECT_THAT(plan, IsOk());
  if (!plan.ok()) return Plan();
  plan->mutable_model()->set_dtype(base::DTYPE_FLOAT32);
  for (FrozenModel& frozen : *plan->mutable_frozen()) {
    frozen.mutable_model()->set_dtype(base::DTYPE_FLOAT32);
  }
  return *std::move(plan);
}

Plan ShortShippedPlan(const std::string& name) {
  Plan plan = LoadShippedPlan(name);
  for (const char* override : {"training.steps=10", "training.eval_every=5",
                               "training.eval_batches=1", "training.metrics_file="}) {
    EXPECT_THAT(ApplyOverride(override, plan), IsOk());
  }
  return plan;
}

void WithMesh(const Plan& plan, int ranks,
              const std::function<void(int, const parallel::DeviceMesh&)>& body) {
  absl::StatusOr<parallel::MeshLayout> layout = parallel::MeshLayout::Create(plan.mesh(), ranks);
  ASSERT_THAT(layout, IsOk());
  parallel::testing::RunOnMesh(
      *layout, plan.device() == parallel::DEVICE_CUDA ? torch::kCUDA : torch::kCPU, body);
}

TrainReport TrainOnRanks(const Plan& plan, int ranks, TrainOptions options) {
  EXPECT_THAT(ValidatePlan(plan, ranks), IsOk());
  options.checkpoint_dir = plan.training().checkpoint().dir();
  TrainReport result;
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    absl::StatusOr<TrainReport> report = Train(plan, mesh, options);
    ASSERT_THAT(report, IsOk());
    if (rank == 0) result = *report;
  });
  return result;
}

}  // namespace plait::trainer::testing
