// A reward program: what it reads (the example's fields, the completion and its ids, a line
// each), its answers, and each way it can fail — exiting, hanging past its timeout, answering
// what is not a finite number, not starting — each an error naming the program and the
// example, with nothing it started left running.
#include "rewards/program.h"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::rewards {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<ProgramReward> Start(const std::vector<std::string>& command,
                                     double timeout_seconds = 10) {
  RewardProgram config;
  for (const std::string& part : command) config.add_command(part);
  config.set_timeout_seconds(timeout_seconds);
  absl::StatusOr<std::unique_ptr<ProgramReward>> program = ProgramReward::Start(config, "reward");
  EXPECT_THAT(program, IsOk());
  return program.ok() ? *std::move(program) : nullptr;
}

const nlohmann::json kExample = {{"prompt", "Q: 2 + 2?"}, {"answer", "4"}, {"bonus", 0.5}};
const std::vector<int64_t> kIds = {5, 6, 7};

// Whether process `pid` is gone (or a zombie, waiting to be reaped by whoever adopted it).
bool Gone(int pid) {
  const std::string stat = base::ReadFile(absl::StrCat("/proc/", pid, "/stat")).value_or("");
  const size_t paren = stat.rfind(')');
  return stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z");
}

TEST(ProgramRewardTest, ReadsEachCompletionsLineAndAnswersItsReward) {
  // The reward: the completion's length, plus the example's bonus, plus its ids' count.
  std::unique_ptr<ProgramReward> program = Start(
      {"python3", "-c",
       "import json, sys\n"
       "for line in sys.stdin:\n"
       "    c = json.loads(line)\n"
       "    print(len(c['completion']) + c['bonus'] + len(c['completion_ids']), flush=True)\n"});
  ASSERT_NE(program, nullptr);
  for (const std::string completion : {"four", "it is 4"}) {
    absl::StatusOr<double> reward = program->Score({kExample, completion, kIds});
    ASSERT_THAT(reward, IsOk());
    EXPECT_EQ(*reward, completion.size() + 0.5 + 3);
  }
}

TEST(ProgramRewardTest, AProgramThatExitsStopsNamingItAndTheExample) {
  std::unique_ptr<ProgramReward> program = Start({"sh", "-c", "read line; exit 3"});
  ASSERT_NE(program, nullptr);
  const absl::StatusOr<double> reward = program->Score({kExample, "four", kIds});
  EXPECT_THAT(reward, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("reward program \"sh -c read line; exit 3\", example "
                                         "\"Q: 2 + 2?\": it exited before answering (it exited "
                                         "with status 3)")));
  // Every later call gets the same error.
  EXPECT_EQ(program->Score({kExample, "four", kIds}).status(), reward.status());
}

TEST(ProgramRewardTest, AProgramThatHangsStopsWithinItsTimeoutLeavingNothingRunning) {
  const std::string pid_file = base::testing::TestPath("sleeper.pid");
  std::filesystem::remove(pid_file);
  // It starts a child of its own, then never answers.
  std::unique_ptr<ProgramReward> program = Start(
      {"sh", "-c", absl::StrCat("sleep 300 & echo $! > ", pid_file, "; read line; sleep 300")},
      /*timeout_seconds=*/0.5);
  ASSERT_NE(program, nullptr);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(program->Score({kExample, "four", kIds}),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("no answer within 0.5 s (RewardProgram.timeout_seconds)")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  int sleeper = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(base::ReadFile(pid_file).value_or("")),
                               &sleeper));
  for (int i = 0; i < 100 && !Gone(sleeper); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(Gone(sleeper)) << "the program's child " << sleeper << " outlived it";
}

TEST(ProgramRewardTest, AnAnswerThatIsNoFiniteNumberStopsQuotingIt) {
  std::unique_ptr<ProgramReward> program =
      Start({"sh", "-c", "while read line; do echo nan; done"});
  ASSERT_NE(program, nullptr);
  EXPECT_THAT(program->Score({kExample, "four", kIds}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("example \"Q: 2 + 2?\": answered \"nan\", not a finite number")));
}

TEST(ProgramRewardTest, RefusesWhatCannotStart) {
  RewardProgram config;
  EXPECT_THAT(ProgramReward::Start(config, "grpo.rewards[1].program"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("grpo.rewards[1].program.command: is empty")));
  config.add_command("no-such-reward-program");
  EXPECT_THAT(ProgramReward::Start(config, "grpo.rewards[1].program"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot start \"no-such-reward-program\"")));
  config.set_timeout_seconds(-1);
  EXPECT_THAT(ProgramReward::Start(config, "grpo.rewards[1].program"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout_seconds: -1")));
}

}  // namespace
}  // namespace plait::rewards
