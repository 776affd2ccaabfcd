#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/free_port.h"
#include "parallel/ring_communicator.h"
#include "parallel/tcp_store.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testing::RunRanks;
using ::testing::AllOf;
using ::testing::HasSubstr;

int FreeLoopbackPort() {
  absl::StatusOr<int> port = PickFreeLoopbackPort();
  EXPECT_THAT(port, IsOk());
  return port.value_or(0);
}

constexpr char kToken[] = "0123456789abcdef-a-test-token";

World RankOf(int rank, int world_size, int port) {
  return World{.rank = rank,
               .world_size = world_size,
               .local_rank = rank,
               .local_world_size = world_size,
               .master_addr = "127.0.0.1",
               .master_port = port,
               .store_token = kToken};
}

// A socket connected to 127.0.0.1:`port` once something listens there, within 10 s.
int ConnectWhenListening(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) return fd;
    close(fd);
    absl::SleepFor(absl::Milliseconds(5));
  }
  ADD_FAILURE() << "nothing listened on port " << port;
  return -1;
}

TEST(RendezvousTest, AllRanksMeetAndShareTheStore) {
  const int port = FreeLoopbackPort();
  absl::BlockingCounter reading(3);
  RunRanks(3, [&](int rank) {
    auto store = Rendezvous(RankOf(rank, 3, port), absl::Seconds(20));
    ASSERT_THAT(store, IsOk());
    (*store)->set("greeting/" + std::to_string(rank), std::vector<uint8_t>{uint8_t(rank)});
    for (int other = 0; other < 3; ++other) {
      EXPECT_EQ((*store)->get("greeting/" + std::to_string(other)),
                std::vector<uint8_t>{uint8_t(other)});
    }
    // Rank 0 hosts the store: it must outlive the others' reads.
    reading.DecrementCount();
    if (rank == 0) reading.Wait();
  });
}

// A one-machine job's ranks meet through a file: no TCP server, so no port to reach.
TEST(RendezvousTest, RanksWithAStoreFileMeetThroughIt) {
  const std::string store_file = absl::StrCat(std::getenv("TEST_TMPDIR"), "/store");
  std::remove(store_file.c_str());
  RunRanks(3, [&](int rank) {
    World world = RankOf(rank, 3, /*port=*/1);  // a port nobody listens on
    world.store_file = store_file;
    world.store_token = "";  // a file store needs none
    auto store = Rendezvous(world, absl::Seconds(20));
    ASSERT_THAT(store, IsOk());
    (*store)->set("greeting/" + std::to_string(rank), std::vector<uint8_t>{uint8_t(rank)});
    for (int other = 0; other < 3; ++other) {
      (*store)->wait({"greeting/" + std::to_string(other)});
      EXPECT_EQ((*store)->get("greeting/" + std::to_string(other)),
                std::vector<uint8_t>{uint8_t(other)});
    }
  });
}

TEST(RendezvousTest, NamesTheRanksThatNeverArrive) {
  const int port = FreeLoopbackPort();
  // Ranks 2 and 3 of 4 never start. The timeout leaves rank 1 time to reach rank 0's store
  // on a loaded machine (connecting counts against it too).
  RunRanks(2, [&](int rank) {
    const absl::Time start = absl::Now();
    // Rank 0 times out first and takes the store down; rank 1 may see either.
    EXPECT_THAT(
        Rendezvous(RankOf(rank, 4, port), absl::Seconds(3)),
        StatusIs(absl::StatusCode::kDeadlineExceeded,
                 AllOf(HasSubstr(absl::StrCat("rendezvous at 127.0.0.1:", port, " timed out")),
                       HasSubstr("ranks 2, 3 of 4 never arrived"))));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  });
}

// In a job of several nodes the error says which nodes the missing ranks are on: of 2 nodes
// of 2 ranks, node 1 (ranks 2, 3) never arrives; of 3 nodes, rank 3 of node 1 and all of
// node 2.
TEST(RendezvousTest, NamesTheNodeThatNeverArrives) {
  const std::string store_file = absl::StrCat(std::getenv("TEST_TMPDIR"), "/nodes_store");
  RunRanks(2, [&](int rank) {
    World world = RankOf(rank, 4, FreeLoopbackPort());
    world.local_world_size = 2;
    world.local_rank = rank;
    world.store_file = store_file;
    EXPECT_THAT(Rendezvous(world, absl::Seconds(2)),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr(absl::StrCat(
                             "ranks 2, 3 of 4 never arrived: all of node 1 (of 2 nodes; a node "
                             "that never arrives was not started, or cannot reach file ",
                             store_file, ")"))));
  });
  const std::string three_nodes = absl::StrCat(std::getenv("TEST_TMPDIR"), "/three_nodes_store");
  RunRanks(3, [&](int rank) {
    World world = RankOf(rank, 6, FreeLoopbackPort());
    world.local_world_size = 2;
    world.local_rank = rank % 2;
    world.store_file = three_nodes;
    EXPECT_THAT(Rendezvous(world, absl::Seconds(2)),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr("ranks 3, 4, 5 of 6 never arrived: 1 of node 1's 2, all of "
                                   "node 2 (of 3 nodes;")));
  });
}

TEST(RendezvousTest, UnreachableStoreIsReportedByTheRank) {
  EXPECT_THAT(Rendezvous(RankOf(1, 2, FreeLoopbackPort()), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("rendezvous: rank 1 could not reach rank 0's store: no store "
                                 "answered at 127.0.0.1:")));
}

TEST(RendezvousTest, RanksMeetOverTheTcpStoreAndCreateARingGroupOverIt) {
  const int port = FreeLoopbackPort();
  absl::BlockingCounter connected(3);
  RunRanks(3, [&](int rank) {
    auto store = Rendezvous(RankOf(rank, 3, port), absl::Seconds(20));
    ASSERT_THAT(store, IsOk());
    auto comm = RingCommunicator::Create(**store, "world", rank, 3, RingCommunicator::kLoopback,
                                         {absl::Seconds(20)});
    // Rank 0 hosts the store: it must outlive the others' use of it.
    connected.DecrementCount();
    if (rank == 0) connected.Wait();
    ASSERT_THAT(comm, IsOk());
    at::Tensor tensor = torch::full({4}, rank + 1.0);
    ASSERT_THAT((*comm)->AllReduce(tensor, ReduceOp::kSum)->Wait(), IsOk());
    EXPECT_TRUE(at::equal(tensor, torch::full({4}, 6.0)));
  });
}

// A local job's store listens on loopback only: tcp_store_test checks that no other address
// of the machine reaches such a store.
TEST(RendezvousTest, ALocalJobsStoreListensOnLoopbackOnly) {
  const int port = FreeLoopbackPort();
  absl::BlockingCounter checked(2);
  RunRanks(2, [&](int rank) {
    auto store = Rendezvous(RankOf(rank, 2, port), absl::Seconds(20));
    ASSERT_THAT(store, IsOk());
    if (rank == 0) {
      const auto* tcp_store = dynamic_cast<const TcpStore*>(store->get());
      ASSERT_NE(tcp_store, nullptr);
      ASSERT_NE(tcp_store->server(), nullptr);
      EXPECT_EQ(tcp_store->server()->BoundAddress(), absl::StrCat("127.0.0.1:", port));
    }
    checked.DecrementCount();
    if (rank == 0) checked.Wait();
  });
}

TEST(RendezvousTest, ARankWithTheWrongTokenIsRefusedAndTheOthersMeet) {
  const int port = FreeLoopbackPort();
  absl::Notification impostor_refused;
  absl::BlockingCounter met(2);
  RunRanks(3, [&](int thread) {
    if (thread == 2) {
      World impostor = RankOf(1, 2, port);
      impostor.store_token = "not-the-token-of-this-job";
      EXPECT_THAT(Rendezvous(impostor, absl::Seconds(20)),
                  StatusIs(absl::StatusCode::kPermissionDenied,
                           AllOf(HasSubstr("rendezvous: rank 1 could not reach rank 0's store"),
                                 HasSubstr("refused this client: wrong token"),
                                 HasSubstr("every rank needs the same PLAIT_STORE_TOKEN"))));
      impostor_refused.Notify();
      return;
    }
    if (thread == 1) impostor_refused.WaitForNotification();
    auto store = Rendezvous(RankOf(thread, 2, port), absl::Seconds(20));
    EXPECT_THAT(store, IsOk());
    met.DecrementCount();
    if (thread == 0) met.Wait();
  });
}

// A client with a wrong token is refused and nothing more: it may be a stray, so rank 0 goes on
// waiting for the ranks, here one that arrives seconds after the refusal, as a slow node does.
TEST(RendezvousTest, AWrongTokenClientDoesNotEndTheRendezvous) {
  const int port = FreeLoopbackPort();
  absl::Notification stray_refused;
  absl::BlockingCounter met(2);
  RunRanks(3, [&](int thread) {
    if (thread == 2) {
      EXPECT_THAT(
          TcpStore::Connect("127.0.0.1", port, "not-the-token-of-this-job", absl::Seconds(20)),
          StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong token")));
      stray_refused.Notify();
      return;
    }
    if (thread == 1) {
      stray_refused.WaitForNotification();
      absl::SleepFor(absl::Seconds(4));
    }
    auto store = Rendezvous(RankOf(thread, 2, port), absl::Seconds(30));
    EXPECT_THAT(store, IsOk());
    met.DecrementCount();
    if (thread == 0) met.Wait();  // rank 0 hosts the store: it leaves last
  });
}

// A rank started with another token is refused at once; rank 0 waits out its timeout for it
// (a refused client may be a stray) and then says, in brief, whom its store refused.
TEST(RendezvousTest, RankZeroNamesTheClientsItsStoreRefusedWhenItTimesOut) {
  const int port = FreeLoopbackPort();
  RunRanks(3, [&](int rank) {
    World world = RankOf(rank, 3, port);
    if (rank == 2) {
      world.store_token = "not-the-token-of-this-job";
      EXPECT_THAT(Rendezvous(world, absl::Seconds(20)),
                  StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong token")));
      return;
    }
    const auto store = Rendezvous(world, absl::Seconds(3));
    if (rank == 0) {
      EXPECT_THAT(store, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                  AllOf(HasSubstr("rank 2 of 3 never arrived; rank 0's store: 1 "
                                                  "client refused: 1 wrong token (first: "
                                                  "127.0.0.1:"),
                                        HasSubstr("); a rank it refused needs the job's "
                                                  "PLAIT_STORE_TOKEN"))));
    } else {
      EXPECT_FALSE(store.ok());  // rank 0 took the store down
    }
  });
}

TEST(RendezvousTest, AStrayConnectionThatSendsOneByteDoesNotStallIt) {
  const int port = FreeLoopbackPort();
  absl::Notification stray_connected;
  absl::BlockingCounter met(2);
  absl::Notification done;  // rank 0 hosts the store: it leaves last
  absl::Time stray_time;
  RunRanks(3, [&](int thread) {
    if (thread == 2) {
      const int stray = ConnectWhenListening(port);
      ASSERT_EQ(send(stray, "p", 1, MSG_NOSIGNAL), 1);  // a hello's first byte, then silence
      stray_time = absl::Now();
      stray_connected.Notify();
      met.Wait();  // held open until both ranks have met
      close(stray);
      done.Notify();
      return;
    }
    if (thread == 1) stray_connected.WaitForNotification();
    auto store = Rendezvous(RankOf(thread, 2, port), absl::Seconds(20));
    EXPECT_THAT(store, IsOk());
    if (thread == 1) {
      // Sooner than the server would drop the stray: nothing waited for it.
      EXPECT_LT(absl::Now() - stray_time, kHelloTimeout);
    }
    met.DecrementCount();
    if (thread == 0) done.WaitForNotification();
  });
}

TEST(RendezvousTest, TheTcpStoreNeedsAToken) {
  World world = RankOf(1, 2, FreeLoopbackPort());
  world.store_token = "";
  EXPECT_THAT(Rendezvous(world, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("PLAIT_STORE_TOKEN is not set"),
                             HasSubstr("export PLAIT_STORE_TOKEN=$(openssl rand -hex 16)"))));
  world.store_token = "too-short";
  EXPECT_THAT(Rendezvous(world, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world.store_token has 9 characters; it needs 16 to 256")));
}

TEST(RendezvousTest, AMultiNodeJobCannotMeetOnLoopback) {
  World world = RankOf(0, 4, FreeLoopbackPort());
  world.local_world_size = 2;  // two nodes
  EXPECT_THAT(Rendezvous(world, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("MASTER_ADDR=127.0.0.1 is a loopback address on rank 0")));
}

TEST(RendezvousTest, RejectsAnInvalidWorld) {
  EXPECT_THAT(Rendezvous(RankOf(0, 2, 70000), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world.master_port=70000")));
}

}  // namespace
}  // namespace plait::parallel
