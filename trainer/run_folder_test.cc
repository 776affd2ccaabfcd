#include "trainer/run_folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::MatchesRegex;

class RunFolderTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv(kRunFolderVariable); }
  void TearDown() override { unsetenv(kRunFolderVariable); }

  // A plan with the shipped jobs' outputs: run_dir and a relative metrics file.
  plan::Plan Plan() const {
    plan::Plan plan;
    plan.mutable_training()->set_run_dir(run_dir_);
    plan.mutable_training()->set_metrics_file("metrics.jsonl");
    return plan;
  }

  std::string Latest() const {
    char target[256] = {};
    return readlink((run_dir_ + "/latest").c_str(), target, sizeof(target) - 1) > 0 ? target : "";
  }

  std::string run_dir_ = FreshTestDir("runs") + "/llama_fsdp";
};

// Two runs of one plan: two folders, each with its outputs, and latest at the second.
TEST_F(RunFolderTest, EachRunGetsANewFolderAndLatestPointsAtTheNewest) {
  plan::Plan first = Plan();
  const RunFolder one = TakeRunFolder(first, /*starts_run=*/true, /*restart_count=*/0);
  EXPECT_TRUE(one.is_new);
  EXPECT_THAT(one.path, MatchesRegex(run_dir_ + "/[0-9]{8}-[0-9]{6}"));
  EXPECT_EQ(first.training().metrics_file(), one.path + "/metrics.jsonl");
  EXPECT_FALSE(std::filesystem::exists(one.path));  // created only once the plan is valid
  ASSERT_THAT(one.Create(), IsOk());
  EXPECT_TRUE(std::filesystem::is_directory(one.path));
  EXPECT_EQ(run_dir_ + "/" + Latest(), one.path);
  ASSERT_THAT(base::WriteFileAtomically(first.training().metrics_file(), "{\"step\":1}\n"), IsOk());

  unsetenv(kRunFolderVariable);  // another invocation of the job
  plan::Plan second = Plan();
  const RunFolder two = TakeRunFolder(second, /*starts_run=*/true, /*restart_count=*/0);
  ASSERT_THAT(two.Create(), IsOk());
  EXPECT_NE(two.path, one.path);  // within the same second: "-2"
  EXPECT_EQ(run_dir_ + "/" + Latest(), two.path);
  EXPECT_EQ(base::ReadFile(first.training().metrics_file()).value_or(""), "{\"step\":1}\n");
}

// The ranks a run starts, and its restarts, write into the folder the run started with.
TEST_F(RunFolderTest, RanksAndRestartsContinueInTheRunsFolder) {
  plan::Plan started = Plan();
  const RunFolder folder = TakeRunFolder(started, /*starts_run=*/true, /*restart_count=*/0);
  ASSERT_THAT(folder.Create(), IsOk());
  EXPECT_EQ(std::getenv(kRunFolderVariable), folder.path);
  plan::Plan rank = Plan();
  const RunFolder handed = TakeRunFolder(rank, /*starts_run=*/true, /*restart_count=*/2);
  EXPECT_FALSE(handed.is_new);
  EXPECT_EQ(rank.training().metrics_file(), folder.path + "/metrics.jsonl");

  // A restart by a launcher that hands no folder (torchrun, SLURM): the newest.
  unsetenv(kRunFolderVariable);
  plan::Plan restarted = Plan();
  EXPECT_EQ(TakeRunFolder(restarted, /*starts_run=*/true, /*restart_count=*/1).path,
            run_dir_ + "/latest");
}

// Absolute paths are written where they say; no run_dir, or no output, no folder.
TEST_F(RunFolderTest, AbsoluteOrNoOutputsNeedNoFolder) {
  plan::Plan absolute = Plan();
  absolute.mutable_training()->set_metrics_file("/tmp/m.jsonl");
  EXPECT_TRUE(TakeRunFolder(absolute, true, 0).path.empty());
  EXPECT_EQ(absolute.training().metrics_file(), "/tmp/m.jsonl");
  plan::Plan none = Plan();
  none.mutable_training()->clear_metrics_file();
  EXPECT_TRUE(TakeRunFolder(none, true, 0).path.empty());
  plan::Plan no_run_dir = Plan();
  no_run_dir.mutable_training()->clear_run_dir();
  EXPECT_TRUE(TakeRunFolder(no_run_dir, true, 0).path.empty());
  EXPECT_EQ(no_run_dir.training().metrics_file(), "metrics.jsonl");
  EXPECT_FALSE(std::filesystem::exists(run_dir_));
}

// A `latest` that is not a link is someone's file: the run is refused before it starts,
// naming it, and neither it nor the run_dir changes.
TEST_F(RunFolderTest, ALatestThatIsNotALinkIsRefused) {
  std::filesystem::create_directories(run_dir_);
  ASSERT_THAT(base::WriteFileAtomically(run_dir_ + "/latest", "mine"), IsOk());
  plan::Plan plan = Plan();
  EXPECT_THAT(TakeRunFolder(plan, true, 0).Create(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "plan.training.run_dir: \"" + run_dir_ +
                           "/latest\" is a regular file, not the link to the newest run that "
                           "plait keeps there: move it away, or choose another run_dir"));
  EXPECT_EQ(base::ReadFile(run_dir_ + "/latest").value_or(""), "mine");
  EXPECT_THAT(base::testing::FolderEntries(run_dir_), ElementsAre("latest"));
}

}  // namespace
}  // namespace plait::trainer
