#include "parallel/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <iterator>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/math.h"
#include "base/status.h"
#include "c10/util/accumulate.h"

namespace plait::parallel {
namespace {

// How often a waiting host checks the completion event and NCCL's error state: short next to
// a collective's usual milliseconds, long enough that polling costs no measurable CPU.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);

// The function called in `expression`: "cudaMemcpyAsync" for "cudaMemcpyAsync(dst, ...)".
absl::string_view CallName(absl::string_view expression) {
  return expression.substr(0, expression.find('('));
}

// A failed call's error is cleared from the thread's last error, which LibTorch checks after
// each kernel launch: it is reported here, and must not resurface as the failure of a kernel.
absl::Status GpuStatus(cudaError_t error, absl::string_view expression) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  std::string message = absl::StrCat(CallName(expression), " failed: ", cudaGetErrorString(error),
                                     " (", cudaGetErrorName(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// ncclInProgress is not an error: a non-blocking communicator accepted the call and finishes
// it in the background, which Connection::Settle waits for.
absl::Status GpuStatus(ncclResult_t result, absl::string_view expression) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  std::string message = absl::StrCat(CallName(expression), " failed: ", ncclGetErrorString(result));
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && *detail != '\0') absl::StrAppend(&message, " (", detail, ")");
  if (result == ncclSystemError || result == ncclRemoteError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

// Returns from the enclosing function, with the call's name and CUDA's or NCCL's description
// of the error, when a CUDA runtime or NCCL call fails.
#define PLAIT_GPU_RETURN_IF_ERROR(call) PLAIT_RETURN_IF_ERROR(GpuStatus((call), #call))

// Destructors cannot return a status, so theirs goes to stderr.
void Report(const absl::Status& status) {
  if (!status.ok()) std::cerr << "plait: " << status.message() << std::endl;
}

absl::Status TimeoutError(absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "did not finish within ", absl::FormatDuration(timeout),
      " (CommunicatorOptions::timeout); a rank of the group may have stopped, or the ranks "
      "may be issuing different calls"));
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kSum:
      break;
  }
  return ncclSum;
}

// The NCCL type of `tensor` (which Communicator checked is on this communicator's device);
// `description` is Communicator::Describe's prefix.
absl::StatusOr<ncclDataType_t> TensorType(const std::string& description, const char* role,
                                          const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kHalf:
      return ncclFloat16;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    default:
      return absl::InvalidArgumentError(absl::StrCat(description, ": ", role, " has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     ", which has no NCCL mapping here"));
  }
}

// An exception's message, without the backtrace LibTorch appends to its own.
std::string ExceptionMessage(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) {
    return torch_error->what_without_backtrace();
  }
  return error.what();
}

// Rank 0 draws the NCCL unique id and publishes it under `key`; the other ranks wait for it
// until `deadline`.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(c10d::Store& store, const std::string& key, int rank,
                                              absl::Time deadline, absl::Duration timeout) {
  ncclUniqueId id;
  if (rank == 0) {
    PLAIT_GPU_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    try {
      store.set(key, std::vector<uint8_t>(std::begin(id.internal), std::end(id.internal)));
    } catch (const std::exception& error) {
      return absl::UnavailableError(absl::StrCat("publishing the NCCL unique id under store key '",
                                                 key, "' failed: ", ExceptionMessage(error)));
    }
    return id;
  }
  // A zero timeout means "wait forever" to c10d::Store, hence at least a millisecond.
  const std::chrono::milliseconds wait(std::max<int64_t>(
      1, absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)))));
  const auto wait_start = std::chrono::steady_clock::now();
  std::vector<uint8_t> bytes;
  try {
    store.wait({key}, wait);
    bytes = store.get(key);
  } catch (const std::exception& error) {
    // Stores report a timeout each in their own way (HashStore a std::system_error, TcpStore a
    // std::runtime_error), so a failure after the whole wait, on the steady clock they time out by,
    // is taken as the timeout.
    if (std::chrono::steady_clock::now() - wait_start >= wait) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank 0 did not publish the NCCL unique id under store key '", key,
                       "' within ", absl::FormatDuration(timeout), " (", ExceptionMessage(error),
                       "); check that rank 0 is running and creates a group of the same name"));
    }
    return absl::UnavailableError(absl::StrCat("reading the NCCL unique id under store key '", key,
                                               "' failed: ", ExceptionMessage(error)));
  }
  if (bytes.size() != sizeof(id.internal)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store key '", key, "' holds ", bytes.size(), " bytes, not an NCCL unique id of ",
        sizeof(id.internal), "; another program may be using the same key"));
  }
  std::copy(bytes.begin(), bytes.end(), std::begin(id.internal));
  return id;
}

// Owns a CUDA event; a failure to destroy it goes to stderr.
struct EventDeleter {
  void operator()(cudaEvent_t event) const {
    Report(GpuStatus(cudaEventDestroy(event), "cudaEventDestroy"));
  }
};
using Event = std::unique_ptr<CUevent_st, EventDeleter>;

absl::StatusOr<Event> CreateEvent() {
  cudaEvent_t event = nullptr;
  PLAIT_GPU_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return Event(event);
}

enum class Direction { kToPadded, kFromPadded };

// Copies every chunk between `flat`, the layout of communicator.h (chunk i holds
// ChunkOf(total, n, i).numel elements, back to back), and `padded`, which holds chunk i at
// i * ceil(total / n) elements. One copy per chunk, queued on `stream`.
absl::Status CopyChunks(Direction direction, char* flat, char* padded, int64_t total, int n,
                        int64_t element_size, cudaStream_t stream) {
  const int64_t padded_bytes = base::CeilDiv(total, n) * element_size;
  for (int i = 0; i < n; ++i) {
    const Chunk chunk = ChunkOf(total, n, i);
    char* flat_chunk = flat + chunk.offset * element_size;
    char* padded_chunk = padded + i * padded_bytes;
    char* destination = direction == Direction::kToPadded ? padded_chunk : flat_chunk;
    const char* source = direction == Direction::kToPadded ? flat_chunk : padded_chunk;
    PLAIT_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(destination, source, chunk.numel * element_size,
                                              cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

}  // namespace

// The NCCL communicator runs in non-blocking mode (ncclConfig_t::blocking = 0): connecting and
// enqueueing return at once and NCCL's state is polled, so a rank that never shows up fails
// connecting or enqueueing after the timeout instead of blocking the host forever.
//
// mu_ guards every NCCL call on comm_ (NCCL communicators are not thread-safe), failure_ and
// the staging buffer. Methods documented "with mu_ held" run in Enqueue's callback, Connect
// and Close.
class NcclCommunicator::Connection {
 public:
  Connection(std::string group, int device, cudaStream_t compute_stream, absl::Duration timeout)
      : group_(std::move(group)),
        device_(device),
        compute_stream_(compute_stream),
        timeout_(timeout) {}

  ~Connection() { Report(base::Annotate(Close(), absl::StrCat("closing ", group_))); }

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Creates the communication stream and the NCCL communicator of rank `rank` of `size`.
  absl::Status Connect(const ncclUniqueId& id, int rank, int size, absl::Time deadline) {
    absl::Status status = [&]() -> absl::Status {
      PLAIT_GPU_RETURN_IF_ERROR(cudaSetDevice(device_));
      PLAIT_GPU_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      PLAIT_ASSIGN_OR_RETURN(ready_, CreateEvent());
      PLAIT_GPU_RETURN_IF_ERROR(cudaMalloc(&barrier_buffer_, sizeof(float)));
      PLAIT_GPU_RETURN_IF_ERROR(cudaMemsetAsync(barrier_buffer_, 0, sizeof(float), stream_));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      absl::MutexLock lock(&mu_);
      PLAIT_GPU_RETURN_IF_ERROR(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
      return Settle(deadline);
    }();
    if (status.ok()) return status;
    return Fail(base::Annotate(status, absl::StrCat("connecting ", group_)));
  }

  int device() const { return device_; }
  cudaStream_t compute_stream() const { return compute_stream_; }

  // With mu_ held: the communicator, its stream and the barrier's one-float buffer.
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  float* barrier_buffer() const { return barrier_buffer_; }

  // Queues `enqueue` on the communication stream after the work queued so far on the compute
  // stream; returns the event recorded after it. A failure aborts the communicator; once it
  // has failed, returns the first failure.
  absl::StatusOr<Event> Enqueue(
      absl::string_view description, absl::Time deadline,
      absl::FunctionRef<absl::Status(Connection& connection, absl::Time deadline)> enqueue) {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    absl::StatusOr<Event> done = [&]() -> absl::StatusOr<Event> {
      PLAIT_GPU_RETURN_IF_ERROR(cudaSetDevice(device_));
      PLAIT_GPU_RETURN_IF_ERROR(cudaEventRecord(ready_.get(), compute_stream_));
      PLAIT_GPU_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, ready_.get(), 0));
      PLAIT_RETURN_IF_ERROR(enqueue(*this, deadline));
      PLAIT_ASSIGN_OR_RETURN(Event event, CreateEvent());
      PLAIT_GPU_RETURN_IF_ERROR(cudaEventRecord(event.get(), stream_));
      return event;
    }();
    // A rank that skipped a collective has left the group out of step, so any failure here
    // ends the communicator.
    if (!done.ok()) return FailLocked(base::Annotate(done.status(), description));
    return done;
  }

  // With mu_ held: waits until the non-blocking communicator has taken in the last call.
  absl::Status Settle(absl::Time deadline) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      PLAIT_GPU_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclInProgress) return GpuStatus(state, "an asynchronous NCCL operation");
      if (absl::Now() >= deadline) return TimeoutError(timeout_);
      absl::SleepFor(kPollInterval);
    }
  }

  // With mu_ held: a device buffer of at least `bytes` for the communication stream. It grows
  // in stream order, so collectives queued earlier keep the buffer they were given.
  absl::StatusOr<char*> Staging(int64_t bytes) {
    if (bytes > staging_bytes_) {
      if (staging_ != nullptr) {
        PLAIT_GPU_RETURN_IF_ERROR(cudaFreeAsync(staging_, stream_));
      }
      staging_ = nullptr;
      staging_bytes_ = 0;
      void* buffer = nullptr;
      PLAIT_GPU_RETURN_IF_ERROR(cudaMallocAsync(&buffer, bytes, stream_));
      staging_ = static_cast<char*>(buffer);
      staging_bytes_ = bytes;
    }
    return staging_;
  }

  // Blocks until `done` has completed; a CUDA or NCCL error, or `deadline` passing first, aborts
  // the communicator. Returns the communicator's first failure if it has one.
  absl::Status Await(cudaEvent_t done, absl::Time deadline, absl::string_view description) {
    absl::Status status = Poll([done] { return cudaEventQuery(done); }, "cudaEventQuery", deadline);
    if (status.ok()) return status;
    return Fail(base::Annotate(status, description));
  }

  // Records `status` as the communicator's failure, unless it already has one, and aborts the
  // NCCL communicator; returns the first failure.
  absl::Status Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    return FailLocked(std::move(status));
  }

 private:
  absl::Status FailLocked(absl::Status status) {
    if (!failure_.ok()) return failure_;
    std::string message = std::string(status.message());
    if (comm_ != nullptr) {
      const absl::Status aborted = GpuStatus(ncclCommAbort(comm_), "ncclCommAbort");
      comm_ = nullptr;
      absl::StrAppend(&message, "; the NCCL communicator was aborted",
                      aborted.ok() ? "" : absl::StrCat(" (", aborted.message(), ")"),
                      " and the group runs no more collectives");
    }
    failure_ = absl::Status(status.code(), message);
    return failure_;
  }

  // Polls `query` (cudaEventQuery, cudaStreamQuery), named `call`, and NCCL's asynchronous error
  // state, without holding mu_ between polls, until the queried work has finished.
  absl::Status Poll(absl::FunctionRef<cudaError_t()> query, absl::string_view call,
                    absl::Time deadline) {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (!failure_.ok()) return failure_;
        ncclResult_t state = ncclSuccess;
        PLAIT_GPU_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
        PLAIT_RETURN_IF_ERROR(GpuStatus(state, "an asynchronous NCCL operation"));
      }
      const cudaError_t result = query();
      if (result == cudaSuccess) return absl::OkStatus();
      if (result != cudaErrorNotReady) return GpuStatus(result, call);
      // Not a failure, and cleared from the thread's last error as GpuStatus clears failures
      // (and LibTorch's own event queries, c10/cuda/CUDAEvent.h, clear it).
      (void)cudaGetLastError();
      if (absl::Now() >= deadline) return TimeoutError(timeout_);
      absl::SleepFor(kPollInterval);
    }
  }

  // Lets the queued collectives drain (for at most the timeout) and closes the communicator,
  // aborting it if draining or closing fails; then frees the CUDA resources.
  absl::Status Close() {
    absl::Status status;
    if (comm_ != nullptr) {
      const absl::Time deadline = absl::Now() + timeout_;
      absl::Status closed =
          Poll([this] { return cudaStreamQuery(stream_); }, "cudaStreamQuery", deadline);
      absl::MutexLock lock(&mu_);
      if (closed.ok()) closed = GpuStatus(ncclCommFinalize(comm_), "ncclCommFinalize");
      if (closed.ok()) closed = Settle(deadline);
      if (closed.ok()) closed = GpuStatus(ncclCommDestroy(comm_), "ncclCommDestroy");
      if (closed.ok()) {
        comm_ = nullptr;
      } else {
        status = FailLocked(closed);
      }
    }
    if (staging_ != nullptr) {
      status.Update(GpuStatus(cudaFreeAsync(staging_, stream_), "cudaFreeAsync"));
    }
    if (barrier_buffer_ != nullptr) {
      status.Update(GpuStatus(cudaFree(barrier_buffer_), "cudaFree"));
    }
    ready_.reset();
    if (stream_ != nullptr) {
      status.Update(GpuStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy"));
    }
    return status;
  }

  const std::string group_;  // "NCCL group 'dp' (rank 1 of 2, cuda:1)", for errors
  const int device_;
  const cudaStream_t compute_stream_;
  const absl::Duration timeout_;

  cudaStream_t stream_ = nullptr;
  Event ready_;  // recorded on the compute stream before each collective
  float* barrier_buffer_ = nullptr;

  absl::Mutex mu_;
  ncclComm_t comm_ = nullptr;  // null once destroyed or aborted
  absl::Status failure_;
  char* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
};

// Keeps the collective's tensors alive until it has been waited for. Destroyed unwaited, it
// still makes the compute stream wait for the collective, so memory the caller frees there is
// not reused while NCCL may still write it.
class NcclCommunicator::NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Connection> connection, Event done, absl::Time deadline,
           std::string description, std::vector<at::Tensor> tensors, CollectiveCall call,
           std::shared_ptr<FailureRecord> failures)
      : connection_(std::move(connection)),
        done_(std::move(done)),
        deadline_(deadline),
        description_(std::move(description)),
        call_(call),
        failures_(std::move(failures)),
        tensors_(std::move(tensors)) {}

  ~NcclWork() override {
    absl::MutexLock lock(&mu_);
    if (!outcome_.has_value()) Report(base::Annotate(OrderComputeStream(), description_));
  }

  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (!outcome_.has_value()) {
      absl::Status status = connection_->Await(done_.get(), deadline_, description_);
      if (status.ok()) status = base::Annotate(OrderComputeStream(), description_);
      if (!status.ok()) failures_->Record(call_);
      tensors_.clear();
      outcome_ = std::move(status);
    }
    return *outcome_;
  }

 private:
  absl::Status OrderComputeStream() {
    // The legacy default stream is the current device's, so the device is set first.
    PLAIT_GPU_RETURN_IF_ERROR(cudaSetDevice(connection_->device()));
    PLAIT_GPU_RETURN_IF_ERROR(cudaStreamWaitEvent(connection_->compute_stream(), done_.get(), 0));
    return absl::OkStatus();
  }

  const std::shared_ptr<Connection> connection_;
  const Event done_;
  const absl::Time deadline_;
  const std::string description_;
  const CollectiveCall call_;
  const std::shared_ptr<FailureRecord> failures_;

  absl::Mutex mu_;
  std::vector<at::Tensor> tensors_;
  std::optional<absl::Status> outcome_;
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    c10::intrusive_ptr<c10d::Store> store, std::string name, int rank, int size, int cuda_device,
    CommunicatorOptions options, cudaStream_t compute_stream) {
  const absl::Time deadline = absl::Now() + options.timeout;
  std::string group = absl::StrCat("NCCL group '", name, "' (rank ", rank, " of ", size,
                                   ", cuda:", cuda_device, ")");
  if (!store) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": no store was given to exchange the NCCL unique id through"));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": the size must be at least 1 and the rank in [0, size)"));
  }
  if (cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": the CUDA device must be an index of a visible device"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(group, ": the timeout must be positive, not ",
                                                   absl::FormatDuration(options.timeout)));
  }
  absl::StatusOr<ncclUniqueId> id = ExchangeUniqueId(
      *store, absl::StrCat("plait/nccl/", name, "/unique_id"), rank, deadline, options.timeout);
  if (!id.ok()) return base::Annotate(id.status(), absl::StrCat("connecting ", group));
  auto connection =
      std::make_shared<Connection>(std::move(group), cuda_device, compute_stream, options.timeout);
  PLAIT_RETURN_IF_ERROR(connection->Connect(*id, rank, size, deadline));
  return absl::WrapUnique(
      new NcclCommunicator(std::move(name), rank, size, options, std::move(connection)));
}

NcclCommunicator::NcclCommunicator(std::string name, int rank, int size,
                                   CommunicatorOptions options,
                                   std::shared_ptr<Connection> connection)
    : Communicator(std::move(name), rank, size, options), connection_(std::move(connection)) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::cuda_device() const { return connection_->device(); }

std::shared_ptr<Work> NcclCommunicator::Launch(
    Collective collective, int peer, std::vector<at::Tensor> tensors, int64_t bytes_sent,
    int64_t bytes_received,
    absl::FunctionRef<absl::Status(Connection& connection, absl::Time deadline)> enqueue) {
  const CollectiveCall call = NextCall(collective, peer);
  std::string description = Describe(call);
  const absl::Time deadline = absl::Now() + options().timeout;
  absl::StatusOr<Event> done = connection_->Enqueue(description, deadline, enqueue);
  if (!done.ok()) {
    failures()->Record(call);
    return FinishedWork(done.status());
  }
  CountTraffic(collective, bytes_sent, bytes_received);
  return std::make_shared<NcclWork>(connection_, *std::move(done), deadline, std::move(description),
                                    std::move(tensors), call, failures());
}

// NCCL does not report the bytes it moves, so traffic is counted as its ring algorithms move
// them. With N ranks, an all-gather or a reduce-scatter of N chunks of C bytes sends and
// receives N-1 chunks on every rank: (N-1)/N of the buffer each way. An all-reduce is a
// reduce-scatter followed by an all-gather: 2(N-1)/N of the buffer each way. A broadcast is
// counted as the root sending the buffer once and every other rank receiving it once (the ring
// also forwards it through every rank but the last, which is not counted).

std::shared_ptr<Work> NcclCommunicator::StartAllReduce(at::Tensor tensor, ReduceOp op) {
  constexpr Collective kOp = Collective::kAllReduce;
  const absl::StatusOr<ncclDataType_t> type = TensorType(Describe(kOp), "tensor", tensor);
  if (!type.ok()) return FinishedWork(type.status());
  const int64_t bytes = 2 * (size() - 1) * tensor.numel() * tensor.element_size() / size();
  return Launch(kOp, /*peer=*/-1, {tensor}, bytes, bytes,
                [&](Connection& connection, absl::Time deadline) -> absl::Status {
                  PLAIT_GPU_RETURN_IF_ERROR(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                                                          tensor.numel(), *type, NcclOp(op),
                                                          connection.comm(), connection.stream()));
                  return connection.Settle(deadline);
                });
}

// NCCL's all-gather and reduce-scatter move chunks of one size, but ChunkOf's chunks differ by
// one element when the buffer of S elements is not a multiple of the group size. Then the
// collective runs in a staging buffer that holds every chunk padded to ceil(S / size)
// elements, and device-to-device copies on the communication stream move the chunks between
// it and the flat layout. A padding element carries whatever the staging buffer held; it is
// gathered or reduced like the others but never copied out.

namespace {

// What all-gather and reduce-scatter share: the NCCL type of their two tensors (both checked)
// and the padded chunks of the flat buffer of `total` elements.
struct PaddedChunks {
  ncclDataType_t type;
  int64_t total;
  int64_t element_size;
  int64_t count;  // elements per (padded) chunk
  int64_t bytes;  // sent and received per rank
};

absl::StatusOr<PaddedChunks> ChunkedCollective(const std::string& description, int size,
                                               const at::Tensor& input, const at::Tensor& output,
                                               int64_t total) {
  PLAIT_ASSIGN_OR_RETURN(ncclDataType_t type, TensorType(description, "input", input));
  PLAIT_RETURN_IF_ERROR(TensorType(description, "output", output).status());
  const int64_t element_size = input.element_size();
  const int64_t count = base::CeilDiv(total, size);
  return PaddedChunks{type, total, element_size, count, (size - 1) * count * element_size};
}

}  // namespace

std::shared_ptr<Work> NcclCommunicator::StartAllGather(at::Tensor input, at::Tensor output) {
  constexpr Collective kOp = Collective::kAllGather;
  const absl::StatusOr<PaddedChunks> chunks =
      ChunkedCollective(Describe(kOp), size(), input, output, output.numel());
  if (!chunks.ok()) return FinishedWork(chunks.status());
  const int n = size();
  const PaddedChunks& c = *chunks;
  return Launch(
      kOp, /*peer=*/-1, {input, output}, c.bytes, c.bytes,
      [&](Connection& connection, absl::Time deadline) -> absl::Status {
        if (c.total % n == 0) {
          PLAIT_GPU_RETURN_IF_ERROR(ncclAllGather(input.data_ptr(), output.data_ptr(), c.count,
                                                  c.type, connection.comm(), connection.stream()));
          return connection.Settle(deadline);
        }
        PLAIT_ASSIGN_OR_RETURN(char* staging, connection.Staging(n * c.count * c.element_size));
        char* own_chunk = staging + rank() * c.count * c.element_size;
        PLAIT_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(own_chunk, input.data_ptr(),
                                                  input.numel() * c.element_size,
                                                  cudaMemcpyDeviceToDevice, connection.stream()));
        PLAIT_GPU_RETURN_IF_ERROR(ncclAllGather(own_chunk, staging, c.count, c.type,
                                                connection.comm(), connection.stream()));
        PLAIT_RETURN_IF_ERROR(connection.Settle(deadline));
        return CopyChunks(Direction::kFromPadded, static_cast<char*>(output.data_ptr()), staging,
                          c.total, n, c.element_size, connection.stream());
      });
}

std::shared_ptr<Work> NcclCommunicator::StartReduceScatter(at::Tensor input, at::Tensor output,
                                                           ReduceOp op) {
  constexpr Collective kOp = Collective::kReduceScatter;
  const absl::StatusOr<PaddedChunks> chunks =
      ChunkedCollective(Describe(kOp), size(), input, output, input.numel());
  if (!chunks.ok()) return FinishedWork(chunks.status());
  const int n = size();
  const PaddedChunks& c = *chunks;
  return Launch(
      kOp, /*peer=*/-1, {input, output}, c.bytes, c.bytes,
      [&](Connection& connection, absl::Time deadline) -> absl::Status {
        if (c.total % n == 0) {
          PLAIT_GPU_RETURN_IF_ERROR(ncclReduceScatter(input.data_ptr(), output.data_ptr(), c.count,
                                                      c.type, NcclOp(op), connection.comm(),
                                                      connection.stream()));
          return connection.Settle(deadline);
        }
        PLAIT_ASSIGN_OR_RETURN(char* staging, connection.Staging(n * c.count * c.element_size));
        PLAIT_RETURN_IF_ERROR(CopyChunks(Direction::kToPadded, static_cast<char*>(input.data_ptr()),
                                         staging, c.total, n, c.element_size, connection.stream()));
        char* own_chunk = staging + rank() * c.count * c.element_size;
        PLAIT_GPU_RETURN_IF_ERROR(ncclReduceScatter(staging, own_chunk, c.count, c.type, NcclOp(op),
                                                    connection.comm(), connection.stream()));
        PLAIT_RETURN_IF_ERROR(connection.Settle(deadline));
        PLAIT_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(output.data_ptr(), own_chunk,
                                                  output.numel() * c.element_size,
                                                  cudaMemcpyDeviceToDevice, connection.stream()));
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> NcclCommunicator::StartBroadcast(at::Tensor tensor, int root) {
  constexpr Collective kOp = Collective::kBroadcast;
  const absl::StatusOr<ncclDataType_t> type = TensorType(Describe(kOp), "tensor", tensor);
  if (!type.ok()) return FinishedWork(type.status());
  const int64_t bytes = tensor.numel() * tensor.element_size();
  const bool is_root = rank() == root;
  return Launch(kOp, /*peer=*/-1, {tensor}, is_root ? bytes : 0, is_root ? 0 : bytes,
                [&](Connection& connection, absl::Time deadline) -> absl::Status {
                  PLAIT_GPU_RETURN_IF_ERROR(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(),
                                                          tensor.numel(), *type, root,
                                                          connection.comm(), connection.stream()));
                  return connection.Settle(deadline);
                });
}

// An all-reduce of one float, which no rank finishes before every rank has joined it.
std::shared_ptr<Work> NcclCommunicator::StartBarrier() {
  const int64_t bytes = 2 * (size() - 1) * static_cast<int64_t>(sizeof(float)) / size();
  return Launch(Collective::kBarrier, /*peer=*/-1, {}, bytes, bytes,
                [](Connection& connection, absl::Time deadline) -> absl::Status {
                  PLAIT_GPU_RETURN_IF_ERROR(
                      ncclAllReduce(connection.barrier_buffer(), connection.barrier_buffer(), 1,
                                    ncclFloat32, ncclSum, connection.comm(), connection.stream()));
                  return connection.Settle(deadline);
                });
}

// Counted as moved: the rows sent to and received from the other ranks, once each.
std::shared_ptr<Work> NcclCommunicator::StartAllToAll(at::Tensor input, at::Tensor output,
                                                      std::vector<int64_t> send_rows,
                                                      std::vector<int64_t> receive_rows) {
  constexpr Collective kOp = Collective::kAllToAll;
  const absl::StatusOr<ncclDataType_t> type = TensorType(Describe(kOp), "input", input);
  if (!type.ok()) return FinishedWork(type.status());
  const int64_t row_numel = c10::multiply_integers(input.sizes().slice(1));
  const int64_t row_bytes = row_numel * input.element_size();
  const std::vector<int64_t> send_offsets = RowOffsets(send_rows);
  const std::vector<int64_t> receive_offsets = RowOffsets(receive_rows);
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    bytes_sent += send_rows[peer] * row_bytes;
    bytes_received += receive_rows[peer] * row_bytes;
  }
  char* const in = static_cast<char*>(input.data_ptr());
  char* const out = static_cast<char*>(output.data_ptr());
  // A count of 0 queues nothing; both ranks of a pair skip it alike, as their counts agree.
  return Launch(kOp, /*peer=*/-1, {input, output}, bytes_sent, bytes_received,
                [&](Connection& connection, absl::Time deadline) -> absl::Status {
                  const int me = rank();
                  if (send_rows[me] > 0) {
                    PLAIT_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(
                        out + receive_offsets[me] * row_bytes, in + send_offsets[me] * row_bytes,
                        send_rows[me] * row_bytes, cudaMemcpyDeviceToDevice, connection.stream()));
                  }
                  PLAIT_GPU_RETURN_IF_ERROR(ncclGroupStart());
                  absl::Status queued;
                  for (int peer = 0; peer < size() && queued.ok(); ++peer) {
                    if (peer == me) continue;
                    if (send_rows[peer] > 0) {
                      queued = GpuStatus(
                          ncclSend(in + send_offsets[peer] * row_bytes, send_rows[peer] * row_numel,
                                   *type, peer, connection.comm(), connection.stream()),
                          "ncclSend");
                    }
                    if (queued.ok() && receive_rows[peer] > 0) {
                      queued = GpuStatus(ncclRecv(out + receive_offsets[peer] * row_bytes,
                                                  receive_rows[peer] * row_numel, *type, peer,
                                                  connection.comm(), connection.stream()),
                                         "ncclRecv");
                    }
                  }
                  // Closed whatever happened inside, so that NCCL is not left in a group.
                  queued.Update(GpuStatus(ncclGroupEnd(), "ncclGroupEnd"));
                  PLAIT_RETURN_IF_ERROR(queued);
                  return connection.Settle(deadline);
                });
}

// NCCL checks neither dtype nor count between a send and its receive: a receive of another
// size than its send is not detected here, and shows as a timeout of one of the two.
std::shared_ptr<Work> NcclCommunicator::StartSend(at::Tensor tensor, int peer) {
  constexpr Collective kOp = Collective::kSend;
  const absl::StatusOr<ncclDataType_t> type = TensorType(Describe(kOp, peer), "tensor", tensor);
  if (!type.ok()) return FinishedWork(type.status());
  return Launch(kOp, peer, {tensor}, tensor.nbytes(), 0,
                [&](Connection& connection, absl::Time deadline) -> absl::Status {
                  PLAIT_GPU_RETURN_IF_ERROR(ncclSend(tensor.data_ptr(), tensor.numel(), *type, peer,
                                                     connection.comm(), connection.stream()));
                  return connection.Settle(deadline);
                });
}

std::shared_ptr<Work> NcclCommunicator::StartReceive(at::Tensor tensor, int peer) {
  constexpr Collective kOp = Collective::kReceive;
  const absl::StatusOr<ncclDataType_t> type = TensorType(Describe(kOp, peer), "tensor", tensor);
  if (!type.ok()) return FinishedWork(type.status());
  return Launch(kOp, peer, {tensor}, 0, tensor.nbytes(),
                [&](Connection& connection, absl::Time deadline) -> absl::Status {
                  PLAIT_GPU_RETURN_IF_ERROR(ncclRecv(tensor.data_ptr(), tensor.numel(), *type, peer,
                                                     connection.comm(), connection.stream()));
                  return connection.Settle(deadline);
                });
}

}  // namespace plait::parallel
