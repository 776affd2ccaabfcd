#include "parallel/ring_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/add.h"
#include "ATen/ops/maximum.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/hash.h"
#include "base/status.h"
#include "c10/util/accumulate.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

// Transfers are tagged per collective: a collective's tags are 2^kSlotBits consecutive
// numbers, one per ring step (more than any group here has), from a base drawn from its call
// (step, index, place, kind). Ranks that issue different collectives in the same turn, e.g.
// one that skipped a collective, thus stop at the first collective they disagree on (a
// transfer with the wrong tag fails; the rank it was meant for times out), rather than
// exchange data between two unrelated ones.
constexpr int kSlotBits = 20;

// Send and Receive tag a message's header and data from its number, which both of its ranks
// know (their places and steps may differ): 2 * index and 2 * index + 1.
uint64_t SlotBase(const CollectiveCall& call) {
  if (IsPointToPoint(call.collective)) return 2 * static_cast<uint64_t>(call.index);
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

// What a Send announces before its data: the dtype and the element count, as int64.
constexpr int64_t kHeaderWords = 2;

std::string TensorText(at::ScalarType dtype, int64_t numel) {
  return absl::StrCat(c10::toString(dtype), "[", numel, "]");
}

int Mod(int value, int modulus) { return ((value % modulus) + modulus) % modulus; }

at::Tensor ChunkView(const at::Tensor& flat, const Chunk& chunk) {
  return flat.narrow(0, chunk.offset, chunk.numel);
}

// out = a (op) b, elementwise; `out` may alias `a` or `b`.
void Combine(ReduceOp op, const at::Tensor& a, const at::Tensor& b, at::Tensor out) {
  if (op == ReduceOp::kMax) {
    at::maximum_out(out, a, b);
  } else {
    at::add_out(out, a, b);
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
  PLAIT_ASSIGN_OR_RETURN(
      std::unique_ptr<internal::TcpMesh> point_to_point_mesh,
      base::Annotate(internal::TcpMesh::Connect(store, absl::StrCat("plait/p2p/", name, "/"), rank,
                                                size, address, options.timeout),
                     absl::StrCat(where, " for send and receive at ", address)));
  return std::unique_ptr<RingCommunicator>(new RingCommunicator(
      std::move(name), rank, size, options, std::move(mesh), std::move(point_to_point_mesh)));
}

RingCommunicator::RingCommunicator(std::string name, int rank, int size,
                                   CommunicatorOptions options,
                                   std::unique_ptr<internal::TcpMesh> mesh,
                                   std::unique_ptr<internal::TcpMesh> point_to_point_mesh)
    : Communicator(std::move(name), rank, size, options),
      mesh_(std::move(mesh)),
      point_to_point_mesh_(std::move(point_to_point_mesh)),
      send_lanes_(size),
      receive_lanes_(size) {
  collectives_.thread = std::thread([this] { RunTasks(collectives_); });
}

RingCommunicator::~RingCommunicator() {
  StopLane(collectives_);
  for (auto* lanes : {&send_lanes_, &receive_lanes_}) {
    for (const std::unique_ptr<Lane>& lane : *lanes) {
      if (lane != nullptr) StopLane(*lane);
    }
  }
}

void RingCommunicator::StopLane(Lane& lane) {
  {
    absl::MutexLock lock(&lane.mutex);
    lane.stopping = true;
  }
  lane.thread.join();
}

RingCommunicator::Lane& RingCommunicator::PointToPointLane(Collective collective, int peer) {
  std::unique_ptr<Lane>& lane =
      (collective == Collective::kSend ? send_lanes_ : receive_lanes_)[peer];
  if (lane == nullptr) {
    lane = std::make_unique<Lane>();
    lane->thread = std::thread([this, lane = lane.get()] { RunTasks(*lane); });
  }
  return *lane;
}

std::shared_ptr<Work> RingCommunicator::Enqueue(Lane& lane, Collective collective, int peer,
                                                Run run) {
  auto work = std::make_shared<NotifiedWork>();
  const CollectiveCall call = NextCall(collective, peer);
  absl::MutexLock lock(&lane.mutex);
  lane.tasks.push_back(Task{call, std::move(run), work, c10::ThreadLocalDebugInfo::current()});
  return work;
}

void RingCommunicator::RunTasks(Lane& lane) {
  // The collectives combine their tensors as data: autograd records nothing here, also for an
  // input that requires grad (tensor parallelism's activations, sent from inside an autograd
  // function's forward, where grad mode is off on the caller's thread only).
  at::NoGradGuard no_grad;
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&lane.mutex);
      lane.mutex.Await(absl::Condition(
          +[](Lane* lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mutex) {
            return lane->stopping || !lane->tasks.empty();
          },
          &lane));
      if (lane.tasks.empty()) return;  // stopping, with nothing left to run
      task = std::move(lane.tasks.front());
      lane.tasks.pop_front();
    }
    if (!lane.broken.ok()) {
      const char* earlier = IsPointToPoint(task.call.collective)
                                ? ": an earlier message of this direction and peer failed: "
                                : ": the group failed earlier: ";
      task.work->Complete(absl::Status(
          lane.broken.code(), absl::StrCat(Describe(task.call), earlier, lane.broken.message())));
      continue;
    }
    absl::Status status;
    {
      c10::DebugInfoGuard debug_info(std::move(task.debug_info));
      status = task.run(task.call, SlotBase(task.call), absl::Now() + options().timeout);
      task.run = nullptr;  // what it holds is freed where it was allocated
    }
    if (!status.ok()) {
      lane.broken = status;
      failures()->Record(task.call);
    }
    task.work->Complete(std::move(status));
  }
}

absl::Status RingCommunicator::Transmit(internal::TcpMesh& mesh, const CollectiveCall& call,
                                        uint64_t slot, const std::vector<Transfer>& sends,
                                        const std::optional<Transfer>& recv, absl::Time deadline) {
  std::vector<internal::TcpMesh::Transfer> mesh_sends;
  mesh_sends.reserve(sends.size());
  for (const Transfer& send : sends) {
    mesh_sends.push_back({send.tensor.data_ptr(), send.tensor.nbytes(), send.peer});
  }
  std::optional<internal::TcpMesh::Transfer> mesh_recv;
  if (recv.has_value()) mesh_recv = {recv->tensor.data_ptr(), recv->tensor.nbytes(), recv->peer};
  const absl::Status status = mesh.Exchange(slot, mesh_sends, mesh_recv, deadline);
  if (absl::IsDeadlineExceeded(status)) {
    const std::string hint =
        IsPointToPoint(call.collective)
            ? absl::StrCat("did rank ", call.peer, " issue the matching ",
                           call.collective == Collective::kSend ? "receive" : "send", "?")
            : "did every rank of the group call it?";
    return absl::DeadlineExceededError(absl::StrCat(Describe(call), ": timed out after ",
                                                    absl::FormatDuration(options().timeout), " ",
                                                    status.message(), " (", hint, ")"));
  }
  return base::Annotate(status, Describe(call));
}

absl::Status RingCommunicator::Exchange(const CollectiveCall& call, uint64_t slot,
                                        const std::vector<Transfer>& sends,
                                        const std::optional<Transfer>& recv, absl::Time deadline) {
  PLAIT_RETURN_IF_ERROR(Transmit(*mesh_, call, slot, sends, recv, deadline));
  int64_t sent_bytes = 0;
  for (const Transfer& send : sends) sent_bytes += static_cast<int64_t>(send.tensor.nbytes());
  CountTraffic(call.collective, sent_bytes, recv.has_value() ? recv->tensor.nbytes() : 0);
  return absl::OkStatus();
}

// Step k of N-1: send the partial reduction of chunk (r - k - 1) to the right neighbour,
// receive that of chunk (r - k - 2) from the left one and add this rank's input to it. At
// the last step the chunk received is chunk r, complete once this rank's part is added.
absl::Status RingCommunicator::ReduceScatterRing(const CollectiveCall& call,
                                                 const at::Tensor& input, const at::Tensor& output,
                                                 ReduceOp op, uint64_t slot_base,
                                                 absl::Time deadline) {
  const int n = size();
  const int r = rank();
  const int64_t total = input.numel();
  if (n == 1) {
    output.copy_(input);
    return absl::OkStatus();
  }
  const int64_t longest = ChunkOf(total, n, 0).numel;
  const at::Tensor received = torch::empty({longest}, input.options());
  const at::Tensor partial = torch::empty({longest}, input.options());
  for (int k = 0; k < n - 1; ++k) {
    const Chunk send_chunk = ChunkOf(total, n, Mod(r - k - 1, n));
    const Chunk recv_chunk = ChunkOf(total, n, Mod(r - k - 2, n));
    const at::Tensor to_send =
        k == 0 ? ChunkView(input, send_chunk) : partial.narrow(0, 0, send_chunk.numel);
    const at::Tensor incoming = received.narrow(0, 0, recv_chunk.numel);
    if (absl::Status status = Exchange(call, slot_base + k, {Transfer{to_send, Mod(r + 1, n)}},
                                       Transfer{incoming, Mod(r - 1, n)}, deadline);
        !status.ok()) {
      return status;
    }
    const at::Tensor target = k == n - 2 ? output : partial.narrow(0, 0, recv_chunk.numel);
    Combine(op, ChunkView(input, recv_chunk), incoming, target);
  }
  if (op == ReduceOp::kAverage) output.div_(n);
  return absl::OkStatus();
}

// Step k of N-1: send chunk (r - k) to the right neighbour and receive chunk (r - k - 1)
// from the left one, straight into place.
absl::Status RingCommunicator::AllGatherRing(const CollectiveCall& call, const at::Tensor& buffer,
                                             uint64_t slot_base, absl::Time deadline) {
  const int n = size();
  const int r = rank();
  for (int k = 0; k < n - 1; ++k) {
    const at::Tensor to_send = ChunkView(buffer, ChunkOf(buffer.numel(), n, Mod(r - k, n)));
    const at::Tensor incoming = ChunkView(buffer, ChunkOf(buffer.numel(), n, Mod(r - k - 1, n)));
    if (absl::Status status = Exchange(call, slot_base + k, {Transfer{to_send, Mod(r + 1, n)}},
                                       Transfer{incoming, Mod(r - 1, n)}, deadline);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> RingCommunicator::StartAllReduce(at::Tensor tensor, ReduceOp op) {
  return Enqueue(
      collectives_, Collective::kAllReduce, /*peer=*/-1,
      [this, tensor, op](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
        const at::Tensor flat = tensor.view({-1});
        const at::Tensor own = ChunkView(flat, ChunkOf(flat.numel(), size(), rank()));
        const at::Tensor reduced = torch::empty_like(own);
        if (absl::Status status = ReduceScatterRing(call, flat, reduced, op, slot_base, deadline);
            !status.ok()) {
          return status;
        }
        own.copy_(reduced);
        return AllGatherRing(call, flat, slot_base + size(), deadline);
      });
}

std::shared_ptr<Work> RingCommunicator::StartAllGather(at::Tensor input, at::Tensor output) {
  return Enqueue(
      collectives_, Collective::kAllGather, /*peer=*/-1,
      [this, input, output](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
        const at::Tensor flat = output.view({-1});
        const at::Tensor own = ChunkView(flat, ChunkOf(flat.numel(), size(), rank()));
        if (own.data_ptr() != input.data_ptr()) own.copy_(input.view({-1}));
        return AllGatherRing(call, flat, slot_base, deadline);
      });
}

std::shared_ptr<Work> RingCommunicator::StartReduceScatter(at::Tensor input, at::Tensor output,
                                                           ReduceOp op) {
  return Enqueue(collectives_, Collective::kReduceScatter, /*peer=*/-1,
                 [this, input, output, op](const CollectiveCall& call, uint64_t slot_base,
                                           absl::Time deadline) {
                   return ReduceScatterRing(call, input.view({-1}), output.view({-1}), op,
                                            slot_base, deadline);
                 });
}

// The root sends the whole tensor to every other rank: simple, and what the small groups and
// one-off broadcasts (initial weights) here need.
std::shared_ptr<Work> RingCommunicator::StartBroadcast(at::Tensor tensor, int root) {
  return Enqueue(
      collectives_, Collective::kBroadcast, /*peer=*/-1,
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
  return Enqueue(collectives_, Collective::kBarrier, /*peer=*/-1,
                 [this](const CollectiveCall& call, uint64_t slot_base, absl::Time deadline) {
                   const at::Tensor tokens = torch::zeros({size()}, at::kByte);
                   return AllGatherRing(call, tokens, slot_base, deadline);
                 });
}

absl::Status RingCommunicator::Shift(const CollectiveCall& call, uint64_t slot_base,
                                     const std::vector<at::Tensor>& sends,
                                     const std::vector<at::Tensor>& receives, absl::Time deadline) {
  const int n = size();
  for (int k = 1; k < n; ++k) {
    const int to = Mod(rank() + k, n);
    const int from = Mod(rank() - k, n);
    PLAIT_RETURN_IF_ERROR(Transmit(*mesh_, call, slot_base + k, {Transfer{sends[to], to}},
                                   Transfer{receives[from], from}, deadline));
  }
  return absl::OkStatus();
}

// Every rank ends with the same table, so every rank finds the same first disagreement.
absl::Status RingCommunicator::CheckAllToAllAgreement(const CollectiveCall& call,
                                                      const at::Tensor& input,
                                                      const std::vector<int64_t>& send_rows,
                                                      const std::vector<int64_t>& receive_rows,
                                                      uint64_t slot_base, absl::Time deadline) {
  const int n = size();
  // Rank q's row: its dtype, elements per row, send_rows, then receive_rows.
  const at::Tensor table = torch::empty({n, 2 + 2 * n}, at::kLong);
  const at::Tensor own = table[rank()];
  int64_t* words = own.data_ptr<int64_t>();
  words[0] = static_cast<int64_t>(input.scalar_type());
  words[1] = c10::multiply_integers(input.sizes().slice(1));
  std::copy(send_rows.begin(), send_rows.end(), words + 2);
  std::copy(receive_rows.begin(), receive_rows.end(), words + 2 + n);
  std::vector<at::Tensor> rows;
  for (int q = 0; q < n; ++q) rows.push_back(table[q]);
  PLAIT_RETURN_IF_ERROR(Shift(call, slot_base, std::vector<at::Tensor>(n, own), rows, deadline));

  const auto t = table.accessor<int64_t, 2>();
  const auto row_text = [&](int q) {
    return TensorText(static_cast<at::ScalarType>(t[q][0]), t[q][1]);
  };
  for (int q = 1; q < n; ++q) {
    if (t[q][0] != t[0][0] || t[q][1] != t[0][1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(call), ": rank ", q, "'s rows are ", row_text(q), " where rank 0's are ",
          row_text(0), "; every rank must exchange rows of one dtype and size"));
    }
  }
  for (int q = 0; q < n; ++q) {
    for (int r = 0; r < n; ++r) {
      const int64_t sent = t[q][2 + r];
      const int64_t expected = t[r][2 + n + q];
      if (sent != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(call), ": rank ", q, " sends ", sent, " rows to rank ", r, " (its send_rows[",
            r, "]), but rank ", r, " expects ", expected, " from rank ", q, " (its receive_rows[",
            q,
            "]); ExchangeRowCounts gives each rank the receive_rows its peers' send_rows imply"));
      }
    }
  }
  return absl::OkStatus();
}

// Counts first (slots 1 to N-1 of the call), then the rows (slots N+1 to 2N-1).
std::shared_ptr<Work> RingCommunicator::StartAllToAll(at::Tensor input, at::Tensor output,
                                                      std::vector<int64_t> send_rows,
                                                      std::vector<int64_t> receive_rows) {
  return Enqueue(
      collectives_, Collective::kAllToAll, /*peer=*/-1,
      [this, input, output, send_rows = std::move(send_rows),
       receive_rows = std::move(receive_rows)](const CollectiveCall& call, uint64_t slot_base,
                                               absl::Time deadline) -> absl::Status {
        PLAIT_RETURN_IF_ERROR(
            CheckAllToAllAgreement(call, input, send_rows, receive_rows, slot_base, deadline));
        const int n = size();
        const std::vector<int64_t> send_offsets = RowOffsets(send_rows);
        const std::vector<int64_t> receive_offsets = RowOffsets(receive_rows);
        std::vector<at::Tensor> sends;
        std::vector<at::Tensor> receives;
        for (int r = 0; r < n; ++r) {
          sends.push_back(input.narrow(0, send_offsets[r], send_rows[r]));
          receives.push_back(output.narrow(0, receive_offsets[r], receive_rows[r]));
        }
        receives[rank()].copy_(sends[rank()]);
        PLAIT_RETURN_IF_ERROR(Shift(call, slot_base + n, sends, receives, deadline));
        int64_t bytes_sent = 0;
        int64_t bytes_received = 0;
        for (int r = 0; r < n; ++r) {
          if (r == rank()) continue;
          bytes_sent += static_cast<int64_t>(sends[r].nbytes());
          bytes_received += static_cast<int64_t>(receives[r].nbytes());
        }
        CountTraffic(Collective::kAllToAll, bytes_sent, bytes_received);
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> RingCommunicator::StartSend(at::Tensor tensor, int peer) {
  return Enqueue(
      PointToPointLane(Collective::kSend, peer), Collective::kSend, peer,
      [this, tensor, peer](const CollectiveCall& call, uint64_t slot_base,
                           absl::Time deadline) -> absl::Status {
        const at::Tensor header =
            torch::tensor({static_cast<int64_t>(tensor.scalar_type()), tensor.numel()});
        PLAIT_RETURN_IF_ERROR(Transmit(*point_to_point_mesh_, call, slot_base,
                                       {Transfer{header, peer}}, std::nullopt, deadline));
        PLAIT_RETURN_IF_ERROR(Transmit(*point_to_point_mesh_, call, slot_base + 1,
                                       {Transfer{tensor, peer}}, std::nullopt, deadline));
        CountTraffic(Collective::kSend, tensor.nbytes(), 0);
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> RingCommunicator::StartReceive(at::Tensor tensor, int peer) {
  return Enqueue(
      PointToPointLane(Collective::kReceive, peer), Collective::kReceive, peer,
      [this, tensor, peer](const CollectiveCall& call, uint64_t slot_base,
                           absl::Time deadline) -> absl::Status {
        const at::Tensor header = torch::empty({kHeaderWords}, at::kLong);
        PLAIT_RETURN_IF_ERROR(
            Transmit(*point_to_point_mesh_, call, slot_base, {}, Transfer{header, peer}, deadline));
        const auto their_dtype = static_cast<at::ScalarType>(header[0].item<int64_t>());
        const int64_t their_numel = header[1].item<int64_t>();
        if (their_dtype != tensor.scalar_type() || their_numel != tensor.numel()) {
          return absl::InvalidArgumentError(absl::StrCat(
              Describe(call), ": rank ", peer, " sent ", TensorText(their_dtype, their_numel),
              ", but the tensor to receive it into is ",
              TensorText(tensor.scalar_type(), tensor.numel()), " (shape ", "[",
              absl::StrJoin(tensor.sizes(), ", "), "]",
              "); the two must have one dtype and element count"));
        }
        PLAIT_RETURN_IF_ERROR(Transmit(*point_to_point_mesh_, call, slot_base + 1, {},
                                       Transfer{tensor, peer}, deadline));
        CountTraffic(Collective::kReceive, 0, tensor.nbytes());
        return absl::OkStatus();
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
