#include "metrics/metrics_log.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::metrics {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::HasSubstr;

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
  absl::StatusOr<MetricsLog> log = MetricsLog::Continue(path, /*after_step=*/0);
  ASSERT_THAT(log, IsOk());
  StepMetrics metrics;
  metrics.step = 1;
  metrics.loss = 3.0;
  ASSERT_THAT(log->Append(metrics), IsOk());
  EXPECT_THAT(
      base::ReadFile(path),
      IsOkAndHolds(std::string("{\"loss\":3.0,\"lr\":0.0,\"step\":1,\"tokens_per_s\":0.0}\n")));

  const std::string missing = TestPath("never_created.jsonl");
  ASSERT_THAT(MetricsLog::Continue(missing, /*after_step=*/0), IsOk());
  EXPECT_THAT(base::ReadFile(missing), IsOkAndHolds(std::string()));

  const std::string notes = TestPath("restart_notes.txt");
  ASSERT_THAT(base::WriteFileAtomically(notes, "my notes\n"), IsOk());
  EXPECT_THAT(MetricsLog::Continue(notes, /*after_step=*/0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a metrics file")));
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
