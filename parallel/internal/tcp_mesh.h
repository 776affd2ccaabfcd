// Point-to-point transfers between the members of one group, over one TCP connection per
// pair of ranks: the transport RingCommunicator's ring collectives run on. The members meet
// through a c10d::Store (each publishes where it listens and a secret a peer must present),
// then every Exchange moves whole buffers, each framed with the caller's tag and size so that
// ranks that disagree on what they are doing fail with an error naming both sides:
//
//   PLAIT_ASSIGN_OR_RETURN(auto mesh, TcpMesh::Connect(store, "plait/mesh/world/", rank, size,
//                                                      "127.0.0.1", absl::Seconds(60)));
//   PLAIT_RETURN_IF_ERROR(mesh->Exchange(/*tag=*/0, {{send_data, bytes, right}},
//                                        TcpMesh::Transfer{recv_data, bytes, left}, deadline));
//
// It replaces Gloo's TCP transport so that plait loads no Gloo of its own: a LibTorch built
// with Gloo (PyTorch's wheels) exports its own copy of Gloo's symbols, and two copies of one
// library in a process bind each other's functions (see third_party/symbol_collision_test.cc).
#ifndef PLAIT_PARALLEL_INTERNAL_TCP_MESH_H_
#define PLAIT_PARALLEL_INTERNAL_TCP_MESH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace plait::parallel::internal {

class TcpMesh {
 public:
  // A buffer sent to, or received into from, one peer.
  struct Transfer {
    void* data;
    size_t bytes;
    int peer;
  };

  // Connects rank `rank` of `size` to every other member, meeting them through `store`
  // under `prefix` (used once per store). It listens on `address`, where the others reach
  // it. DeadlineExceeded when a peer has not appeared within `timeout`, Unavailable when one
  // cannot be reached; errors name the peer.
  static absl::StatusOr<std::unique_ptr<TcpMesh>> Connect(c10d::Store& store,
                                                          const std::string& prefix, int rank,
                                                          int size, const std::string& address,
                                                          absl::Duration timeout);
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;
  // Closes every connection: a peer's transfer with this rank then fails at once.
  ~TcpMesh();

  // Sends every one of `sends` (at most one per peer) and receives `recv`, all at once, each
  // framed with `tag`, and returns when all are done. DeadlineExceeded "waiting for rank N"
  // when `deadline` passes first; Unavailable "transfer with rank N failed: ..." when a
  // connection breaks or the peer sent another tag or size. Exchanges may run at once on
  // several threads when no two of them send to the same peer, nor receive from the same peer
  // (a connection's two directions are independent).
  absl::Status Exchange(uint64_t tag, const std::vector<Transfer>& sends,
                        const std::optional<Transfer>& recv, absl::Time deadline);

 private:
  TcpMesh(int rank, std::vector<int> sockets);

  const int rank_;
  const std::vector<int> sockets_;  // by peer rank; -1 for this rank
};

}  // namespace plait::parallel::internal

#endif  // PLAIT_PARALLEL_INTERNAL_TCP_MESH_H_
