// NcclCommunicator runs the Communicator collectives on CUDA tensors with NCCL, one
// communicator per rank of the group and one CUDA device per rank. Collectives are ordered
// after the work already queued on the caller's compute stream and run on a stream of their
// own; Work::Wait() orders the compute stream after the collective and blocks the host until
// it has finished, failed or run past CommunicatorOptions::timeout.
//
//   PLAIT_ASSIGN_OR_RETURN(auto store, Rendezvous(world, absl::Minutes(5)));  // rendezvous.h
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> dp,
//                          NcclCommunicator::Create(store, "dp", rank, size, local_rank,
//                                                   CommunicatorOptions{}));
//   PLAIT_RETURN_IF_ERROR(dp->AllReduce(gradients, ReduceOp::kAverage)->Wait());
//
// A collective's timeout counts from the call that starts it, including the time it waits for
// the compute stream. A collective that fails or times out aborts the NCCL communicator: that
// Work and every later collective return the first error, since the ranks of the group are no
// longer in step.
//
// Send and Receive are ncclSend and ncclRecv on the same communication stream, in issue order:
// unlike RingCommunicator's, a send here waits for its receive to start on the peer's stream
// beyond NCCL's buffering, so two ranks that both send a large tensor before receiving wait
// for each other until the timeout: on NCCL, one rank of a pair must receive before it sends.
//
// AllToAll is ncclSend and ncclRecv to and from every other rank inside one ncclGroupStart and
// ncclGroupEnd, and a device-to-device copy for the rows a rank keeps. NCCL does not check
// that the counts of two ranks agree: rank q's send_rows[r] must equal rank r's
// receive_rows[q] (ExchangeRowCounts), else the call corrupts data or times out.
#ifndef PLAIT_PARALLEL_NCCL_COMMUNICATOR_H_
#define PLAIT_PARALLEL_NCCL_COMMUNICATOR_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/communicator.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace plait::parallel {

class NcclCommunicator final : public Communicator {
 public:
  // Connects rank `rank` of the `size` ranks of group `name` on CUDA device `cuda_device`.
  // Every rank calls it with the same `name`, `size` and a store shared by the group: rank 0
  // publishes the NCCL unique id under "plait/nccl/<name>/unique_id" and the others read it,
  // so a name is used once per store. Connecting fails with DeadlineExceeded after
  // `options.timeout`.
  //
  // `compute_stream` is the CUDA stream the caller's kernels run on, on `cuda_device`; every
  // collective waits for the work queued on it, and Wait() makes it wait for the collective.
  // The default, the legacy default stream, is where LibTorch queues work unless the caller
  // set another current stream (then pass at::cuda::getCurrentCUDAStream().stream()).
  //
  // Create, every collective and Work::Wait() make `cuda_device` the calling thread's current
  // device.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      c10::intrusive_ptr<c10d::Store> store, std::string name, int rank, int size, int cuda_device,
      CommunicatorOptions options, cudaStream_t compute_stream = cudaStreamLegacy);

  // Works still in flight keep the NCCL communicator alive; the last owner closes it, waiting
  // at most the timeout for the queued collectives to drain before aborting them.
  ~NcclCommunicator() override;

  // The CUDA device this rank runs on.
  int cuda_device() const;
  at::Device device() const override {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device()));
  }

 private:
  // The NCCL communicator, its stream and its failure state, shared with the Works in flight.
  class Connection;
  class NcclWork;

  NcclCommunicator(std::string name, int rank, int size, CommunicatorOptions options,
                   std::shared_ptr<Connection> connection);

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

  // Queues `enqueue` on the communication stream between the compute-stream events, counts the
  // traffic and returns the Work; a failure aborts the communicator. `tensors` stay alive
  // until the collective has been waited for.
  // `peer` as in NextCall.
  std::shared_ptr<Work> Launch(
      Collective collective, int peer, std::vector<at::Tensor> tensors, int64_t bytes_sent,
      int64_t bytes_received,
      absl::FunctionRef<absl::Status(Connection& connection, absl::Time deadline)> enqueue);

  std::shared_ptr<Connection> connection_;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_NCCL_COMMUNICATOR_H_
