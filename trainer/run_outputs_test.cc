// What a run leaves for a person to look at, on 2 FSDP ranks as threads: TensorBoard's event
// file holds every number of the metrics file under the same name, and the plan as text; the
// run summary beside the metrics file tells the run's steps, evaluations, checkpoints and
// each rank's peak memory. And what one process leaves: no export or checkpoint of weights
// that are not finite, and progress lines that say what it trains and trained.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/status.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "metrics/record_file.h"
#include "metrics/tensorboard_event.pb.h"
#include "models/estimates.h"
#include "models/parameter_shapes.h"
#include "nlohmann/json.hpp"
#include "plan/compute_dtype.h"
#include "plan/plan.h"
#include "plan/validate.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::FolderEntries;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// llama_single's plan without evaluations, for `steps` steps, with `assignments` applied.
plan::Plan Single(int steps, const std::vector<std::string>& assignments) {
  plan::Plan plan = ShortShippedPlan("llama_single");
  plan.mutable_schedule()->clear_warmup();  // longer than the runs
  for (const std::string& assignment :
       {absl::StrCat("training.steps=", steps), std::string("training.eval_every=0"),
        std::string("training.eval_batches=0")}) {
    EXPECT_THAT(plan::ApplyOverride(assignment, plan), IsOk()) << assignment;
  }
  for (const std::string& assignment : assignments) {
    EXPECT_THAT(plan::ApplyOverride(assignment, plan), IsOk()) << assignment;
  }
  return plan;
}

// Trains `plan` in one process, printing its progress into `log`.
absl::Status TrainAlone(const plan::Plan& plan, std::ostream* log = nullptr) {
  PLAIT_ASSIGN_OR_RETURN(const plan::ResolvedPlan resolved, plan::Resolve(plan, 1));
  TrainOptions options;
  options.log = log;
  absl::Status status = absl::UnknownError("did not run");
  WithMesh(plan, 1, [&](int, const parallel::DeviceMesh& mesh) {
    status = Train(resolved, mesh, options).status();
  });
  return status;
}

TEST(RunOutputsTest, TensorBoardHoldsTheMetricsFileAndTheSummaryTellsTheRun) {
  const std::string dir = FreshTestDir("outputs");
  absl::StatusOr<plan::Plan> plan = plan::LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/llama_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  for (const std::string& assignment : std::vector<std::string>{
           "training.steps=6", "schedule.warmup.steps=2", "training.eval_every=3",
           "training.eval_batches=1", "training.checkpoint.every=4",
           absl::StrCat("training.checkpoint.dir=", dir, "/checkpoints"),
           absl::StrCat("training.metrics_file=", dir, "/metrics.jsonl"),
           absl::StrCat("training.tensorboard_dir=", dir, "/tensorboard")}) {
    ASSERT_THAT(plan::ApplyOverride(assignment, *plan), IsOk()) << assignment;
  }
  TrainOnRanks(*plan, 2);

  std::vector<nlohmann::json> rows;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_THAT(rows, SizeIs(6));

  // One event file: its version, the start, the plan, then a step per event.
  const std::vector<std::string> files = FolderEntries(dir + "/tensorboard");
  ASSERT_THAT(files, SizeIs(1));
  const std::string events_path = dir + "/tensorboard/" + files[0];
  absl::StatusOr<std::string> bytes = base::ReadFile(events_path);
  ASSERT_THAT(bytes, IsOk());
  absl::StatusOr<metrics::Records> records = metrics::ParseRecords(*bytes, events_path);
  ASSERT_THAT(records, IsOk());
  ASSERT_THAT(records->records, SizeIs(3 + rows.size()));
  std::vector<metrics::tensorboard::Event> events(records->records.size());
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_TRUE(events[i].ParseFromString(records->records[i])) << i;
  }

  absl::string_view plan_text = events[2].summary().value(0).tensor().string_val(0);
  ASSERT_TRUE(absl::ConsumePrefix(&plan_text, "```\n"));
  ASSERT_TRUE(absl::ConsumeSuffix(&plan_text, "```\n"));
  plan::Plan logged;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(std::string(plan_text), &logged));
  // The plan as it ran: its DTYPE_AUTO resolved for the CPU.
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      logged, plan::ResolveAutoDtypes(*plan, at::Device(at::kCPU))));
  EXPECT_NE(logged.model().dtype(), base::DTYPE_AUTO);

  for (size_t i = 0; i < rows.size(); ++i) {
    const metrics::tensorboard::Event& event = events[3 + i];
    EXPECT_EQ(event.step(), rows[i]["step"]);
    // Every number of the row but its step, none missing, none added.
    EXPECT_EQ(event.summary().value_size() + 1, rows[i].size()) << rows[i];
    for (const auto& value : event.summary().value()) {
      ASSERT_TRUE(rows[i].contains(value.tag())) << value.tag();
      EXPECT_EQ(value.simple_value(), static_cast<float>(rows[i][value.tag()].get<double>()))
          << value.tag() << " at step " << event.step();
    }
  }

  absl::StatusOr<std::string> summary_text = base::ReadFile(dir + "/metrics.run_summary.json");
  ASSERT_THAT(summary_text, IsOk());
  const nlohmann::json summary = nlohmann::json::parse(*summary_text);
  EXPECT_EQ(summary["last_step"], 6);
  EXPECT_EQ(summary["steps_trained"], 6);
  EXPECT_EQ(summary["checkpoints_written"], 2);  // steps 4 and 6
  EXPECT_EQ(summary["skipped_steps"], 0);
  EXPECT_EQ(summary["last_eval_loss"], rows[5]["eval_loss"]);
  EXPECT_EQ(summary["best_eval_loss"],
            std::min(rows[2]["eval_loss"].get<double>(), rows[5]["eval_loss"].get<double>()));
  EXPECT_TRUE(summary.contains("entropy_floor"));  // synthetic data
  ASSERT_THAT(summary["peak_memory_bytes"], SizeIs(2));
  for (const nlohmann::json& bytes : summary["peak_memory_bytes"]) {
    EXPECT_GT(bytes.get<int64_t>(), 1 << 20);
  }
}

// A learning rate beyond fp32's range makes step 1's update send the weights to infinity or
// NaN: the run stops naming that step and the first such parameter, found at the end of the
// run, before a checkpoint, or when the next step's update is skipped for its loss; it leaves
// neither an export nor a checkpoint of them.
TEST(RunOutputsTest, WeightsThatAreNotFiniteStopTheRunAndAreNeverSaved) {
  struct Case {
    int steps;
    bool checkpoints;
    int stopped_at;
  };
  for (const Case& run : {Case{1, false, 1}, Case{1, true, 1}, Case{2, true, 2}}) {
    const std::string dir = FreshTestDir("non_finite");
    std::vector<std::string> assignments = {"schedule.lr=1e39",
                                            absl::StrCat("training.save_hf_dir=", dir, "/model")};
    if (run.checkpoints) {
      assignments.push_back(absl::StrCat("training.checkpoint.dir=", dir, "/checkpoints"));
      assignments.push_back(absl::StrCat("training.checkpoint.every=", run.steps));
    }
    EXPECT_THAT(TrainAlone(Single(run.steps, assignments)),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr(absl::StrCat("step ", run.stopped_at,
                                                      ": the trained parameters are not finite "
                                                      "after the update of step 1: model.")),
                               HasSubstr("; the run stops and saves nothing from them"))))
        << run.steps << " steps, checkpoints " << run.checkpoints;
    EXPECT_FALSE(std::filesystem::exists(dir + "/model"));
    if (run.checkpoints) {
      EXPECT_THAT(FolderEntries(dir + "/checkpoints"), ElementsAre(".lock"));
    }
  }
}

// A LoRA run's first line counts the adapters it trains, of the model's parameters; a run
// resumed after step 1 of 3 says it trained 2 steps after step 1; one step is "1 step".
TEST(RunOutputsTest, TheProgressSaysWhatTrainsAndWhatARunTrained) {
  const std::string dir = FreshTestDir("progress");
  plan::Plan plan = Single(1, {absl::StrCat("training.checkpoint.dir=", dir)});
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(lora { rank: 2 alpha: 4 target: "*q_proj" })pb", plan.add_prepare()));
  int64_t adapters = 0;
  for (const models::ParameterShape& shape : models::ParameterShapes(ConfigOf(plan.model()))) {
    // A is [rank, in], B [out, rank].
    if (absl::EndsWith(shape.name, "q_proj.weight")) {
      adapters += 2 * (shape.shape[0] + shape.shape[1]);
    }
  }
  std::ostringstream first;
  ASSERT_THAT(TrainAlone(plan, &first), IsOk());
  EXPECT_THAT(first.str(),
              HasSubstr(absl::StrCat("training ", adapters, " parameters of a ",
                                     models::NumParameters(ConfigOf(plan.model())),
                                     "-parameter model on 1 rank, 1 step of 1024 tokens;")));
  EXPECT_THAT(first.str(), HasSubstr("\ndone: 1 step in "));

  ASSERT_THAT(plan::ApplyOverride("training.steps=3", plan), IsOk());
  plan.mutable_training()->mutable_checkpoint()->set_resume(true);
  std::ostringstream resumed;
  ASSERT_THAT(TrainAlone(plan, &resumed), IsOk());
  EXPECT_THAT(resumed.str(), HasSubstr("model on 1 rank, 3 steps of 1024 tokens;"));
  EXPECT_THAT(resumed.str(), HasSubstr("\nresumed after step 1\n"));
  EXPECT_THAT(resumed.str(), HasSubstr("\ndone: 2 steps after step 1 in "));
}

}  // namespace
}  // namespace plait::trainer
