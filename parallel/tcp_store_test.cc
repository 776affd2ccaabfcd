#include "parallel/tcp_store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr char kToken[] = "0123456789abcdef-a-test-token";

std::vector<uint8_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::unique_ptr<TcpStoreServer> StartServer(int max_connections = 16) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", 0, kToken, max_connections);
  EXPECT_THAT(server, IsOk());
  return server.ok() ? *std::move(server) : nullptr;
}

c10::intrusive_ptr<TcpStore> ConnectTo(const TcpStoreServer& server,
                                       absl::Duration timeout = absl::Seconds(10)) {
  absl::StatusOr<c10::intrusive_ptr<TcpStore>> store =
      TcpStore::Connect("127.0.0.1", server.port(), kToken, timeout);
  EXPECT_THAT(store, IsOk());
  return store.ok() ? *store : c10::intrusive_ptr<TcpStore>();
}

// A socket that speaks the protocol by hand, or not at all.
class RawClient {
 public:
  explicit RawClient(int port) : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
        << std::strerror(errno);
  }
  ~RawClient() { close(fd_); }

  void Send(const std::string& bytes) {
    EXPECT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // Reads one reply header and returns its kind (0: OK).
  uint32_t ReplyKind() {
    char header[tcp_store_wire::kHeaderBytes];
    EXPECT_EQ(recv(fd_, header, sizeof(header), MSG_WAITALL), static_cast<ssize_t>(sizeof(header)));
    return static_cast<uint32_t>(header[0]);
  }

  // Whether the server closes the connection (end of stream or reset) within `timeout`;
  // anything it sends before is read and ignored.
  bool ClosedByServerWithin(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      pollfd entry{fd_, POLLIN, 0};
      const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (left_ms <= 0 || poll(&entry, 1, left_ms) <= 0) return false;
      char buffer[256];
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
  }

 private:
  int fd_;
};

TEST(TcpStoreTest, ClientsShareEveryOperation) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  c10::intrusive_ptr<TcpStore> a = ConnectTo(*server);
  c10::intrusive_ptr<TcpStore> b = ConnectTo(*server);
  ASSERT_TRUE(a && b);

  a->set("address", Bytes("10.0.0.1:1234"));
  EXPECT_EQ(b->get("address"), Bytes("10.0.0.1:1234"));
  EXPECT_TRUE(b->check({"address"}));
  EXPECT_FALSE(b->check({"address", "missing"}));

  EXPECT_EQ(a->add("count", 5), 5);
  EXPECT_EQ(b->add("count", -2), 3);
  EXPECT_EQ(a->get("count"), Bytes("3"));  // decimal text, as c10d's stores keep counters

  // compareSet follows c10d's HashStore: a missing key is set only when nothing is expected.
  EXPECT_EQ(a->compareSet("owner", {}, Bytes("a")), Bytes("a"));
  EXPECT_EQ(b->compareSet("owner", Bytes("b?"), Bytes("b")), Bytes("a"));
  EXPECT_EQ(b->compareSet("owner", Bytes("a"), Bytes("b")), Bytes("b"));
  EXPECT_EQ(a->compareSet("absent", Bytes("x"), Bytes("y")), Bytes("x"));
  EXPECT_FALSE(a->check({"absent"}));

  EXPECT_EQ(a->getNumKeys(), 3);
  EXPECT_TRUE(b->deleteKey("address"));
  EXPECT_FALSE(a->deleteKey("address"));
  EXPECT_FALSE(a->check({"address"}));
  EXPECT_EQ(b->getNumKeys(), 2);

  // A value at the limit travels; one over it is refused before it is sent.
  const std::vector<uint8_t> largest(kMaxValueBytes, 7);
  a->set("largest", largest);
  EXPECT_EQ(b->get("largest"), largest);
  EXPECT_THROW(a->set("too_large", std::vector<uint8_t>(kMaxValueBytes + 1)),
               std::invalid_argument);
  EXPECT_THROW(a->set(std::string(kMaxKeyBytes + 1, 'k'), {}), std::invalid_argument);
  EXPECT_EQ(a->getNumKeys(), 3);  // the connection is still good
}

TEST(TcpStoreTest, ACloneIsAnotherClientOfTheSameServer) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  c10::intrusive_ptr<TcpStore> store = ConnectTo(*server, absl::Seconds(7));
  ASSERT_TRUE(store);
  const c10::intrusive_ptr<c10d::Store> clone = store->Clone();
  ASSERT_NE(clone.get(), store.get());
  clone->set("from clone", Bytes("hello"));
  EXPECT_EQ(store->get("from clone"), Bytes("hello"));
  EXPECT_EQ(clone->getTimeout(), std::chrono::milliseconds(7000));
  server.reset();
  store->setTimeout(std::chrono::milliseconds(100));
  EXPECT_THAT([&] { store->Clone(); },
              ThrowsMessage<std::runtime_error>(HasSubstr("cloning the store at 127.0.0.1:")));
}

TEST(TcpStoreTest, WaitReturnsOnceAnotherClientSetsTheKeys) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  c10::intrusive_ptr<TcpStore> a = ConnectTo(*server);
  c10::intrusive_ptr<TcpStore> b = ConnectTo(*server);
  ASSERT_TRUE(a && b);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    a->set("late/1", Bytes("1"));
    a->set("late/2", Bytes("2"));
  });
  b->wait({"late/1", "late/2"}, std::chrono::seconds(10));
  EXPECT_EQ(b->get("late/2"), Bytes("2"));
  setter.join();
}

TEST(TcpStoreTest, WaitAndGetTimeOutNamingTheKey) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  c10::intrusive_ptr<TcpStore> store = ConnectTo(*server, absl::Milliseconds(200));
  ASSERT_TRUE(store);
  store->set("here", Bytes("1"));
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      [&] {
        store->wait({"here", "never"}, std::chrono::milliseconds(100));
      },
      ThrowsMessage<std::runtime_error>(
          AllOf(HasSubstr("timed out after 100ms"), HasSubstr("store key 'never'"))));
  EXPECT_THAT([&] { store->get("never/get"); },  // the store's own timeout, 200 ms
              ThrowsMessage<std::runtime_error>(HasSubstr("store key 'never/get'")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(TcpStoreTest, RefusesAWrongTokenAndServesTheRightOne) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(TcpStore::Connect("127.0.0.1", server->port(), "not-the-token-of-this-job",
                                absl::Seconds(10)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("refused this client"), HasSubstr("wrong token"))));
  c10::intrusive_ptr<TcpStore> store = ConnectTo(*server);
  ASSERT_TRUE(store);
  store->set("key", Bytes("value"));
  EXPECT_EQ(store->get("key"), Bytes("value"));
}

TEST(TcpStoreTest, SummarisesTheClientsItRefusedByReason) {
  StoreRefusals refusals;
  EXPECT_EQ(refusals.Summary(), "");
  for (int i = 0; i < 6; ++i) {
    refusals.Record(StoreRefusals::kWrongToken, absl::StrCat("10.0.0.1:", 1000 + i));
  }
  refusals.Record(StoreRefusals::kOtherVersion, "10.0.0.2:2000 speaking version 2");
  EXPECT_EQ(refusals.total(), 7);
  EXPECT_EQ(refusals.Summary(),
            "7 clients refused: 6 wrong token (first: 10.0.0.1:1000, 10.0.0.1:1001, "
            "10.0.0.1:1002, 10.0.0.1:1003, ...), 1 another protocol version (first: "
            "10.0.0.2:2000 speaking version 2)");
}

TEST(TcpStoreTest, CountsAClientOfAnotherProtocolVersion) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RawClient client(server->port());
  std::string hello = tcp_store_wire::Hello(kToken);
  hello[8] = 2;  // the protocol version, after the 8 bytes of magic
  client.Send(hello);
  EXPECT_EQ(client.ReplyKind(), 3u);  // refused
  EXPECT_TRUE(client.ClosedByServerWithin(absl::Seconds(2)));
  EXPECT_THAT(server->Refusals().Summary(),
              AllOf(HasSubstr("1 client refused: 1 another protocol version (first: 127.0.0.1:"),
                    HasSubstr(" speaking version 2)")));
}

// A flood of clients with a wrong token, while the job's clients use the store: each is
// refused and closed, the server keeps a count of them and a few addresses, not one entry
// each, and the job's clients, old and new, are served throughout.
TEST(TcpStoreTest, AFloodOfWrongTokensIsCountedAndTheJobIsServedThroughout) {
  constexpr int kMinFlood = 3000;
  constexpr int kMaxFlood = 30000;  // the flood's bound, should the job's clients be slow
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  c10::intrusive_ptr<TcpStore> admitted = ConnectTo(*server);
  ASSERT_TRUE(admitted);
  absl::Notification flooding;
  absl::Notification served;
  int flood = 0;
  std::thread flooder([&] {
    for (; flood < kMaxFlood && (flood < kMinFlood || !served.HasBeenNotified()); ++flood) {
      RawClient client(server->port());
      client.Send(tcp_store_wire::Hello("not-the-token-of-this-job"));
      if (!client.ClosedByServerWithin(absl::Seconds(10))) {
        ADD_FAILURE() << "the server kept wrong-token client " << flood << " open";
        break;
      }
      if (flood == 100) flooding.Notify();
    }
    if (!flooding.HasBeenNotified()) flooding.Notify();
  });
  flooding.WaitForNotification();
  for (int i = 1; i <= 100; ++i) EXPECT_EQ(admitted->add("count", 1), i);
  c10::intrusive_ptr<TcpStore> newcomer = ConnectTo(*server);
  ASSERT_TRUE(newcomer);
  EXPECT_EQ(newcomer->get("count"), Bytes("100"));
  served.Notify();
  flooder.join();

  const StoreRefusals refusals = server->Refusals();
  EXPECT_EQ(refusals.total(), flood);
  EXPECT_EQ(refusals.tallies[StoreRefusals::kWrongToken].count, flood);
  EXPECT_EQ(refusals.tallies[StoreRefusals::kWrongToken].first.size(),
            StoreRefusals::kAddressesKept);
  const std::string summary = refusals.Summary();
  EXPECT_THAT(summary, HasSubstr(absl::StrCat(flood, " clients refused: ", flood,
                                              " wrong token (first: 127.0.0.1:")));
  EXPECT_LT(summary.size(), 256u) << summary;
  EXPECT_EQ(admitted->get("count"), Bytes("100"));
}

TEST(TcpStoreTest, AStrayConnectionStallsNobodyAndIsClosedAfterTheHelloTimeout) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RawClient stray(server->port());
  stray.Send("p");  // the first byte of a hello, then nothing
  const absl::Time start = absl::Now();
  c10::intrusive_ptr<TcpStore> a = ConnectTo(*server);
  c10::intrusive_ptr<TcpStore> b = ConnectTo(*server);
  ASSERT_TRUE(a && b);
  a->set("key", Bytes("value"));
  EXPECT_EQ(b->get("key"), Bytes("value"));
  EXPECT_LT(absl::Now() - start, kHelloTimeout / 2);
  EXPECT_TRUE(stray.ClosedByServerWithin(kHelloTimeout + absl::Seconds(2)));
}

TEST(TcpStoreTest, DropsAnAuthenticatedClientClaimingAHugeFrame) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RawClient client(server->port());
  client.Send(tcp_store_wire::Hello(kToken));
  ASSERT_EQ(client.ReplyKind(), 0u);
  client.Send(tcp_store_wire::Header(tcp_store_wire::kSet, 1, uint64_t{1} << 40, 0) + "k");
  EXPECT_TRUE(client.ClosedByServerWithin(absl::Seconds(2)));
  c10::intrusive_ptr<TcpStore> store = ConnectTo(*server);
  ASSERT_TRUE(store);
  store->set("key", Bytes("value"));
  EXPECT_EQ(store->get("key"), Bytes("value"));
}

TEST(TcpStoreTest, DropsAnUnauthenticatedClientAtItsFirstBytes) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RawClient client(server->port());
  client.Send(tcp_store_wire::Header(tcp_store_wire::kSet, 1, uint64_t{1} << 40, 0));
  // Well before the hello timeout: the bytes are not a hello.
  EXPECT_TRUE(client.ClosedByServerWithin(kHelloTimeout / 2));
  c10::intrusive_ptr<TcpStore> store = ConnectTo(*server);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->getNumKeys(), 0);
}

// The IPv4 addresses of this machine's interfaces other than loopback.
std::vector<in_addr> NonLoopbackAddresses() {
  std::vector<in_addr> addresses;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return addresses;
  for (ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    const in_addr address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr;
    if ((ntohl(address.s_addr) >> 24) != 127) addresses.push_back(address);
  }
  freeifaddrs(interfaces);
  return addresses;
}

TEST(TcpStoreTest, ListensOnlyOnTheAddressItIsGiven) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->BoundAddress(), absl::StrCat("127.0.0.1:", server->port()));
  EXPECT_TRUE(server->ListensOnLoopback());
  const std::vector<in_addr> others = NonLoopbackAddresses();
  if (others.empty()) GTEST_LOG_(INFO) << "no non-loopback address to try connecting from";
  for (const in_addr& other : others) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr = other;
    address.sin_port = htons(server->port());
    EXPECT_NE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
        << "reached the store through " << inet_ntoa(other);
    close(fd);
  }
}

TEST(TcpStoreTest, RefusesAWildcardAddress) {
  for (const char* wildcard : {"0.0.0.0", "::"}) {
    EXPECT_THAT(TcpStoreServer::Start(wildcard, 0, kToken, 4),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("\"", wildcard, "\" is a wildcard address"))));
  }
}

TEST(TcpStoreTest, RefusesAShortToken) {
  EXPECT_THAT(TcpStoreServer::Start("127.0.0.1", 0, "short", 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the store token has 5 characters; it needs 16 to 256")));
}

TEST(TcpStoreTest, ClosesConnectionsOverTheLimit) {
  std::unique_ptr<TcpStoreServer> server = StartServer(/*max_connections=*/2);
  ASSERT_NE(server, nullptr);
  auto first = std::make_unique<RawClient>(server->port());
  RawClient second(server->port());
  RawClient third(server->port());
  EXPECT_TRUE(third.ClosedByServerWithin(absl::Seconds(2)));
  EXPECT_THAT(TcpStore::Connect("127.0.0.1", server->port(), kToken, absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("no store answered")));
  first.reset();  // a slot frees: a client now gets in
  EXPECT_TRUE(ConnectTo(*server));
}

TEST(TcpStoreTest, LosingTheServerIsAnErrorNamingTheKey) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  c10::intrusive_ptr<TcpStore> store = ConnectTo(*server);
  ASSERT_TRUE(store);
  server.reset();
  EXPECT_THAT([&] { store->set("key", Bytes("value")); },
              ThrowsMessage<std::runtime_error>(
                  AllOf(HasSubstr("lost the store at 127.0.0.1:"), HasSubstr("key 'key'"))));
}

int CountEntries(const char* dir) {
  int count = 0;
  DIR* listing = opendir(dir);
  while (readdir(listing) != nullptr) ++count;
  closedir(listing);
  return count;
}

TEST(TcpStoreTest, LeavesNoThreadOrDescriptorBehind) {
  const int fds = CountEntries("/proc/self/fd");
  const int threads = CountEntries("/proc/self/task");
  {
    std::unique_ptr<TcpStoreServer> server = StartServer();
    ASSERT_NE(server, nullptr);
    c10::intrusive_ptr<TcpStore> client = ConnectTo(*server);
    RawClient stray(server->port());
    stray.Send("p");
    absl::StatusOr<c10::intrusive_ptr<TcpStore>> host =
        TcpStore::Host("127.0.0.1", 0, kToken, 4, absl::Seconds(10));
    ASSERT_THAT(host, IsOk());
    ASSERT_NE((*host)->server(), nullptr);
    EXPECT_EQ((*host)->server()->BoundAddress(),
              absl::StrCat("127.0.0.1:", (*host)->server()->port()));
    (*host)->set("key", Bytes("value"));
    client->set("key", Bytes("value"));
  }
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds);
  EXPECT_EQ(CountEntries("/proc/self/task"), threads);
}

}  // namespace
}  // namespace plait::parallel
