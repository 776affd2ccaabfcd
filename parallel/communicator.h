// A Communicator runs collectives among the ranks of one group (the world, or one dimension
// of a DeviceMesh): all-reduce, all-gather into one flat output, reduce-scatter from one flat
// input, broadcast and barrier. Every collective is asynchronous and returns a Work to wait
// on; every member of the group must issue the same collectives in the same order.
//
//   std::shared_ptr<Work> gather = communicator.AllGather(shard, full);  // starts
//   ... compute that does not touch `full` ...
//   PLAIT_RETURN_IF_ERROR(gather->Wait());
//
// Flat layouts follow torch::tensor_split: a buffer of S elements is split into size()
// contiguous chunks, the first S % size() of them one element longer; rank r owns chunk r.
// Each collective fails, rather than hangs, after the communicator's timeout, with an error
// naming the operation, the group and the rank. Each communicator counts the bytes it really
// sent and received per kind of collective (traffic()), so callers can compare against the
// theoretical volume. Backends: RingCommunicator (CPU), NcclCommunicator (CUDA).
#ifndef PLAIT_PARALLEL_COMMUNICATOR_H_
#define PLAIT_PARALLEL_COMMUNICATOR_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "torch/types.h"

namespace plait::parallel {

enum class ReduceOp { kSum, kAverage, kMax };

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };
inline constexpr int kNumCollectives = 5;

// "all_reduce", "all_gather", ...: the name used in errors and reports.
absl::string_view CollectiveName(Collective collective);

// The handle of a collective in flight.
class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the collective has finished; its outcome. May be called more than once.
  virtual absl::Status Wait() = 0;
};

// A Work completed by whoever runs the collective, possibly on another thread.
class NotifiedWork final : public Work {
 public:
  absl::Status Wait() override;
  void Complete(absl::Status status);

 private:
  absl::Status status_;
  absl::Notification done_;
};

// A Work that has already finished with `status` (e.g. a rejected argument).
std::shared_ptr<Work> FinishedWork(absl::Status status);

// The position of one chunk of a flat buffer split as torch::tensor_split splits it.
struct Chunk {
  int64_t offset;
  int64_t numel;
};
Chunk ChunkOf(int64_t total_numel, int num_chunks, int index);

// Bytes one rank sent and received for one kind of collective, and how many it ran.
struct Traffic {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

struct CommunicatorOptions {
  // How long a collective (or connecting the group) may take before it fails.
  absl::Duration timeout = absl::Minutes(5);
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommunicatorOptions& options() const { return options_; }

  // Where the tensors of its collectives must live: the CPU, or one CUDA device.
  virtual torch::Device device() const = 0;

  // In place: `tensor` becomes the reduction of every rank's `tensor`.
  std::shared_ptr<Work> AllReduce(torch::Tensor tensor, ReduceOp op);

  // `output` (S elements) becomes the concatenation of every rank's `input`, which holds
  // chunk rank() of S. `input` may be a view of that chunk of `output`.
  std::shared_ptr<Work> AllGather(torch::Tensor input, torch::Tensor output);

  // `output` becomes chunk rank() of the reduction of every rank's `input` (S elements).
  std::shared_ptr<Work> ReduceScatter(torch::Tensor input, torch::Tensor output, ReduceOp op);

  // Every rank's `tensor` becomes rank `root`'s.
  std::shared_ptr<Work> Broadcast(torch::Tensor tensor, int root);

  // Finishes once every rank has reached it.
  std::shared_ptr<Work> Barrier();

  // What this rank has sent and received so far for `collective`.
  Traffic traffic(Collective collective) const;

  // "all_reduce on group 'dp' (rank 1 of 2)": the prefix of every error about `collective`.
  std::string Describe(Collective collective) const;

 protected:
  Communicator(std::string name, int rank, int size, CommunicatorOptions options);

  // Called after the arguments were checked: tensors are defined, contiguous, of one
  // supported dtype and of matching sizes; `op` is valid for the dtype; `root` is a rank.
  virtual std::shared_ptr<Work> StartAllReduce(torch::Tensor tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> StartAllGather(torch::Tensor input, torch::Tensor output) = 0;
  virtual std::shared_ptr<Work> StartReduceScatter(torch::Tensor input, torch::Tensor output,
                                                   ReduceOp op) = 0;
  virtual std::shared_ptr<Work> StartBroadcast(torch::Tensor tensor, int root) = 0;
  virtual std::shared_ptr<Work> StartBarrier() = 0;

  // Adds to the traffic counters; backends call it for every transfer (thread-safe).
  void CountTraffic(Collective collective, int64_t bytes_sent, int64_t bytes_received);
  void CountCall(Collective collective);

 private:
  absl::Status CheckTensor(Collective collective, absl::string_view role,
                           const torch::Tensor& tensor) const;
  absl::Status CheckOp(Collective collective, const torch::Tensor& tensor, ReduceOp op) const;

  struct Counters {
    std::atomic<int64_t> calls{0};
    std::atomic<int64_t> bytes_sent{0};
    std::atomic<int64_t> bytes_received{0};
  };

  const std::string name_;
  const int rank_;
  const int size_;
  const CommunicatorOptions options_;
  std::array<Counters, kNumCollectives> counters_;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_COMMUNICATOR_H_
