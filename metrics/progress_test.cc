#include "metrics/progress.h"

#include <cmath>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace plait::metrics {
namespace {

StepMetrics Metrics(int64_t step) {
  StepMetrics metrics;
  metrics.step = step;
  metrics.loss = 2.5;
  metrics.lr = 1e-3;
  return metrics;
}

TEST(ProgressLogTest, RedrawsOneStatusLineOnATerminalAndKeepsNotableSteps) {
  std::ostringstream out;
  ProgressLog progress(out, ProgressLog::Style::kStatusLine, /*total_steps=*/4, /*log_every=*/10);
  progress.Print("training");
  progress.Step(Metrics(1), 1000, 90);
  StepMetrics evaluated = Metrics(2);
  evaluated.eval_loss = 2.25;
  progress.Step(evaluated, 1000, 60);
  progress.Step(Metrics(3), 1000, 30);
  progress.Step(Metrics(4), 1000, 0);
  EXPECT_EQ(out.str(),
            "training\x1b[K\n"
            "step 1/4 [=====>              ] loss 2.5000 | lr 1.00e-03 | 1000 tok/s | ETA 1m30s"
            "\x1b[K\r"
            "step 2/4 | loss 2.5000 | lr 1.00e-03 | 1000 tok/s | ETA 1m00s | eval 2.2500\x1b[K\n"
            "step 3/4 [===============>    ] loss 2.5000 | lr 1.00e-03 | 1000 tok/s | ETA 30s"
            "\x1b[K\r"
            "step 4/4 | loss 2.5000 | lr 1.00e-03 | 1000 tok/s | ETA 0s\x1b[K\n");
}

TEST(ProgressLogTest, PrintsPlainLinesEveryLogEveryStepsAndNotableSteps) {
  std::ostringstream out;
  ProgressLog progress(out, ProgressLog::Style::kPlainLines, /*total_steps=*/5, /*log_every=*/2);
  StepMetrics skipped = Metrics(1);
  skipped.skipped = true;
  progress.Step(skipped, 10, 4);
  for (int64_t step = 2; step <= 5; ++step) {
    StepMetrics metrics = Metrics(step);
    if (step == 3) {
      metrics.loss = std::nan("");
      metrics.skipped = true;
    }
    progress.Step(metrics, 10, 5 - step);
  }
  progress.Print("done");
  EXPECT_EQ(out.str(),
            "step 1/5 | loss 2.5000 | lr 1.00e-03 | 10 tok/s | ETA 4s | update skipped: "
            "non-finite gradient norm\n"
            "step 2/5 | loss 2.5000 | lr 1.00e-03 | 10 tok/s | ETA 3s\n"
            "step 3/5 | loss nan | lr 1.00e-03 | 10 tok/s | ETA 2s | update skipped: "
            "non-finite loss\n"
            "step 4/5 | loss 2.5000 | lr 1.00e-03 | 10 tok/s | ETA 1s\n"
            "step 5/5 | loss 2.5000 | lr 1.00e-03 | 10 tok/s | ETA 0s\n"
            "done\n");
}

TEST(ProgressLogTest, HeaderAndSummaryFrameTheRun) {
  std::ostringstream out;
  ProgressLog progress(out, ProgressLog::Style::kPlainLines, /*total_steps=*/100, /*log_every=*/10);
  progress.Header(/*trained_parameters=*/4999424, /*model_parameters=*/4999424, /*ranks=*/2,
                  /*tokens_per_step=*/1024, 1.1369, 40, /*restart=*/"");
  RunMetrics run;
  run.seconds = 16.1;
  run.tokens_per_s = 6523;
  run.mfu = 0.481;
  run.best_eval_loss = 1.1914;
  run.entropy_floor = 1.1369;
  run.peak_memory_bytes = {300 << 20, 700 << 20};
  run.checkpoints_written = 2;
  for (int64_t step = 41; step <= 100; ++step) run.steps.push_back(Metrics(step));
  run.steps[1].skipped = true;
  progress.Summary(run);
  EXPECT_EQ(out.str(),
            "training 4999424 parameters on 2 ranks, 100 steps of 1024 tokens; synthetic data, "
            "entropy floor 1.1369 nats\n"
            "resumed after step 40\n"
            "done: 60 steps after step 40 in 16.1 s, 6523 tokens/s, MFU 48.10% (6N + 6Lsh FLOPs "
            "a token, causal "
            "attention halved), best eval loss 1.1914 "
            "(entropy floor 1.1369, gap 0.0545 nats); peak memory 700.0 MiB (rank 1), "
            "1 update skipped, 2 checkpoints written\n");
}

// A restarted job's first line says which restart, why, and where it resumes.
TEST(ProgressLogTest, HeaderNamesARestartAndWhereItResumes) {
  for (const int64_t resume_step : {20, 0}) {
    std::ostringstream out;
    ProgressLog progress(out, ProgressLog::Style::kPlainLines, /*total_steps=*/40,
                         /*log_every=*/10);
    progress.Header(/*trained_parameters=*/100, /*model_parameters=*/100, /*ranks=*/1,
                    /*tokens_per_step=*/64, std::nullopt, resume_step,
                    "restart 1 after rank 1 was killed by signal 9 (Killed)");
    EXPECT_EQ(out.str(),
              absl::StrCat("training 100 parameters on 1 rank, 40 steps of 64 tokens\n"
                           "restart 1 after rank 1 was killed by signal 9 (Killed): ",
                           resume_step > 0 ? "resumed after step 20"
                                           : "no checkpoint to resume from, starting over",
                           "\n"));
  }
}

// A restarted run's summary says how often, with the steps trained again, which count as
// skipped updates when they were.
TEST(ProgressLogTest, SummaryCountsTheRestartsAndTheStepsTheyRepeated) {
  std::ostringstream out;
  ProgressLog progress(out, ProgressLog::Style::kPlainLines, /*total_steps=*/10, /*log_every=*/10);
  RunMetrics run;
  run.seconds = 2.0;
  run.tokens_per_s = 1000;
  run.steps.resize(10);
  run.restarts.resize(2);
  run.restarts[0].repeated.resize(3);
  run.restarts[0].repeated[1].skipped = true;
  progress.Summary(run);
  EXPECT_EQ(out.str(),
            "done: 13 steps in 2.0 s, 1000 tokens/s, 1 update skipped, 2 restarts (3 steps "
            "trained again)\n");
}

// A CUDA run's summary gives the most GPU memory a rank held.
TEST(ProgressLogTest, SummaryGivesThePeakDeviceMemory) {
  std::ostringstream out;
  ProgressLog progress(out, ProgressLog::Style::kPlainLines, /*total_steps=*/10, /*log_every=*/10);
  RunMetrics run;
  run.seconds = 2.0;
  run.tokens_per_s = 1000;
  run.peak_device_memory_bytes = int64_t{3} << 30;
  for (int64_t step = 1; step <= 10; ++step) run.steps.push_back(Metrics(step));
  progress.Summary(run);
  EXPECT_EQ(out.str(),
            "done: 10 steps in 2.0 s, 1000 tokens/s, peak device memory 3.00 GiB per rank\n");
}

// Counts agree with their nouns, and a run that trains some of its model's parameters (LoRA's
// adapters, a base that a step froze) says how many of how large a model.
TEST(ProgressLogTest, ARunOfOneStepOnOneRankTrainingAdaptersSaysSo) {
  std::ostringstream out;
  ProgressLog progress(out, ProgressLog::Style::kPlainLines, /*total_steps=*/1, /*log_every=*/10);
  progress.Header(/*trained_parameters=*/74752, /*model_parameters=*/869504, /*ranks=*/1,
                  /*tokens_per_step=*/1024, std::nullopt, 0, /*restart=*/"");
  RunMetrics run;
  run.seconds = 1.0;
  run.tokens_per_s = 1024;
  run.steps.push_back(Metrics(1));
  run.steps[0].skipped = true;
  run.checkpoints_written = 1;
  run.restarts.resize(1);
  run.restarts[0].repeated.resize(1);
  progress.Summary(run);
  EXPECT_EQ(out.str(),
            "training 74752 parameters of a 869504-parameter model on 1 rank, 1 step of 1024 "
            "tokens\n"
            "done: 2 steps in 1.0 s, 1024 tokens/s, 1 update skipped, 1 checkpoint written, "
            "1 restart (1 step trained again)\n");
}

}  // namespace
}  // namespace plait::metrics
