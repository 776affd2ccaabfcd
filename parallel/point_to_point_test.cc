// Send and Receive on RingCommunicator: exact values, issue order, the patterns pipeline
// schedules use (a ring, a pair sending both ways before receiving), argument errors, a
// mismatched or missing message, and traffic.
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testing::RunOnRingGroup;
using ::testing::AllOf;
using ::testing::HasSubstr;

// What rank `from` sends as its message `message`: distinct per sender and message, exact in
// every dtype used.
at::Tensor Payload(int from, int message, at::ScalarType dtype, int64_t numel = 1000) {
  return (torch::arange(numel, at::kLong).remainder(97) + 100 * from + 10 * message).to(dtype);
}

class PointToPointTest : public ::testing::TestWithParam<int> {};

TEST_P(PointToPointTest, ValuesArriveExactlyAndInOrder) {
  const int size = GetParam();
  constexpr int kMessages = 3;
  RunOnRingGroup("pp", size, [&](int rank, Communicator& comm) {
    // Rank 0 sends every other rank kMessages messages of each dtype, in one order.
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      SCOPED_TRACE(c10::toString(dtype));
      std::vector<std::shared_ptr<Work>> works;
      std::vector<at::Tensor> received;
      for (int message = 0; message < kMessages; ++message) {
        for (int peer = 1; peer < size; ++peer) {
          if (rank == 0) {
            works.push_back(comm.Send(Payload(peer, message, dtype), peer));
          } else if (rank == peer) {
            received.push_back(torch::zeros({10, 100}, dtype));
            works.push_back(comm.Receive(received.back(), 0));
          }
        }
      }
      for (const std::shared_ptr<Work>& work : works) ASSERT_THAT(work->Wait(), IsOk());
      for (int message = 0; message < static_cast<int>(received.size()); ++message) {
        EXPECT_TRUE(at::equal(received[message].view({-1}), Payload(rank, message, dtype)))
            << "message " << message;
      }
    }
  });
}

TEST_P(PointToPointTest, RingOfSendsBeforeAnyWaitCompletes) {
  const int size = GetParam();
  // Larger than the sockets buffer: a send that waited for its receive would hang here.
  constexpr int64_t kNumel = 4 << 20;
  RunOnRingGroup("pp", size, [&](int rank, Communicator& comm) {
    const at::Tensor out = Payload(rank, 0, at::kFloat, kNumel);
    const at::Tensor in = torch::empty({kNumel});
    const std::shared_ptr<Work> sent = comm.Send(out, (rank + 1) % size);
    const std::shared_ptr<Work> got = comm.Receive(in, (rank + size - 1) % size);
    ASSERT_THAT(sent->Wait(), IsOk());
    ASSERT_THAT(got->Wait(), IsOk());
    EXPECT_TRUE(at::equal(in, Payload((rank + size - 1) % size, 0, at::kFloat, kNumel)));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, PointToPointTest, ::testing::Values(2, 4));

TEST(PointToPointPairTest, BothSendBeforeEitherReceives) {
  RunOnRingGroup("pp", 2, [&](int rank, Communicator& comm) {
    const int peer = 1 - rank;
    // As 1F1B: rank 0 sends activations, rank 1 gradients, and only then do they receive. A
    // small send finishes before its receive is issued (it waits for no rendezvous)...
    ASSERT_THAT(comm.Send(Payload(rank, 0, at::kFloat), peer)->Wait(), IsOk());
    const at::Tensor small = torch::empty({1000});
    ASSERT_THAT(comm.Receive(small, peer)->Wait(), IsOk());
    EXPECT_TRUE(at::equal(small, Payload(peer, 0, at::kFloat)));
    // ... and one larger than the socket buffers leaves as its receive takes it.
    constexpr int64_t kNumel = 4 << 20;
    const std::shared_ptr<Work> sent = comm.Send(Payload(rank, 1, at::kFloat, kNumel), peer);
    const at::Tensor large = torch::empty({kNumel});
    ASSERT_THAT(comm.Receive(large, peer)->Wait(), IsOk());
    ASSERT_THAT(sent->Wait(), IsOk());
    EXPECT_TRUE(at::equal(large, Payload(peer, 1, at::kFloat, kNumel)));
  });
}

TEST(PointToPointPairTest, TrafficCountsTheBytes) {
  RunOnRingGroup("pp", 2, [&](int rank, Communicator& comm) {
    const at::Tensor tensor = Payload(0, 0, at::kBFloat16);
    const std::shared_ptr<Work> work = rank == 0 ? comm.Send(tensor, 1) : comm.Receive(tensor, 0);
    ASSERT_THAT(work->Wait(), IsOk());
    const Traffic sent = comm.traffic(Collective::kSend);
    const Traffic received = comm.traffic(Collective::kReceive);
    EXPECT_EQ(sent.calls, rank == 0 ? 1 : 0);
    EXPECT_EQ(sent.bytes_sent, rank == 0 ? 2000 : 0);
    EXPECT_EQ(received.calls, rank == 1 ? 1 : 0);
    EXPECT_EQ(received.bytes_received, rank == 1 ? 2000 : 0);
  });
}

TEST(PointToPointPairTest, AreNotCountedInTheStepsCollectiveIndex) {
  RunOnRingGroup("pp", 2, [&](int rank, Communicator& comm) {
    comm.BeginStep(1);
    const at::Tensor tensor = torch::zeros({4});
    ASSERT_THAT((rank == 0 ? comm.Send(tensor, 1) : comm.Receive(tensor, 0))->Wait(), IsOk());
    EXPECT_EQ(comm.NextCall(Collective::kBarrier).index, 0);
    EXPECT_EQ(comm.Describe(Collective::kSend, 1 - rank),
              absl::StrCat("step 1, send to rank ", 1 - rank, " on group 'pp' (rank ", rank,
                           " of 2; message #", rank == 0 ? 1 : 0, " from rank ", rank, " to rank ",
                           1 - rank, ")"));
    ASSERT_THAT(comm.Barrier()->Wait(), IsOk());
  });
}

// In the error tests, rank 0 stays until rank 1 has checked its error: a rank that leaves
// closes its connections, which the other would see first.

TEST(PointToPointErrorsTest, AReceiveOfAnotherSizeOrDtypeNamesBoth) {
  absl::Notification checked;
  RunOnRingGroup("pp", 2, [&](int rank, Communicator& comm) {
    if (rank == 0) {
      ASSERT_THAT(comm.Send(torch::zeros({12}), 1)->Wait(), IsOk());
      checked.WaitForNotification();
      return;
    }
    EXPECT_THAT(comm.Receive(torch::zeros({2, 3}), 0)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("receive from rank 0 on group 'pp' (rank 1 of 2; "
                                         "message #0 from rank 0 to rank 1)"),
                               HasSubstr("rank 0 sent Float[12]"),
                               HasSubstr("is Float[6] (shape [2, 3])"))));
    // The rest of that message is left unread: the next receive from rank 0 fails too.
    EXPECT_THAT(comm.Receive(torch::zeros({12}), 0)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("message #1 from rank 0 to rank 1): an earlier message of this "
                                   "direction and peer failed: ")));
    checked.Notify();
  });
  absl::Notification checked_dtype;
  RunOnRingGroup("pp", 2, [&](int rank, Communicator& comm) {
    if (rank == 0) {
      ASSERT_THAT(comm.Send(torch::zeros({6}), 1)->Wait(), IsOk());
      checked_dtype.WaitForNotification();
      return;
    }
    EXPECT_THAT(comm.Receive(torch::zeros({6}, at::kLong), 0)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("rank 0 sent Float[6]"), HasSubstr("is Long[6]"))));
    checked_dtype.Notify();
  });
}

TEST(PointToPointErrorsTest, APeerMustBeAnotherRankOfTheGroup) {
  RunOnRingGroup("pp", 2, [&](int rank, Communicator& comm) {
    for (int peer : {-1, 2}) {
      EXPECT_THAT(
          comm.Send(torch::zeros({1}), peer)->Wait(),
          StatusIs(absl::StatusCode::kInvalidArgument,
                   AllOf(HasSubstr("send on group 'pp'"),
                         HasSubstr(absl::StrCat("peer ", peer, " is not a rank of the group")))));
    }
    EXPECT_THAT(comm.Receive(torch::zeros({1}), rank)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("peer ", rank, " is this rank"))));
    EXPECT_THAT(
        comm.Send(torch::zeros({4}).slice(0, 0, 4, 2), 1 - rank)->Wait(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor is not contiguous")));
    EXPECT_EQ(comm.traffic(Collective::kSend).calls, 0);
  });
}

TEST(PointToPointErrorsTest, AReceiveWhoseSenderNeverSendsTimesOutNamingIt) {
  absl::Notification checked;
  RunOnRingGroup(
      "pp", 2,
      [&](int rank, Communicator& comm) {
        if (rank == 0) {
          checked.WaitForNotification();
          return;
        }
        EXPECT_THAT(comm.Receive(torch::zeros({3}), 0)->Wait(),
                    StatusIs(absl::StatusCode::kDeadlineExceeded,
                             AllOf(HasSubstr("receive from rank 0 on group 'pp' (rank 1 of 2"),
                                   HasSubstr("waiting for rank 0"),
                                   HasSubstr("did rank 0 issue the matching send?"))));
        checked.Notify();
      },
      absl::Milliseconds(300));
}

}  // namespace
}  // namespace plait::parallel
