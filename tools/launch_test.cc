// Runs //tools:launch as a subprocess on parallel/testdata/launcher_child.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/testdata/subprocess.h"

namespace plait::tools {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::parallel::testdata::StartSubprocess;
using ::plait::parallel::testdata::SubprocessOptions;
using ::plait::parallel::testdata::WaitForFiles;
using ::plait::parallel::testdata::WaitForSubprocess;
using ::testing::HasSubstr;

// Every launch here ends in well under this; the ranks that should be stopped sleep 60 s.
constexpr absl::Duration kTimeout = absl::Seconds(15);

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path);
}

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/launch_XXXXXX");
    ASSERT_NE(mkdtemp(dir_.data()), nullptr) << dir_;
  }

  // Starts launch with `flags`, then "--", launcher_child and `child_args`.
  pid_t Start(const std::vector<std::string>& flags, const std::vector<std::string>& child_args) {
    SubprocessOptions options;
    options.argv = {Runfile("tools/launch")};
    options.argv.insert(options.argv.end(), flags.begin(), flags.end());
    options.argv.push_back("--");
    options.argv.push_back(Runfile("parallel/testdata/launcher_child"));
    options.argv.insert(options.argv.end(), child_args.begin(), child_args.end());
    options.stdout_path = dir_ + "/stdout";
    options.stderr_path = dir_ + "/stderr";
    absl::StatusOr<pid_t> pid = StartSubprocess(options);
    EXPECT_THAT(pid, IsOk());
    return pid.value_or(-1);
  }

  // Waits for launch to end; returns its exit code, or -1 when it did not exit normally.
  int Wait(pid_t pid) {
    absl::StatusOr<int> wait_status = WaitForSubprocess(pid, kTimeout);
    EXPECT_THAT(wait_status, IsOk());
    stdout_ = base::ReadFile(dir_ + "/stdout").value_or("<unreadable>");
    stderr_ = base::ReadFile(dir_ + "/stderr").value_or("<unreadable>");
    if (!wait_status.ok() || !WIFEXITED(*wait_status)) return -1;
    return WEXITSTATUS(*wait_status);
  }

  int Run(const std::vector<std::string>& flags, const std::vector<std::string>& child_args) {
    return Wait(Start(flags, child_args));
  }

  std::string dir_;
  std::string stdout_;
  std::string stderr_;
};

TEST_F(LaunchTest, RunsEveryRankAndExitsZero) {
  EXPECT_EQ(Run({"--nproc_per_node=2"}, {"print_env"}), 0) << stderr_;
  EXPECT_THAT(stdout_, HasSubstr("[rank 0] RANK=0 WORLD_SIZE=2 LOCAL_RANK=0"));
  EXPECT_THAT(stdout_, HasSubstr("[rank 1] RANK=1 WORLD_SIZE=2 LOCAL_RANK=1"));
  EXPECT_THAT(stderr_, HasSubstr("[rank 1] to stderr\n"));
}

TEST_F(LaunchTest, ExitsWithTheFailingRanksStatus) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(Run({"--nproc_per_node=3"}, {"exit_on_rank", "1", "3"}), 3);
  EXPECT_LT(absl::Now() - start, kTimeout);
  EXPECT_THAT(stderr_, HasSubstr("launch: rank 1 exited with status 3; stopped the 2 other"));
}

TEST_F(LaunchTest, ExitsWith128PlusTheSignalThatKilledARank) {
  EXPECT_EQ(Run({"--nproc_per_node=2", "--grace_period=1s"}, {"kill_self_on_rank", "0", "9"}),
            128 + SIGKILL);
  EXPECT_THAT(stderr_, HasSubstr("launch: rank 0 was killed by signal 9 (Killed)"));
}

TEST_F(LaunchTest, RestartsTheRanksUpToMaxRestarts) {
  EXPECT_EQ(Run({"--nproc_per_node=2", "--max_restarts=1"}, {"fail_first_start", "0", "5"}), 0)
      << stderr_;
  EXPECT_THAT(stderr_, HasSubstr("launch: rank 0 exited with status 5; stopped the 1 other "
                                 "running rank with SIGTERM; starting the 2 ranks again "
                                 "(restart 1 of 1)\n"));
  EXPECT_THAT(stdout_, HasSubstr("[rank 1] restart 1 of 1 after: rank 0 exited with status 5\n"));
}

TEST_F(LaunchTest, GivesTheRanksOfOneNodeOfSeveralTheirGlobalRanks) {
  EXPECT_EQ(Run({"--nproc_per_node=2", "--nnodes=2", "--node_rank=1", "--master_port=29400"},
                {"print_node_env"}),
            0)
      << stderr_;
  EXPECT_THAT(stdout_, HasSubstr("[rank 3] RANK=3 GROUP_RANK=1 GROUP_WORLD_SIZE=2 ROLE_RANK=3 "
                                 "ROLE_WORLD_SIZE=4 PLAIT_STORE_FILE=<unset>\n"));
}

TEST_F(LaunchTest, ForwardsSigtermToTheRanks) {
  const pid_t launch = Start({"--nproc_per_node=2"}, {"wait_for_sigterm", dir_});
  ASSERT_THAT(WaitForFiles({dir_ + "/ready.0", dir_ + "/ready.1"}, kTimeout), IsOk());
  ASSERT_EQ(kill(launch, SIGTERM), 0);
  // The ranks exit 0 on SIGTERM, so launch does too.
  EXPECT_EQ(Wait(launch), 0) << stderr_;
  EXPECT_THAT(WaitForFiles({dir_ + "/sigterm.0", dir_ + "/sigterm.1"}, absl::ZeroDuration()),
              IsOk());
}

TEST_F(LaunchTest, RejectsBadFlagsWithExitCode2) {
  EXPECT_EQ(Run({"--nproc_per_node=0"}, {"print_env"}), 2);
  EXPECT_THAT(stderr_, HasSubstr("launch: --nproc_per_node=0 must be >= 1"));

  EXPECT_EQ(Run({"--master_port=70000"}, {"print_env"}), 2);
  EXPECT_THAT(stderr_, HasSubstr("launch: master_port=70000 must be in [0, 65535]"));

  EXPECT_EQ(Run({"--grace_period=-2s"}, {"print_env"}), 2);
  EXPECT_THAT(stderr_, HasSubstr("launch: grace_period=-2s must be >= 0"));

  EXPECT_EQ(Run({"--nnodes=2", "--node_rank=1"}, {"print_env"}), 2);
  EXPECT_THAT(stderr_, HasSubstr("launch: master_port=0 with num_nodes=2"));
}

TEST_F(LaunchTest, RunsTheCommandFromBuildWorkingDirectory) {
  SubprocessOptions options;
  options.argv = {Runfile("tools/launch"),      "--nproc_per_node=2", "--", "sh", "-c",
                  "touch created_by_rank_$RANK"};
  options.environment_changes = {{"BUILD_WORKING_DIRECTORY", dir_}};
  options.stdout_path = dir_ + "/stdout";
  options.stderr_path = dir_ + "/stderr";
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_THAT(pid, IsOk());
  EXPECT_EQ(Wait(*pid), 0) << stderr_;
  EXPECT_THAT(WaitForFiles({dir_ + "/created_by_rank_0", dir_ + "/created_by_rank_1"},
                           absl::ZeroDuration()),
              IsOk());
}

TEST_F(LaunchTest, RejectsAMissingProgram) {
  SubprocessOptions options;
  options.argv = {Runfile("tools/launch"), "--nproc_per_node=2"};
  options.stdout_path = dir_ + "/stdout";
  options.stderr_path = dir_ + "/stderr";
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_THAT(pid, IsOk());
  EXPECT_EQ(Wait(*pid), 2);
  EXPECT_THAT(stderr_, HasSubstr("launch: no program to run"));
}

}  // namespace
}  // namespace plait::tools
