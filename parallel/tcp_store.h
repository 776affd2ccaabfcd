// The key-value store the ranks of a multi-node job meet through: rank 0 hosts a
// TcpStoreServer on the one address it is given, and every rank, rank 0 included, talks to it
// through a TcpStore, the c10d::Store that Gloo and NCCL communicators expect. It replaces
// c10d's TCPStore, which listens on every interface, admits anyone and believes the lengths
// it is sent: a client here first proves with the job's token that it belongs to the job, and
// nothing else it sends is read before that; frames are bounded (kMaxKeyBytes,
// kMaxValueBytes); the server never waits on one client, so a stray connection stalls nobody.
//
//   // rank 0
//   PLAIT_ASSIGN_OR_RETURN(auto store, TcpStore::Host("10.0.0.1", 29500, token,
//                                                     /*max_connections=*/2 * world_size + 16,
//                                                     absl::Minutes(5)));
//   // every other rank
//   PLAIT_ASSIGN_OR_RETURN(auto store,
//                          TcpStore::Connect("10.0.0.1", 29500, token, absl::Minutes(5)));
//
// The token crosses the network in the clear: it keeps out stray and unauthorised clients,
// not an eavesdropper on the job's own network.
#ifndef PLAIT_PARALLEL_TCP_STORE_H_
#define PLAIT_PARALLEL_TCP_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/torch_compat.h"
#include "parallel/world.h"

namespace plait::parallel {

// The store carries addresses and ids, so these are generous; a frame claiming more closes
// its connection before anything is allocated for it.
inline constexpr size_t kMaxKeyBytes = 4 * 1024;
inline constexpr size_t kMaxValueBytes = 16 * 1024 * 1024;

// How long a new connection has to say hello before the server closes it.
inline constexpr absl::Duration kHelloTimeout = absl::Seconds(3);

// What a TcpStoreServer keeps of the clients it refused: a count for each reason and the
// addresses of the first few, so that an error can say who was refused while a flood of
// refused clients costs the server a count each, not memory.
struct StoreRefusals {
  // Addresses kept for each reason: enough to name the nodes of a job started with another
  // token, or where a flood comes from; the counts say how many more there were. With the
  // longest address ("[IPv6]:port", under 64 bytes) the kept text stays under 1 KiB.
  static constexpr size_t kAddressesKept = 4;

  enum Reason { kWrongToken, kOtherVersion, kReasons };
  struct Tally {
    int64_t count = 0;
    // The first kAddressesKept clients, "127.0.0.1:40112" (and for kOtherVersion
    // "127.0.0.1:40112 speaking version 2").
    std::vector<std::string> first;
  };

  void Record(Reason reason, std::string client);
  int64_t total() const;
  // "" when none were refused, else "5 clients refused: 4 wrong token (first: 127.0.0.1:40112,
  // 127.0.0.1:40113, 127.0.0.1:40114, 127.0.0.1:40115, ...), 1 another protocol version
  // (first: 127.0.0.1:40116 speaking version 2)", short however many there were.
  std::string Summary() const;

  Tally tallies[kReasons];
};

// Serves the keys on a background thread from construction until destruction. A client that
// fails the hello only has its own connection closed, and is counted (Refusals).
class TcpStoreServer {
 public:
  // Listens on `address` (a numeric address or a host name, which must resolve to one of
  // this machine's addresses, never a wildcard such as 0.0.0.0) at `port` (0: one the kernel
  // picks, see port()). `token` is the job's secret (kMinStoreTokenBytes to
  // kMaxStoreTokenBytes, world.h); at most `max_connections` are open at once, any more are
  // closed as they arrive.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& address, int port,
                                                               const std::string& token,
                                                               int max_connections);
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  // Stops the thread and closes every socket.
  ~TcpStoreServer();

  int port() const;
  // Where the listening socket is bound, "127.0.0.1:29500" (getsockname).
  std::string BoundAddress() const;
  // Whether that is a loopback address, which no other machine reaches.
  bool ListensOnLoopback() const;

  // The clients refused so far, so that a rendezvous waiting for a rank can say why it may
  // never have arrived.
  StoreRefusals Refusals() const;

  // What the server thread records and Refusals reads.
  struct RefusalLog {
    mutable std::mutex mutex;
    StoreRefusals refusals;
  };

 private:
  TcpStoreServer(int listener, int wake, std::string token, int max_connections);

  const int listener_;
  const int wake_;  // an eventfd the destructor writes to stop the thread
  std::shared_ptr<RefusalLog> refusals_ = std::make_shared<RefusalLog>();
  std::thread thread_;
};

// A client of a TcpStoreServer. Its calls throw std::runtime_error, as c10d::Store's
// interface requires, when the server is lost or the store's timeout passes; errors name the
// key and the server. Safe to share between threads.
class TcpStore final : public base::CompatStore {
 public:
  // Connects to the server at `address`:`port` and says hello with `token`, retrying until
  // the server is up or `timeout` passes (DeadlineExceeded). A server that refuses the token
  // is PermissionDenied at once. `timeout` is then the store's timeout (getTimeout()).
  static absl::StatusOr<c10::intrusive_ptr<TcpStore>> Connect(const std::string& address, int port,
                                                              const std::string& token,
                                                              absl::Duration timeout);

  // Starts a TcpStoreServer (see Start) and connects to it; the store owns the server, which
  // stops when the store is destroyed.
  static absl::StatusOr<c10::intrusive_ptr<TcpStore>> Host(const std::string& address, int port,
                                                           const std::string& token,
                                                           int max_connections,
                                                           absl::Duration timeout);

  ~TcpStore() override;

  // The server a store made by Host owns; null for one made by Connect.
  const TcpStoreServer* server() const { return server_.get(); }

  // A new connection to the same server, with the same token and timeout (c10d's clone()).
  // Throws std::runtime_error when the server cannot be reached.
  c10::intrusive_ptr<c10d::Store> Clone() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  // Sets `key` to `desired` when it holds `expected` (or is missing and `expected` is empty);
  // returns the value it then holds (`expected` when it is missing), as c10d's stores do.
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  // Waits up to the store's timeout for `key` to be set.
  std::vector<uint8_t> get(const std::string& key) override;
  // Adds to the integer `key` holds as decimal text (0 when missing); returns the sum.
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  // A timeout of kNoTimeout waits for ever.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  struct Reply;

  TcpStore(int socket, std::string address, int port, std::string token,
           std::chrono::milliseconds timeout);

  // Sends one request and returns the server's reply, or throws.
  Reply Call(uint32_t op, absl::string_view key, absl::string_view value = {},
             absl::string_view second = {});
  // Repeats `op` on `key` while the server answers that the key is missing, until `timeout`
  // (kNoTimeout: for ever) has passed since `since`.
  Reply Await(uint32_t op, const std::string& key, std::chrono::milliseconds timeout,
              std::chrono::steady_clock::time_point since);

  std::unique_ptr<TcpStoreServer> server_;  // set by Host
  std::mutex mutex_;                        // one request at a time on the socket
  int socket_;                              // -1 once the connection is lost
  std::string lost_;                        // why it was lost
  const std::string address_;               // the server's, as given to Connect
  const int port_;
  const std::string token_;
  const std::string server_address_;  // "host:port", for errors
};

// The wire format, for tests that speak it by hand. A client sends a hello of kHelloBytes
// (kHelloMagic, the protocol version, the token's length and the token padded to
// kMaxStoreTokenBytes); every request and reply after it is a header of kHeaderBytes
// (kind, key length, value length, second value length; integers little-endian) and then the
// key and values.
namespace tcp_store_wire {

inline constexpr size_t kHelloBytes = 8 + 4 + 4 + kMaxStoreTokenBytes;
inline constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8;
inline constexpr uint32_t kSet = 1;

std::string Hello(absl::string_view token);
std::string Header(uint32_t kind, uint64_t key_bytes, uint64_t value_bytes, uint64_t second_bytes);

}  // namespace tcp_store_wire

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_TCP_STORE_H_
