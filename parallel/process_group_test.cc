#include "parallel/process_group.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/synchronization/notification.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kRanks = 3;

// Rank `rank` of a local job of kRanks ranks meeting through `store_file`, on a mesh whose
// collectives give up after a second.
absl::StatusOr<std::unique_ptr<ProcessGroup>> StartRank(int rank, const std::string& store_file) {
  MeshConfig config;
  MeshConfig::Dimension* dim = config.add_dims();
  dim->set_name("dp");
  dim->set_size(kRanks);
  config.set_collective_timeout_seconds(1);
  return ProcessGroup::Start(testing::LocalWorld(rank, kRanks, store_file), config, at::kCPU,
                             absl::Seconds(30));
}

TEST(ProcessGroupTest, AFailedCollectiveNamesTheRankThatStoppedAnswering) {
  const std::string store_file = base::testing::FreshTestDir("stopped_store");
  absl::Notification others_done;
  std::thread stopped([&] {
    absl::StatusOr<std::unique_ptr<ProcessGroup>> group = StartRank(kRanks - 1, store_file);
    ASSERT_THAT(group, IsOk());
    others_done.WaitForNotification();  // alive, but never joins the collective
  });
  std::vector<absl::Status> results(kRanks - 1);
  std::vector<std::thread> working;
  for (int rank = 0; rank < kRanks - 1; ++rank) {
    working.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<ProcessGroup>> group = StartRank(rank, store_file);
      ASSERT_THAT(group, IsOk());
      at::Tensor tensor = torch::ones({4});
      results[rank] = (*group)->ExplainFailure((*group)->mesh().AllReduce(tensor, ReduceOp::kSum));
    });
  }
  for (std::thread& thread : working) thread.join();
  others_done.Notify();
  stopped.join();
  for (const absl::Status& result : results) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                 HasSubstr("rank 2 of 3 did not answer within 2s")));
  }
}

TEST(ProcessGroupTest, FailuresEveryRankReachesOrThatAreNotCollectivesAreKept) {
  const std::string store_file = base::testing::FreshTestDir("all_fail_store");
  const absl::Status timeout = absl::DeadlineExceededError("all-reduce timed out");
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<ProcessGroup>> group = StartRank(rank, store_file);
      ASSERT_THAT(group, IsOk());
      EXPECT_EQ((*group)->ExplainFailure(timeout), timeout);
      const absl::Status bad_data = absl::DataLossError("train.bin changed");
      EXPECT_EQ((*group)->ExplainFailure(bad_data), bad_data);
    });
  }
  for (std::thread& thread : ranks) thread.join();
}

}  // namespace
}  // namespace plait::parallel
