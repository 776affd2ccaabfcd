#include "metrics/metrics_log.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;
using ::testing::SizeIs;

TEST(KeepRowsUpToTest, KeepsRowsUpToTheStepAndLeavesAMissingFileMissing) {
  const std::string path = TestPath("keep.jsonl");
  EXPECT_THAT(KeepRowsUpTo(path, 3), IsOk());
  EXPECT_FALSE(std::filesystem::exists(path));
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2}\nnot json\n{\"step\":3}\n{\"step\":4}";
  ASSERT_THAT(KeepRowsUpTo(path, 2), IsOk());
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(std::string("{\"step\":1}\n{\"step\":2}\n")));
}

TEST(MetricsLogTest, AppendsOneRowPerStepAfterTheResumedOnes) {
  const std::string path = TestPath("run.jsonl");
  std::ofstream(path) << "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.0}\n";
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(path, /*resume_step=*/1);
  ASSERT_THAT(log, IsOk());
  StepMetrics metrics;
  metrics.step = 2;
  metrics.loss = 2.5;
  metrics.lr = 0.5;
  metrics.tokens_per_s = 100;
  metrics.eval_loss = 2.25;
  ASSERT_THAT(log->Append(metrics), IsOk());
  EXPECT_THAT(base::ReadFile(path),
              IsOkAndHolds(std::string("{\"step\":1,\"loss\":3.0}\n"
                                       "{\"eval_loss\":2.25,\"loss\":2.5,\"lr\":0.5,\"step\":2,"
                                       "\"tokens_per_s\":100.0}\n")));
}

// A restarted run that found no checkpoint starts over: the rows of the start before it go,
// and a file it never got to create is created.
TEST(MetricsLogTest, ARestartContinuesTheFileOfTheStartBeforeItEvenFromStepZero) {
  const std::string path = TestPath("restarted.jsonl");
  std::ofstream(path) << "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.0}\n{\"st";
  absl::StatusOr<MetricsLog> log = MetricsLog::Continue(path, Restart{1, 0, "rank 0 exited"});
  ASSERT_THAT(log, IsOk());
  StepMetrics metrics;
  metrics.step = 1;
  metrics.loss = 3.0;
  ASSERT_THAT(log->Append(metrics), IsOk());
  EXPECT_THAT(
      base::ReadFile(path),
      IsOkAndHolds(std::string("{\"loss\":3.0,\"lr\":0.0,\"step\":1,\"tokens_per_s\":0.0}\n")));

  const std::string missing = TestPath("never_created.jsonl");
  ASSERT_THAT(MetricsLog::Continue(missing, Restart{1, 0, "rank 0 exited"}), IsOk());
  EXPECT_THAT(base::ReadFile(missing), IsOkAndHolds(std::string()));

  const std::string notes = TestPath("restart_notes.txt");
  ASSERT_THAT(base::WriteFileAtomically(notes, "my notes\n"), IsOk());
  EXPECT_THAT(MetricsLog::Continue(notes, Restart{1, 0, "rank 0 exited"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a metrics file")));
  EXPECT_FALSE(std::filesystem::exists(TestPath("restart_notes.restarts.jsonl")));
}

// Rows of steps `first`..`last` as Append writes them, each step's 100 tokens taking
// `seconds`, and a row cut short by a kill after them.
std::string RowsOfSteps(int64_t first, int64_t last, double seconds) {
  std::string rows;
  for (int64_t step = first; step <= last; ++step) {
    rows += nlohmann::json(
                {{"step", step}, {"loss", 2.0}, {"lr", 0.5}, {"tokens_per_s", 100 / seconds}})
                .dump() +
            "\n";
  }
  return rows + "{\"step\":" + std::to_string(last + 1) + ",\"lo";
}

std::vector<int64_t> StepsOf(const std::vector<StepMetrics>& rows) {
  std::vector<int64_t> steps;
  for (const StepMetrics& row : rows) steps.push_back(row.step);
  return steps;
}

// A restart notes itself, with the rows it drops, before it drops them, and reads what the
// earlier starts left: their kept rows and the restarts before it.
TEST(MetricsLogTest, ARestartNotesItselfWithTheRowsItDropsAndReadsTheEarlierStarts) {
  const std::string dir = FreshTestDir("restarts");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  const std::string restarts = dir + "/metrics.restarts.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(path, RowsOfSteps(1, 5, 1.0)), IsOk());
  absl::StatusOr<MetricsLog> first = MetricsLog::Continue(path, Restart{1, 3, "rank 1 died"});
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(base::ReadFile(restarts),
              IsOkAndHolds(std::string(
                  "{\"restart\":1,\"after_step\":3,\"cause\":\"rank 1 died\",\"repeated\":["
                  "{\"loss\":2.0,\"lr\":0.5,\"step\":4,\"tokens_per_s\":100.0},"
                  "{\"loss\":2.0,\"lr\":0.5,\"step\":5,\"tokens_per_s\":100.0}]}\n")));
  EXPECT_THAT(StepsOf(first->earlier().steps), ElementsAre(1, 2, 3));
  ASSERT_THAT(first->earlier().restarts, SizeIs(1));
  EXPECT_EQ(first->earlier().restarts[0].number, 1);
  EXPECT_EQ(first->earlier().restarts[0].after_step, 3);
  EXPECT_EQ(first->earlier().restarts[0].cause, "rank 1 died");
  EXPECT_THAT(StepsOf(first->earlier().restarts[0].repeated), ElementsAre(4, 5));
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(HasSubstr("\"step\":3")));
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(Not(HasSubstr("\"step\":4"))));

  // The second start trains steps 4 to 6, saves step 5 and dies.
  StepMetrics metrics;
  metrics.tokens_per_s = 50;
  for (metrics.step = 4; metrics.step <= 6; ++metrics.step) {
    ASSERT_THAT(first->Append(metrics), IsOk());
  }
  absl::StatusOr<MetricsLog> second = MetricsLog::Continue(path, Restart{2, 5, ""});
  ASSERT_THAT(second, IsOk());
  EXPECT_THAT(StepsOf(second->earlier().steps), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(second->earlier().steps[4].tokens_per_s, 50);
  ASSERT_THAT(second->earlier().restarts, SizeIs(2));
  EXPECT_EQ(second->earlier().restarts[0].cause, "rank 1 died");
  EXPECT_THAT(StepsOf(second->earlier().restarts[0].repeated), ElementsAre(4, 5));
  EXPECT_EQ(second->earlier().restarts[1].number, 2);
  EXPECT_EQ(second->earlier().restarts[1].after_step, 5);
  EXPECT_THAT(StepsOf(second->earlier().restarts[1].repeated), ElementsAre(6));
}

// A restart killed after noting itself but before dropping the rows leaves them in the metrics
// file; the next restart drops them, and does not count them a second time.
TEST(MetricsLogTest, RowsNotedByARestartThatDidNotDropThemAreNotCountedTwice) {
  const std::string dir = FreshTestDir("restart_killed_while_noting");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(path, RowsOfSteps(1, 5, 1.0)), IsOk());
  ASSERT_THAT(MetricsLog::Continue(path, Restart{1, 3, "rank 1 died"}), IsOk());
  ASSERT_THAT(base::WriteFileAtomically(path, RowsOfSteps(1, 5, 1.0)), IsOk());
  absl::StatusOr<MetricsLog> log = MetricsLog::Continue(path, Restart{2, 3, "rank 0 died"});
  ASSERT_THAT(log, IsOk());
  ASSERT_THAT(log->earlier().restarts, SizeIs(2));
  EXPECT_THAT(StepsOf(log->earlier().restarts[0].repeated), ElementsAre(4, 5));
  EXPECT_THAT(log->earlier().restarts[1].repeated, IsEmpty());
  EXPECT_EQ(log->earlier().restarts[1].cause, "rank 0 died");
}

// The row a restart reads back is the row Append wrote, the objective's metrics in the order
// of their names, a number that was not finite as NaN.
TEST(MetricsLogTest, ARestartReadsBackTheRowsAppendWrote) {
  const std::string path = TestPath("read_back.jsonl");
  std::filesystem::remove(path);
  std::filesystem::remove(TestPath("read_back.restarts.jsonl"));
  StepMetrics written;
  written.step = 1;
  written.loss = std::numeric_limits<double>::infinity();
  written.lr = 0.25;
  written.grad_norm = 1.5;
  written.skipped = true;
  written.tokens_per_s = 300;
  written.mfu = 0.125;
  written.eval_loss = 2.5;
  written.named = {{"rewards/margins", 0.5}, {"rewards/accuracies", 0.75}};
  written.eval_named = {{"rewards/accuracies", 0.625}};
  written.peak_device_memory_bytes = int64_t{5} << 30;
  {
    absl::StatusOr<MetricsLog> log = MetricsLog::Open(path, 0);
    ASSERT_THAT(log, IsOk());
    ASSERT_THAT(log->Append(written), IsOk());
  }
  absl::StatusOr<MetricsLog> log = MetricsLog::Continue(path, Restart{1, 1, "rank 0 died"});
  ASSERT_THAT(log, IsOk());
  ASSERT_THAT(log->earlier().steps, SizeIs(1));
  const StepMetrics& read = log->earlier().steps[0];
  EXPECT_EQ(read.step, 1);
  EXPECT_TRUE(std::isnan(read.loss));
  EXPECT_EQ(read.lr, 0.25);
  EXPECT_EQ(read.grad_norm, 1.5);
  EXPECT_TRUE(read.skipped);
  EXPECT_EQ(read.tokens_per_s, 300);
  EXPECT_EQ(read.mfu, 0.125);
  EXPECT_EQ(read.eval_loss, 2.5);
  EXPECT_THAT(read.named,
              ElementsAre(Pair("rewards/accuracies", 0.75), Pair("rewards/margins", 0.5)));
  EXPECT_THAT(read.eval_named, ElementsAre(Pair("rewards/accuracies", 0.625)));
  EXPECT_EQ(read.peak_device_memory_bytes, int64_t{5} << 30);
}

// A resume into a metrics file that keeps an earlier run's rows marks where its own run
// begins: its restarts read only its own rows. One into a file without such rows leaves no
// restarts file, an earlier run's removed.
TEST(MetricsLogTest, AResumeMarksWhereItsRunBeginsForItsRestarts) {
  const std::string dir = FreshTestDir("resumed_then_restarted");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  const std::string restarts = dir + "/metrics.restarts.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(path, RowsOfSteps(1, 4, 1.0)), IsOk());
  ASSERT_THAT(base::WriteFileAtomically(restarts, "an earlier run's\n"), IsOk());
  ASSERT_THAT(MetricsLog::Open(path, /*resume_step=*/2), IsOk());
  EXPECT_THAT(base::ReadFile(restarts),
              IsOkAndHolds(std::string("{\"restart\":0,\"after_step\":2}\n")));
  ASSERT_THAT(base::WriteFileAtomically(path, RowsOfSteps(1, 5, 1.0)), IsOk());
  absl::StatusOr<MetricsLog> log = MetricsLog::Continue(path, Restart{1, 4, "rank 1 died"});
  ASSERT_THAT(log, IsOk());
  EXPECT_THAT(StepsOf(log->earlier().steps), ElementsAre(3, 4));
  ASSERT_THAT(log->earlier().restarts, SizeIs(1));
  EXPECT_THAT(StepsOf(log->earlier().restarts[0].repeated), ElementsAre(5));

  const std::string fresh_folder_path = dir + "/other.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(dir + "/other.restarts.jsonl", "an earlier run's\n"),
              IsOk());
  ASSERT_THAT(MetricsLog::Open(fresh_folder_path, /*resume_step=*/2), IsOk());
  EXPECT_FALSE(std::filesystem::exists(dir + "/other.restarts.jsonl"));
}

TEST(MetricsLogTest, AFreshRunRefusesAnExistingRestartsFile) {
  const std::string dir = FreshTestDir("old_restarts");
  std::filesystem::create_directories(dir);
  const std::string restarts = dir + "/run.restarts.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(restarts, "{}\n"), IsOk());
  EXPECT_THAT(MetricsLog::Open(dir + "/run.jsonl", 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + restarts + "\" already exists; the restarts of the run")));
  EXPECT_FALSE(std::filesystem::exists(dir + "/run.jsonl"));
}

TEST(MetricsLogTest, ARestartRefusesARestartsFileThatIsNotOneNamingTheLine) {
  const std::string dir = FreshTestDir("bad_restarts");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/run.jsonl";
  const std::string restarts = dir + "/run.restarts.jsonl";
  ASSERT_THAT(base::WriteFileAtomically(path, RowsOfSteps(1, 2, 1.0)), IsOk());
  for (const auto& [line, error] : std::vector<std::pair<std::string, std::string>>{
           {"{\"restart\":1,\"after_step\":-2}", "line 2: \"after_step\" is -2, not a count"},
           {"{\"restart\":1,\"after_step\":2}", "line 2: a restart needs a \"cause\" string"},
           {"{\"restart\":1,\"after_step\":2,\"cause\":\"\",\"repeated\":[{\"step\":3,"
            "\"loss\":\"low\"}]}",
            "line 2 repeated[0]: \"loss\" is \"low\", not a number"},
           {"[1]", "line 2: expected an object, got an array"},
       }) {
    ASSERT_THAT(base::WriteFileAtomically(restarts, "{\"restart\":0,\"after_step\":0}\n" + line),
                IsOk());
    EXPECT_THAT(MetricsLog::Continue(path, Restart{1, 1, "rank 0 died"}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(restarts + " " + error)));
    EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(RowsOfSteps(1, 2, 1.0)));
  }
}

// A fresh run never writes over a file it did not create: the path it was given may name a
// token file, a model or someone's notes.
TEST(MetricsLogTest, AFreshRunRefusesAnExistingPathAndLeavesItAsItWas) {
  const std::string path = TestPath("notes.txt");
  const std::string notes = "my notes\n";
  ASSERT_THAT(base::WriteFileAtomically(path, notes), IsOk());
  EXPECT_THAT(MetricsLog::Open(path, /*resume_step=*/0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + path + "\" already exists; a fresh run creates")));
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(notes));
  // A resumed run continues only a metrics file.
  EXPECT_THAT(MetricsLog::Open(path, /*resume_step=*/3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is not a metrics file (line 1 is not a row with a step)")));
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(notes));
}

// A run that failed before writing a row leaves its metrics file empty: the rerun uses it.
TEST(MetricsLogTest, AFreshRunTakesAnEmptyFile) {
  const std::string path = TestPath("empty_metrics.jsonl");
  ASSERT_THAT(base::WriteFileAtomically(path, ""), IsOk());
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(path, /*resume_step=*/0);
  ASSERT_THAT(log, IsOk());
  StepMetrics metrics;
  metrics.step = 1;
  metrics.loss = 2.5;
  ASSERT_THAT(log->Append(metrics), IsOk());
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(HasSubstr("\"step\":1")));
}

TEST(MetricsLogTest, RefusesWhatIsNotARegularFile) {
  const std::string dir = FreshTestDir("a_folder");
  std::filesystem::create_directories(dir);
  EXPECT_THAT(MetricsLog::Open(dir, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is a directory")));
  EXPECT_THAT(MetricsLog::Open("/dev/null", 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is a device")));
  const std::string link = TestPath("link.jsonl");
  std::filesystem::remove(link);
  std::filesystem::create_symlink(TestPath("elsewhere"), link);
  EXPECT_THAT(MetricsLog::Open(link, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is a symbolic link")));
  EXPECT_FALSE(std::filesystem::exists(TestPath("elsewhere")));
}

TEST(MetricsLogTest, WritesTheSummaryBesideTheMetricsFile) {
  const std::string dir = FreshTestDir("summary");
  std::filesystem::create_directories(dir);
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(dir + "/metrics.jsonl", 0);
  ASSERT_THAT(log, IsOk());
  RunMetrics run;
  run.checkpoints_written = 2;
  ASSERT_THAT(log->WriteSummary(run), IsOk());
  absl::StatusOr<std::string> summary = base::ReadFile(dir + "/metrics.run_summary.json");
  ASSERT_THAT(summary, IsOk());
  EXPECT_THAT(*summary, HasSubstr("\"checkpoints_written\": 2"));
}

// The summary of another run with the same metrics file name: a fresh run refuses it before
// it trains, as it refuses an existing metrics file; a resumed run replaces it at its end.
TEST(MetricsLogTest, AFreshRunRefusesAnExistingSummaryAndAResumedOneReplacesIt) {
  const std::string dir = FreshTestDir("old_summary");
  std::filesystem::create_directories(dir);
  const std::string summary = dir + "/run.run_summary.json";
  ASSERT_THAT(base::WriteFileAtomically(summary, "{}\n"), IsOk());
  EXPECT_THAT(MetricsLog::Open(dir + "/run.jsonl", 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + summary + "\" already exists; the summary of the run")));
  EXPECT_FALSE(std::filesystem::exists(dir + "/run.jsonl"));
  std::ofstream(dir + "/run.jsonl") << "{\"step\":1}\n";
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(dir + "/run.jsonl", /*resume_step=*/1);
  ASSERT_THAT(log, IsOk());
  ASSERT_THAT(log->WriteSummary(RunMetrics()), IsOk());
  EXPECT_THAT(base::ReadFile(summary), IsOkAndHolds(HasSubstr("\"steps_trained\": 0")));
}

TEST(MetricsLogTest, AnUnwritableFileIsNamed) {
  EXPECT_THAT(MetricsLog::Open(TestPath("no/such/folder/run.jsonl"), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no/such/folder/run.jsonl")));
}

}  // namespace
}  // namespace plait::metrics
