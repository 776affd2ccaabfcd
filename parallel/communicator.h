// A Communicator runs collectives among the ranks of one group (the world, or one dimension
// of a DeviceMesh): all-reduce, all-gather into one flat output, reduce-scatter from one flat
// input, broadcast, barrier and a variable-size all-to-all of rows (expert parallelism's
// tokens); and point-to-point Send and Receive between two of its ranks (pipeline
// parallelism's activations and gradients). Every operation is asynchronous and returns a
// Work to wait on; every member of the group must issue the same collectives in the same
// order.
//
//   std::shared_ptr<Work> gather = communicator.AllGather(shard, full);  // starts
//   ... compute that does not touch `full` ...
//   PLAIT_RETURN_IF_ERROR(gather->Wait());
//
// Flat layouts follow at::tensor_split: a buffer of S elements is split into size()
// contiguous chunks, the first S % size() of them one element longer; rank r owns chunk r.
// Each collective fails, rather than hangs, after the communicator's timeout, with an error
// naming the operation, the group, the rank and, within a training step, the collective's
// place in it (StepPlace). Each communicator counts the bytes it really
// sent and received per kind of collective (traffic()), so callers can compare against the
// theoretical volume. Backends: RingCommunicator (CPU), NcclCommunicator (CUDA).
#ifndef PLAIT_PARALLEL_COMMUNICATOR_H_
#define PLAIT_PARALLEL_COMMUNICATOR_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/tensor_split.h"
#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {

enum class ReduceOp { kSum, kAverage, kMax };

// The kinds of operation a Communicator runs; kSend and kReceive are its point-to-point ones.
enum class Collective {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kBarrier,
  kSend,
  kReceive,
  kAllToAll
};
inline constexpr int kNumCollectives = 8;

// Whether `collective` is issued by two ranks only (kSend, kReceive).
bool IsPointToPoint(Collective collective);

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

// The position of one chunk of a flat buffer split as at::tensor_split splits it.
struct Chunk {
  int64_t offset;
  int64_t numel;
};
Chunk ChunkOf(int64_t total_numel, int num_chunks, int index);

// Where the rows of each rank start in an AllToAll tensor that holds `rows[r]` rows for rank
// r, back to back: the sum of the counts before each.
std::vector<int64_t> RowOffsets(const std::vector<int64_t>& rows);

// Bytes one rank sent and received for one kind of collective, and how many it ran.
struct Traffic {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

// Which pass over a block a collective belongs to.
enum class Pass { kNone, kForward, kBackward };

// What a collective is for, in the words its errors use: "block 7 backward, reduce_scatter of
// FSDP unit". The code that issues collectives says so around them (ScopedPlace); the trainer
// numbers the steps (Communicator::BeginStep). Nothing here allocates: text is made only for
// an error.
struct StepPlace {
  static constexpr int kNoBlock = -1;
  static constexpr int kRoot = -2;  // the parameters outside the blocks (embedding, head)

  int block = kNoBlock;           // a block's index, kRoot or kNoBlock
  Pass pass = Pass::kNone;        // of that block
  const char* purpose = nullptr;  // "FSDP unit", "DDP bucket": a string literal, or null
  int part = -1;                  // which of the purpose's parts ("DDP bucket 3"), or -1
};

// A collective as it was issued: what its errors, and the ring's transfer tags, are made from.
struct CollectiveCall {
  Collective collective;
  int64_t step;  // 0 outside the training steps
  // Collectives: among the group's collectives of the step (or, outside steps, since start).
  // Send and Receive: among the messages from the sender to the receiver since the start, the
  // same number on both ranks (a message's two ranks see different steps' collectives).
  int64_t index;
  StepPlace place;
  int peer = -1;  // Send and Receive: the other rank
};

// The first collective of a group that failed on this rank (Communicator::FirstFailure),
// shared with the Works of a backend whose Works may outlive their communicator; thread-safe.
class FailureRecord {
 public:
  // Keeps `call` unless a failure is kept already.
  void Record(const CollectiveCall& call);
  std::optional<CollectiveCall> first() const;

 private:
  mutable absl::Mutex mutex_;
  std::optional<CollectiveCall> first_ ABSL_GUARDED_BY(mutex_);
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
  virtual at::Device device() const = 0;

  // In place: `tensor` becomes the reduction of every rank's `tensor`.
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op);

  // `output` (S elements) becomes the concatenation of every rank's `input`, which holds
  // chunk rank() of S. `input` may be a view of that chunk of `output`.
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output);

  // `output` becomes chunk rank() of the reduction of every rank's `input` (S elements).
  std::shared_ptr<Work> ReduceScatter(at::Tensor input, at::Tensor output, ReduceOp op);

  // Every rank's `tensor` becomes rank `root`'s.
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root);

  // Finishes once every rank has reached it.
  std::shared_ptr<Work> Barrier();

  // Variable-size all-to-all of rows (dim 0): this rank sends rows [RowOffsets(send_rows)[r],
  // + send_rows[r]) of `input` to rank r, and receives rank r's rows for it into rows
  // [RowOffsets(receive_rows)[r], + receive_rows[r]) of `output`; the rows for itself are a
  // local copy. Both tensors have the same dtype and row shape (sizes after dim 0); either may
  // have 0 rows, and any count may be 0. `output` must not overlap `input`. Rank q's
  // send_rows[r] must equal rank r's receive_rows[q]: ExchangeRowCounts gives the
  // receive_rows that match, so callers can size `output`:
  //
  //   // Tokens to the ranks of their experts, sorted by rank, send_rows[r] of them for rank r.
  //   PLAIT_ASSIGN_OR_RETURN(std::vector<int64_t> receive_rows,
  //                          ExchangeRowCounts(ep, send_rows));
  //   const int64_t rows = std::accumulate(receive_rows.begin(), receive_rows.end(), int64_t{0});
  //   at::Tensor routed = torch::empty({rows, hidden}, tokens.options());
  //   PLAIT_RETURN_IF_ERROR(ep.AllToAll(tokens, routed, send_rows, receive_rows)->Wait());
  //   ... experts on `routed`, then back: AllToAll(outputs, tokens, receive_rows, send_rows).
  //
  // InvalidArgument, through the Work, when a count vector does not have size() entries, a
  // count is negative, the counts do not sum to the tensor's rows, the tensors differ in dtype
  // or row shape, or send_rows[rank()] != receive_rows[rank()]. Counts that disagree between
  // ranks fail with InvalidArgument naming both ranks and both counts on RingCommunicator
  // (every rank of the group fails alike); NcclCommunicator does not check them, and
  // mismatched counts there corrupt data or time out: there they are the caller's contract.
  // traffic() counts the rows sent to and received from other ranks, not the local copy.
  std::shared_ptr<Work> AllToAll(at::Tensor input, at::Tensor output,
                                 std::vector<int64_t> send_rows, std::vector<int64_t> receive_rows);

  // Point-to-point: only the two ranks concerned call these, `peer` being the other one (a
  // rank of this group, not this rank). The k-th Send from rank a to rank b is taken by the
  // k-th Receive on b from a, whatever else either issues in between; the two tensors must
  // have the same dtype and number of elements (the shape may differ). A Send finishes once
  // its data has left this rank (keep `tensor` until Wait); it does not wait for the
  // matching Receive beyond the transport's buffering, so two ranks may both send before
  // they receive (pipeline 1F1B). A Receive fills `tensor`; it fails with an error naming
  // both tensors when they differ, and with one naming the peer when the message has not come
  // within the timeout. They are not counted in the step's collective index (#N of the step):
  // the other ranks do not issue them.
  //
  //   std::shared_ptr<Work> sent = pp.Send(activations, pp.rank() + 1);
  //   std::shared_ptr<Work> got = pp.Receive(gradients, pp.rank() + 1);
  //   PLAIT_RETURN_IF_ERROR(got->Wait());
  //   PLAIT_RETURN_IF_ERROR(sent->Wait());
  std::shared_ptr<Work> Send(at::Tensor tensor, int peer);
  std::shared_ptr<Work> Receive(at::Tensor tensor, int peer);

  // What this rank has sent and received so far for `collective`.
  Traffic traffic(Collective collective) const;

  // Starts training step `step` (from 1): the collectives issued from here on are counted from
  // 0 and their errors name the step and their index in it, as the same collective on every
  // rank of the group has the same index. Every rank of the group calls it at the same point.
  void BeginStep(int64_t step);

  // The place of the collectives issued from now on (use ScopedPlace). Like issuing
  // collectives, for one thread at a time.
  const StepPlace& place() const { return place_; }
  void set_place(const StepPlace& place) { place_ = place; }

  // The collective `collective` would be if it were issued now (with `peer` for Send and
  // Receive).
  CollectiveCall NextCall(Collective collective, int peer = -1) const;

  // "step 12, block 7 backward, reduce_scatter of FSDP unit on group 'dp' (rank 0 of 2;
  // collective #41 of the step)", or outside steps and places "all_reduce on group 'dp'
  // (rank 1 of 2)": the prefix of every error about `call`. Send and Receive say "send to
  // rank 1 on group 'pp' (rank 0 of 2; message #3 from rank 0 to rank 1)".
  std::string Describe(const CollectiveCall& call) const;
  // The same for the collective `collective` being issued now.
  std::string Describe(Collective collective, int peer = -1) const {
    return Describe(NextCall(collective, peer));
  }

  // Where this rank's first failed collective of the group was, as Describe says it without
  // the rank ("step 12, ... on group 'dp' (collective #41 of the step)"), so that ranks can
  // compare theirs; empty while none has failed.
  std::string FirstFailure() const;

 protected:
  Communicator(std::string name, int rank, int size, CommunicatorOptions options);

  // Called after the arguments were checked: tensors are defined, contiguous, on device(),
  // of one supported dtype and of matching sizes; `op` is valid for the dtype; `root` is a
  // rank; `peer` is another rank; row counts are size() non-negative numbers that sum to their
  // tensor's rows. While they run, NextCall and Describe(collective) (with `peer` for Send
  // and Receive) are the call being started.
  virtual std::shared_ptr<Work> StartAllReduce(at::Tensor tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> StartAllGather(at::Tensor input, at::Tensor output) = 0;
  virtual std::shared_ptr<Work> StartReduceScatter(at::Tensor input, at::Tensor output,
                                                   ReduceOp op) = 0;
  virtual std::shared_ptr<Work> StartBroadcast(at::Tensor tensor, int root) = 0;
  virtual std::shared_ptr<Work> StartBarrier() = 0;
  virtual std::shared_ptr<Work> StartAllToAll(at::Tensor input, at::Tensor output,
                                              std::vector<int64_t> send_rows,
                                              std::vector<int64_t> receive_rows) = 0;
  virtual std::shared_ptr<Work> StartSend(at::Tensor tensor, int peer) = 0;
  virtual std::shared_ptr<Work> StartReceive(at::Tensor tensor, int peer) = 0;

  // Adds to the traffic counters; backends call it for every transfer (thread-safe).
  void CountTraffic(Collective collective, int64_t bytes_sent, int64_t bytes_received);
  void CountCall(Collective collective);

  // Where backends record failed collectives (FirstFailure).
  const std::shared_ptr<FailureRecord>& failures() const { return failures_; }

 private:
  friend void SkipCollectiveForTesting(Communicator& communicator,
                                       std::function<bool(const CollectiveCall&)> skip);

  // Runs `start` (which sees the call as NextCall(collective, peer)) and counts it as issued;
  // unless the test hook skips it, which returns finished work and counts nothing.
  std::shared_ptr<Work> Issue(Collective collective, int peer,
                              absl::FunctionRef<std::shared_ptr<Work>()> start);
  // Send and Receive: checks `tensor` and `peer`, then issues.
  std::shared_ptr<Work> IssuePointToPoint(Collective collective, at::Tensor tensor, int peer);
  std::string Render(const CollectiveCall& call, bool with_rank) const;

  // `peer` as in NextCall.
  absl::Status CheckTensor(Collective collective, absl::string_view role, const at::Tensor& tensor,
                           int peer = -1) const;
  absl::Status CheckOp(Collective collective, const at::Tensor& tensor, ReduceOp op) const;
  absl::Status CheckAllToAll(const at::Tensor& input, const at::Tensor& output,
                             const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& receive_rows) const;

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

  int64_t step_ = 0;
  int64_t issued_in_step_ = 0;
  // By peer rank: the messages sent to it, and received from it, so far.
  std::vector<int64_t> sent_to_;
  std::vector<int64_t> received_from_;
  StepPlace place_;
  std::function<bool(const CollectiveCall&)> skip_for_testing_;  // testing_skip.h
  const std::shared_ptr<FailureRecord> failures_ = std::make_shared<FailureRecord>();
};

// Sets, for the lifetime of the scope, the place of the collectives `communicator` issues,
// and then restores the one before:
//
//   ScopedPlace place(communicator, {block, Pass::kBackward, "FSDP unit"});
//   std::shared_ptr<Work> reduce = communicator.ReduceScatter(gradients, shard, ReduceOp::kSum);
class ScopedPlace {
 public:
  ScopedPlace(Communicator& communicator, const StepPlace& place)
      : communicator_(communicator), before_(communicator.place()) {
    communicator.set_place(place);
  }
  ~ScopedPlace() { communicator_.set_place(before_); }
  ScopedPlace(const ScopedPlace&) = delete;
  ScopedPlace& operator=(const ScopedPlace&) = delete;

 private:
  Communicator& communicator_;
  const StepPlace before_;
};

// Every rank's `own` bytes, in rank order, through two collectives of `group` (their lengths,
// then the bytes padded to the longest): for the few names ranks tell each other outside a
// step (the parameters a later preparation step added to each pipeline stage). Every rank of
// the group calls it at the same point.
absl::StatusOr<std::vector<std::string>> AllGatherStrings(Communicator& group,
                                                          const std::string& own);

// The receive_rows of an AllToAll whose send_rows on this rank are `send_rows`: how many rows
// every rank of `group` will send this one, through one AllToAll of one int64 per rank. Every
// rank of the group calls it at the same point. InvalidArgument when `send_rows` does not
// have group.size() entries or one is negative.
absl::StatusOr<std::vector<int64_t>> ExchangeRowCounts(Communicator& group,
                                                       const std::vector<int64_t>& send_rows);

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_COMMUNICATOR_H_
