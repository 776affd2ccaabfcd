// The memory estimate (memory_estimate.h) against what the trainer's ranks hold, measured
// (testing_memory.h), for the plans of testing::MemoryCheckPlans: the shipped jobs, the medium
// shape, bf16, sequence parallelism, activation checkpointing, LoRA, pipelines and context
// parallelism. Memory is
// deterministic for a plan, so the goal is an assertion: every rank's estimate (a pipeline
// stage's its own) within 15% of what it holds.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/memory_estimate.h"
#include "plan/testing_resolved.h"
#include "trainer/testing_memory.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::plan::testing::Resolved;
using ::testing::DoubleNear;

constexpr double kMiB = 1 << 20;

// A row of the table the test prints: estimate, measured and their ratio, in MiB.
std::string Row(const char* term, double estimate, double measured) {
  return absl::StrFormat("  %-32s %9.2f %9.2f %7.3f\n", term, estimate / kMiB, measured / kMiB,
                         estimate / measured);
}

// Within 15% of what each rank holds between steps, of what a step adds at its peak, and of
// the peak. Prints the table (bazel test --test_output=all).
TEST(MemoryEstimateMeasuredTest, EstimatesEveryRankWithin15Percent) {
  std::string table =
      absl::StrFormat("  %-32s %9s %9s %7s\n", "MiB per rank", "estimate", "measured", "ratio");
  for (const testing::MemoryCheckPlan& check : testing::MemoryCheckPlans()) {
    SCOPED_TRACE(check.name);
    absl::StatusOr<std::vector<plan::MemoryEstimate>> estimates =
        plan::EstimateMemoryOfEachRank(Resolved(check.plan, check.ranks));
    ASSERT_THAT(estimates, IsOk());
    const std::vector<testing::MeasuredMemory> measured =
        testing::MeasureTrainingMemory(check.plan, check.ranks);
    for (size_t rank = 0; rank < measured.size(); ++rank) {
      const plan::MemoryEstimate* estimate = &(*estimates)[rank];
      const double between = static_cast<double>(measured[rank].between_steps_bytes);
      const double peak = static_cast<double>(measured[rank].peak_bytes);
      EXPECT_THAT(estimate->between_steps_bytes() / between, DoubleNear(1.0, 0.15));
      EXPECT_THAT(estimate->step_bytes() / (peak - between), DoubleNear(1.0, 0.15));
      EXPECT_THAT(estimate->total_bytes() / peak, DoubleNear(1.0, 0.15));
      absl::StrAppend(&table, check.name, " rank ", rank, " of ", check.ranks, "\n",
                      Row("between steps", estimate->between_steps_bytes(), between),
                      Row("a step's peak over that", estimate->step_bytes(), peak - between),
                      Row("peak", estimate->total_bytes(), peak));
      if (rank == 0 || !estimate->preparation.share_dim.empty()) {
        absl::StrAppend(&table, "  estimate (", plan::DescribeShare(*estimate),
                        "): ", plan::DescribeMemory(*estimate), "\n");
      }
    }
  }
  std::printf("%s", table.c_str());
}

// Context parallelism over 4 ranks trains one sequence of 4096 tokens whose step one process
// could not hold within a budget of kBudget: each rank's step holds about a quarter of what
// the estimate says one process's would (the ratios printed), and each rank's estimate is
// within 15% of what it holds.
TEST(MemoryEstimateMeasuredTest, FourContextRanksHoldAQuarterOfOneProcesssStep) {
  constexpr int64_t kSeqLen = 4096;
  constexpr int kRanks = 4;
  constexpr double kBudget = 96 * kMiB;
  const testing::MemoryCheckPlan one = testing::LongSequencePlan(kSeqLen, 1);
  const testing::MemoryCheckPlan split = testing::LongSequencePlan(kSeqLen, kRanks);
  absl::StatusOr<std::vector<plan::MemoryEstimate>> one_estimate =
      plan::EstimateMemoryOfEachRank(Resolved(one.plan, 1));
  absl::StatusOr<std::vector<plan::MemoryEstimate>> estimates =
      plan::EstimateMemoryOfEachRank(Resolved(split.plan, kRanks));
  ASSERT_THAT(one_estimate, IsOk());
  ASSERT_THAT(estimates, IsOk());
  const double one_step = one_estimate->front().step_bytes();
  EXPECT_GT(one_step, kBudget);
  std::string table =
      absl::StrFormat("%s: one process's step, estimated: %.2f MiB (budget %.0f MiB)\n", split.name,
                      one_step / kMiB, kBudget / kMiB);
  const std::vector<testing::MeasuredMemory> measured =
      testing::MeasureTrainingMemory(split.plan, kRanks);
  ASSERT_EQ(measured.size(), kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    const double between = static_cast<double>(measured[rank].between_steps_bytes);
    const double step = static_cast<double>(measured[rank].peak_bytes) - between;
    EXPECT_LT(step, kBudget) << "rank " << rank;
    EXPECT_THAT(step / one_step, DoubleNear(0.25, 0.05)) << "rank " << rank;
    EXPECT_THAT((*estimates)[rank].step_bytes() / step, DoubleNear(1.0, 0.15)) << "rank " << rank;
    EXPECT_THAT((*estimates)[rank].total_bytes() / (between + step), DoubleNear(1.0, 0.15))
        << "rank " << rank;
    absl::StrAppend(&table, "  rank ", rank, ": step ", absl::StrFormat("%.2f", step / kMiB),
                    " MiB measured, ", absl::StrFormat("%.3f", step / one_step),
                    " of one process's; its estimate ",
                    absl::StrFormat("%.3f", (*estimates)[rank].step_bytes() / step), " of it\n");
  }
  std::printf("%s", table.c_str());
}

}  // namespace
}  // namespace plait::trainer
