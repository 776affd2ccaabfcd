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
  run.checkpoints_written = 3;
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
    "peak_memory_bytes": [1048576, 2097152], "skipped_steps": 2, "checkpoints_written": 3})"));
}

TEST(RunSummaryJsonTest, LeavesOutWhatTheRunDidNotMeasure) {
  const nlohmann::json summary = nlohmann::json::parse(RunSummaryJson(RunMetrics()));
  for (const char* absent : {"mfu", "best_eval_loss", "last_eval_loss", "entropy_floor"}) {
    EXPECT_FALSE(summary.contains(absent)) << absent;
  }
  EXPECT_EQ(summary["last_step"], 0);
}

}  // namespace
}  // namespace plait::metrics
