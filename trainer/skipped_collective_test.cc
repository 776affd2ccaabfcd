// A hang, as a run reports it: rank 1 of a 2-rank FSDP run skips a collective of step 2
// (parallel/testing_skip.h), and rank 0's error names that collective's place in the step and
// rank 1, with where rank 1 was instead. A test of its own, as trainer_test's runs already
// take most of its time limit.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/process_group.h"
#include "parallel/test_ranks.h"
#include "parallel/testing_skip.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::plan::testing::Resolved;
using ::plait::trainer::testing::ShortShippedPlan;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Rank 1 skips step 2's reduce-scatter of block 1. Rank 0's Train returns the error, and
// ProcessGroup::ExplainFailure (as trainer/run.cc calls it) adds where rank 1 was instead.
TEST(SkippedCollectiveTest, StopsTheRunNamingItsPlaceAndTheRank) {
  plan::Plan plan = ShortShippedPlan("llama_fsdp");
  ASSERT_THAT(plan::ApplyOverride("training.steps=2", plan), IsOk());
  plan.mutable_schedule()->clear_warmup();  // longer than the run
  plan.mutable_mesh()->set_collective_timeout_seconds(1);
  const plan::ResolvedPlan resolved = Resolved(plan, 2);
  const std::string store_file = base::testing::FreshTestDir("skipped_collective_store");
  std::vector<absl::Status> results(2);
  parallel::testing::RunRanks(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<parallel::ProcessGroup>> group =
        parallel::ProcessGroup::Start(parallel::testing::LocalWorld(rank, 2, store_file),
                                      plan.mesh(), at::kCPU, absl::Seconds(30));
    ASSERT_THAT(group, IsOk());
    if (rank == 1) {
      parallel::SkipCollectiveForTesting(
          **(*group)->mesh().communicator("dp"), [](const parallel::CollectiveCall& call) {
            return call.step == 2 && call.collective == parallel::Collective::kReduceScatter &&
                   call.place.block == 1;
          });
    }
    results[rank] =
        (*group)->ExplainFailure(Train(resolved, (*group)->mesh(), TrainOptions()).status());
  });
  EXPECT_THAT(std::string(results[0].message()),
              AllOf(HasSubstr("step 2, block 1 backward, reduce_scatter of FSDP unit on group "
                              "'dp' (rank 0 of 2; collective #"),
                    HasSubstr("rank 1"),
                    HasSubstr("; rank 1 of 2 did not reach it: it failed at step 2, block 0 "
                              "backward, reduce_scatter of FSDP unit on group 'dp'"),
                    Not(HasSubstr("step 2: step 2"))))  // named once
      << results[0];
  EXPECT_FALSE(results[1].ok());
}

}  // namespace
}  // namespace plait::trainer
