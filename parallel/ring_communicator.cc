#include "parallel/ring_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/hash.h"
#include "base/status.h"
#include "torch/utils.h"

namespace plait::parallel {
namespace {

// Transfers are tagged per collective: a collective's tags are 2^kSlotBits consecutive
// numbers, one per ring step (more than any group here has), from a base drawn from its call
// (step, index, place, kind). Ranks that issue different collectives in the same turn, e.g.
// one that skipped a collective, thus stop at the first collective they disagree on (a
// transfer with the wrong tag fails; the rank it was meant for times out), rather than
// exchange data between two unrelated ones.
constexpr int kSlotBits = 20;

uint64_t SlotBase(const CollectiveCall& call) {
  const StepPlace& place = call.place;
  const int64_t numbers[] = {
      static_cast<int64_t>(call.collective), call.step, call.index, place.block,
      static_cast<int64_t>(place.pass),      place.part};
  uint64_t hash = base::Fnv1a64Words(base::kFnv1a64OffsetBasis, numbers, sizeof(numbers));
  if (place.purpose != nullptr) {
    hash = base::Fnv1a64Words(hash, place.purpose, std::strlen(place.purpose));
  }
  return base::SplitMix64(hash) << kSlotBits;
}

int Mod(int value, int modulus) { return ((value % modulus) + modulus) % modulus; }

torch::Tensor ChunkView(const torch::Tensor& flat, const Chunk& chunk) {
  return flat.narrow(0, chunk.offset, chunk.numel);
}

// out = a (op) b, elementwise; `out` may alias `a` or `b`.
void Combine(ReduceOp op, const torch::Tensor& a, const torch::Tensor& b, torch::Tensor out) {
  if (op == ReduceOp::kMax) {
    torch::maximum_out(out, a, b);
  } else {
    torch::add_out(out, a, b);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingCommunicator>> RingCommunicator::Create(
    c10d::Store& store, std::string name, int rank, int size, const std::string& address,
    CommunicatorOptions options) {
  const std::string where =
      absl::StrCat("connecting group '", name, "' (rank ", rank, " of ", size, ")");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": rank must be in [0, size)"));
  }
  PLAIT_ASSIGN_OR_RETURN(
      std::unique_ptr<internal::TcpMesh> mesh,
      base::Annotate(internal::TcpMesh::Connect(store, absl::StrCat("plait/gloo/", name, "/"), rank,
                                                size, address, options.timeout),
                     absl::StrCat(where, " at ", address)));
  return std::unique_ptr<RingCommunicator>(
      new RingCommunicator(std::move(name), rank, size, options, std::move(mesh)));
}

RingCommunicator::RingCommunicator(std::string name, int rank, int size,
                                   CommunicatorOptions options,
                                   std::unique_ptr<internal::TcpMesh> mesh)
    : Communicator(std::move(name), rank, size, options), mesh_(std::move(mesh)) {
  worker_ = std::thread([this] { RunTasks(); });
}

RingCommunicator::~RingCommunicator() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  worker_.join();
}

std::shared_ptr<Work> RingCommunicator::Enqueue(Collective collective, Run run) {
  auto work = std::make_shared<NotifiedWork>();
  const CollectiveCall call = NextCall(collective);
  absl::MutexLock lock(&mutex_);
  tasks_.push_back(Task{call, std::move(run), work, c10::ThreadLocalDebugInfo::current()});
  return work;
}

void RingCommunicator::RunTasks() {
  // The collectives combine their tensors as data: autograd records nothing here, also for an
  // input that requires grad (tensor parallelism's activations, sent from inside an autograd
  // function's forward, where grad mode is off on the caller's thread only).
  torch::NoGradGuard no_grad;
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(
          +[](RingCommunicator* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mutex_) {
            return self->stopping_ || !self->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, with nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    if (!broken_.ok()) {
      task.work->Complete(absl::Status(
          broken_.code(),
          absl::StrCat(Describe(task.call), ": the group failed earlier: ", broken_.message())));
      continue;
    }
    absl::Status status;
    {
      c10::DebugInfoGuard debug_info(std::move(task.debug_info));
      status = task.run(task.call, SlotBase(task.call), absl::Now() + options().timeout);
      task.run = nullptr;  // what it holds is freed where it was allocated
    }
    if (!status.ok()) {
      broken_ = status;
      failures()->Record(task.call);
    }
    task.work->Complete(std::move(status));
  }
}

absl::Status RingCommunicator::Exchange(const CollectiveCall& call, uint64_t slot,
                                        const std::vector<Transfer>& sends,
                                        const std::optional<Transfer>& recv, absl::Time deadline) {
  std::vector<internal::TcpMesh::Transfer> mesh_sends;
  mesh_sends.reserve(sends.size());
  int64_t sent_bytes = 0;
  for (const Transfer& send : sends) {
    mesh_sends.push_back({send.tensor.data_ptr(), send.tensor.nbytes(), send.peer});
    sent_bytes += static_cast<int64_t>(send.tensor.nbytes());
  }
  std::optional<internal::TcpMesh::Transfer> mesh_recv;
  if (recv.has_value()) mesh_recv = {recv->tensor.data_ptr(), recv->tensor.nbytes(), recv->peer};
  const absl::Status status = mesh_->Exchange(slot, mesh_sends, mesh_recv, deadline);
  if (absl::IsDeadlineExceeded(status)) {
    return absl::DeadlineExceededError(
        absl::StrCat(Describe(call), ": timed out after ", absl::FormatDuration(options().timeout),
                     " ", status.message(), " (did every rank of the group call it?)"));
  }
  PLAIT_RETURN_IF_ERROR(base::Annotate(status, Describe(call)));
  CountTraffic(call.collective, sent_bytes, recv.has_value() ? recv->tensor.nbytes() : 0);
  return absl::OkStatus();
}

// Step k of N-1: send the partial reduction of chunk (r - k - 1) to the right neighbour,
// receive that of chunk (r - k - 2) from the left one and add this rank's input to it. At
// the last step the chunk received is chunk r, complete once this rank's part is added.
absl::Status RingCommunicator::ReduceScatterRing(const CollectiveCall& call,
                                                 const torch::Tensor& input,
                                                 const torch::Tensor& output, ReduceOp op,
                                                 uint64_t slot_base, absl::Time deadline) {
  const int n = size();
  const int r = rank();
  const int64_t total = input.numel();
  if (n == 1) {
    output.copy_(input);
    return absl::OkStatus();
  }
  const int64_t longest = ChunkOf(total, n, 0).numel;
  const torch::Tensor received = torch::empty({longest}, input.options());
  const torch::Tensor partial = torch::empty({longest}, input.options());
  for (int k = 0; k < n - 1; ++k) {
    const Chunk send_chunk = ChunkOf(total, n, Mod(r - k - 1, n));
    const Chunk recv_chunk = ChunkOf(total, n, Mod(r - k - 2, n));
    const torch::Tensor to_send =
        k == 0 ? ChunkView(input, send_chunk) : partial.narrow(0, 0, send_chunk.numel);
    const torch::Tensor incoming = received.narrow(0, 0, recv_chunk.numel);
    if (absl::Status status = Exchange(call, slot_base + k, {Transfer{to_send, Mod(r + 1, n)}},
                                       Transfer{incoming, Mod(r - 1, n)}, deadline);
        !status.ok()) {
      return status;
    }
    const torch::Tensor target = k == n - 2 ? output : partial.narrow(0, 0, recv_chunk.numel);
    Combine(op, ChunkView(input, recv_chunk), incoming, target);
  }
  if (op == ReduceOp::kAverage) output.div_(n);
  return absl::OkStatus();
}

// Step k of N-1: send chunk (r - k) to the right neighbour and receive chunk (r - k - 1)
// from the left one, straight into place.
absl::Status RingCommunicator::AllGatherRing(const CollectiveCall& call,
                                             const torch::Tensor& buffer, uint64_t slot_base,
                                             absl::Time deadline) {
  const int n = size();
  const int r = rank();
  for (int k = 0; k < n - 1; ++k) {
    const torch::Tensor to_send = ChunkView(buffer, ChunkOf(buffer.numel(), n, Mod(r - k, n)));
    const torch::Tensor incoming = ChunkView(buffer, ChunkOf(buffer.numel(), n, Mod(r - k - 1, n)));
    if (absl::Status status = Exchange(call, slot_base + k, {Transfer{to_send, Mod(r + 1, n)}},
                                       Transfer{incoming, Mod(r - 1, n)}, deadline);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> RingCommunicator::StartAllReduce(torch::Tensor tensor, ReduceOp op) {
  return Enqueue(
      Collective::kAllReduce,
      [this, tensor, op](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
        const torch::Tensor flat = tensor.view({-1});
        const torch::Tensor own = ChunkView(flat, ChunkOf(flat.numel(), size(), rank()));
        const torch::Tensor reduced = torch::empty_like(own);
        if (absl::Status status = ReduceScatterRing(call, flat, reduced, op, slot_base, deadline);
            !status.ok()) {
          return status;
        }
        own.copy_(reduced);
        return AllGatherRing(call, flat, slot_base + size(), deadline);
      });
}

std::shared_ptr<Work> RingCommunicator::StartAllGather(torch::Tensor input, torch::Tensor output) {
  return Enqueue(
      Collective::kAllGather,
      [this, input, output](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
        const torch::Tensor flat = output.view({-1});
        const torch::Tensor own = ChunkView(flat, ChunkOf(flat.numel(), size(), rank()));
        if (own.data_ptr() != input.data_ptr()) own.copy_(input.view({-1}));
        return AllGatherRing(call, flat, slot_base, deadline);
      });
}

std::shared_ptr<Work> RingCommunicator::StartReduceScatter(torch::Tensor input,
                                                           torch::Tensor output, ReduceOp op) {
  return Enqueue(Collective::kReduceScatter, [this, input, output, op](const CollectiveCall& call,
                                                                       uint64_t slot_base,
                                                                       absl::Time deadline) {
    return ReduceScatterRing(call, input.view({-1}), output.view({-1}), op, slot_base, deadline);
  });
}

// The root sends the whole tensor to every other rank: simple, and what the small groups and
// one-off broadcasts (initial weights) here need.
std::shared_ptr<Work> RingCommunicator::StartBroadcast(torch::Tensor tensor, int root) {
  return Enqueue(
      Collective::kBroadcast,
      [this, tensor, root](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
        if (rank() != root) {
          return Exchange(call, slot_base, {}, Transfer{tensor, root}, deadline);
        }
        std::vector<Transfer> sends;
        for (int peer = 0; peer < size(); ++peer) {
          if (peer != root) sends.push_back(Transfer{tensor, peer});
        }
        return Exchange(call, slot_base, sends, std::nullopt, deadline);
      });
}

// An all-gather of one byte per rank: after it every rank has heard, directly or through
// its neighbours, from every other.
std::shared_ptr<Work> RingCommunicator::StartBarrier() {
  return Enqueue(Collective::kBarrier,
                 [this](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
                   const torch::Tensor tokens = torch::zeros({size()}, torch::kUInt8);
                   return AllGatherRing(call, tokens, slot_base, deadline);
                 });
}

CommunicatorFactory RingCommunicatorFactory(c10d::Store& store, std::string address,
                                            CommunicatorOptions options) {
  return [&store, address = std::move(address), options](
             const std::string& name, int rank,
             int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    return RingCommunicator::Create(store, name, rank, size, address, options);
  };
}

}  // namespace plait::parallel
