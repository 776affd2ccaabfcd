#include "parallel/ring_communicator.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/maximum.h"
#include "ATen/ops/mm.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/test_ranks.h"
#include "parallel/testing_skip.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testing::RunOnRingGroup;
using ::plait::parallel::testing::RunRanks;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kLong, at::kByte};
// Sizes below, at and above the world size, divisible by it or not.
constexpr int64_t kSizes[] = {1, 3, 7, 1001, 4096};

// Rank r's contribution: small integers, so sums are exact in every dtype.
at::Tensor Contribution(int64_t numel, int rank, at::ScalarType dtype) {
  return (torch::arange(numel, at::kLong).remainder(7) * (rank + 1) + rank).to(dtype);
}

// The reduction over `size` ranks, computed in double from the same contributions.
at::Tensor Expected(int64_t numel, int size, ReduceOp op, at::ScalarType dtype) {
  at::Tensor result = Contribution(numel, 0, at::kDouble);
  for (int rank = 1; rank < size; ++rank) {
    const at::Tensor next = Contribution(numel, rank, at::kDouble);
    result = op == ReduceOp::kMax ? at::maximum(result, next) : result + next;
  }
  if (op == ReduceOp::kAverage) result = result / size;
  return result.to(dtype);
}

class RingCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(RingCollectivesTest, AllReduceEveryDtypeSizeAndOp) {
  const int size = GetParam();
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t numel : kSizes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
          if (op == ReduceOp::kAverage && !c10::isFloatingType(dtype)) continue;
          SCOPED_TRACE(::testing::Message()
                       << c10::toString(dtype) << "[" << numel << "] op " << static_cast<int>(op));
          at::Tensor tensor = Contribution(numel, rank, dtype).reshape({numel, 1});
          ASSERT_THAT(comm.AllReduce(tensor, op)->Wait(), IsOk());
          EXPECT_TRUE(at::equal(tensor.view({-1}), Expected(numel, size, op, dtype)));
        }
      }
    }
  });
}

TEST_P(RingCollectivesTest, AllGatherAndReduceScatterUnevenChunks) {
  const int size = GetParam();
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t numel : kSizes) {
        SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << "[" << numel << "]");
        const Chunk own = ChunkOf(numel, size, rank);
        // all_gather: every rank holds its chunk of a known buffer.
        const at::Tensor full = torch::arange(numel, at::kLong).to(dtype);
        at::Tensor gathered = torch::full({numel}, -1, dtype);
        ASSERT_THAT(comm.AllGather(full.narrow(0, own.offset, own.numel).clone(), gathered)->Wait(),
                    IsOk());
        EXPECT_TRUE(at::equal(gathered, full));

        // reduce_scatter: each rank gets its chunk of the sum.
        at::Tensor scattered = torch::empty({own.numel}, dtype);
        ASSERT_THAT(
            comm.ReduceScatter(Contribution(numel, rank, dtype), scattered, ReduceOp::kSum)->Wait(),
            IsOk());
        EXPECT_TRUE(at::equal(
            scattered,
            Expected(numel, size, ReduceOp::kSum, dtype).narrow(0, own.offset, own.numel)));
      }
    }
  });
}

TEST_P(RingCollectivesTest, AllGatherInPlaceAndBroadcast) {
  const int size = GetParam();
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    at::Tensor buffer = torch::zeros({10});
    const Chunk own = ChunkOf(10, size, rank);
    at::Tensor mine = buffer.narrow(0, own.offset, own.numel);
    mine.fill_(rank + 1);
    ASSERT_THAT(comm.AllGather(mine, buffer)->Wait(), IsOk());
    for (int r = 0; r < size; ++r) {
      const Chunk chunk = ChunkOf(10, size, r);
      EXPECT_TRUE(buffer.narrow(0, chunk.offset, chunk.numel).eq(r + 1).all().item<bool>());
    }

    const int root = size - 1;
    at::Tensor weights =
        rank == root ? torch::arange(6, at::kFloat).reshape({2, 3}) : torch::zeros({2, 3});
    ASSERT_THAT(comm.Broadcast(weights, root)->Wait(), IsOk());
    EXPECT_TRUE(at::equal(weights, torch::arange(6, at::kFloat).reshape({2, 3})));
  });
}

// Strings of different lengths (rank 0's empty, one with a zero byte) arrive whole, in rank
// order; empty strings everywhere take no second collective.
TEST_P(RingCollectivesTest, AllGatherStringsInRankOrder) {
  const int size = GetParam();
  const auto own = [](int rank) {
    return rank == 1 ? std::string("x\0y", 3)
                     : std::string(3 * rank, static_cast<char>('a' + rank));
  };
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    absl::StatusOr<std::vector<std::string>> strings = AllGatherStrings(comm, own(rank));
    ASSERT_THAT(strings, IsOk());
    ASSERT_EQ(strings->size(), static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) EXPECT_EQ((*strings)[r], own(r)) << "rank " << r;
    absl::StatusOr<std::vector<std::string>> empty = AllGatherStrings(comm, "");
    ASSERT_THAT(empty, IsOk());
    EXPECT_EQ(*empty, std::vector<std::string>(size));
  });
}

// Bytes really sent per rank against the bandwidth-optimal volume.
TEST_P(RingCollectivesTest, TrafficIsTheBandwidthOptimalVolume) {
  const int size = GetParam();
  constexpr int64_t kNumel = 1 << 16;
  constexpr int64_t kBytes = kNumel * 4;
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    at::Tensor full = torch::ones({kNumel});
    const Chunk own = ChunkOf(kNumel, size, rank);
    ASSERT_THAT(comm.AllReduce(full, ReduceOp::kSum)->Wait(), IsOk());
    ASSERT_THAT(comm.AllGather(full.narrow(0, own.offset, own.numel), full)->Wait(), IsOk());
    at::Tensor shard = torch::empty({own.numel});
    ASSERT_THAT(comm.ReduceScatter(full, shard, ReduceOp::kSum)->Wait(), IsOk());

    const int64_t one_way = kBytes / size * (size - 1);  // kNumel divides evenly here
    for (auto [collective, expected] : {std::pair{Collective::kAllReduce, 2 * one_way},
                                        std::pair{Collective::kAllGather, one_way},
                                        std::pair{Collective::kReduceScatter, one_way}}) {
      const Traffic traffic = comm.traffic(collective);
      EXPECT_EQ(traffic.calls, 1) << CollectiveName(collective);
      EXPECT_EQ(traffic.bytes_sent, expected) << CollectiveName(collective);
      EXPECT_EQ(traffic.bytes_received, expected) << CollectiveName(collective);
    }
  });
}

TEST_P(RingCollectivesTest, BarrierWaitsForTheLastRank) {
  const int size = GetParam();
  const absl::Time start = absl::Now();
  const absl::Duration last_arrival = absl::Milliseconds(200) * (size - 1);
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    ASSERT_THAT(comm.Barrier()->Wait(), IsOk());  // everyone connected
    const absl::Time synchronized = absl::Now();
    absl::SleepFor(absl::Milliseconds(200) * rank);
    ASSERT_THAT(comm.Barrier()->Wait(), IsOk());
    EXPECT_GE(absl::Now() - synchronized, last_arrival - absl::Milliseconds(20));
  });
  EXPECT_GE(absl::Now() - start, last_arrival);
}

// Two collectives in flight at once while the caller computes; both complete correctly.
TEST_P(RingCollectivesTest, AsyncCollectivesOverlapWithCompute) {
  const int size = GetParam();
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    at::Tensor gradients = torch::full({1 << 18}, static_cast<float>(rank));
    at::Tensor parameters = torch::zeros({1 << 18});
    const Chunk own = ChunkOf(parameters.numel(), size, rank);
    parameters.narrow(0, own.offset, own.numel).fill_(rank);
    std::shared_ptr<Work> reduce = comm.AllReduce(gradients, ReduceOp::kAverage);
    std::shared_ptr<Work> gather =
        comm.AllGather(parameters.narrow(0, own.offset, own.numel), parameters);
    const at::Tensor product = at::mm(torch::ones({128, 128}), torch::ones({128, 128}));
    ASSERT_THAT(gather->Wait(), IsOk());
    ASSERT_THAT(reduce->Wait(), IsOk());
    EXPECT_EQ(product[0][0].item<float>(), 128.0f);
    EXPECT_TRUE(gradients.eq((size - 1) / 2.0f).all().item<bool>());
    for (int r = 0; r < size; ++r) {
      const Chunk chunk = ChunkOf(parameters.numel(), size, r);
      EXPECT_TRUE(parameters.narrow(0, chunk.offset, chunk.numel).eq(r).all().item<bool>());
    }
  });
}

// Tensor parallelism reduce-scatters activations that require grad from inside an autograd
// function (whose forward turns grad mode off on its own thread only): the collective reads
// them as data, records nothing, and leaves its output without a gradient.
TEST_P(RingCollectivesTest, ReduceScatterOfATensorThatRequiresGrad) {
  const int size = GetParam();
  RunOnRingGroup("world", size, [&](int rank, RingCommunicator& comm) {
    const at::Tensor input = Contribution(1001, rank, at::kFloat).requires_grad_();
    const Chunk own = ChunkOf(input.numel(), size, rank);
    at::Tensor scattered = torch::empty({own.numel});
    {
      at::NoGradGuard no_grad;
      ASSERT_THAT(comm.ReduceScatter(input, scattered, ReduceOp::kSum)->Wait(), IsOk());
    }
    EXPECT_FALSE(scattered.requires_grad());
    EXPECT_TRUE(at::equal(scattered, Expected(input.numel(), size, ReduceOp::kSum, at::kFloat)
                                         .narrow(0, own.offset, own.numel)));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingCollectivesTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_ranks";
                         });

TEST(RingCommunicatorTest, MissingRankTimesOutWithANamedError) {
  absl::Notification rank0_done;
  RunOnRingGroup(
      "lonely", 2,
      [&](int rank, RingCommunicator& comm) {
        if (rank == 1) {  // stays connected but never takes part
          rank0_done.WaitForNotification();
          return;
        }
        const absl::Time start = absl::Now();
        absl::Status status = comm.AllReduce(torch::ones({16}), ReduceOp::kSum)->Wait();
        EXPECT_LT(absl::Now() - start, absl::Seconds(5));
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     AllOf(HasSubstr("all_reduce on group 'lonely' (rank 0 of 2)"),
                                           HasSubstr("timed out after 1s waiting for rank 1"))));
        // The group is unusable now, and says why at once.
        EXPECT_THAT(comm.Barrier()->Wait(),
                    StatusIs(absl::StatusCode::kDeadlineExceeded,
                             HasSubstr("barrier on group 'lonely' (rank 0 of 2): the group failed "
                                       "earlier: all_reduce")));
        rank0_done.Notify();
      },
      /*timeout=*/absl::Seconds(1));
}

// Rank 1 skips block 1's gather (testing_skip.h) and issues block 0's, of the same size, in
// its turn: the ranks stop there, each naming its own collective's place in the step, rather
// than exchange the two blocks' data.
TEST(RingCommunicatorTest, ASkippedCollectiveStopsBothRanksWhereTheyDisagree) {
  RunOnRingGroup(
      "skipping", 2,
      [&](int rank, RingCommunicator& comm) {
        comm.BeginStep(3);
        const at::Tensor full = torch::zeros({8});
        ASSERT_THAT(comm.AllReduce(full, ReduceOp::kSum)->Wait(), IsOk());
        if (rank == 1) {
          SkipCollectiveForTesting(
              comm, [](const CollectiveCall& call) { return call.place.block == 1; });
        }
        absl::Status first;
        for (const int block : {1, 0}) {
          const ScopedPlace place(comm, {block, Pass::kForward, "test unit"});
          absl::Status status = comm.AllGather(full.narrow(0, 4 * rank, 4), full)->Wait();
          if (first.ok()) first = status;
        }
        EXPECT_TRUE(absl::IsDeadlineExceeded(first) || absl::IsUnavailable(first)) << first;
        const std::string place =
            rank == 0 ? "step 3, block 1 forward, all_gather of test unit on group 'skipping'"
                      : "step 3, block 0 forward, all_gather of test unit on group 'skipping'";
        EXPECT_THAT(std::string(first.message()),
                    HasSubstr(absl::StrCat(place, " (rank ", rank,
                                           " of 2; collective #1 of the "
                                           "step): ")));
        EXPECT_EQ(comm.FirstFailure(), absl::StrCat(place, " (collective #1 of the step)"));
        // Outside a block, the place is the step and the index only; rank 1 issued one less.
        EXPECT_EQ(comm.Describe(Collective::kBarrier),
                  absl::StrCat("step 3, barrier on group 'skipping' (rank ", rank,
                               " of 2; collective #", rank == 0 ? 3 : 2, " of the step)"));
        const ScopedPlace root(comm, {StepPlace::kRoot, Pass::kBackward, "test bucket", 5});
        EXPECT_EQ(comm.Describe(Collective::kAllReduce),
                  absl::StrCat("step 3, root backward, all_reduce of test bucket 5 on group "
                               "'skipping' (rank ",
                               rank, " of 2; collective #", rank == 0 ? 3 : 2, " of the step)"));
      },
      /*timeout=*/absl::Seconds(1));
}

TEST(RingCommunicatorTest, DepartedRankFailsTheCollectiveBeforeTheTimeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(2, [&](int rank) {
    auto comm = RingCommunicator::Create(*store, "departed", rank, 2, RingCommunicator::kLoopback,
                                         {absl::Seconds(60)});
    ASSERT_THAT(comm, IsOk());
    ASSERT_THAT((*comm)->Barrier()->Wait(), IsOk());
    if (rank == 1) {
      comm->reset();  // its connections close
      return;
    }
    const absl::Time start = absl::Now();
    EXPECT_THAT((*comm)->AllReduce(torch::ones({16}), ReduceOp::kSum)->Wait(),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("all_reduce on group 'departed' (rank 0 of 2): transfer "
                                   "with rank 1 failed")));
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  });
}

TEST(RingCommunicatorTest, RejectsBadArgumentsWithNamedErrors) {
  RunOnRingGroup("solo", 1, [](int, RingCommunicator& comm) {
    const auto invalid = [](const std::string& message) {
      return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message));
    };
    EXPECT_THAT(comm.AllReduce(torch::ones({3}, at::kDouble), ReduceOp::kSum)->Wait(),
                invalid("all_reduce on group 'solo' (rank 0 of 1): tensor has dtype Double"));
    EXPECT_THAT(comm.AllReduce(torch::ones({3}, at::kLong), ReduceOp::kAverage)->Wait(),
                invalid("average of Long tensors is not defined"));
    EXPECT_THAT(comm.AllReduce(torch::ones({3, 4}).t(), ReduceOp::kSum)->Wait(),
                invalid("tensor is not contiguous"));
    EXPECT_THAT(comm.AllReduce(at::Tensor(), ReduceOp::kSum)->Wait(),
                invalid("tensor is an undefined tensor"));
    EXPECT_THAT(comm.AllGather(torch::ones({3}), torch::ones({4}))->Wait(),
                invalid("all_gather on group 'solo' (rank 0 of 1): input is Float[3], but chunk 0 "
                        "of the Float[4] output has 4 elements"));
    EXPECT_THAT(
        comm.ReduceScatter(torch::ones({4}), torch::ones({4}, at::kBFloat16), ReduceOp::kSum)
            ->Wait(),
        invalid("output is BFloat16[4], but chunk 0 of the Float[4] input"));
    EXPECT_THAT(comm.Broadcast(torch::ones({3}), 1)->Wait(),
                invalid("broadcast on group 'solo' (rank 0 of 1): root 1 is not a rank"));
    // Rejected arguments do not break the group.
    EXPECT_THAT(comm.Barrier()->Wait(), IsOk());
  });
}

TEST(RingCommunicatorTest, RejectsAnInvalidRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THAT(RingCommunicator::Create(*store, "bad", 2, 2, RingCommunicator::kLoopback),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("connecting group 'bad' (rank 2 of 2)")));
}

}  // namespace
}  // namespace plait::parallel
