#include "parallel/communicator.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

bool SupportedDtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf ||
         dtype == at::kLong || dtype == at::kByte;
}

// Checks the row counts `name` of an AllToAll among `size` ranks; the error says what is wrong
// with them, for the caller to prefix.
absl::Status CheckRowCounts(absl::string_view name, const std::vector<int64_t>& rows, int size) {
  if (static_cast<int>(rows.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " has ", rows.size(), " counts; it needs one per rank of the group (", size, ")"));
  }
  for (int rank = 0; rank < size; ++rank) {
    if (rows[rank] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", rank, "] is ", rows[rank], "; a count of rows is at least 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kSend:
      return "send";
    case Collective::kReceive:
      return "receive";
    case Collective::kAllToAll:
      return "all_to_all";
  }
  return "collective";
}

bool IsPointToPoint(Collective collective) {
  return collective == Collective::kSend || collective == Collective::kReceive;
}

absl::Status NotifiedWork::Wait() {
  done_.WaitForNotification();
  return status_;
}

void NotifiedWork::Complete(absl::Status status) {
  status_ = std::move(status);
  done_.Notify();
}

std::shared_ptr<Work> FinishedWork(absl::Status status) {
  auto work = std::make_shared<NotifiedWork>();
  work->Complete(std::move(status));
  return work;
}

Chunk ChunkOf(int64_t total_numel, int num_chunks, int index) {
  const int64_t base = total_numel / num_chunks;
  const int64_t longer = total_numel % num_chunks;  // the first `longer` chunks get one more
  const int64_t offset = index * base + std::min<int64_t>(index, longer);
  return {offset, base + (index < longer ? 1 : 0)};
}

std::vector<int64_t> RowOffsets(const std::vector<int64_t>& rows) {
  std::vector<int64_t> offsets(rows.size());
  std::exclusive_scan(rows.begin(), rows.end(), offsets.begin(), int64_t{0});
  return offsets;
}

Communicator::Communicator(std::string name, int rank, int size, CommunicatorOptions options)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      options_(options),
      sent_to_(size, 0),
      received_from_(size, 0) {}

void Communicator::BeginStep(int64_t step) {
  step_ = step;
  issued_in_step_ = 0;
}

CollectiveCall Communicator::NextCall(Collective collective, int peer) const {
  if (!IsPointToPoint(collective))
    return CollectiveCall{collective, step_, issued_in_step_, place_};
  const std::vector<int64_t>& messages =
      collective == Collective::kSend ? sent_to_ : received_from_;
  return CollectiveCall{collective, step_, messages[peer], place_, peer};
}

std::shared_ptr<Work> Communicator::Issue(Collective collective, int peer,
                                          absl::FunctionRef<std::shared_ptr<Work>()> start) {
  if (skip_for_testing_ && skip_for_testing_(NextCall(collective, peer))) {
    return FinishedWork(absl::OkStatus());
  }
  std::shared_ptr<Work> work = start();
  if (IsPointToPoint(collective)) {
    ++(collective == Collective::kSend ? sent_to_ : received_from_)[peer];
  } else {
    ++issued_in_step_;
  }
  CountCall(collective);
  return work;
}

std::string Communicator::Render(const CollectiveCall& call, bool with_rank) const {
  std::string text;
  if (call.step > 0) absl::StrAppend(&text, "step ", call.step, ", ");
  const StepPlace& place = call.place;
  if (place.block != StepPlace::kNoBlock) {
    if (place.block == StepPlace::kRoot) {
      absl::StrAppend(&text, "root");
    } else {
      absl::StrAppend(&text, "block ", place.block);
    }
  }
  if (place.pass != Pass::kNone) {
    absl::StrAppend(&text, place.block != StepPlace::kNoBlock ? " " : "",
                    place.pass == Pass::kForward ? "forward" : "backward");
  }
  if (place.block != StepPlace::kNoBlock || place.pass != Pass::kNone) {
    absl::StrAppend(&text, ", ");
  }
  absl::StrAppend(&text, CollectiveName(call.collective));
  const bool point_to_point = IsPointToPoint(call.collective);
  if (point_to_point) {
    absl::StrAppend(&text, call.collective == Collective::kSend ? " to" : " from", " rank ",
                    call.peer);
  }
  if (place.purpose != nullptr) {
    absl::StrAppend(&text, " of ", place.purpose);
    if (place.part >= 0) absl::StrAppend(&text, " ", place.part);
  }
  absl::StrAppend(&text, " on group '", name_, "'");
  if (with_rank || call.step > 0 || point_to_point) {
    absl::StrAppend(&text, " (");
    if (with_rank) absl::StrAppend(&text, "rank ", rank_, " of ", size_);
    const char* separator = with_rank ? "; " : "";
    if (point_to_point) {
      const bool sending = call.collective == Collective::kSend;
      absl::StrAppend(&text, separator, "message #", call.index, " from rank ",
                      sending ? rank_ : call.peer, " to rank ", sending ? call.peer : rank_);
    } else if (call.step > 0) {
      absl::StrAppend(&text, separator, "collective #", call.index, " of the step");
    }
    absl::StrAppend(&text, ")");
  }
  return text;
}

std::string Communicator::Describe(const CollectiveCall& call) const {
  return Render(call, /*with_rank=*/true);
}

void FailureRecord::Record(const CollectiveCall& call) {
  absl::MutexLock lock(&mutex_);
  if (!first_.has_value()) first_ = call;
}

std::optional<CollectiveCall> FailureRecord::first() const {
  absl::MutexLock lock(&mutex_);
  return first_;
}

std::string Communicator::FirstFailure() const {
  const std::optional<CollectiveCall> first = failures_->first();
  return first.has_value() ? Render(*first, /*with_rank=*/false) : "";
}

Traffic Communicator::traffic(Collective collective) const {
  const Counters& counters = counters_[static_cast<int>(collective)];
  return {counters.calls.load(), counters.bytes_sent.load(), counters.bytes_received.load()};
}

void Communicator::CountTraffic(Collective collective, int64_t bytes_sent, int64_t bytes_received) {
  Counters& counters = counters_[static_cast<int>(collective)];
  counters.bytes_sent += bytes_sent;
  counters.bytes_received += bytes_received;
}

void Communicator::CountCall(Collective collective) {
  ++counters_[static_cast<int>(collective)].calls;
}

absl::Status Communicator::CheckTensor(Collective collective, absl::string_view role,
                                       const at::Tensor& tensor, int peer) const {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(collective, peer), ": ", role, " is an undefined tensor"));
  }
  if (tensor.device() != device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(collective, peer), ": ", role, " is on ", tensor.device().str(),
                     ", but this communicator runs on ", device().str(), "; move it there first"));
  }
  if (!SupportedDtype(tensor.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(collective, peer), ": ", role, " has dtype ", c10::toString(tensor.scalar_type()),
        "; supported are Float, BFloat16, Half, Long and Byte"));
  }
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(collective, peer), ": ", role, " is not contiguous"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckOp(Collective collective, const at::Tensor& tensor,
                                   ReduceOp op) const {
  if (op == ReduceOp::kAverage && !tensor.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(collective), ": average of ",
                                                   c10::toString(tensor.scalar_type()),
                                                   " tensors is not defined; use sum"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckAllToAll(const at::Tensor& input, const at::Tensor& output,
                                         const std::vector<int64_t>& send_rows,
                                         const std::vector<int64_t>& receive_rows) const {
  constexpr Collective kOp = Collective::kAllToAll;
  for (auto [role, tensor] : {std::pair{"input", &input}, std::pair{"output", &output}}) {
    PLAIT_RETURN_IF_ERROR(CheckTensor(kOp, role, *tensor));
    if (tensor->dim() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(kOp), ": ", role, " is a 0-dim tensor; it needs a dimension of rows"));
    }
  }
  if (input.scalar_type() != output.scalar_type() ||
      input.sizes().slice(1) != output.sizes().slice(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(kOp), ": input is ", c10::toString(input.scalar_type()), " [",
                     absl::StrJoin(input.sizes(), ", "), "] and output ",
                     c10::toString(output.scalar_type()), " [", absl::StrJoin(output.sizes(), ", "),
                     "]; their rows (the sizes after dim 0) must have one dtype and shape"));
  }
  for (auto [name, rows, role, tensor] :
       {std::tuple{"send_rows", &send_rows, "input", &input},
        std::tuple{"receive_rows", &receive_rows, "output", &output}}) {
    PLAIT_RETURN_IF_ERROR(base::Annotate(CheckRowCounts(name, *rows, size_), Describe(kOp)));
    const int64_t total = std::accumulate(rows->begin(), rows->end(), int64_t{0});
    if (total != tensor->size(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Describe(kOp), ": ", name, " [", absl::StrJoin(*rows, ", "), "] sum to ",
                       total, ", but ", role, " has ", tensor->size(0), " rows"));
    }
  }
  if (send_rows[rank_] != receive_rows[rank_]) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(kOp), ": send_rows[", rank_, "] is ", send_rows[rank_],
                     " but receive_rows[", rank_, "] is ", receive_rows[rank_],
                     "; the rows this rank sends itself are the rows it receives from itself"));
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> Communicator::AllReduce(at::Tensor tensor, ReduceOp op) {
  constexpr Collective kOp = Collective::kAllReduce;
  if (absl::Status status = CheckTensor(kOp, "tensor", tensor); !status.ok()) {
    return FinishedWork(status);
  }
  if (absl::Status status = CheckOp(kOp, tensor, op); !status.ok()) return FinishedWork(status);
  return Issue(kOp, /*peer=*/-1, [&] { return StartAllReduce(std::move(tensor), op); });
}

std::shared_ptr<Work> Communicator::AllGather(at::Tensor input, at::Tensor output) {
  constexpr Collective kOp = Collective::kAllGather;
  for (auto [role, tensor] : {std::pair{"input", &input}, std::pair{"output", &output}}) {
    if (absl::Status status = CheckTensor(kOp, role, *tensor); !status.ok()) {
      return FinishedWork(status);
    }
  }
  const Chunk chunk = ChunkOf(output.numel(), size_, rank_);
  if (input.scalar_type() != output.scalar_type() || input.numel() != chunk.numel) {
    return FinishedWork(absl::InvalidArgumentError(absl::StrCat(
        Describe(kOp), ": input is ", c10::toString(input.scalar_type()), "[", input.numel(),
        "], but chunk ", rank_, " of the ", c10::toString(output.scalar_type()), "[",
        output.numel(), "] output has ", chunk.numel, " elements")));
  }
  return Issue(kOp, /*peer=*/-1,
               [&] { return StartAllGather(std::move(input), std::move(output)); });
}

std::shared_ptr<Work> Communicator::ReduceScatter(at::Tensor input, at::Tensor output,
                                                  ReduceOp op) {
  constexpr Collective kOp = Collective::kReduceScatter;
  for (auto [role, tensor] : {std::pair{"input", &input}, std::pair{"output", &output}}) {
    if (absl::Status status = CheckTensor(kOp, role, *tensor); !status.ok()) {
      return FinishedWork(status);
    }
  }
  if (absl::Status status = CheckOp(kOp, input, op); !status.ok()) return FinishedWork(status);
  const Chunk chunk = ChunkOf(input.numel(), size_, rank_);
  if (input.scalar_type() != output.scalar_type() || output.numel() != chunk.numel) {
    return FinishedWork(absl::InvalidArgumentError(absl::StrCat(
        Describe(kOp), ": output is ", c10::toString(output.scalar_type()), "[", output.numel(),
        "], but chunk ", rank_, " of the ", c10::toString(input.scalar_type()), "[", input.numel(),
        "] input has ", chunk.numel, " elements")));
  }
  return Issue(kOp, /*peer=*/-1,
               [&] { return StartReduceScatter(std::move(input), std::move(output), op); });
}

std::shared_ptr<Work> Communicator::Broadcast(at::Tensor tensor, int root) {
  constexpr Collective kOp = Collective::kBroadcast;
  if (absl::Status status = CheckTensor(kOp, "tensor", tensor); !status.ok()) {
    return FinishedWork(status);
  }
  if (root < 0 || root >= size_) {
    return FinishedWork(absl::InvalidArgumentError(
        absl::StrCat(Describe(kOp), ": root ", root, " is not a rank of the group")));
  }
  return Issue(kOp, /*peer=*/-1, [&] { return StartBroadcast(std::move(tensor), root); });
}

std::shared_ptr<Work> Communicator::Barrier() {
  return Issue(Collective::kBarrier, /*peer=*/-1, [&] { return StartBarrier(); });
}

std::shared_ptr<Work> Communicator::AllToAll(at::Tensor input, at::Tensor output,
                                             std::vector<int64_t> send_rows,
                                             std::vector<int64_t> receive_rows) {
  if (absl::Status status = CheckAllToAll(input, output, send_rows, receive_rows); !status.ok()) {
    return FinishedWork(status);
  }
  return Issue(Collective::kAllToAll, /*peer=*/-1, [&] {
    return StartAllToAll(std::move(input), std::move(output), std::move(send_rows),
                         std::move(receive_rows));
  });
}

std::shared_ptr<Work> Communicator::IssuePointToPoint(Collective collective, at::Tensor tensor,
                                                      int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return FinishedWork(absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(collective), " on group '", name_, "' (rank ", rank_, " of ", size_,
        "): peer ", peer, " is ", peer == rank_ ? "this rank" : "not a rank of the group",
        "; it must be another rank in [0, ", size_, ")")));
  }
  if (absl::Status status = CheckTensor(collective, "tensor", tensor, peer); !status.ok()) {
    return FinishedWork(status);
  }
  return Issue(collective, peer, [&] {
    return collective == Collective::kSend ? StartSend(std::move(tensor), peer)
                                           : StartReceive(std::move(tensor), peer);
  });
}

std::shared_ptr<Work> Communicator::Send(at::Tensor tensor, int peer) {
  return IssuePointToPoint(Collective::kSend, std::move(tensor), peer);
}

std::shared_ptr<Work> Communicator::Receive(at::Tensor tensor, int peer) {
  return IssuePointToPoint(Collective::kReceive, std::move(tensor), peer);
}

absl::StatusOr<std::vector<std::string>> AllGatherStrings(Communicator& group,
                                                          const std::string& own) {
  const int size = group.size();
  at::Tensor lengths = torch::zeros({size}, at::kLong);
  lengths[group.rank()] = static_cast<int64_t>(own.size());
  lengths = lengths.to(group.device());
  if (absl::Status status = group.AllReduce(lengths, ReduceOp::kSum)->Wait(); !status.ok()) {
    return status;
  }
  lengths = lengths.cpu();
  const int64_t longest = lengths.max().item<int64_t>();
  std::vector<std::string> strings(size);
  if (longest == 0) return strings;
  at::Tensor bytes = torch::zeros({size * longest}, at::kByte);
  std::copy(own.begin(), own.end(), bytes.data_ptr<uint8_t>() + group.rank() * longest);
  bytes = bytes.to(group.device());
  const at::Tensor chunk = bytes.narrow(0, group.rank() * longest, longest);
  if (absl::Status status = group.AllGather(chunk, bytes)->Wait(); !status.ok()) return status;
  bytes = bytes.cpu();
  const auto* data = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  for (int rank = 0; rank < size; ++rank) {
    strings[rank].assign(data + rank * longest, lengths[rank].item<int64_t>());
  }
  return strings;
}

absl::StatusOr<std::vector<int64_t>> ExchangeRowCounts(Communicator& group,
                                                       const std::vector<int64_t>& send_rows) {
  PLAIT_RETURN_IF_ERROR(
      base::Annotate(CheckRowCounts("send_rows", send_rows, group.size()),
                     absl::StrCat("exchanging row counts on group '", group.name(), "' (rank ",
                                  group.rank(), " of ", group.size(), ")")));
  const int64_t size = group.size();
  const at::Tensor sent = torch::tensor(send_rows, at::kLong).to(group.device());
  const at::Tensor received = torch::empty({size}, sent.options());
  const std::vector<int64_t> one_each(size, 1);
  PLAIT_RETURN_IF_ERROR(group.AllToAll(sent, received, one_each, one_each)->Wait());
  const at::Tensor counts = received.cpu();
  return std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + size);
}

}  // namespace plait::parallel
