#include "trainer/testing_ranks.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "parallel/test_ranks.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"

namespace plait::trainer::testing {

using ::plait::base::testing::IsOk;
using ::plait::plan::testing::Resolved;

namespace {

void ExpectNearRelative(double actual, double expected, const std::string& what, double tolerance,
                        double floor) {
  EXPECT_NEAR(actual, expected, tolerance * std::max(std::abs(expected), floor)) << what;
}

}  // namespace

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
  parallel::testing::RunOnMesh(*layout,
                               plan.device() == parallel::DEVICE_CUDA ? at::kCUDA : at::kCPU, body);
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

void ExpectSameSteps(const TrainReport& run, const TrainReport& expected, const std::string& layout,
                     double tolerance, double floor) {
  ASSERT_EQ(run.steps.size(), expected.steps.size());
  for (size_t i = 0; i < expected.steps.size(); ++i) {
    const metrics::StepMetrics& a = run.steps[i];
    const metrics::StepMetrics& e = expected.steps[i];
    const std::string step = absl::StrCat(layout, " step ", e.step, " ");
    ExpectNearRelative(a.loss, e.loss, step + "loss", tolerance, floor);
    ExpectNearRelative(*a.grad_norm, *e.grad_norm, step + "grad_norm", tolerance, floor);
    ASSERT_EQ(a.named.size(), e.named.size());
    for (size_t m = 0; m < e.named.size(); ++m) {
      ExpectNearRelative(a.named[m].second, e.named[m].second, step + e.named[m].first, tolerance,
                         floor);
    }
    ASSERT_EQ(a.eval_named.size(), e.eval_named.size());
    for (size_t m = 0; m < e.eval_named.size(); ++m) {
      ExpectNearRelative(a.eval_named[m].second, e.eval_named[m].second,
                         step + "eval_" + e.eval_named[m].first, tolerance, floor);
    }
  }
}

SavedRun TrainAndSave(plan::Plan plan, int ranks, const std::string& name,
                      const TrainOptions& options) {
  const std::string saved = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  plan.mutable_training()->set_save_hf_dir(saved);
  SavedRun run{TrainOnRanks(plan, ranks, options), {}};
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model = models::LoadHfModel(saved);
  EXPECT_THAT(model, IsOk());
  if (model.ok()) {
    for (const auto& named : (*model)->NamedParameters()) {
      run.parameters[named.name] = named.parameter.detach().clone();
    }
  }
  return run;
}

const SavedRun& TrainAndSaveOnce(const plan::Plan& plan, int ranks, const std::string& name) {
  static auto* runs = new std::map<std::string, SavedRun>();
  if (runs->count(name) == 0) (*runs)[name] = TrainAndSave(plan, ranks, name);
  return runs->at(name);
}

wrap::PrepareStep& AddMeshStep(plan::Plan& plan, const std::string& dim, int size) {
  parallel::MeshConfig::Dimension& added = *plan.mutable_mesh()->add_dims();
  added.set_name(dim);
  added.set_size(size);
  return *plan.add_prepare();
}

void ExpectSameTraining(const SavedRun& run, const SavedRun& expected, const std::string& layout) {
  ASSERT_EQ(run.report.steps.size(), expected.report.steps.size()) << layout;
  ExpectSameSteps(run.report, expected.report, layout);
  ASSERT_TRUE(run.report.steps.back().eval_loss.has_value()) << layout;
  ASSERT_TRUE(expected.report.steps.back().eval_loss.has_value()) << layout;
  EXPECT_NEAR(*run.report.steps.back().eval_loss, *expected.report.steps.back().eval_loss,
              1e-5 * *expected.report.steps.back().eval_loss)
      << layout;
  ExpectSameParameters(run, expected, layout);
}

void ExpectSameParameters(const SavedRun& run, const SavedRun& expected, const std::string& layout,
                          double tolerance) {
  ASSERT_EQ(run.parameters.size(), expected.parameters.size()) << layout;
  for (const auto& [name, value] : expected.parameters) {
    const at::Tensor& actual = run.parameters.at(name);
    if (absl::StrContains(name, "k_proj.bias")) {
      EXPECT_LE((actual - value).abs().max().item<double>(), 1e-4) << layout << " " << name;
      continue;
    }
    EXPECT_LE((actual - value).norm().item<double>(), tolerance * value.norm().item<double>())
        << layout << " " << name;
  }
}

}  // namespace plait::trainer::testing
