#include "parallel/rendezvous.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/free_port.h"
#include "parallel/test_ranks.h"

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

World RankOf(int rank, int world_size, int port) {
  return World{.rank = rank,
               .world_size = world_size,
               .local_rank = rank,
               .local_world_size = world_size,
               .master_addr = "127.0.0.1",
               .master_port = port};
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

TEST(RendezvousTest, UnreachableStoreIsReportedByTheRank) {
  EXPECT_THAT(Rendezvous(RankOf(1, 2, FreeLoopbackPort()), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("rendezvous: rank 1 could not reach rank 0's store at "
                                 "127.0.0.1:")));
}

TEST(RendezvousTest, RejectsAnInvalidWorld) {
  EXPECT_THAT(Rendezvous(RankOf(0, 2, 70000), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world.master_port=70000")));
}

}  // namespace
}  // namespace plait::parallel
