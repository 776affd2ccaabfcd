// A Communicator for CPU tensors: ring collectives over plait's own TCP connections between
// the members of a group (internal/tcp_mesh.h), linking no collective library (Gloo, which
// it first ran on, is not linked: the LibTorch of PyTorch's wheels carries a copy of its own,
// see third_party/symbol_collision_test.cc). Every member
// of a group creates it with the same name and a store they share; collectives then run on
// one communication thread per communicator, in the order they were issued:
//
//   auto store = Rendezvous(world, absl::Seconds(60));            // rendezvous.h
//   auto world_comm = RingCommunicator::Create(*store, "world", world.rank, world.world_size,
//                                              RingCommunicator::kLoopback);
//   (*world_comm)->AllReduce(gradients, ReduceOp::kAverage)->Wait();
//
// The collectives are ring algorithms written on point-to-point transfers: c10d's Gloo group
// in LibTorch 1.13 has no reduce_scatter and no flat all_gather, and owning every transfer
// lets traffic() count real bytes. Each rank sends and receives (N-1)/N of the buffer in
// all_gather and reduce_scatter, 2(N-1)/N in all_reduce (reduce-scatter then all-gather),
// the bandwidth-optimal volumes. The all-to-all runs in N-1 steps, step k sending to rank
// r + k and receiving from rank r - k; the same steps first take every rank's counts to every
// other, so that counts that disagree fail on every rank with one message, rather than time
// out on some. Each collective's transfers are tagged from its call (its step, index and
// place, communicator.h), so ranks that issue different collectives (one skipped one) stop at
// the first they disagree on instead of mixing their data. A failed or
// timed-out collective leaves the connections in an unknown state, so every later collective
// fails with the first error.
//
// Send and Receive run on a second set of connections (one per pair of ranks), so that they
// never wait behind a collective nor interleave their frames with one, each direction of each
// pair on a thread of its own, started at its first use: messages to one peer go in issue
// order, and a send blocked on a slow receiver (socket buffers full) holds up neither the
// sends to other peers nor any receive. A message is a 16-byte header (dtype and element count,
// which the receiver checks before taking the data) and the data, tagged with the message's
// number (CollectiveCall::index). A failed Send or Receive fails the later ones of its
// direction and peer, not the collectives.
#ifndef PLAIT_PARALLEL_RING_COMMUNICATOR_H_
#define PLAIT_PARALLEL_RING_COMMUNICATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "c10/util/ThreadLocalDebugInfo.h"
#include "parallel/communicator.h"
#include "parallel/device_mesh.h"
#include "parallel/internal/tcp_mesh.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace plait::parallel {

class RingCommunicator final : public Communicator {
 public:
  // The address to use when every member of the group runs on this machine.
  static constexpr const char* kLoopback = "127.0.0.1";

  // Connects this process, rank `rank` of `size`, to the other members of group `name`
  // through `store` (keys under "plait/gloo/<name>/"; a name must be used once per store).
  // `address` is where the other members reach this one: kLoopback on one machine, else
  // this machine's hostname or IP address.
  static absl::StatusOr<std::unique_ptr<RingCommunicator>> Create(c10d::Store& store,
                                                                  std::string name, int rank,
                                                                  int size,
                                                                  const std::string& address,
                                                                  CommunicatorOptions options = {});

  ~RingCommunicator() override;

  at::Device device() const override { return at::kCPU; }

 protected:
  std::shared_ptr<Work> StartAllReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> StartAllGather(at::Tensor input, at::Tensor output) override;
  std::shared_ptr<Work> StartReduceScatter(at::Tensor input, at::Tensor output,
                                           ReduceOp op) override;
  std::shared_ptr<Work> StartBroadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> StartBarrier() override;
  std::shared_ptr<Work> StartAllToAll(at::Tensor input, at::Tensor output,
                                      std::vector<int64_t> send_rows,
                                      std::vector<int64_t> receive_rows) override;
  std::shared_ptr<Work> StartSend(at::Tensor tensor, int peer) override;
  std::shared_ptr<Work> StartReceive(at::Tensor tensor, int peer) override;

 private:
  // A collective's transfers, given its call, the slot base of its transfers and the deadline.
  using Run = std::function<absl::Status(const CollectiveCall& call, uint64_t slot_base,
                                         absl::Time deadline)>;

  // A collective as run on a communication thread.
  struct Task {
    CollectiveCall call;
    Run run;
    std::shared_ptr<NotifiedWork> work;
    // The enqueuing thread's c10 debug info, under which the task runs, so that its
    // allocations are reported where that thread's are (base/allocation_counter.h).
    std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info;
  };

  // A tensor sent to, or received from, one peer.
  struct Transfer {
    at::Tensor tensor;
    int peer;
  };

  // A communication thread and the tasks it runs in order. After a failure its connections
  // are in an unknown state: its later tasks fail with the first error.
  struct Lane {
    absl::Mutex mutex;
    std::deque<Task> tasks ABSL_GUARDED_BY(mutex);
    bool stopping ABSL_GUARDED_BY(mutex) = false;
    absl::Status broken;  // the first failure; touched only by `thread`
    std::thread thread;
  };

  RingCommunicator(std::string name, int rank, int size, CommunicatorOptions options,
                   std::unique_ptr<internal::TcpMesh> mesh,
                   std::unique_ptr<internal::TcpMesh> point_to_point_mesh);

  // Queues the call being issued (NextCall(collective, peer)) on `lane`.
  std::shared_ptr<Work> Enqueue(Lane& lane, Collective collective, int peer, Run run);
  void RunTasks(Lane& lane);
  // The lane of Sends to `peer` (or Receives from it), started at its first use.
  Lane& PointToPointLane(Collective collective, int peer);
  // Drains `lane`'s tasks and joins its thread.
  static void StopLane(Lane& lane);

  // Runs `recv` (if any) and every send as transfer `slot` on `mesh`, and waits for all of
  // them; errors say which call failed and how.
  absl::Status Transmit(internal::TcpMesh& mesh, const CollectiveCall& call, uint64_t slot,
                        const std::vector<Transfer>& sends, const std::optional<Transfer>& recv,
                        absl::Time deadline);
  // Transmit on the collectives' mesh, counting the traffic.
  absl::Status Exchange(const CollectiveCall& call, uint64_t slot,
                        const std::vector<Transfer>& sends, const std::optional<Transfer>& recv,
                        absl::Time deadline);

  // The ring algorithms, on flat contiguous tensors laid out in ChunkOf chunks.
  absl::Status ReduceScatterRing(const CollectiveCall& call, const at::Tensor& input,
                                 const at::Tensor& output, ReduceOp op, uint64_t slot_base,
                                 absl::Time deadline);
  absl::Status AllGatherRing(const CollectiveCall& call, const at::Tensor& buffer,
                             uint64_t slot_base, absl::Time deadline);

  // The all-to-all's steps: step k of N-1 sends sends[r + k] to rank r + k and receives
  // receives[r - k] from rank r - k (mod N), as transfer slot_base + k; traffic is not counted.
  absl::Status Shift(const CollectiveCall& call, uint64_t slot_base,
                     const std::vector<at::Tensor>& sends, const std::vector<at::Tensor>& receives,
                     absl::Time deadline);
  // Tells every rank this rank's dtype, row size and counts (a Shift from `slot_base`), and
  // checks that every pair of ranks agrees.
  absl::Status CheckAllToAllAgreement(const CollectiveCall& call, const at::Tensor& input,
                                      const std::vector<int64_t>& send_rows,
                                      const std::vector<int64_t>& receive_rows, uint64_t slot_base,
                                      absl::Time deadline);

  const std::unique_ptr<internal::TcpMesh> mesh_;
  const std::unique_ptr<internal::TcpMesh> point_to_point_mesh_;

  Lane collectives_;
  // By peer rank; null until first used (by the issuing thread, one at a time).
  std::vector<std::unique_ptr<Lane>> send_lanes_;
  std::vector<std::unique_ptr<Lane>> receive_lanes_;
};

// A DeviceMesh factory (device_mesh.h) whose groups are RingCommunicators over `store`,
// reached at `address` (see RingCommunicator::Create). `store` must outlive the mesh's
// creation.
CommunicatorFactory RingCommunicatorFactory(c10d::Store& store, std::string address,
                                            CommunicatorOptions options = {});

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_RING_COMMUNICATOR_H_
