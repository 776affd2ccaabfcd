#include "parallel/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/testdata/subprocess.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testdata::StartSubprocess;
using ::plait::parallel::testdata::SubprocessOptions;
using ::plait::parallel::testdata::WaitForFiles;
using ::plait::parallel::testdata::WaitForSubprocess;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

// Fail-fast launches must end well within this, although their other ranks sleep 60 s.
constexpr absl::Duration kFailFastBound = absl::Seconds(15);

std::string ChildPath() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/parallel/testdata/launcher_child");
}

// A fresh directory under the test's scratch space.
std::string NewDirectory() {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/launcher_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) ADD_FAILURE() << "mkdtemp(" << dir << ") failed";
  return dir;
}

// The lines a launch passed to its sinks.
struct Output {
  std::vector<std::string> out;
  std::vector<std::string> err;
};

LaunchOptions ChildOptions(int num_ranks, std::vector<std::string> args, Output* output) {
  LaunchOptions options;
  options.num_ranks = num_ranks;
  options.command = {ChildPath()};
  options.command.insert(options.command.end(), args.begin(), args.end());
  options.stdout_sink = [output](std::string_view line) { output->out.emplace_back(line); };
  options.stderr_sink = [output](std::string_view line) { output->err.emplace_back(line); };
  return options;
}

TEST(CheckLocalRanksTest, BoundsLocalRanksByTheCoresUnlessTold) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_THAT(CheckLocalRanks(kLocalRanksPerCore * cores, std::nullopt), IsOk());
  EXPECT_THAT(CheckLocalRanks(100000, std::nullopt),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("100000 local ranks are more than this machine runs")));
  EXPECT_THAT(CheckLocalRanks(100000, 100000), IsOk());
  EXPECT_THAT(CheckLocalRanks(3, 2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              HasSubstr("(2 by --max_local_ranks)")));
}

TEST(LaunchTest, AllRanksSucceedWithTheirWorldAndPrefixedOutput) {
  Output output;
  absl::StatusOr<LaunchResult> result = Launch(ChildOptions(3, {"print_env"}, &output));
  ASSERT_THAT(result, IsOk());
  EXPECT_TRUE(result->ok());
  EXPECT_THAT(result->status(), IsOk());
  EXPECT_EQ(result->ExitCode(), 0);
  EXPECT_EQ(result->summary, "all 3 ranks exited with status 0");
  EXPECT_THAT(result->ranks, ElementsAre(Field(&RankStatus::rank, 0), Field(&RankStatus::rank, 1),
                                         Field(&RankStatus::rank, 2)));
  EXPECT_THAT(result->ranks,
              Each(AllOf(Field(&RankStatus::exit_status, 0), Field(&RankStatus::term_signal, 0))));
  EXPECT_GE(result->master_port, 1);
  EXPECT_LE(result->master_port, 65535);

  // Every rank got the same picked port, and its final line without '\n' came through.
  std::vector<std::string> expected_out;
  std::vector<std::string> expected_err;
  for (int rank = 0; rank < 3; ++rank) {
    expected_out.push_back(absl::StrCat(
        "[rank ", rank, "] RANK=", rank, " WORLD_SIZE=3 LOCAL_RANK=", rank,
        " LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=", result->master_port, "\n"));
    expected_out.push_back(absl::StrCat("[rank ", rank, "] no newline\n"));
    expected_err.push_back(absl::StrCat("[rank ", rank, "] to stderr\n"));
  }
  EXPECT_THAT(output.out, UnorderedElementsAreArray(expected_out));
  EXPECT_THAT(output.err, UnorderedElementsAreArray(expected_err));
}

// A local job's ranks meet through a file in a folder only this user can enter, removed
// after the job: its rendezvous opens no network port.
TEST(LaunchTest, RanksShareAPrivateStoreFileThatIsRemovedAfterTheJob) {
  Output output;
  absl::StatusOr<LaunchResult> result = Launch(ChildOptions(2, {"print_store_file"}, &output));
  ASSERT_THAT(result, IsOk());
  ASSERT_TRUE(result->ok()) << result->summary;
  ASSERT_EQ(output.out.size(), 2u);
  std::string store_file;
  for (const std::string& line : output.out) {
    const size_t space = line.find(' ', line.find(']') + 2);
    const std::string file = line.substr(line.find(']') + 2, space - line.find(']') - 2);
    EXPECT_THAT(line, HasSubstr("/tmp/plait-launch-"));
    EXPECT_THAT(line, HasSubstr(" in a private folder"));
    if (store_file.empty()) store_file = file;
    EXPECT_EQ(file, store_file) << "every rank gets the same store";
  }
  struct stat info;
  EXPECT_NE(stat(store_file.substr(0, store_file.rfind('/')).c_str(), &info), 0)
      << "the folder outlived the job";
}

TEST(LaunchTest, PassesOnTheGivenMasterAddressAndPort) {
  Output output;
  LaunchOptions options = ChildOptions(2, {"print_env"}, &output);
  options.master_addr = "localhost";
  options.master_port = 29123;
  absl::StatusOr<LaunchResult> result = Launch(options);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->master_port, 29123);
  EXPECT_THAT(output.out,
              ::testing::Contains(HasSubstr("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 "
                                            "MASTER_ADDR=localhost MASTER_PORT=29123")));
}

TEST(LaunchTest, FindsTheProgramOnPath) {
  Output output;
  LaunchOptions options;
  options.num_ranks = 2;
  options.command = {"sh", "-c", "echo rank $RANK of $WORLD_SIZE"};
  options.stdout_sink = [&output](std::string_view line) { output.out.emplace_back(line); };
  absl::StatusOr<LaunchResult> result = Launch(options);
  ASSERT_THAT(result, IsOk());
  EXPECT_TRUE(result->ok()) << result->summary;
  EXPECT_THAT(output.out,
              UnorderedElementsAreArray({"[rank 0] rank 0 of 2\n", "[rank 1] rank 1 of 2\n"}));
}

TEST(LaunchTest, PassesOnALineLongerThan64KiBInPieces) {
  Output output;
  LaunchOptions options;
  options.command = {"sh", "-c", "head -c 70000 /dev/zero | tr '\\0' x"};
  options.stdout_sink = [&output](std::string_view line) { output.out.emplace_back(line); };
  ASSERT_THAT(Launch(options), IsOk());
  EXPECT_THAT(output.out, ElementsAre(absl::StrCat("[rank 0] ", std::string(65536, 'x'), "\n"),
                                      absl::StrCat("[rank 0] ", std::string(4464, 'x'), "\n")));
}

TEST(LaunchTest, KeepsALoneCarriageReturnAndPassesOnCrLfAsNewline) {
  Output output;
  LaunchOptions options;
  options.command = {"sh", "-c", "printf 'step 1\\rstep 2\\rdone\\r\\nnext\\n'"};
  options.stdout_sink = [&output](std::string_view line) { output.out.emplace_back(line); };
  ASSERT_THAT(Launch(options), IsOk());
  EXPECT_THAT(output.out, ElementsAre("[rank 0] step 1\r", "[rank 0] step 2\r", "[rank 0] done\n",
                                      "[rank 0] next\n"));
}

TEST(LaunchTest, TellsTheRanksWhetherTheirOutputReachesATerminal) {
  for (const bool terminal : {true, false}) {
    Output output;
    LaunchOptions options;
    options.command = {"sh", "-c", absl::StrCat("echo $", kStdoutIsTerminalVariable)};
    options.stdout_sink = [&output](std::string_view line) { output.out.emplace_back(line); };
    options.stdout_is_terminal = terminal;
    ASSERT_THAT(Launch(options), IsOk());
    EXPECT_THAT(output.out, ElementsAre(terminal ? "[rank 0] 1\n" : "[rank 0] 0\n"));
  }
}

TEST(StdoutIsTerminalTest, FollowsTheLauncherUnlessTheTerminalIsDumb) {
  ASSERT_EQ(isatty(STDOUT_FILENO), 0) << "the test expects its stdout not to be a terminal";
  setenv("TERM", "xterm", 1);
  setenv(kStdoutIsTerminalVariable, "1", 1);
  EXPECT_TRUE(StdoutIsTerminal());
  setenv("TERM", "dumb", 1);
  EXPECT_FALSE(StdoutIsTerminal());
  unsetenv("TERM");
  EXPECT_FALSE(StdoutIsTerminal());
  setenv("TERM", "xterm", 1);
  setenv(kStdoutIsTerminalVariable, "0", 1);
  EXPECT_FALSE(StdoutIsTerminal());
  unsetenv(kStdoutIsTerminalVariable);
  EXPECT_FALSE(StdoutIsTerminal());
}

// A rank's own messages name it once: by Launch's "[rank N] " when it runs under Launch
// (not "[rank 1] rank 1: failed"), by their own "rank N: " when nothing else says which rank
// wrote them.
TEST(LaunchTest, ARanksMessagesNameItOnce) {
  Output output;
  ASSERT_THAT(Launch(ChildOptions(2, {"report_error"}, &output)), IsOk());
  EXPECT_THAT(output.err, UnorderedElementsAre("[rank 0] failed\n", "[rank 1] failed\n"));
  unsetenv(kOutputPrefixedVariable);
  EXPECT_EQ(RankMessagePrefix(4), "rank 4: ");
  setenv(kOutputPrefixedVariable, "1", 1);
  EXPECT_EQ(RankMessagePrefix(4), "");
  unsetenv(kOutputPrefixedVariable);
}

TEST(LaunchTest, FailsFastWhenARankExitsNonZero) {
  Output output;
  const absl::Time start = absl::Now();
  absl::StatusOr<LaunchResult> result =
      Launch(ChildOptions(3, {"exit_on_rank", "1", "3"}, &output));
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_THAT(result, IsOk());
  EXPECT_LT(elapsed, kFailFastBound);
  EXPECT_FALSE(result->ok());
  ASSERT_TRUE(result->first_failure.has_value());
  EXPECT_EQ(result->first_failure->rank, 1);
  EXPECT_EQ(result->first_failure->exit_status, 3);
  EXPECT_THAT(result->status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 1 exited with status 3")));
  EXPECT_THAT(result->summary, HasSubstr("stopped the 2 other running ranks with SIGTERM"));
  EXPECT_EQ(result->ExitCode(), 3);
  EXPECT_EQ(result->ranks[0].term_signal, SIGTERM);
  EXPECT_EQ(result->ranks[2].term_signal, SIGTERM);
}

TEST(LaunchTest, ReportsARankKilledBySignal) {
  Output output;
  const absl::Time start = absl::Now();
  absl::StatusOr<LaunchResult> result =
      Launch(ChildOptions(3, {"kill_self_on_rank", "2", "9"}, &output));
  ASSERT_THAT(result, IsOk());
  EXPECT_LT(absl::Now() - start, kFailFastBound);
  ASSERT_TRUE(result->first_failure.has_value());
  EXPECT_EQ(result->first_failure->rank, 2);
  EXPECT_EQ(result->first_failure->term_signal, SIGKILL);
  EXPECT_THAT(result->summary, HasSubstr("rank 2 was killed by signal 9 (Killed)"));
  EXPECT_EQ(result->ExitCode(), 128 + SIGKILL);
}

// With max_restarts, a failure stops the other ranks and then starts every rank again,
// telling them which start this is and why the last one ended.
TEST(LaunchTest, RestartsEveryRankAfterAFailure) {
  Output output;
  LaunchOptions options = ChildOptions(2, {"fail_first_start", "1", "3"}, &output);
  options.max_restarts = 1;
  absl::StatusOr<LaunchResult> result = Launch(options);
  ASSERT_THAT(result, IsOk());
  EXPECT_TRUE(result->ok()) << result->summary;
  EXPECT_EQ(result->ExitCode(), 0);
  ASSERT_EQ(result->restarted_after.size(), 1u);
  EXPECT_EQ(result->restarted_after[0].rank, 1);
  EXPECT_EQ(result->restarted_after[0].exit_status, 3);
  EXPECT_EQ(result->summary, "all 2 ranks exited with status 0 (after 1 restart)");
  EXPECT_THAT(output.err, ::testing::Contains(
                              "launch: rank 1 exited with status 3; stopped the 1 other running "
                              "rank with SIGTERM; starting the 2 ranks again (restart 1 of 1)\n"));
  EXPECT_THAT(output.out, UnorderedElementsAreArray(
                              {"[rank 0] restart 1 of 1 after: rank 1 exited with status 3\n",
                               "[rank 1] restart 1 of 1 after: rank 1 exited with status 3\n"}));
}

TEST(LaunchTest, GivesUpAfterMaxRestarts) {
  Output output;
  LaunchOptions options = ChildOptions(2, {"kill_self_on_rank", "0", "9"}, &output);
  options.max_restarts = 2;
  absl::StatusOr<LaunchResult> result = Launch(options);
  ASSERT_THAT(result, IsOk());
  EXPECT_FALSE(result->ok());
  EXPECT_EQ(result->restarted_after.size(), 2u);
  EXPECT_THAT(result->summary, AllOf(HasSubstr("rank 0 was killed by signal 9 (Killed)"),
                                     HasSubstr("(after 2 restarts)")));
  EXPECT_EQ(result->ExitCode(), 128 + SIGKILL);
  EXPECT_THAT(output.err,
              ::testing::Contains(HasSubstr("starting the 2 ranks again (restart 2 of 2)")));
}

// One node of several: the ranks are numbered from node_rank * num_ranks in a world of
// num_nodes * num_ranks, with torchrun's node (GROUP_*) and role variables, and meet through
// rank 0's store rather than a local file.
TEST(LaunchTest, GivesTheRanksOfOneNodeTheirPlaceInTheJob) {
  Output output;
  LaunchOptions options = ChildOptions(2, {"print_node_env"}, &output);
  options.num_nodes = 3;
  options.node_rank = 1;
  options.master_port = 29400;
  absl::StatusOr<LaunchResult> result = Launch(options);
  ASSERT_THAT(result, IsOk());
  ASSERT_TRUE(result->ok()) << result->summary;
  EXPECT_THAT(result->ranks, ElementsAre(Field(&RankStatus::rank, 2), Field(&RankStatus::rank, 3)));
  EXPECT_THAT(output.out,
              UnorderedElementsAreArray(
                  {"[rank 2] RANK=2 GROUP_RANK=1 GROUP_WORLD_SIZE=3 ROLE_RANK=2 ROLE_WORLD_SIZE=6 "
                   "PLAIT_STORE_FILE=<unset>\n",
                   "[rank 3] RANK=3 GROUP_RANK=1 GROUP_WORLD_SIZE=3 ROLE_RANK=3 ROLE_WORLD_SIZE=6 "
                   "PLAIT_STORE_FILE=<unset>\n"}));
}

TEST(LaunchTest, KillsRanksThatIgnoreSigtermAfterTheGracePeriod) {
  Output output;
  const std::string dir = NewDirectory();
  LaunchOptions options = ChildOptions(3, {"ignore_sigterm_except_rank", "0", "4", dir}, &output);
  options.grace_period = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  absl::StatusOr<LaunchResult> result = Launch(options);
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_THAT(result, IsOk());
  EXPECT_GE(elapsed, options.grace_period);
  EXPECT_LT(elapsed, kFailFastBound);
  ASSERT_TRUE(result->first_failure.has_value());
  EXPECT_EQ(result->first_failure->rank, 0);
  EXPECT_EQ(result->first_failure->exit_status, 4);
  EXPECT_EQ(result->ranks[1].term_signal, SIGKILL);
  EXPECT_EQ(result->ranks[2].term_signal, SIGKILL);
  EXPECT_THAT(result->summary,
              HasSubstr("rank 0 exited with status 4; stopped the 2 other running ranks with "
                        "SIGTERM, then 2 with SIGKILL after the 500ms grace period"));
  EXPECT_EQ(result->ExitCode(), 4);
}

TEST(LaunchTest, ForwardsSigtermToEveryRankAndRestoresTheHandler) {
  struct sigaction before;
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &before), 0);
  Output output;
  const std::string dir = NewDirectory();
  // Signals this process once both ranks wait for SIGTERM; Launch must pass it on.
  std::thread signaller([&dir] {
    if (WaitForFiles({dir + "/ready.0", dir + "/ready.1"}, absl::Seconds(10)).ok()) {
      kill(getpid(), SIGTERM);
    }
  });
  absl::StatusOr<LaunchResult> result = Launch(ChildOptions(2, {"wait_for_sigterm", dir}, &output));
  signaller.join();
  ASSERT_THAT(result, IsOk());
  EXPECT_TRUE(result->ok()) << result->summary;
  EXPECT_THAT(WaitForFiles({dir + "/sigterm.0", dir + "/sigterm.1"}, absl::ZeroDuration()), IsOk());
  struct sigaction after;
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(LaunchTest, RefusesASecondLaunchWhileOneRuns) {
  Output first_output;
  const std::string dir = NewDirectory();
  absl::StatusOr<LaunchResult> first;
  std::thread first_launch([&] {
    first = Launch(ChildOptions(1, {"wait_for_sigterm", dir}, &first_output));
  });
  ASSERT_THAT(WaitForFiles({dir + "/ready.0"}, absl::Seconds(10)), IsOk());
  Output second_output;
  EXPECT_THAT(
      Launch(ChildOptions(1, {"print_env"}, &second_output)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another Launch is running")));
  kill(getpid(), SIGTERM);
  first_launch.join();
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(first->ok()) << first->summary;
}

TEST(LaunchTest, RejectsInvalidOptionsNamingTheField) {
  Output output;
  LaunchOptions options = ChildOptions(0, {"print_env"}, &output);
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_ranks=0 must be >= 1"));

  options = ChildOptions(2, {}, &output);
  options.command.clear();
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("command is empty")));

  options = ChildOptions(2, {}, &output);
  options.command = {""};
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("command[0]")));

  options = ChildOptions(2, {"print_env"}, &output);
  options.master_port = 70000;
  EXPECT_THAT(Launch(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("master_port=70000 must be in [0, 65535]")));
  options.master_port = -1;
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("master_port=-1")));

  options = ChildOptions(2, {"print_env"}, &output);
  options.master_addr = "";
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("master_addr is empty")));

  options = ChildOptions(2, {"print_env"}, &output);
  options.grace_period = absl::Seconds(-1);
  EXPECT_THAT(Launch(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("grace_period=-1s must be >= 0")));

  options = ChildOptions(2, {"print_env"}, &output);
  options.num_nodes = 2;
  options.node_rank = 2;
  EXPECT_THAT(Launch(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "node_rank=2 must be in [0, num_nodes=2)"));
  options.node_rank = 1;
  EXPECT_THAT(Launch(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("master_port=0 with num_nodes=2")));
  options.master_port = 29400;
  options.max_restarts = 1;
  EXPECT_THAT(Launch(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("max_restarts=1 with num_nodes=2")));
  options = ChildOptions(2, {"print_env"}, &output);
  options.max_restarts = -1;
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_restarts=-1 must be >= 0"));
  EXPECT_THAT(output.out, ::testing::IsEmpty());
}

TEST(LaunchTest, ReportsAProgramThatCannotBeExecuted) {
  LaunchOptions options;
  options.num_ranks = 2;
  options.command = {"/nonexistent/launcher_child"};
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "command[0]=\"/nonexistent/launcher_child\" cannot be executed: No such "
                       "file or directory"));

  options.command = {"plait-no-such-program"};
  EXPECT_THAT(Launch(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("command[0]=\"plait-no-such-program\" is not an executable "
                                 "file on PATH=")));

  const std::string not_executable = NewDirectory() + "/data.txt";
  std::ofstream(not_executable) << "not a program\n";
  options.command = {not_executable};
  EXPECT_THAT(Launch(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("cannot be executed: Permission denied")));
}

// LaunchSelfIfNoWorld runs in launcher_child's main ("launch_self N"), in a process of its
// own so that its environment can be chosen.
class LaunchSelfIfNoWorldTest : public ::testing::Test {
 protected:
  // Runs `launcher_child launch_self 2` with the environment changed by `changes`; returns
  // its wait status.
  int RunLaunchSelf(std::map<std::string, std::optional<std::string>> changes) {
    const std::string dir = NewDirectory();
    SubprocessOptions options;
    options.argv = {ChildPath(), "launch_self", "2"};
    options.environment_changes = std::move(changes);
    options.stdout_path = dir + "/stdout";
    options.stderr_path = dir + "/stderr";
    absl::StatusOr<pid_t> pid = StartSubprocess(options);
    EXPECT_THAT(pid, IsOk());
    if (!pid.ok()) return -1;
    absl::StatusOr<int> wait_status = WaitForSubprocess(*pid, absl::Seconds(30));
    EXPECT_THAT(wait_status, IsOk());
    stdout_ = base::ReadFile(options.stdout_path).value_or("<unreadable>");
    stderr_ = base::ReadFile(options.stderr_path).value_or("<unreadable>");
    return wait_status.value_or(-1);
  }

  static std::map<std::string, std::optional<std::string>> World(const std::string& rank) {
    return {{"RANK", rank},
            {"WORLD_SIZE", "2"},
            {"LOCAL_RANK", rank},
            {"LOCAL_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", "29500"}};
  }

  std::string stdout_;
  std::string stderr_;
};

TEST_F(LaunchSelfIfNoWorldTest, WithoutAWorldLaunchesItselfAsRanks) {
  const int wait_status = RunLaunchSelf({{"RANK", std::nullopt},
                                         {"SLURM_PROCID", std::nullopt},
                                         {"OMPI_COMM_WORLD_RANK", std::nullopt}});
  ASSERT_TRUE(WIFEXITED(wait_status)) << wait_status;
  EXPECT_EQ(WEXITSTATUS(wait_status), 0) << stderr_;
  EXPECT_THAT(stdout_, HasSubstr("[rank 0] RANK=0 WORLD_SIZE=2 LOCAL_RANK=0"));
  EXPECT_THAT(stdout_, HasSubstr("[rank 1] RANK=1 WORLD_SIZE=2 LOCAL_RANK=1"));
}

TEST_F(LaunchSelfIfNoWorldTest, WithAWorldRunsAsOneRank) {
  const int wait_status = RunLaunchSelf(World("1"));
  ASSERT_TRUE(WIFEXITED(wait_status)) << wait_status;
  EXPECT_EQ(WEXITSTATUS(wait_status), 0) << stderr_;
  EXPECT_EQ(stdout_,
            "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
            "MASTER_PORT=29500\n");
}

TEST_F(LaunchSelfIfNoWorldTest, WithAnInvalidWorldFails) {
  const int wait_status = RunLaunchSelf(World("5"));
  ASSERT_TRUE(WIFEXITED(wait_status)) << wait_status;
  EXPECT_EQ(WEXITSTATUS(wait_status), kLaunchErrorExitCode);
  EXPECT_THAT(stderr_, HasSubstr("invalid world: RANK=5 must be in [0, WORLD_SIZE=2)"));
  EXPECT_EQ(stdout_, "");
}

}  // namespace
}  // namespace plait::parallel
