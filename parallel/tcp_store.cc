#include "parallel/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "parallel/internal/fd.h"

namespace plait::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using internal::AppendLittleEndian;
using internal::ErrnoText;
using internal::Fd;
using internal::GetLittleEndian;
using tcp_store_wire::kHeaderBytes;
using tcp_store_wire::kHelloBytes;

// The first bytes of a hello; a connection whose first bytes differ is closed at once.
constexpr char kHelloMagic[8] = {'p', 'l', 'a', 'i', 't', 'k', 'v', '1'};
constexpr uint32_t kProtocolVersion = 1;
// Where the token's length and the padded token sit in a hello.
constexpr size_t kTokenOffset = sizeof(kHelloMagic) + 4;

// Request kinds (tcp_store_wire::kSet is 1) and reply kinds.
enum : uint32_t { kGet = 2, kAdd = 3, kCompareSet = 4, kDelete = 5, kCheck = 6, kNumKeys = 7 };
enum : uint32_t { kOk = 0, kMissing = 1, kFailed = 2, kRefused = 3 };

// How much the server reads from one connection at a time.
constexpr size_t kReadChunk = 64 * 1024;
constexpr int kListenBacklog = 128;
// How long the server stops accepting after the process ran out of file descriptors.
constexpr std::chrono::milliseconds kAcceptPause(100);
// A client waiting for a key asks again after 1 ms, then twice as long each time up to this.
constexpr std::chrono::milliseconds kMaxPollInterval(32);

// A point on the steady clock `timeout` after `since`; never, for c10d's kNoTimeout.
class Deadline {
 public:
  Deadline(Clock::time_point since, std::chrono::milliseconds timeout)
      : never_(timeout == c10d::Store::kNoTimeout), at_(since + timeout) {}

  bool Passed() const { return !never_ && Clock::now() >= at_; }
  // For poll: -1 for never, else the milliseconds left, rounded up.
  int PollMs() const {
    if (never_) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(at_ - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
  }

 private:
  bool never_;
  Clock::time_point at_;
};

struct Header {
  uint32_t kind;
  uint32_t key_bytes;
  uint64_t value_bytes;
  uint64_t second_bytes;
};

Header ParseHeader(const char* in) {
  return {static_cast<uint32_t>(GetLittleEndian(in, 4)),
          static_cast<uint32_t>(GetLittleEndian(in + 4, 4)), GetLittleEndian(in + 8, 8),
          GetLittleEndian(in + 16, 8)};
}

bool WithinLimits(const Header& header) {
  return header.key_bytes <= kMaxKeyBytes && header.value_bytes <= kMaxValueBytes &&
         header.second_bytes <= kMaxValueBytes;
}

std::string Frame(uint32_t kind, absl::string_view key = {}, absl::string_view value = {},
                  absl::string_view second = {}) {
  std::string frame = tcp_store_wire::Header(kind, key.size(), value.size(), second.size());
  absl::StrAppend(&frame, key, value, second);
  return frame;
}

std::string Int64Bytes(int64_t value) {
  std::string bytes;
  AppendLittleEndian(bytes, static_cast<uint64_t>(value), 8);
  return bytes;
}

// The integer an add or key count reply carries.
int64_t Int64Of(absl::string_view bytes) {
  if (bytes.size() != 8) {
    throw std::runtime_error(
        absl::StrCat("the store replied with ", bytes.size(), " bytes where an integer is 8"));
  }
  return static_cast<int64_t>(GetLittleEndian(bytes.data(), 8));
}

absl::string_view Bytes(const std::vector<uint8_t>& value) {
  return {reinterpret_cast<const char*>(value.data()), value.size()};
}

std::vector<uint8_t> ToVector(absl::string_view bytes) { return {bytes.begin(), bytes.end()}; }

// The token as a hello carries it: its length, then the token padded with zeros.
std::string TokenField(absl::string_view token) {
  std::string field;
  AppendLittleEndian(field, token.size(), 4);
  absl::StrAppend(&field, token, std::string(kMaxStoreTokenBytes - token.size(), '\0'));
  return field;
}

// Compares in time that depends only on the length, so timing tells nothing of the token.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= a[i] ^ b[i];
  return difference == 0;
}

std::string DescribeAddress(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(v6->sin6_port));
  }
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
  inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(v4->sin_port));
}

sockaddr_storage LocalAddress(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return address;
}

bool IsWildcard(const sockaddr* address) {
  if (address->sa_family == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  }
  return reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr == htonl(INADDR_ANY);
}

using AddressList = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

absl::StatusOr<AddressList> Resolve(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int error = getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", address, "\": ", gai_strerror(error)));
  }
  return AddressList(list, &freeaddrinfo);
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// --- Server ------------------------------------------------------------------------------

struct Connection {
  explicit Connection(int fd)
      : fd(fd), hello_deadline(Clock::now() + absl::ToChronoNanoseconds(kHelloTimeout)) {}

  Fd fd;
  Clock::time_point hello_deadline;
  bool authenticated = false;
  bool dropped = false;
  std::string in;   // received, not yet handled: at most one frame and one read
  std::string out;  // the reply being sent; nothing more is read until it is
  size_t sent = 0;  // of `out`
};

// The server thread's state and work. It polls every socket and never blocks on one, and
// reads from a connection only while it owes it no reply, so each holds at most one
// bounded frame in and one reply out.
class ServerLoop {
 public:
  ServerLoop(int listener, int wake, std::string token_field, size_t max_connections,
             std::shared_ptr<TcpStoreServer::RefusalLog> refusals)
      : listener_(listener),
        wake_(wake),
        token_field_(std::move(token_field)),
        max_connections_(max_connections),
        refusals_(std::move(refusals)) {}

  void Run();

 private:
  void Accept();
  bool Service(Connection& connection, short events);
  bool Receive(Connection& connection);
  bool CheckHello(Connection& connection);
  bool HandleBuffered(Connection& connection);
  bool Handle(const Header& header, const char* payload, std::string& reply);
  std::string Add(const std::string& key, absl::string_view delta);
  std::string CompareSet(const std::string& key, absl::string_view expected,
                         absl::string_view desired);

  const int listener_;
  const int wake_;
  const std::string token_field_;
  const size_t max_connections_;
  const std::shared_ptr<TcpStoreServer::RefusalLog> refusals_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::unordered_map<std::string, std::string> keys_;
  Clock::time_point accept_resumes_;  // accepting pauses until then after running out of fds
};

void ServerLoop::Run() {
  std::vector<pollfd> fds;
  for (;;) {
    // While the process is out of descriptors, the listener stays readable but accepts
    // nothing: it is left out of the poll until the pause ends, rather than spun on.
    const bool accepting = Clock::now() >= accept_resumes_;
    fds.assign({{wake_, POLLIN, 0}, {listener_, static_cast<short>(accepting ? POLLIN : 0), 0}});
    std::optional<Clock::time_point> next_hello_deadline;
    if (!accepting) next_hello_deadline = accept_resumes_;
    for (const auto& connection : connections_) {
      const short events = connection->out.empty() ? POLLIN : POLLOUT;
      fds.push_back({connection->fd.get(), events, 0});
      if (!connection->authenticated) {
        next_hello_deadline = std::min(next_hello_deadline.value_or(Clock::time_point::max()),
                                       connection->hello_deadline);
      }
    }
    int timeout_ms = -1;
    if (next_hello_deadline.has_value()) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, std::chrono::ceil<std::chrono::milliseconds>(*next_hello_deadline - Clock::now())
                 .count()));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      std::cerr << "tcp_store: the server stops: " << ErrnoText("poll") << "\n";
      return;
    }
    if (fds[0].revents != 0) return;
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection& connection = *connections_[i];
      if (fds[i + 2].revents != 0 && !Service(connection, fds[i + 2].revents)) {
        connection.dropped = true;
      }
      if (!connection.authenticated && now >= connection.hello_deadline) connection.dropped = true;
    }
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [](const auto& connection) { return connection->dropped; }),
                       connections_.end());
    if (fds[1].revents != 0) Accept();
  }
}

void ServerLoop::Accept() {
  for (;;) {
    Fd fd(accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_resumes_ = Clock::now() + kAcceptPause;
      }
      return;  // none left, or one that failed: the next poll says
    }
    if (connections_.size() >= max_connections_) continue;  // closed as it arrived
    SetNoDelay(fd.get());
    connections_.push_back(std::make_unique<Connection>(fd.release()));
  }
}

// Reads what is there, then handles requests and sends replies until a reply waits for room
// in the socket or no complete request is left. False when the connection is to be dropped.
bool ServerLoop::Service(Connection& connection, short events) {
  if ((events & (POLLERR | POLLNVAL)) != 0) return false;
  if (connection.out.empty() && !Receive(connection)) return false;
  for (;;) {
    if (!HandleBuffered(connection)) return false;
    if (connection.out.empty()) return true;
    while (connection.sent < connection.out.size()) {
      const ssize_t n = send(connection.fd.get(), connection.out.data() + connection.sent,
                             connection.out.size() - connection.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      connection.sent += static_cast<size_t>(n);
    }
    connection.out.clear();
    connection.sent = 0;
  }
}

bool ServerLoop::Receive(Connection& connection) {
  // Before the hello is complete, nothing past it is read.
  const size_t want = connection.authenticated ? kReadChunk : kHelloBytes - connection.in.size();
  char buffer[kReadChunk];
  const ssize_t n = recv(connection.fd.get(), buffer, want, 0);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  connection.in.append(buffer, static_cast<size_t>(n));
  return connection.authenticated || CheckHello(connection);
}

bool ServerLoop::CheckHello(Connection& connection) {
  const absl::string_view hello = connection.in;
  const absl::string_view magic(kHelloMagic, sizeof(kHelloMagic));
  // Not this protocol (a port scanner, a web client): closed as soon as its first bytes show it.
  const size_t shown = std::min(hello.size(), magic.size());
  if (hello.substr(0, shown) != magic.substr(0, shown)) return false;
  if (hello.size() < kHelloBytes) return true;
  const uint64_t version = GetLittleEndian(hello.data() + sizeof(kHelloMagic), 4);
  const bool other_version = version != kProtocolVersion;
  if (other_version || !SameSecret(hello.substr(kTokenOffset), token_field_)) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    std::string who =
        getpeername(connection.fd.get(), reinterpret_cast<sockaddr*>(&peer), &length) == 0
            ? DescribeAddress(reinterpret_cast<const sockaddr*>(&peer))
            : "a client";
    if (other_version) absl::StrAppend(&who, " speaking version ", version);
    {
      std::lock_guard<std::mutex> lock(refusals_->mutex);
      refusals_->refusals.Record(
          other_version ? StoreRefusals::kOtherVersion : StoreRefusals::kWrongToken,
          std::move(who));
    }
    // Best effort: a fresh socket has room for it, and the connection closes either way.
    const std::string frame =
        Frame(kRefused, {},
              other_version ? absl::StrCat("protocol version ", version,
                                           "; this server speaks version ", kProtocolVersion)
                            : "wrong token");
    [[maybe_unused]] ssize_t n =
        send(connection.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return false;
  }
  connection.authenticated = true;
  connection.in.clear();
  connection.out = Frame(kOk);
  return true;
}

// Handles the complete requests in `in` while no reply is pending; false when a header
// breaks the protocol, which is known before its payload is read or allocated.
bool ServerLoop::HandleBuffered(Connection& connection) {
  while (connection.authenticated && connection.out.empty() &&
         connection.in.size() >= kHeaderBytes) {
    const Header header = ParseHeader(connection.in.data());
    if (header.kind < tcp_store_wire::kSet || header.kind > kNumKeys || !WithinLimits(header)) {
      return false;
    }
    const size_t frame_bytes =
        kHeaderBytes + header.key_bytes + header.value_bytes + header.second_bytes;
    if (connection.in.size() < frame_bytes) return true;
    if (!Handle(header, connection.in.data() + kHeaderBytes, connection.out)) return false;
    connection.in.erase(0, frame_bytes);
  }
  return true;
}

bool ServerLoop::Handle(const Header& header, const char* payload, std::string& reply) {
  const std::string key(payload, header.key_bytes);
  const absl::string_view value(payload + header.key_bytes, header.value_bytes);
  const absl::string_view second(value.end(), header.second_bytes);
  const auto found = keys_.find(key);
  switch (header.kind) {
    case tcp_store_wire::kSet:
      keys_[key] = std::string(value);
      reply = Frame(kOk);
      return true;
    case kGet:
      reply = found == keys_.end() ? Frame(kMissing) : Frame(kOk, {}, found->second);
      return true;
    case kCheck:
      reply = Frame(found == keys_.end() ? kMissing : kOk);
      return true;
    case kDelete:
      reply = Frame(keys_.erase(key) == 1 ? kOk : kMissing);
      return true;
    case kNumKeys:
      reply = Frame(kOk, {}, Int64Bytes(static_cast<int64_t>(keys_.size())));
      return true;
    case kAdd:
      if (value.size() != 8) return false;
      reply = Add(key, value);
      return true;
    case kCompareSet:
      reply = CompareSet(key, value, second);
      return true;
  }
  return false;
}

std::string ServerLoop::Add(const std::string& key, absl::string_view delta) {
  std::string& text = keys_[key];
  int64_t sum = 0;
  if (!text.empty() && !absl::SimpleAtoi(text, &sum)) {
    return Frame(kFailed, {}, absl::StrCat("add: store key '", key, "' does not hold an integer"));
  }
  // Wraps on overflow, rather than undefined behaviour.
  sum = static_cast<int64_t>(static_cast<uint64_t>(sum) + GetLittleEndian(delta.data(), 8));
  text = std::to_string(sum);
  return Frame(kOk, {}, Int64Bytes(sum));
}

std::string ServerLoop::CompareSet(const std::string& key, absl::string_view expected,
                                   absl::string_view desired) {
  const auto found = keys_.find(key);
  if (found == keys_.end()) {
    if (!expected.empty()) return Frame(kOk, {}, expected);
    keys_[key] = std::string(desired);
    return Frame(kOk, {}, desired);
  }
  if (found->second == expected) found->second = std::string(desired);
  return Frame(kOk, {}, found->second);
}

// --- Client I/O ------------------------------------------------------------------------------

// Waits until `fd` is ready for `events`; DeadlineExceeded when the deadline passes first.
absl::Status AwaitReady(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = poll(&entry, 1, deadline.PollMs());
    if (ready > 0) return absl::OkStatus();
    if (ready == 0) return absl::DeadlineExceededError("the store's timeout passed");
    if (errno != EINTR) return absl::UnavailableError(ErrnoText("poll"));
  }
}

absl::Status SendAll(int fd, absl::string_view data, const Deadline& deadline) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (errno == EAGAIN) {
      PLAIT_RETURN_IF_ERROR(AwaitReady(fd, POLLOUT, deadline));
    } else if (errno != EINTR) {
      return absl::UnavailableError(ErrnoText("send"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReceiveExactly(int fd, char* data, size_t size, const Deadline& deadline) {
  while (size > 0) {
    const ssize_t n = recv(fd, data, size, MSG_DONTWAIT);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      return absl::UnavailableError("the server closed the connection");
    } else if (errno == EAGAIN) {
      PLAIT_RETURN_IF_ERROR(AwaitReady(fd, POLLIN, deadline));
    } else if (errno != EINTR) {
      return absl::UnavailableError(ErrnoText("recv"));
    }
  }
  return absl::OkStatus();
}

// A connected socket to the first of `address`'s addresses that accepts.
absl::StatusOr<Fd> OpenConnection(const std::string& address, int port, const Deadline& deadline) {
  PLAIT_ASSIGN_OR_RETURN(AddressList list, Resolve(address, port));
  absl::Status last;
  for (const addrinfo* entry = list.get(); entry != nullptr; entry = entry->ai_next) {
    Fd fd(socket(entry->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return absl::UnavailableError(ErrnoText("socket"));
    if (connect(fd.get(), entry->ai_addr, entry->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = absl::UnavailableError(ErrnoText("connect"));
        continue;
      }
      last = AwaitReady(fd.get(), POLLOUT, deadline);
      if (!last.ok()) continue;
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        errno = error;
        last = absl::UnavailableError(ErrnoText("connect"));
        continue;
      }
    }
    SetNoDelay(fd.get());
    return fd;
  }
  return last;
}

}  // namespace

namespace tcp_store_wire {

std::string Hello(absl::string_view token) {
  std::string hello(kHelloMagic, sizeof(kHelloMagic));
  AppendLittleEndian(hello, kProtocolVersion, 4);
  return hello + TokenField(token);
}

std::string Header(uint32_t kind, uint64_t key_bytes, uint64_t value_bytes, uint64_t second_bytes) {
  std::string header;
  AppendLittleEndian(header, kind, 4);
  AppendLittleEndian(header, key_bytes, 4);
  AppendLittleEndian(header, value_bytes, 8);
  AppendLittleEndian(header, second_bytes, 8);
  return header;
}

}  // namespace tcp_store_wire

// --- StoreRefusals -------------------------------------------------------------------------

void StoreRefusals::Record(Reason reason, std::string client) {
  Tally& tally = tallies[reason];
  ++tally.count;
  if (tally.first.size() < kAddressesKept) tally.first.push_back(std::move(client));
}

int64_t StoreRefusals::total() const {
  int64_t total = 0;
  for (const Tally& tally : tallies) total += tally.count;
  return total;
}

std::string StoreRefusals::Summary() const {
  static constexpr const char* kReasonNames[kReasons] = {"wrong token", "another protocol version"};
  std::vector<std::string> parts;
  for (int reason = 0; reason < kReasons; ++reason) {
    const Tally& tally = tallies[reason];
    if (tally.count == 0) continue;
    parts.push_back(absl::StrCat(
        tally.count, " ", kReasonNames[reason], " (first: ", absl::StrJoin(tally.first, ", "),
        tally.count > static_cast<int64_t>(tally.first.size()) ? ", ...)" : ")"));
  }
  if (parts.empty()) return "";
  const int64_t count = total();
  return absl::StrCat(count, count == 1 ? " client" : " clients",
                      " refused: ", absl::StrJoin(parts, ", "));
}

// --- TcpStoreServer ------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& address,
                                                                      int port,
                                                                      const std::string& token,
                                                                      int max_connections) {
  if (token.size() < kMinStoreTokenBytes || token.size() > kMaxStoreTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the store token has ", token.size(),
                                                   " characters; it needs ", kMinStoreTokenBytes,
                                                   " to ", kMaxStoreTokenBytes));
  }
  if (max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections=", max_connections, " must be >= 1"));
  }
  PLAIT_ASSIGN_OR_RETURN(AddressList list, Resolve(address, port));
  std::string last_error;
  for (const addrinfo* entry = list.get(); entry != nullptr; entry = entry->ai_next) {
    if (IsWildcard(entry->ai_addr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", address,
                       "\" is a wildcard address, which would listen on every interface; give "
                       "the address the other ranks reach this one at"));
    }
    Fd listener(socket(entry->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (listener.get() < 0) return absl::UnavailableError(ErrnoText("socket"));
    // A restarted job may bind the port while the last job's connections linger in TIME_WAIT.
    const int one = 1;
    setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(listener.get(), entry->ai_addr, entry->ai_addrlen) != 0 ||
        listen(listener.get(), kListenBacklog) != 0) {
      last_error = ErrnoText(absl::StrCat("listening on ", DescribeAddress(entry->ai_addr)));
      continue;
    }
    Fd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (wake.get() < 0) return absl::UnavailableError(ErrnoText("eventfd"));
    return std::unique_ptr<TcpStoreServer>(
        new TcpStoreServer(listener.release(), wake.release(), token, max_connections));
  }
  return absl::UnavailableError(last_error);
}

TcpStoreServer::TcpStoreServer(int listener, int wake, std::string token, int max_connections)
    : listener_(listener), wake_(wake) {
  thread_ = std::thread([loop = ServerLoop(listener, wake, TokenField(token), max_connections,
                                           refusals_)]() mutable { loop.Run(); });
}

StoreRefusals TcpStoreServer::Refusals() const {
  std::lock_guard<std::mutex> lock(refusals_->mutex);
  return refusals_->refusals;
}

TcpStoreServer::~TcpStoreServer() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_, &one, sizeof(one));
  thread_.join();
  close(listener_);
  close(wake_);
}

int TcpStoreServer::port() const {
  const sockaddr_storage address = LocalAddress(listener_);
  return ntohs(address.ss_family == AF_INET6
                   ? reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port
                   : reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
}

std::string TcpStoreServer::BoundAddress() const {
  const sockaddr_storage address = LocalAddress(listener_);
  return DescribeAddress(reinterpret_cast<const sockaddr*>(&address));
}

bool TcpStoreServer::ListensOnLoopback() const {
  const sockaddr_storage address = LocalAddress(listener_);
  if (address.ss_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr);
  }
  return (ntohl(reinterpret_cast<const sockaddr_in*>(&address)->sin_addr.s_addr) >> 24) == 127;
}

// --- TcpStore ------------------------------------------------------------------------------

struct TcpStore::Reply {
  uint32_t kind;
  std::string value;
};

namespace {

// Reads one reply, its header checked before its value is allocated.
absl::Status ReceiveReply(int fd, const Deadline& deadline, uint32_t& kind, std::string& value) {
  char header_bytes[kHeaderBytes];
  PLAIT_RETURN_IF_ERROR(ReceiveExactly(fd, header_bytes, kHeaderBytes, deadline));
  const Header header = ParseHeader(header_bytes);
  if (header.kind > kRefused || header.key_bytes != 0 || header.second_bytes != 0 ||
      header.value_bytes > kMaxValueBytes) {
    return absl::DataLossError("the server sent a malformed reply");
  }
  kind = header.kind;
  value.resize(header.value_bytes);
  return ReceiveExactly(fd, value.data(), value.size(), deadline);
}

// Says hello on a fresh connection; PermissionDenied when the server refuses it.
absl::Status Greet(int fd, const std::string& token, const std::string& server,
                   const Deadline& deadline) {
  PLAIT_RETURN_IF_ERROR(SendAll(fd, tcp_store_wire::Hello(token), deadline));
  uint32_t kind = 0;
  std::string message;
  PLAIT_RETURN_IF_ERROR(ReceiveReply(fd, deadline, kind, message));
  if (kind == kOk) return absl::OkStatus();
  if (kind == kRefused) {
    return absl::PermissionDeniedError(
        absl::StrCat("the store at ", server, " refused this client: ", message));
  }
  return absl::DataLossError(absl::StrCat("the store at ", server, " answered hello oddly"));
}

std::chrono::milliseconds ToMilliseconds(absl::Duration duration) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(duration)));
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<TcpStore>> TcpStore::Connect(const std::string& address, int port,
                                                               const std::string& token,
                                                               absl::Duration timeout) {
  if (token.size() > kMaxStoreTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the store token has ", token.size(),
                                                   " characters; at most ", kMaxStoreTokenBytes));
  }
  const std::string server = absl::StrCat(address, ":", port);
  const Deadline deadline(Clock::now(), ToMilliseconds(timeout));
  std::chrono::milliseconds pause(10);
  absl::Status last;
  for (;;) {
    absl::StatusOr<Fd> fd = OpenConnection(address, port, deadline);
    if (fd.ok()) {
      last = Greet(fd->get(), token, server, deadline);
      if (last.ok()) {
        // make_intrusive cannot reach the private constructor.
        return c10::intrusive_ptr<TcpStore>::unsafe_steal_from_new(
            new TcpStore(fd->release(), address, port, token, ToMilliseconds(timeout)));
      }
      if (absl::IsPermissionDenied(last)) return last;
    } else {
      last = fd.status();
    }
    // The server may not be up yet, or may be full: try again until the deadline.
    if (deadline.Passed()) {
      return absl::DeadlineExceededError(absl::StrCat("no store answered at ", server, " within ",
                                                      absl::FormatDuration(timeout), " (",
                                                      last.message(), ")"));
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::milliseconds>(pause, std::chrono::milliseconds(deadline.PollMs())));
    pause = std::min(2 * pause, std::chrono::milliseconds(200));
  }
}

absl::StatusOr<c10::intrusive_ptr<TcpStore>> TcpStore::Host(const std::string& address, int port,
                                                            const std::string& token,
                                                            int max_connections,
                                                            absl::Duration timeout) {
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreServer> server,
                         TcpStoreServer::Start(address, port, token, max_connections));
  PLAIT_ASSIGN_OR_RETURN(c10::intrusive_ptr<TcpStore> store,
                         Connect(address, server->port(), token, timeout));
  store->server_ = std::move(server);
  return store;
}

TcpStore::TcpStore(int socket, std::string address, int port, std::string token,
                   std::chrono::milliseconds timeout)
    : base::CompatStore(timeout),
      socket_(socket),
      address_(std::move(address)),
      port_(port),
      token_(std::move(token)),
      server_address_(absl::StrCat(address_, ":", port_)) {}

TcpStore::~TcpStore() {
  if (socket_ >= 0) close(socket_);
}

c10::intrusive_ptr<c10d::Store> TcpStore::Clone() {
  absl::StatusOr<c10::intrusive_ptr<TcpStore>> clone =
      Connect(address_, port_, token_, absl::FromChrono(timeout_));
  if (!clone.ok()) {
    throw std::runtime_error(
        absl::StrCat("cloning the store at ", server_address_, ": ", clone.status().message()));
  }
  return *std::move(clone);
}

TcpStore::Reply TcpStore::Call(uint32_t op, absl::string_view key, absl::string_view value,
                               absl::string_view second) {
  if (key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes ||
      second.size() > kMaxValueBytes) {
    throw std::invalid_argument(absl::StrCat(
        "store key '", key.substr(0, 64), key.size() > 64 ? "...' (" : "' (", key.size(),
        " bytes) or its value (", std::max(value.size(), second.size()),
        " bytes) is over the store's limit of ", kMaxKeyBytes, " and ", kMaxValueBytes, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (socket_ >= 0) {
    const Deadline deadline(Clock::now(), timeout_);
    Reply reply;
    absl::Status status = SendAll(socket_, Frame(op, key, value, second), deadline);
    if (status.ok()) status = ReceiveReply(socket_, deadline, reply.kind, reply.value);
    if (status.ok() && reply.kind == kFailed) {
      throw std::runtime_error(absl::StrCat("the store at ", server_address_, ": ", reply.value));
    }
    if (status.ok()) return reply;
    // A reply may still be on its way: the connection cannot be trusted with another request.
    lost_ = std::string(status.message());
    close(socket_);
    socket_ = -1;
  }
  throw std::runtime_error(absl::StrCat("lost the store at ", server_address_, " (", lost_,
                                        ") while using key '", key, "'"));
}

TcpStore::Reply TcpStore::Await(uint32_t op, const std::string& key,
                                std::chrono::milliseconds timeout, Clock::time_point since) {
  const Deadline deadline(since, timeout);
  std::chrono::milliseconds pause(1);
  for (;;) {
    Reply reply = Call(op, key);
    if (reply.kind != kMissing) return reply;
    if (deadline.Passed()) {
      throw std::runtime_error(
          absl::StrCat("timed out after ", absl::FormatDuration(absl::FromChrono(timeout)),
                       " waiting for store key '", key, "' at ", server_address_));
    }
    const int left_ms = deadline.PollMs();
    std::this_thread::sleep_for(left_ms < 0 ? pause
                                            : std::min(pause, std::chrono::milliseconds(left_ms)));
    pause = std::min(2 * pause, kMaxPollInterval);
  }
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Call(tcp_store_wire::kSet, key, Bytes(value));
}

std::vector<uint8_t> TcpStore::compareSet(const std::string& key,
                                          const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return ToVector(Call(kCompareSet, key, Bytes(expected), Bytes(desired)).value);
}

std::vector<uint8_t> TcpStore::get(const std::string& key) {
  return ToVector(Await(kGet, key, timeout_, Clock::now()).value);
}

int64_t TcpStore::add(const std::string& key, int64_t value) {
  return Int64Of(Call(kAdd, key, Int64Bytes(value)).value);
}

bool TcpStore::deleteKey(const std::string& key) { return Call(kDelete, key).kind == kOk; }

bool TcpStore::check(const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(),
                     [this](const std::string& key) { return Call(kCheck, key).kind == kOk; });
}

int64_t TcpStore::getNumKeys() { return Int64Of(Call(kNumKeys, {}).value); }

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  const Clock::time_point since = Clock::now();
  for (const std::string& key : keys) Await(kCheck, key, timeout, since);
}

}  // namespace plait::parallel
