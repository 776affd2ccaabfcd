#include "metrics/tensorboard_log.h"

#include <string>
#include <vector>

#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/record_file.h"
#include "metrics/tensorboard_event.pb.h"

namespace plait::metrics {
namespace {

using ::plait::base::testing::FolderEntries;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

// The events of the file `path` cut to its first `size` bytes (all of it by default).
std::vector<tensorboard::Event> ReadEvents(const std::string& path,
                                           size_t size = std::string::npos) {
  absl::StatusOr<std::string> bytes = base::ReadFile(path);
  EXPECT_THAT(bytes, IsOk());
  absl::StatusOr<Records> records = ParseRecords(bytes->substr(0, size), path);
  EXPECT_THAT(records, IsOk());
  std::vector<tensorboard::Event> events(records->records.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_TRUE(events[i].ParseFromString(records->records[i])) << i;
  }
  return events;
}

// The (tag, value) pairs of a scalar event.
std::vector<std::pair<std::string, float>> ScalarsOf(const tensorboard::Event& event) {
  std::vector<std::pair<std::string, float>> scalars;
  for (const tensorboard::Summary::Value& value : event.summary().value()) {
    EXPECT_EQ(value.value_case(), tensorboard::Summary::Value::kSimpleValue) << value.tag();
    scalars.emplace_back(value.tag(), value.simple_value());
  }
  return scalars;
}

StepMetrics DpoStep() {
  StepMetrics metrics;
  metrics.step = 4;
  metrics.loss = 0.6931;
  metrics.lr = 1e-3;
  metrics.tokens_per_s = 512;
  metrics.grad_norm = 0.25;
  metrics.eval_loss = 0.7;
  metrics.named = {{"rewards/chosen", 0.125}, {"rewards/margins", -0.5}};
  metrics.eval_named = {{"rewards/accuracies", 0.75}};
  return metrics;
}

TEST(TensorBoardLogTest, WritesTheVersionTheStartThePlanAndEveryScalarOfTheMetricsFile) {
  const std::string dir = FreshTestDir("tensorboard") + "/run";  // created by Open
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(dir, /*resume_step=*/3);
  ASSERT_THAT(log, IsOk());
  EXPECT_THAT(log->path(), StartsWith(dir + "/events.out.tfevents."));
  ASSERT_THAT(log->AppendText("plan", "training { steps: 8 }\n", 4), IsOk());
  ASSERT_THAT(log->Append(DpoStep()), IsOk());

  const std::vector<tensorboard::Event> events = ReadEvents(log->path());
  ASSERT_EQ(events.size(), 4);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.7e9);  // seconds since 1970, after 2023
  EXPECT_EQ(events[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[1].step(), 4);

  ASSERT_EQ(events[2].summary().value_size(), 1);
  const tensorboard::Summary::Value& plan = events[2].summary().value(0);
  EXPECT_EQ(plan.tag(), "plan");
  EXPECT_EQ(plan.metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(plan.tensor().dtype(), tensorboard::DT_STRING);
  EXPECT_EQ(plan.tensor().tensor_shape().dim_size(), 0);
  EXPECT_THAT(plan.tensor().string_val(), ElementsAre("```\ntraining { steps: 8 }\n```\n"));

  EXPECT_EQ(events[3].step(), 4);
  EXPECT_THAT(
      ScalarsOf(events[3]),
      ElementsAre(Pair("loss", 0.6931f), Pair("lr", 1e-3f), Pair("tokens_per_s", 512.0f),
                  Pair("grad_norm", 0.25f), Pair("eval_loss", 0.7f), Pair("rewards/chosen", 0.125f),
                  Pair("rewards/margins", -0.5f), Pair("eval_rewards/accuracies", 0.75f)));
}

TEST(TensorBoardLogTest, FencesTextThatHoldsBackticksWithMoreOfThem) {
  const std::string dir = FreshTestDir("backticks");
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(dir, 0);
  ASSERT_THAT(log, IsOk());
  ASSERT_THAT(log->AppendText("plan", "a ```` b", 1), IsOk());
  EXPECT_THAT(ReadEvents(log->path())[2].summary().value(0).tensor().string_val(),
              ElementsAre("`````\na ```` b\n`````\n"));
}

// A killed run's file ends anywhere: the steps before its last full record still read.
TEST(TensorBoardLogTest, AFileCutShortReadsUpToItsLastFullEvent) {
  const std::string dir = FreshTestDir("killed");
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(dir, 0);
  ASSERT_THAT(log, IsOk());
  StepMetrics metrics = DpoStep();
  for (metrics.step = 1; metrics.step <= 3; ++metrics.step) {
    ASSERT_THAT(log->Append(metrics), IsOk());
  }
  const absl::StatusOr<std::string> bytes = base::ReadFile(log->path());
  ASSERT_THAT(bytes, IsOk());
  const std::vector<tensorboard::Event> cut = ReadEvents(log->path(), bytes->size() - 5);
  ASSERT_EQ(cut.size(), 4);  // version, start, steps 1 and 2
  EXPECT_EQ(cut.back().step(), 2);
}

TEST(TensorBoardLogTest, EachRunWritesItsOwnFile) {
  const std::string dir = FreshTestDir("two_runs");
  absl::StatusOr<TensorBoardLog> first = TensorBoardLog::Open(dir, 0);
  absl::StatusOr<TensorBoardLog> second = TensorBoardLog::Open(dir, 0);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_NE(first->path(), second->path());
  EXPECT_EQ(FolderEntries(dir).size(), 2);
}

TEST(TensorBoardLogTest, RefusesAFileAsItsFolderAndLeavesItAsItWas) {
  const std::string path = TestPath("notes.txt");
  ASSERT_THAT(base::WriteFileAtomically(path, "my notes\n"), IsOk());
  EXPECT_THAT(TensorBoardLog::Open(path, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + path + "\" is not a folder")));
  EXPECT_THAT(base::ReadFile(path), IsOkAndHolds(std::string("my notes\n")));
}

}  // namespace
}  // namespace plait::metrics
