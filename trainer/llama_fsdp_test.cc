// End to end: //trainer:llama_fsdp's compiled-in plan, shortened to 3 steps, run as 2 rank
// processes through parallel::Launch (as //tools:launch and torchrun start it), and its
// metrics file checked; the same job on a token file truncated under it, which stops with an
// error naming the file; and one whose rank 1 stops, which rank 0 names (and the same for
// //trainer:llama_pp, mid-schedule).
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/testing_token_files.h"
#include "data/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "parallel/launcher.h"
#include "parallel/testdata/subprocess.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::TestPath;
using ::testing::HasSubstr;

// A file of the test's runfiles.
std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path);
}

// The job's binary, in the test's runfiles.
std::string LlamaFsdp() { return Runfile("trainer/llama_fsdp"); }

TEST(LlamaFsdpTest, TwoRanksTrainAndWriteTheMetrics) {
  const std::string metrics = absl::StrCat(std::getenv("TEST_TMPDIR"), "/metrics.jsonl");
  const std::string hf_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf");
  absl::Mutex mutex;
  std::string output;
  auto sink = [&](std::string_view line) {
    absl::MutexLock lock(&mutex);
    output.append(line);
  };
  parallel::LaunchOptions options;
  options.num_ranks = 2;
  options.command = {LlamaFsdp(),
                     "--set=training.steps=3",
                     "--set=training.compute_threads_per_rank=1",
                     "--set=schedule.warmup.steps=1",
                     "--set=training.eval_batches=1",
                     "--set=training.log_every=1",
                     absl::StrCat("--set=training.metrics_file=", metrics),
                     absl::StrCat("--set=training.save_hf_dir=", hf_dir)};
  options.stdout_sink = sink;
  options.stderr_sink = sink;
  absl::StatusOr<parallel::LaunchResult> result = parallel::Launch(options);
  ASSERT_THAT(result, IsOk());
  ASSERT_TRUE(result->ok()) << result->summary << "\n" << output;
  // Local rank 0 says first how many threads each rank computes with, and why.
  EXPECT_THAT(output, HasSubstr("[rank 0] compute threads: 1 per rank "
                                "(training.compute_threads_per_rank: 1)\n"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("[rank 1] compute threads")));
  EXPECT_THAT(output, HasSubstr("[rank 0] step 3/3 | loss "));
  EXPECT_THAT(output, HasSubstr("[rank 0] done: 3 steps in "));
  EXPECT_THAT(output, HasSubstr("entropy floor"));
  EXPECT_THAT(output, HasSubstr("[rank 0] saved the model to " + hf_dir));
  EXPECT_TRUE(std::ifstream(hf_dir + "/config.json").good());
  EXPECT_TRUE(std::ifstream(hf_dir + "/model.safetensors").good());
  EXPECT_THAT(output, ::testing::Not(HasSubstr("[rank 1] step")));  // only rank 0 reports

  std::ifstream file(metrics);
  ASSERT_TRUE(file) << metrics;
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(file, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i]["step"], i + 1);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "mfu"}) {
      ASSERT_TRUE(rows[i].contains(key)) << key << " in " << rows[i].dump();
      EXPECT_GE(rows[i][key].get<double>(), 0.0) << key;
    }
  }
  EXPECT_FALSE(rows[0].contains("eval_loss"));
  ASSERT_TRUE(rows[2].contains("eval_loss"));  // evaluated after the last step
  EXPECT_GT(rows[2]["eval_loss"].get<double>(), 0.0);
  // A one-step warmup from 0, then the peak.
  EXPECT_EQ(rows[0]["lr"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(rows[1]["lr"].get<double>(), 3e-3);
}

// Truncating the training file while the job runs (once rank 0 reports its first step) used
// to kill the ranks with SIGBUS, the file being memory-mapped; now the next read is an error
// naming the file, and the job exits with status 1.
TEST(LlamaFsdpTest, ATokenFileTruncatedDuringTheRunStopsItWithANamedError) {
  // 16 world batches of 2 ranks x 8 x 64 tokens; ids below the tiny model's vocabulary.
  constexpr int kTokens = 1 << 14;
  std::vector<uint16_t> tokens(kTokens);
  for (int i = 0; i < kTokens; ++i) tokens[i] = static_cast<uint16_t>(i * 7 % 4096);
  const int64_t header_bytes = data::kLlmcHeaderInts * 4;
  const std::string train = TestPath("train.bin");
  const std::string eval = TestPath("eval.bin");
  data::testing::WriteLlmcFile(train, tokens);
  data::testing::WriteLlmcFile(eval, tokens);
  absl::Mutex mutex;
  std::string output;
  bool truncated = false;
  auto sink = [&](std::string_view line) {
    absl::MutexLock lock(&mutex);
    output.append(line);
    if (!truncated && line.find("[rank 0] step 1/") != std::string_view::npos) {
      ASSERT_EQ(truncate(train.c_str(), header_bytes), 0) << train;
      truncated = true;
    }
  };
  // llama_fsdp's plan reading the token files in place of its synthetic source (which an
  // override cannot replace: another member of the plan's oneof data.source).
  std::ifstream example(Runfile("plan/examples/llama_fsdp.textproto"));
  std::string plan((std::istreambuf_iterator<char>(example)), std::istreambuf_iterator<char>());
  const std::string synthetic = "data { synthetic { seed: 7 } }";
  const size_t source = plan.find(synthetic);
  ASSERT_NE(source, std::string::npos) << plan;
  plan.replace(source, synthetic.size(),
               absl::StrCat("data { token_files { train_path: \"", train, "\" eval_path: \"", eval,
                            "\" format: TOKEN_FORMAT_LLMC } }"));
  const std::string plan_path = TestPath("llama_fsdp_token_files.textproto");
  std::ofstream(plan_path) << plan;
  parallel::LaunchOptions options;
  options.num_ranks = 2;
  // Far more steps than the run gets through before the truncation stops it.
  options.command = {Runfile("trainer/train"), absl::StrCat("--plan=", plan_path),
                     "--set=training.steps=1000", "--set=training.log_every=1",
                     "--set=training.metrics_file="};
  options.stdout_sink = sink;
  options.stderr_sink = sink;
  absl::StatusOr<parallel::LaunchResult> result = parallel::Launch(options);
  ASSERT_THAT(result, IsOk());
  ASSERT_TRUE(truncated) << output;
  ASSERT_FALSE(result->ok()) << output;
  EXPECT_EQ(result->first_failure->term_signal, 0) << result->summary << "\n" << output;
  EXPECT_EQ(result->first_failure->exit_status, 1) << result->summary << "\n" << output;
  EXPECT_THAT(output,
              HasSubstr(absl::StrCat("] plan.data.token_files.train_path: ", train,
                                     ": the file changed after it was opened: it held ", kTokens,
                                     " tokens (", header_bytes + 2 * kTokens,
                                     " bytes) when opened and now has ", header_bytes, " bytes")));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("done:")));
}

// Runs `job` on 2 ranks, stops rank 1 (SIGSTOP) once rank 0 logged a step, and expects rank
// 0 to name it within the collective timeout, in the error of the operation `waiting_in`.
void ExpectAStoppedRankNamed(const std::string& job, const std::string& waiting_in) {
  SCOPED_TRACE(job);
  absl::Mutex mutex;
  std::string output;
  pid_t stopped = -1;
  auto sink = [&](std::string_view line) {
    absl::MutexLock lock(&mutex);
    output.append(line);
    if (stopped < 0 && line.find("[rank 0] step 1/") != std::string_view::npos) {
      stopped = parallel::testdata::ChildWithRank(getpid(), 1);
      ASSERT_GT(stopped, 0) << "no child process with RANK=1";
      ASSERT_EQ(kill(stopped, SIGSTOP), 0);
    }
  };
  parallel::LaunchOptions options;
  options.num_ranks = 2;
  options.grace_period = absl::Seconds(1);  // a stopped rank ignores SIGTERM until SIGKILL
  options.command = {job, "--set=training.steps=1000", "--set=training.log_every=1",
                     "--set=training.metrics_file=", "--set=mesh.collective_timeout_seconds=2"};
  options.stdout_sink = sink;
  options.stderr_sink = sink;
  absl::StatusOr<parallel::LaunchResult> result = parallel::Launch(options);
  ASSERT_THAT(result, IsOk());
  ASSERT_GT(stopped, 0) << output;
  ASSERT_FALSE(result->ok()) << output;
  EXPECT_THAT(output, HasSubstr(waiting_in));
  EXPECT_THAT(output, HasSubstr("rank 1 of 2 did not answer within 4s: stopped, hung or dead"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("done:")));
}

// A rank that stops (SIGSTOP) mid-run is found within the plan's collective timeout: the
// other rank's collective fails, and its error names the rank that did not answer. The same
// for the job //trainer:llama_pp, whose rank 0 then waits for rank 1's gradients in the
// middle of the pipeline's schedule.
TEST(LlamaFsdpTest, ARankThatStopsIsNamedAfterTheCollectiveTimeout) {
  ExpectAStoppedRankNamed(LlamaFsdp(), "on group 'dp'");
  ExpectAStoppedRankNamed(absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/llama_pp"),
                          "receive from rank 1 on group 'pp'");
}

}  // namespace
}  // namespace plait::trainer
