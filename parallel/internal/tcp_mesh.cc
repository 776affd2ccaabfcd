#include "parallel/internal/tcp_mesh.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "parallel/internal/fd.h"

namespace plait::parallel::internal {
namespace {

// A hello is the magic, the connecting rank (4 bytes) and the secret the listening rank
// published; a connection whose hello differs is closed unheard.
constexpr char kHelloMagic[8] = {'p', 'l', 'a', 'i', 't', 'm', 's', 'h'};
constexpr size_t kSecretBytes = 16;
constexpr size_t kHelloBytes = sizeof(kHelloMagic) + 4 + kSecretBytes;
// How long an accepted connection has to say hello before it is dropped as a stray one.
constexpr absl::Duration kHelloTimeout = absl::Seconds(3);
// Every transfer starts with its tag and its size in bytes (8 bytes each, little-endian).
constexpr size_t kFrameHeaderBytes = 16;

// For poll: the milliseconds left until `deadline`, rounded up; 0 once it has passed.
int PollMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// Waits for `events` on `fd` until `deadline`; false when it passed first.
absl::StatusOr<bool> PollOne(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = poll(&entry, 1, PollMs(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return absl::InternalError(ErrnoText("poll"));
  }
}

// Moves `bytes` bytes on the non-blocking `fd` (send when `out`, else receive) by `deadline`.
absl::Status MoveAll(int fd, char* data, size_t bytes, bool out, absl::Time deadline) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = out ? send(fd, data + done, bytes - done, MSG_NOSIGNAL)
                          : recv(fd, data + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("the connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(ErrnoText(out ? "send" : "recv"));
    }
    PLAIT_ASSIGN_OR_RETURN(const bool ready, PollOne(fd, out ? POLLOUT : POLLIN, deadline));
    if (!ready) return absl::DeadlineExceededError("timed out");
  }
  return absl::OkStatus();
}

// A non-blocking socket listening on `address` at a port the kernel picks.
absl::StatusOr<std::pair<Fd, int>> Listen(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(address.c_str(), "0", &hints, &found); error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on '", address, "': ", gai_strerror(error)));
  }
  std::string last = "no address";
  for (const addrinfo* candidate = found; candidate != nullptr; candidate = candidate->ai_next) {
    Fd fd(socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.get() < 0 || bind(fd.get(), candidate->ai_addr, candidate->ai_addrlen) != 0 ||
        listen(fd.get(), SOMAXCONN) != 0) {
      last = ErrnoText(fd.get() < 0 ? "socket" : "bind/listen");
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      last = ErrnoText("getsockname");
      continue;
    }
    const int port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(found);
    return std::make_pair(std::move(fd), port);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot listen on '", address, "': ", last));
}

// A non-blocking connection to `host`:`port`, made by `deadline`.
absl::StatusOr<Fd> Dial(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(error)));
  }
  std::string last = "no address";
  for (const addrinfo* candidate = found; candidate != nullptr; candidate = candidate->ai_next) {
    Fd fd(socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.get() < 0) {
      last = ErrnoText("socket");
      continue;
    }
    if (connect(fd.get(), candidate->ai_addr, candidate->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = ErrnoText("connect");
        continue;
      }
      absl::StatusOr<bool> ready = PollOne(fd.get(), POLLOUT, deadline);
      int error = 0;
      socklen_t length = sizeof(error);
      if (!ready.ok() || !*ready ||
          getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
        last = !ready.ok()  ? std::string(ready.status().message())
               : !*ready    ? "timed out"
               : error != 0 ? absl::StrCat("connect: ", std::strerror(error))
                            : ErrnoText("getsockopt");
        continue;
      }
    }
    freeaddrinfo(found);
    return fd;
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot connect to ", host, ":", port, ": ", last));
}

std::string RandomSecret() {
  std::random_device device;  // the kernel's random source on Linux
  std::string secret(kSecretBytes, '\0');
  for (char& byte : secret) byte = static_cast<char>(device());
  return secret;
}

std::string Hello(int rank, const std::string& secret) {
  std::string hello(kHelloBytes, '\0');
  std::memcpy(hello.data(), kHelloMagic, sizeof(kHelloMagic));
  PutLittleEndian(hello.data() + sizeof(kHelloMagic), static_cast<uint32_t>(rank), 4);
  std::memcpy(hello.data() + sizeof(kHelloMagic) + 4, secret.data(), kSecretBytes);
  return hello;
}

// What a rank publishes in the store: "host\nport\nsecret in hex".
struct Published {
  std::string host;
  int port = 0;
  std::string secret;
};

absl::StatusOr<Published> ParsePublished(const std::vector<uint8_t>& value) {
  const std::vector<std::string> parts =
      absl::StrSplit(std::string(value.begin(), value.end()), '\n');
  Published published;
  if (parts.size() == 3 && absl::SimpleAtoi(parts[1], &published.port)) {
    published.host = parts[0];
    published.secret = absl::HexStringToBytes(parts[2]);
    if (published.secret.size() == kSecretBytes) return published;
  }
  return absl::DataLossError("its entry in the store is malformed");
}

std::chrono::milliseconds StoreTimeout(absl::Time deadline) {
  return std::chrono::milliseconds(std::max(1, PollMs(deadline)));
}

// Accepts connections on `listener` until every rank above `rank` has said hello with
// `secret`; connections that do not are dropped.
absl::Status AcceptHigherRanks(int listener, int rank, const std::string& secret,
                               absl::Time deadline, std::vector<Fd>& sockets) {
  const int size = static_cast<int>(sockets.size());
  for (int waiting = size - 1 - rank; waiting > 0;) {
    PLAIT_ASSIGN_OR_RETURN(const bool ready, PollOne(listener, POLLIN, deadline));
    if (!ready) {
      std::vector<int> missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (sockets[peer].get() < 0) missing.push_back(peer);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("rank(s) ", absl::StrJoin(missing, ", "), " never connected"));
    }
    Fd fd(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) continue;  // the connection went away again
    char hello[kHelloBytes];
    if (!MoveAll(fd.get(), hello, kHelloBytes, /*out=*/false,
                 std::min(deadline, absl::Now() + kHelloTimeout))
             .ok() ||
        std::memcmp(hello, kHelloMagic, sizeof(kHelloMagic)) != 0 ||
        std::memcmp(hello + sizeof(kHelloMagic) + 4, secret.data(), kSecretBytes) != 0) {
      continue;
    }
    const int peer = static_cast<int>(GetLittleEndian(hello + sizeof(kHelloMagic), 4));
    if (peer <= rank || peer >= size || sockets[peer].get() >= 0) continue;
    sockets[peer] = std::move(fd);
    --waiting;
  }
  return absl::OkStatus();
}

// One peer's part of an Exchange: a frame to send and/or one to receive.
struct Peer {
  int rank = -1;
  int fd = -1;
  bool sending = false;
  char send_header[kFrameHeaderBytes] = {};
  const char* send_data = nullptr;
  size_t send_bytes = 0;
  size_t sent = 0;  // of header and data together
  bool receiving = false;
  char recv_header[kFrameHeaderBytes] = {};
  char* recv_data = nullptr;
  size_t recv_bytes = 0;
  size_t received = 0;  // of header and data together
};

// Sends what the socket takes now of `peer`'s frame.
absl::Status SendSome(Peer& peer) {
  iovec parts[2];
  int count = 0;
  if (peer.sent < kFrameHeaderBytes) {
    parts[count++] = {peer.send_header + peer.sent, kFrameHeaderBytes - peer.sent};
  }
  const size_t data_done = peer.sent > kFrameHeaderBytes ? peer.sent - kFrameHeaderBytes : 0;
  if (data_done < peer.send_bytes) {
    parts[count++] = {const_cast<char*>(peer.send_data) + data_done, peer.send_bytes - data_done};
  }
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = count;
  const ssize_t n = sendmsg(peer.fd, &message, MSG_NOSIGNAL);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return absl::OkStatus();
    return absl::UnavailableError(ErrnoText("send"));
  }
  peer.sent += static_cast<size_t>(n);
  if (peer.sent == kFrameHeaderBytes + peer.send_bytes) peer.sending = false;
  return absl::OkStatus();
}

// Receives what has arrived of `peer`'s frame, checking its header against `tag` and the
// expected size.
absl::Status ReceiveSome(uint64_t tag, Peer& peer) {
  const bool in_header = peer.received < kFrameHeaderBytes;
  char* into = in_header ? peer.recv_header + peer.received
                         : peer.recv_data + (peer.received - kFrameHeaderBytes);
  const size_t want = in_header ? kFrameHeaderBytes - peer.received
                                : peer.recv_bytes - (peer.received - kFrameHeaderBytes);
  const ssize_t n = recv(peer.fd, into, want, 0);
  if (n == 0)
    return absl::UnavailableError(absl::StrCat("rank ", peer.rank, " closed the connection"));
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return absl::OkStatus();
    return absl::UnavailableError(ErrnoText("recv"));
  }
  peer.received += static_cast<size_t>(n);
  if (in_header && peer.received == kFrameHeaderBytes) {
    const uint64_t their_tag = GetLittleEndian(peer.recv_header, 8);
    const uint64_t their_bytes = GetLittleEndian(peer.recv_header + 8, 8);
    // The tags are the callers' (RingCommunicator's are hashes): a mismatch is named, not
    // printed.
    if (their_tag != tag) {
      return absl::UnavailableError(
          absl::StrCat("rank ", peer.rank,
                       " sent another transfer than this rank expects (the ranks called "
                       "different collectives, or in another order)"));
    }
    if (their_bytes != peer.recv_bytes) {
      return absl::UnavailableError(
          absl::StrCat("rank ", peer.rank, " sent ", their_bytes, " bytes as transfer ", tag,
                       " where this rank expects ", peer.recv_bytes,
                       " bytes (the ranks called the same collective on different sizes)"));
    }
  }
  if (peer.received == kFrameHeaderBytes + peer.recv_bytes) peer.receiving = false;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpMesh>> TcpMesh::Connect(c10d::Store& store,
                                                          const std::string& prefix, int rank,
                                                          int size, const std::string& address,
                                                          absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  PLAIT_ASSIGN_OR_RETURN(auto listening, Listen(address));
  const std::string secret = RandomSecret();
  std::vector<Fd> sockets(size);
  try {
    const std::string published =
        absl::StrCat(address, "\n", listening.second, "\n", absl::BytesToHexString(secret));
    store.set(absl::StrCat(prefix, rank), std::vector<uint8_t>(published.begin(), published.end()));
    // Each rank dials the ranks below it and accepts the ones above it.
    for (int peer = 0; peer < rank; ++peer) {
      const std::string key = absl::StrCat(prefix, peer);
      std::vector<uint8_t> value;
      try {
        store.wait({key}, StoreTimeout(deadline));
        value = store.get(key);
      } catch (const std::exception& error) {
        return absl::DeadlineExceededError(absl::StrCat("rank ", peer, " did not appear within ",
                                                        absl::FormatDuration(timeout), " (",
                                                        error.what(), ")"));
      }
      PLAIT_ASSIGN_OR_RETURN(const Published to,
                             base::Annotate(ParsePublished(value), absl::StrCat("rank ", peer)));
      PLAIT_ASSIGN_OR_RETURN(sockets[peer], base::Annotate(Dial(to.host, to.port, deadline),
                                                           absl::StrCat("reaching rank ", peer)));
      std::string hello = Hello(rank, to.secret);
      PLAIT_RETURN_IF_ERROR(base::Annotate(
          MoveAll(sockets[peer].get(), hello.data(), hello.size(), /*out=*/true, deadline),
          absl::StrCat("greeting rank ", peer)));
    }
  } catch (const std::exception& error) {
    // c10d's stores report a lost server as an exception.
    return absl::UnavailableError(absl::StrCat("the store failed: ", error.what()));
  }
  PLAIT_RETURN_IF_ERROR(AcceptHigherRanks(listening.first.get(), rank, secret, deadline, sockets));
  std::vector<int> fds(size, -1);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    // Latency matters more than packet count: a barrier's frames are a few bytes.
    const int one = 1;
    setsockopt(sockets[peer].get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fds[peer] = sockets[peer].release();
  }
  return std::unique_ptr<TcpMesh>(new TcpMesh(rank, std::move(fds)));
}

TcpMesh::TcpMesh(int rank, std::vector<int> sockets) : rank_(rank), sockets_(std::move(sockets)) {}

TcpMesh::~TcpMesh() {
  for (const int fd : sockets_) {
    if (fd >= 0) close(fd);
  }
}

absl::Status TcpMesh::Exchange(uint64_t tag, const std::vector<Transfer>& sends,
                               const std::optional<Transfer>& recv, absl::Time deadline) {
  const int size = static_cast<int>(sockets_.size());
  std::vector<Peer> peers;
  const auto peer_entry = [&](int rank) -> absl::StatusOr<Peer*> {
    if (rank < 0 || rank >= size || rank == rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is not a peer of rank ", rank_, " in a group of ", size));
    }
    for (Peer& peer : peers) {
      if (peer.rank == rank) return &peer;
    }
    Peer& peer = peers.emplace_back();
    peer.rank = rank;
    peer.fd = sockets_[rank];
    return &peer;
  };
  peers.reserve(sends.size() + 1);
  for (const Transfer& send : sends) {
    PLAIT_ASSIGN_OR_RETURN(Peer * peer, peer_entry(send.peer));
    if (peer->sending) {
      return absl::InvalidArgumentError(absl::StrCat("two sends to rank ", send.peer));
    }
    peer->sending = true;
    PutLittleEndian(peer->send_header, tag, 8);
    PutLittleEndian(peer->send_header + 8, send.bytes, 8);
    peer->send_data = static_cast<const char*>(send.data);
    peer->send_bytes = send.bytes;
  }
  if (recv.has_value()) {
    PLAIT_ASSIGN_OR_RETURN(Peer * peer, peer_entry(recv->peer));
    peer->receiving = true;
    peer->recv_data = static_cast<char*>(recv->data);
    peer->recv_bytes = recv->bytes;
  }

  std::vector<pollfd> polled;
  std::vector<Peer*> polled_peers;
  for (;;) {
    polled.clear();
    polled_peers.clear();
    for (Peer& peer : peers) {
      const short events = (peer.sending ? POLLOUT : 0) | (peer.receiving ? POLLIN : 0);
      if (events == 0) continue;
      polled.push_back({peer.fd, events, 0});
      polled_peers.push_back(&peer);
    }
    if (polled.empty()) return absl::OkStatus();
    const int ready = poll(polled.data(), polled.size(), PollMs(deadline));
    if (ready < 0 && errno != EINTR) return absl::InternalError(ErrnoText("poll"));
    if (ready == 0) {
      // Name the peer this rank waits on to receive from, if any: the one that is late.
      const auto late = std::find_if(polled_peers.begin(), polled_peers.end(),
                                     [](const Peer* peer) { return peer->receiving; });
      return absl::DeadlineExceededError(absl::StrCat(
          "waiting for rank ", (late != polled_peers.end() ? *late : polled_peers[0])->rank));
    }
    for (size_t i = 0; i < polled.size() && ready > 0; ++i) {
      Peer& peer = *polled_peers[i];
      const short revents = polled[i].revents;
      absl::Status status;
      if (peer.receiving && (revents & (POLLIN | POLLHUP | POLLERR))) {
        status = ReceiveSome(tag, peer);
      }
      if (status.ok() && peer.sending && (revents & (POLLOUT | POLLHUP | POLLERR))) {
        status = SendSome(peer);
      }
      if (!status.ok()) {
        return absl::UnavailableError(
            absl::StrCat("transfer with rank ", peer.rank, " failed: ", status.message()));
      }
    }
  }
}

}  // namespace plait::parallel::internal
