#include "metrics/run_summary.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {
namespace {

TEST(RunSummaryPathTest, ReplacesTheMetricsFilesExtension) {
  EXPECT_EQ(RunSummaryPath("runs/a/metrics.jsonl"), "runs/a/metrics.run_summary.json");
  EXPECT_EQ(RunSummaryPath("llama_fsdp_metrics.jsonl"), "llama_fsdp_metrics.run_summary.json");
  EXPECT_EQ(RunSummaryPath("runs/a.b/metrics"), "runs/a.b/metrics.run_summary.json");
  EXPECT_EQ(RunSummaryPath("runs/.metrics"), "runs/.metrics.run_summary.json");
}

TEST(RunSummaryJsonTest, SummarisesTheRun) {
  RunMetrics run;
  run.seconds = 12.5;
  run.tokens_per_s = 8192;
  run.mfu = 0.25;
  run.entropy_floor = 1.125;
  run.best_eval_loss = 1.5;
  run.peak_memory_bytes = {1 << 20, 2 << 20};
  run.memory_estimate_bytes = 768 << 10;
  run.peak_tensor_bytes = {700 << 10, 800 << 10};
  run.checkpoints_written = 3;
  run.samples_file = "runs/a/samples.jsonl";
  for (int64_t step = 11; step <= 14; ++step) {
    StepMetrics metrics;
    metrics.step = step;
    metrics.skipped = step == 12 || step == 13;
    if (step == 11) metrics.eval_loss = 1.5;
    if (step == 13) metrics.eval_loss = 1.75;
    run.steps.push_back(metrics);
  }
  const nlohmann::json summary = nlohmann::json::parse(RunSummaryJson(run));
  EXPECT_EQ(summary, nlohmann::json::parse(R"({
    "last_step": 14, "steps_trained": 4, "seconds": 12.5, "tokens_per_s": 8192.0,
    "mfu": 0.25, "best_eval_loss": 1.5, "last_eval_loss": 1.75, "entropy_floor": 1.125,
    "peak_memory_bytes": [1048576, 2097152], "memory_estimate_bytes": 786432.0,
    "peak_tensor_bytes": [716800, 819200], "skipped_steps": 2, "checkpoints_written": 3,
    "samples_file": "runs/a/samples.jsonl"})"));
}

TEST(RunSummaryJsonTest, LeavesOutWhatTheRunDidNotMeasure) {
  const nlohmann::json summary = nlohmann::json::parse(RunSummaryJson(RunMetrics()));
  for (const char* absent :
       {"mfu", "best_eval_loss", "last_eval_loss", "entropy_floor", "memory_estimate_bytes",
        "peak_tensor_bytes", "steps_repeated", "restarts"}) {
    EXPECT_FALSE(summary.contains(absent)) << absent;
  }
  EXPECT_EQ(summary["last_step"], 0);
}

// A row of step `step` that took `seconds` for 100 tokens.
StepMetrics Row(int64_t step, double seconds) {
  StepMetrics row;
  row.step = step;
  row.tokens_per_s = 100 / seconds;
  return row;
}

// A run of 8 steps of 100 tokens, checkpointed every 2, restarted twice: the first start
// trains steps 1-5 (4 kept, 5 repeated), the second 5-7 (6 kept, 7 repeated), the last 7-8.
TEST(WholeRunTest, SummarisesEveryStartOfARestartedRun) {
  EarlierStarts earlier;
  for (int64_t step = 1; step <= 6; ++step) earlier.steps.push_back(Row(step, 1.0));
  earlier.steps[2].skipped = true;
  earlier.steps[3].eval_loss = 2.0;
  earlier.checkpoints_written = 3;  // steps 2, 4, 6
  Restart first{1, 4, "rank 1 was killed by signal 9 (Killed)", {Row(5, 2.0)}};
  first.repeated[0].eval_loss = 1.5;  // the best evaluation, of a step trained again
  first.repeated[0].skipped = true;
  earlier.restarts.push_back(first);
  earlier.restarts.push_back(Restart{2, 6, "rank 0 exited with status 1", {Row(7, 0.5)}});

  RunMetrics last;
  last.steps = {Row(7, 0.25), Row(8, 0.25)};
  last.steps[1].eval_loss = 1.75;
  last.best_eval_loss = 1.75;
  last.seconds = 2.0;  // its steps' 0.5 s and an evaluation
  last.tokens_per_s = 400;
  last.mfu = 0.5;
  last.peak_memory_bytes = {1 << 20};
  last.checkpoints_written = 1;  // step 8

  const RunMetrics whole = WholeRun(last, earlier, /*tokens_per_step=*/100);
  EXPECT_FALSE(whole.mfu.has_value());
  // 10 steps of 100 tokens in 6 + 2 + 0.5 + 0.5 seconds of steps.
  EXPECT_EQ(nlohmann::json::parse(RunSummaryJson(whole)), nlohmann::json::parse(R"json({
    "last_step": 8, "steps_trained": 10, "seconds": 10.5, "tokens_per_s": 111.11111111111111,
    "best_eval_loss": 1.5, "last_eval_loss": 1.75, "peak_memory_bytes": [1048576],
    "skipped_steps": 2, "checkpoints_written": 4, "steps_repeated": 2,
    "restarts": [
      {"restart": 1, "after_step": 4, "cause": "rank 1 was killed by signal 9 (Killed)",
       "steps_repeated": 1},
      {"restart": 2, "after_step": 6, "cause": "rank 0 exited with status 1",
       "steps_repeated": 1}]})json"));
}

// A last start resumed from the run's last step trains nothing: the run is its earlier steps.
TEST(WholeRunTest, ALastStartThatTrainedNothingKeepsTheEarlierSteps) {
  EarlierStarts earlier;
  earlier.steps = {Row(1, 1.0), Row(2, 1.0)};
  earlier.restarts.push_back(Restart{1, 2, "", {}});
  RunMetrics last;
  last.seconds = 0.5;
  const RunMetrics whole = WholeRun(last, earlier, /*tokens_per_step=*/100);
  const nlohmann::json summary = nlohmann::json::parse(RunSummaryJson(whole));
  EXPECT_EQ(summary["last_step"], 2);
  EXPECT_EQ(summary["steps_trained"], 2);
  EXPECT_EQ(summary["steps_repeated"], 0);
  EXPECT_EQ(summary["seconds"], 2.5);
  EXPECT_EQ(summary["tokens_per_s"], 100.0);
}

}  // namespace
}  // namespace plait::metrics
