// End to end: a job that launches itself with --max_restarts=1 (//trainer:llama_fsdp's
// binary on a 4-rank plan) survives a rank killed mid-run, resuming from its checkpoint.
#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/run_summary.h"
#include "nlohmann/json.hpp"
#include "parallel/testdata/subprocess.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::testing::HasSubstr;

// The job's binary, in the test's runfiles.
std::string LlamaFsdp() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/llama_fsdp");
}

// The metrics file's rows, each parsed.
std::vector<nlohmann::json> MetricsRows(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << path;
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(file, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// The last "[rank 0] step N/" in `output`; 0 when there is none.
int64_t LastStep(const std::string& output) {
  const size_t at = output.rfind("[rank 0] step ");
  if (at == std::string::npos) return 0;
  return std::strtoll(output.c_str() + at + std::strlen("[rank 0] step "), nullptr, 10);
}

// The run summary beside the metrics file `metrics_path`, parsed. Callers hold it non-const:
// a missing field then reads as null and fails its comparison, where a const lookup would be
// undefined.
nlohmann::json Summary(const std::string& metrics_path) {
  const std::string path = metrics::RunSummaryPath(metrics_path);
  absl::StatusOr<std::string> text = base::ReadFile(path);
  EXPECT_THAT(text, IsOk()) << path;
  return nlohmann::json::parse(text.value_or("{}"));
}

// The number after the first `label` in `text`; -1 when there is none.
int64_t NumberAfter(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  return std::strtoll(text.c_str() + at + label.size(), nullptr, 10);
}

// The plan's tokens per step: global_batch 16 x seq_len 32 (testdata/runs/llama_fsdp_4ranks).
constexpr double kTokensPerStep = 16 * 32;

// The seconds of the steps of `rows`, as their tokens_per_s says.
double StepSeconds(const std::vector<nlohmann::json>& rows) {
  double seconds = 0.0;
  for (const nlohmann::json& row : rows) {
    seconds += kTokensPerStep / row["tokens_per_s"].get<double>();
  }
  return seconds;
}

// A 40-step job (plans/llama_fsdp's plan on 4 ranks) saving a checkpoint every 10 steps
// launches itself with --max_restarts=1; once its first checkpoint is complete, a random rank
// is killed with SIGKILL at a random later step. The launcher stops the other ranks and
// starts all of them again, saying why; they resume from the last complete checkpoint, and
// the metrics file holds steps 1..40 once each with the losses of the run never interrupted
// (bitwise: the same layout computes the same numbers). The run's summary covers both starts:
// the steps the first trained after its last checkpoint are trained twice, and the restarts
// file keeps their rows.
TEST(RestartTest, ARankKilledMidRunIsRestartedFromTheLastCheckpoint) {
  const std::string plan = absl::StrCat("--plan=", std::getenv("TEST_SRCDIR"),
                                        "/plait/trainer/testdata/runs/llama_fsdp_4ranks.textproto");
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/restart");
  std::filesystem::create_directories(dir);
  auto run = [&](const std::string& name, bool kill_a_rank) {
    parallel::testdata::SubprocessOptions options;
    options.argv = {LlamaFsdp(),
                    plan,
                    "--max_restarts=1",
                    absl::StrCat("--set=training.metrics_file=", dir, "/", name, ".jsonl"),
                    absl::StrCat("--set=training.checkpoint.dir=", dir, "/", name),
                    "--set=training.checkpoint.every=10",
                    "--set=training.checkpoint.resume=true"};
    options.stdout_path = absl::StrCat(dir, "/", name, ".out");
    options.stderr_path = absl::StrCat(dir, "/", name, ".err");
    absl::StatusOr<pid_t> launcher = parallel::testdata::StartSubprocess(options);
    EXPECT_THAT(launcher, IsOk());
    if (kill_a_rank) {
      std::mt19937 random(std::random_device{}());
      const int rank = std::uniform_int_distribution<int>(0, 3)(random);
      const int64_t step = std::uniform_int_distribution<int64_t>(11, 38)(random);
      SCOPED_TRACE(absl::StrCat("rank ", rank, " killed at step ", step));
      EXPECT_THAT(parallel::testdata::WaitForFiles({absl::StrCat(dir, "/", name, "/step-00000010")},
                                                   absl::Minutes(3)),
                  IsOk());
      const absl::Time deadline = absl::Now() + absl::Minutes(3);
      while (LastStep(base::ReadFile(options.stdout_path).value_or("")) < step &&
             absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      const pid_t victim = parallel::testdata::ChildWithRank(launcher.value_or(-1), rank);
      EXPECT_GT(victim, 0);
      if (victim > 0) {
        EXPECT_EQ(kill(victim, SIGKILL), 0);
      }
    }
    EXPECT_THAT(parallel::testdata::WaitForSubprocess(launcher.value_or(-1), absl::Minutes(5)),
                IsOkAndHolds(0));
    return base::ReadFile(options.stdout_path).value_or("") +
           base::ReadFile(options.stderr_path).value_or("");
  };
  const std::string straight_output = run("straight", false);
  const std::string output = run("restarted", true);
  EXPECT_THAT(output, ::testing::ContainsRegex(
                          "launch: rank [0-3] was killed by signal 9 \\(Killed\\); stopped the 3 "
                          "other running ranks with SIGTERM; starting the 4 ranks again "
                          "\\(restart 1 of 1\\)"));
  EXPECT_THAT(output, ::testing::ContainsRegex(
                          "\\[rank 0\\] restart 1 after rank [0-3] was killed by signal 9 "
                          "\\(Killed\\): resumed after step [1-3]0\n"));
  EXPECT_THAT(straight_output, ::testing::Not(HasSubstr("restart")));

  const std::vector<nlohmann::json> straight = MetricsRows(dir + "/straight.jsonl");
  const std::vector<nlohmann::json> restarted = MetricsRows(dir + "/restarted.jsonl");
  ASSERT_EQ(straight.size(), 40u) << straight_output;
  ASSERT_EQ(restarted.size(), 40u) << output;
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(restarted[i]["step"], i + 1) << output;
    EXPECT_EQ(restarted[i]["loss"].get<double>(), straight[i]["loss"].get<double>())
        << "step " << i + 1;
  }

  nlohmann::json straight_summary = Summary(dir + "/straight.jsonl");
  EXPECT_EQ(straight_summary["last_step"], 40);
  EXPECT_EQ(straight_summary["steps_trained"], 40);
  EXPECT_EQ(straight_summary["checkpoints_written"], 4);
  EXPECT_FALSE(straight_summary.contains("restarts"));
  EXPECT_FALSE(straight_summary.contains("steps_repeated"));
  EXPECT_FALSE(std::filesystem::exists(metrics::RestartsPath(dir + "/straight.jsonl")));

  // The restart resumed after step `after`; rank 0 printed step `printed` before it was
  // stopped, and wrote that step's row, maybe the next one's too.
  const size_t restart_line = output.find("[rank 0] restart 1 after ");
  ASSERT_NE(restart_line, std::string::npos) << output;
  const int64_t after = NumberAfter(output.substr(restart_line), "resumed after step ");
  const int64_t printed = LastStep(output.substr(0, restart_line));
  const std::vector<nlohmann::json> restarts =
      MetricsRows(metrics::RestartsPath(dir + "/restarted.jsonl"));
  ASSERT_EQ(restarts.size(), 1u) << output;
  EXPECT_EQ(restarts[0]["restart"], 1);
  EXPECT_EQ(restarts[0]["after_step"], after);
  std::vector<nlohmann::json> repeated = restarts[0]["repeated"];
  const int64_t steps_repeated = static_cast<int64_t>(repeated.size());
  EXPECT_THAT(steps_repeated, ::testing::AnyOf(printed - after, printed + 1 - after)) << output;
  for (int64_t i = 0; i < steps_repeated; ++i) {
    EXPECT_EQ(repeated[i]["step"], after + 1 + i);
    EXPECT_EQ(repeated[i]["loss"].get<double>(), straight[after + i]["loss"].get<double>())
        << "step " << after + 1 + i << " before the restart";
  }

  nlohmann::json summary = Summary(dir + "/restarted.jsonl");
  EXPECT_EQ(summary["last_step"], 40);
  EXPECT_EQ(summary["steps_trained"], 40 + steps_repeated);
  EXPECT_EQ(summary["steps_repeated"], steps_repeated);
  EXPECT_EQ(summary["skipped_steps"], 0);
  EXPECT_EQ(summary["checkpoints_written"], 4);  // steps 10, 20, 30, 40, whichever start saved them
  EXPECT_EQ(summary["last_eval_loss"], straight_summary["last_eval_loss"]);
  ASSERT_EQ(summary["restarts"].size(), 1u) << summary.dump();
  nlohmann::json& restart = summary["restarts"][0];
  EXPECT_EQ(restart["restart"], 1);
  EXPECT_EQ(restart["after_step"], after);
  EXPECT_EQ(restart["steps_repeated"], steps_repeated);
  EXPECT_THAT(restart["cause"].get<std::string>(),
              ::testing::MatchesRegex("rank [0-3] was killed by signal 9 \\(Killed\\)"));
  EXPECT_THAT(output, HasSubstr("restart 1 after " + restart["cause"].get<std::string>()));
  // Every step's seconds count, the ones trained twice twice: tokens/s is over all of them,
  // and the run took at least as long.
  const double step_seconds = StepSeconds(restarted) + StepSeconds(repeated);
  EXPECT_NEAR(summary["tokens_per_s"].get<double>(),
              kTokensPerStep * static_cast<double>(40 + steps_repeated) / step_seconds,
              1e-9 * summary["tokens_per_s"].get<double>());
  EXPECT_GE(summary["seconds"].get<double>(), step_seconds);
}

}  // namespace
}  // namespace plait::trainer
