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

}  // namespace
}  // namespace plait::trainer
