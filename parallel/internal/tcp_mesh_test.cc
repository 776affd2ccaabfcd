#include "parallel/internal/tcp_mesh.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel::internal {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testing::RunRanks;
using ::testing::HasSubstr;

constexpr char kLoopback[] = "127.0.0.1";

std::unique_ptr<TcpMesh> Connect(c10d::Store& store, int rank, int size) {
  absl::StatusOr<std::unique_ptr<TcpMesh>> mesh =
      TcpMesh::Connect(store, "mesh/", rank, size, kLoopback, absl::Seconds(30));
  EXPECT_THAT(mesh, IsOk());
  return mesh.ok() ? *std::move(mesh) : nullptr;
}

TEST(TcpMeshTest, ARingOfExchangesDeliversEveryBuffer) {
  constexpr int kSize = 3;
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(kSize, [&](int rank) {
    std::unique_ptr<TcpMesh> mesh = Connect(*store, rank, kSize);
    ASSERT_NE(mesh, nullptr);
    // Empty, small and larger-than-a-socket-buffer transfers, several per connection.
    for (const size_t bytes : {size_t{0}, size_t{3}, size_t{8} << 20, size_t{1000}}) {
      std::vector<char> out(bytes, static_cast<char>('a' + rank));
      std::vector<char> in(bytes, 0);
      const int right = (rank + 1) % kSize;
      const int left = (rank + kSize - 1) % kSize;
      ASSERT_THAT(mesh->Exchange(bytes, {{out.data(), bytes, right}},
                                 TcpMesh::Transfer{in.data(), bytes, left},
                                 absl::Now() + absl::Seconds(30)),
                  IsOk());
      EXPECT_EQ(in, std::vector<char>(bytes, static_cast<char>('a' + left)));
    }
  });
}

// Rank 0's status when it exchanges 8 bytes as transfer 7 with rank 1, which only sends,
// `rank1_bytes` as transfer `rank1_tag` (so it never stops at rank 0's frame before sending).
absl::Status ExchangeAgainst(uint64_t rank1_tag, size_t rank1_bytes) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  absl::Notification checked;  // rank 1 keeps its connection open until rank 0 has looked
  absl::Status rank0_status;
  RunRanks(2, [&](int rank) {
    std::unique_ptr<TcpMesh> mesh = Connect(*store, rank, 2);
    ASSERT_NE(mesh, nullptr);
    std::vector<char> out(rank == 0 ? 8 : rank1_bytes, 'x');
    std::vector<char> in(8, 0);
    if (rank == 0) {
      rank0_status = mesh->Exchange(7, {{out.data(), out.size(), 1}},
                                    TcpMesh::Transfer{in.data(), in.size(), 1},
                                    absl::Now() + absl::Seconds(30));
      checked.Notify();
    } else {
      EXPECT_THAT(mesh->Exchange(rank1_tag, {{out.data(), out.size(), 0}}, std::nullopt,
                                 absl::Now() + absl::Seconds(30)),
                  IsOk());
      checked.WaitForNotification();
    }
  });
  return rank0_status;
}

TEST(TcpMeshTest, ATransferOfAnotherSizeIsAnErrorNamingBothSides) {
  EXPECT_THAT(ExchangeAgainst(7, 16),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("transfer with rank 1 failed: rank 1 sent 16 bytes as transfer 7 "
                                 "where this rank expects 8 bytes")));
}

TEST(TcpMeshTest, ATransferWithAnotherTagIsAnErrorNamingThePeer) {
  EXPECT_THAT(ExchangeAgainst(9, 8),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("transfer with rank 1 failed: rank 1 sent another transfer than "
                                 "this rank expects (the ranks called different collectives")));
}

TEST(TcpMeshTest, AStrayConnectionIsDroppedAndTheRanksStillMeet) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::thread rank0([&] { EXPECT_NE(Connect(*store, 0, 2), nullptr); });
  // Rank 0's entry: "host\nport\nsecret".
  store->wait({"mesh/0"});
  const std::vector<uint8_t> entry = store->get("mesh/0");
  const std::vector<std::string> parts =
      absl::StrSplit(std::string(entry.begin(), entry.end()), '\n');
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(parts.at(1), &port));
  const int stray = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(stray, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  const std::string junk(28, 'j');  // a hello's length, with the wrong magic and secret
  ASSERT_EQ(send(stray, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  EXPECT_NE(Connect(*store, 1, 2), nullptr);
  rank0.join();
  close(stray);
}

TEST(TcpMeshTest, ARankThatNeverComesIsNamed) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THAT(
      TcpMesh::Connect(*store, "lonely/", 0, 3, kLoopback, absl::Milliseconds(200)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank(s) 1, 2 never connected")));
  EXPECT_THAT(TcpMesh::Connect(*store, "late/", 1, 2, kLoopback, absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank 0 did not appear")));
}

}  // namespace
}  // namespace plait::parallel::internal
