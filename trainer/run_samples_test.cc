// A run's samples file across a resume: the lines of the steps up to the one it resumes from
// stay, those after it go (the run draws them again), and the new ones follow; a line that is
// not a sample stops the run naming the file and line.
#include "trainer/run_samples.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "parallel/test_ranks.h"
#include "plan/testing_resolved.h"
#include "prepared/prepared_model.h"
#include "trainer/testing_ranks.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The text SFT example's plan on one rank, its samples in `path`.
plan::ResolvedPlan OneRankPlan(const std::string& path) {
  plan::Plan plan = testing::ShortShippedPlan("llama_sft_text");
  plan.clear_mesh();
  plan.clear_prepare();
  plan.mutable_training()->set_global_batch(0);
  plan.mutable_training()->mutable_samples()->set_file(path);
  return plan::testing::Resolved(plan, 1);
}

// The steps of the samples file's lines.
std::vector<int64_t> StepsIn(const std::string& path) {
  absl::StatusOr<std::string> text = base::ReadFile(path);
  EXPECT_THAT(text, IsOk());
  std::vector<int64_t> steps;
  for (const absl::string_view line : absl::StrSplit(text.value_or(""), '\n', absl::SkipEmpty())) {
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  }
  return steps;
}

void OnOneRank(const std::function<void(const parallel::DeviceMesh&)>& body) {
  absl::StatusOr<parallel::MeshLayout> layout =
      parallel::MeshLayout::Create(parallel::MeshConfig(), 1);
  ASSERT_THAT(layout, IsOk());
  parallel::testing::RunOnRingMesh(*layout, [&](int, parallel::DeviceMesh& mesh) { body(mesh); });
}

TEST(RunSamplesTest, AResumedRunKeepsTheSamplesUpToItsStepAndAddsItsOwn) {
  const std::string folder = base::testing::FreshTestDir("resumed_samples");
  std::filesystem::create_directories(folder);
  const std::string path = folder + "/samples.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(path, "{\"step\": 5}\n{\"step\": 10}\n{\"step\": 15}\n"),
              IsOk());
  const plan::ResolvedPlan resolved = OneRankPlan(path);
  OnOneRank([&](const parallel::DeviceMesh& mesh) {
    absl::StatusOr<std::optional<RunSamples>> samples = RunSamples::Open(resolved, mesh, 10);
    ASSERT_THAT(samples, IsOk());
    ASSERT_TRUE(samples->has_value());
    EXPECT_FALSE((*samples)->IsDue(11));
    EXPECT_TRUE((*samples)->IsDue(10));  // the last step, whatever every_steps says
    absl::StatusOr<std::unique_ptr<prepared::PreparedModel>> prepared =
        prepared::PreparedModel::Prepare(resolved.plan.model(), resolved.model, "",
                                         resolved.plan.prepare(), mesh, prepared::Role::kTrained,
                                         "plan");
    ASSERT_THAT(prepared, IsOk());
    ASSERT_THAT((*samples)->Draw(12, **prepared), IsOk());
  });
  // Three prompts drawn after step 12.
  EXPECT_THAT(StepsIn(path), ElementsAre(5, 10, 12, 12, 12));
}

TEST(RunSamplesTest, ALineThatIsNotASampleNamesTheFileAndLine) {
  const std::string folder = base::testing::FreshTestDir("corrupt_samples");
  std::filesystem::create_directories(folder);
  const std::string path = folder + "/samples.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(path, "{\"step\": 5}\n{\"stop\": 10}\n"), IsOk());
  const plan::ResolvedPlan resolved = OneRankPlan(path);
  OnOneRank([&](const parallel::DeviceMesh& mesh) {
    EXPECT_THAT(RunSamples::Open(resolved, mesh, 10),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path + ":2")));
  });
}

}  // namespace
}  // namespace plait::trainer
