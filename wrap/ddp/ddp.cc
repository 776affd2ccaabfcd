#include "wrap/ddp/ddp.h"

#include <cmath>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/mul.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::ddp {
namespace {

// PyTorch DDP's defaults (torch.nn.parallel.DistributedDataParallel's bucket_cap_mb and
// its smaller first bucket, dist._DEFAULT_FIRST_BUCKET_BYTES).
constexpr double kDefaultBucketCapMb = 25.0;
constexpr double kDefaultFirstBucketCapMb = 1.0;
constexpr double kBytesPerMb = 1024.0 * 1024.0;

double BucketCapMb(const DdpConfig& config) {
  return config.has_bucket_cap_mb() ? config.bucket_cap_mb() : kDefaultBucketCapMb;
}

double FirstBucketCapMb(const DdpConfig& config) {
  return config.has_first_bucket_cap_mb() ? config.first_bucket_cap_mb() : kDefaultFirstBucketCapMb;
}

}  // namespace

absl::Status ValidateDdpConfig(const DdpConfig& config) {
  for (auto [field, value] : {std::pair{"bucket_cap_mb", BucketCapMb(config)},
                              std::pair{"first_bucket_cap_mb", FirstBucketCapMb(config)}}) {
    if (!(value > 0.0 && std::isfinite(value))) {
      return absl::InvalidArgumentError(
          absl::StrCat("ddp.", field, ": ", value, " must be > 0 and finite"));
    }
  }
  return absl::OkStatus();
}

struct Ddp::Bucket {
  std::vector<int> members;
  at::Tensor buffer;  // the members' gradients, flat, in member order (see used_)
  std::vector<int64_t> offsets;
  int first_flag = 0;  // the index of members[0]'s usage flag in used_
  int pending = 0;     // members whose gradient has not arrived in this backward
  std::shared_ptr<parallel::Work> work;
};

absl::StatusOr<std::unique_ptr<Ddp>> Ddp::Create(Wrappable& model,
                                                 parallel::Communicator& communicator,
                                                 const DdpConfig& config) {
  PLAIT_RETURN_IF_ERROR(ValidateDdpConfig(config));
  const double cap_mb = BucketCapMb(config);
  const double first_cap_mb = FirstBucketCapMb(config);

  std::vector<at::Tensor> parameters;
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    parameters.push_back(named.parameter);
  }
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& parameter : parameters) {
      // DDP keeps each parameter whole, in memory of its own: a view without it (a model
      // built for deferred initialisation) becomes its contiguous copy.
      if (!parameter.is_contiguous()) parameter.set_data(parameter.contiguous());
      PLAIT_RETURN_IF_ERROR(communicator.Broadcast(parameter, 0)->Wait());
    }
  }

  auto ddp = std::unique_ptr<Ddp>(new Ddp(model, std::move(parameters), communicator));
  // Buckets in reverse registration order, dtype by dtype.
  const int count = static_cast<int>(ddp->parameters_.size());
  Bucket bucket;
  int64_t bucket_bytes = 0;
  auto close_bucket = [&] {
    if (bucket.members.empty()) return;
    ddp->bucket_members_.push_back(bucket.members);
    ddp->buckets_.push_back(std::move(bucket));
    bucket = Bucket();
    bucket_bytes = 0;
  };
  for (int index = count - 1; index >= 0; --index) {
    const at::Tensor& parameter = ddp->parameters_[index];
    if (!parameter.requires_grad()) continue;
    const double cap = (ddp->buckets_.empty() ? first_cap_mb : cap_mb) * kBytesPerMb;
    const bool other_dtype =
        !bucket.members.empty() &&
        ddp->parameters_[bucket.members.front()].scalar_type() != parameter.scalar_type();
    if (other_dtype || (!bucket.members.empty() && bucket_bytes + parameter.nbytes() > cap)) {
      close_bucket();
    }
    bucket.members.push_back(index);
    bucket_bytes += static_cast<int64_t>(parameter.nbytes());
  }
  close_bucket();

  Ddp* self = ddp.get();
  model.SetUnitHooks({[self](int unit) {
                        if (unit == Wrappable::kRootUnit) self->OnForwardStart();
                      },
                      nullptr});
  int flags = 0;
  for (Bucket& bucket : ddp->buckets_) {
    bucket.first_flag = flags;
    flags += static_cast<int>(bucket.members.size());
  }
  for (int b = 0; b < static_cast<int>(ddp->buckets_.size()); ++b) {
    Bucket& bucket = ddp->buckets_[b];
    int64_t numel = 0;
    for (int member : bucket.members) {
      bucket.offsets.push_back(numel);
      numel += ddp->parameters_[member].numel();
    }
    const bool last = b + 1 == static_cast<int>(ddp->buckets_.size());
    bucket.buffer =
        torch::zeros({numel + (last ? flags : 0)}, ddp->parameters_[bucket.members[0]].options());
    if (last) ddp->used_ = bucket.buffer.narrow(0, numel, flags);
    for (int member : bucket.members) {
      ddp->hooks_.push_back(internal::AddPostAccumulateHook(
          ddp->parameters_[member], [ddp = ddp.get(), b] { ddp->OnGradientReady(b); }));
    }
  }
  return ddp;
}

Ddp::Ddp(Wrappable& model, std::vector<at::Tensor> parameters, parallel::Communicator& communicator)
    : model_(model), parameters_(std::move(parameters)), communicator_(communicator) {}

Ddp::~Ddp() { model_.SetUnitHooks({}); }

void Ddp::OnForwardStart() {
  if (!backward_started_) return;
  // The last backward never reached its end (it threw): settle the all-reduces it started,
  // so every rank is in step again, and report it.
  for (Bucket& bucket : buckets_) {
    if (bucket.work != nullptr) bucket.work->Wait().IgnoreError();
    bucket.work.reset();
  }
  backward_started_ = false;
  if (last_sync_status_.ok()) {
    last_sync_status_ = absl::AbortedError(
        "ddp: the previous backward pass did not finish; its gradients were not synchronised");
  }
}

void Ddp::OnGradientReady(int bucket) {
  if (!sync_) return;
  if (!backward_started_) {
    backward_started_ = true;
    for (Bucket& b : buckets_) b.pending = static_cast<int>(b.members.size());
    next_to_launch_ = 0;
    used_.zero_();
    every_gradient_here_ = true;
    internal::QueueEndOfBackwardCallback([this] { FinishBackward(); });
  }
  if (--buckets_[bucket].pending == 0) LaunchReadyBuckets();
}

// Buckets are launched in order, so that every rank issues the same all-reduces in the same
// order whatever order its gradients arrive in.
void Ddp::LaunchReadyBuckets() {
  while (next_to_launch_ < static_cast<int>(buckets_.size()) &&
         buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_++];
    at::NoGradGuard no_grad;
    // Averaged while copied in, as PyTorch's reducer does, so the all-reduce is a plain sum
    // with no pass over the result (dividing by a power of two is exact).
    const at::Tensor scale = torch::scalar_tensor(1.0 / communicator_.size(), at::kDouble);
    for (size_t i = 0; i < bucket.members.size(); ++i) {
      const at::Tensor& parameter = parameters_[bucket.members[i]];
      at::Tensor slot = bucket.buffer.narrow(0, bucket.offsets[i], parameter.numel());
      const at::Tensor& grad = parameter.grad();
      if (grad.defined()) {
        at::mul_out(slot, grad.reshape({-1}), scale);
        used_.narrow(0, bucket.first_flag + static_cast<int64_t>(i), 1).fill_(1);
      } else {
        slot.zero_();  // a parameter unused in this step contributes zero
        every_gradient_here_ = false;
      }
    }
    const parallel::ScopedPlace place(
        communicator_, {parallel::StepPlace::kNoBlock, parallel::Pass::kBackward, "DDP bucket",
                        next_to_launch_ - 1});
    bucket.work = communicator_.AllReduce(bucket.buffer, parallel::ReduceOp::kSum);
  }
}

void Ddp::FinishBackward() {
  // Parameters that received no gradient leave their buckets pending: launch those now.
  for (Bucket& bucket : buckets_) bucket.pending = 0;
  LaunchReadyBuckets();
  backward_started_ = false;
  for (Bucket& bucket : buckets_) {
    absl::Status status = bucket.work->Wait();
    bucket.work.reset();
    if (!status.ok() && last_sync_status_.ok()) last_sync_status_ = status;
  }
  // After a failure the group is out of step: the gradients stay this rank's own.
  if (!last_sync_status_.ok()) return;
  // The gradients become views of the averaged buffer: no copy, and the next backward
  // accumulates into them in place or, after ZeroGrad, into fresh tensors. A parameter no
  // rank produced a gradient for gets none, as in one process, so the optimizer skips it
  // rather than decaying it (PyTorch's DDP with find_unused_parameters). Reading the flags
  // waits for the device, so they are read only when this rank lacks a gradient; in a usual
  // step every rank has every gradient.
  const at::Tensor used = every_gradient_here_ ? at::Tensor() : used_.to(at::kCPU, at::kFloat);
  for (Bucket& bucket : buckets_) {
    for (size_t i = 0; i < bucket.members.size(); ++i) {
      if (used.defined() && used.data_ptr<float>()[bucket.first_flag + i] == 0.0f) continue;
      at::Tensor& parameter = parameters_[bucket.members[i]];
      parameter.mutable_grad() =
          bucket.buffer.narrow(0, bucket.offsets[i], parameter.numel()).view(parameter.sizes());
    }
  }
}

StepEstimate DdpStrategy::Estimate(const ModelShape& shape,
                                   const parallel::MeshConfig& mesh) const {
  const int dim_size = static_cast<int>(parallel::SubmeshRanks(mesh, {config_.mesh_dim()}));
  StepEstimate estimate;
  estimate.description = absl::StrFormat(
      "ddp over %s (%d ranks): parameters stay whole on every rank (broadcast from rank 0); "
      "gradients averaged in buckets of %.0f MiB during backward",
      config_.mesh_dim(), dim_size, BucketCapMb(config_));
  // The buckets hold every gradient, averaged, from the first backward on.
  estimate.memory_on_rank = [](const RankHolding& rank) {
    return std::vector<MemoryTerm>{{.name = "gradient buckets",
                                    .part = MemoryTerm::Part::kBuffers,
                                    .bytes = rank.gradient_bytes}};
  };
  // One ring all-reduce of every trainable parameter's gradient per optimizer step (no-sync
  // micro-batches send none).
  estimate.transfers.push_back(
      {.mesh_dim = config_.mesh_dim(),
       .bytes_per_step =
           2.0 * (dim_size - 1) / dim_size * shape.TrainableParameters() * shape.parameter_bytes});
  return estimate;
}

absl::Status DdpStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator * communicator,
                         mesh.communicator(config_.mesh_dim()));
  PLAIT_ASSIGN_OR_RETURN(ddp_, Ddp::Create(model, *communicator, config_));
  communicator_ = communicator;
  return absl::OkStatus();
}

void DdpStrategy::UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) {
  for (parallel::TrainableParameter& parameter : parameters) {
    parameter.slice.replica =
        parameter.slice.replica * communicator_->size() + communicator_->rank();
  }
}

std::vector<PrepareStep> DdpStrategy::Replacements() const {
  PrepareStep fsdp;
  fsdp.mutable_fsdp()->set_mesh_dim(config_.mesh_dim());
  return {fsdp};
}

}  // namespace plait::wrap::ddp
