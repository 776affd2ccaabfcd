// The whole CPU stack as a user runs it: the launcher starts real processes, which find the
// world in their environment, meet through rank 0's TCP store and run ring collectives.
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/launcher.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::testing::Contains;
using ::testing::HasSubstr;

struct WorkerRun {
  absl::StatusOr<LaunchResult> result;
  std::vector<std::string> out;
  std::vector<std::string> err;
  absl::Duration took;
};

WorkerRun LaunchWorkers(int num_ranks, std::vector<std::string> arguments) {
  WorkerRun run;
  LaunchOptions options;
  options.num_ranks = num_ranks;
  options.command = {
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/parallel/testdata/collective_worker")};
  options.command.insert(options.command.end(), arguments.begin(), arguments.end());
  options.stdout_sink = [&run](std::string_view line) { run.out.emplace_back(line); };
  options.stderr_sink = [&run](std::string_view line) { run.err.emplace_back(line); };
  const absl::Time start = absl::Now();
  run.result = Launch(options);
  run.took = absl::Now() - start;
  return run;
}

TEST(MultiprocessTest, FourRanksRunCorrectCollectives) {
  const WorkerRun run = LaunchWorkers(4, {});
  ASSERT_THAT(run.result, IsOk());
  EXPECT_TRUE(run.result->ok()) << run.result->summary << "\n" << ::testing::PrintToString(run.err);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(run.out,
                Contains(absl::StrCat("[rank ", rank, "] collectives correct on 4 ranks\n")));
  }
}

// A rank that leaves makes the others fail with a named error within seconds, not hang.
TEST(MultiprocessTest, DepartedRankFailsTheOthersPromptly) {
  const WorkerRun run = LaunchWorkers(3, {"depart", "2"});
  ASSERT_THAT(run.result, IsOk());
  ASSERT_FALSE(run.result->ok());
  EXPECT_LT(run.took, absl::Seconds(20));
  EXPECT_NE(run.result->first_failure->rank, 2);
  EXPECT_EQ(run.result->first_failure->exit_status, 3);
  EXPECT_THAT(run.err, Contains(HasSubstr("all_reduce on group 'world'")));
}

}  // namespace
}  // namespace plait::parallel
