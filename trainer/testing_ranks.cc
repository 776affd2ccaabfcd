#include "trainer/testing_ranks.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/model_config.h"
#include "parallel/test_ranks.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"

namespace plait::trainer::testing {

using ::plait::base::testing::IsOk;
using ::plait::plan::testing::Resolved;

plan::Plan LoadShippedPlan(const std::string& name) {
  absl::StatusOr<plan::Plan> plan = plan::LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/", name, ".textproto"));
  EXPECT_THAT(plan, IsOk());
  if (!plan.ok()) return plan::Plan();
  plan->mutable_model()->set_dtype(base::DTYPE_FLOAT32);
  for (plan::FrozenModel& frozen : *plan->mutable_frozen()) {
    frozen.mutable_model()->set_dtype(base::DTYPE_FLOAT32);
  }
  return *std::move(plan);
}

plan::Plan ShortShippedPlan(const std::string& name) {
  plan::Plan plan = LoadShippedPlan(name);
  for (const char* override : {"training.steps=10", "training.eval_every=5",
                               "training.eval_batches=1", "training.metrics_file="}) {
    EXPECT_THAT(plan::ApplyOverride(override, plan), IsOk());
  }
  return plan;
}

void WithMesh(const plan::Plan& plan, int ranks,
              const std::function<void(int, const parallel::DeviceMesh&)>& body) {
  absl::StatusOr<parallel::MeshLayout> layout = parallel::MeshLayout::Create(plan.mesh(), ranks);
  ASSERT_THAT(layout, IsOk());
  parallel::testing::RunOnMesh(
      *layout, plan.device() == parallel::DEVICE_CUDA ? torch::kCUDA : torch::kCPU, body);
}

TrainReport TrainOnRanks(const plan::Plan& plan, int ranks, const TrainOptions& options) {
  const plan::ResolvedPlan resolved = Resolved(plan, ranks);
  TrainReport result;
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    absl::StatusOr<TrainReport> report = Train(resolved, mesh, options);
    ASSERT_THAT(report, IsOk());
    if (rank == 0) result = *report;
  });
  return result;
}

models::ModelConfig ConfigOf(const models::ModelSpec& spec) {
  absl::StatusOr<models::ModelConfig> config = models::ResolveModelSpec(spec, "plan.model");
  EXPECT_THAT(config, IsOk());
  return config.value_or(models::ModelConfig());
}

}  // namespace plait::trainer::testing
