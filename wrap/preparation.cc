#include "wrap/preparation.h"

#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"

namespace plait::wrap {
namespace {

// The models that have a live Preparation, by root module.
absl::Mutex registry_mutex(absl::kConstInit);
std::set<const torch::nn::Module*>& Prepared() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mutex) {
  static auto* prepared = new std::set<const torch::nn::Module*>();
  return *prepared;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Preparation>> Preparation::Begin(Wrappable& model,
                                                                const parallel::DeviceMesh& mesh) {
  absl::MutexLock lock(&registry_mutex);
  if (!Prepared().insert(&model.RootModule()).second) {
    return absl::FailedPreconditionError(
        "this model is already being prepared: apply every wrapper through its one "
        "Preparation");
  }
  return std::unique_ptr<Preparation>(new Preparation(model, mesh));
}

Preparation::Preparation(Wrappable& model, const parallel::DeviceMesh& mesh)
    : model_(model), mesh_(mesh) {}

Preparation::~Preparation() {
  fsdp_.reset();
  ddp_.reset();
  absl::MutexLock lock(&registry_mutex);
  Prepared().erase(&model_.RootModule());
}

absl::StatusOr<parallel::Communicator*> Preparation::Dimension(const std::string& strategy,
                                                               const std::string& mesh_dim) {
  if (parameters_taken_) {
    return absl::FailedPreconditionError(
        absl::StrCat(strategy,
                     ": the model's parameters were already handed to an optimizer; apply every "
                     "wrapper before TakeTrainableParameters()"));
  }
  if ((strategy == "ddp" && ddp_ != nullptr) || (strategy == "fsdp" && fsdp_ != nullptr)) {
    return absl::FailedPreconditionError(
        absl::StrCat(strategy, " is already applied to this model (over mesh dimension \"",
                     strategy == "ddp" ? ddp_dim_ : fsdp_dim_, "\"); a wrapper applies once"));
  }
  absl::StatusOr<parallel::Communicator*> communicator = mesh_.communicator(mesh_dim);
  if (!communicator.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(strategy, ".mesh_dim: ", communicator.status().message()));
  }
  const std::string& other_dim = strategy == "ddp" ? fsdp_dim_ : ddp_dim_;
  const std::string other = strategy == "ddp" ? "fsdp" : "ddp";
  if (!other_dim.empty() && other_dim == mesh_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(strategy, ".mesh_dim: \"", mesh_dim, "\" is already used by ", other,
                     "; DDP and FSDP need mesh dimensions of their own"));
  }
  if (!other_dim.empty()) {
    return absl::UnimplementedError(absl::StrCat(strategy, " over \"", mesh_dim, "\" with ", other,
                                                 " over \"", other_dim,
                                                 "\" (hybrid sharding) is not supported yet"));
  }
  return *communicator;
}

absl::Status Preparation::ApplyDdp(const DdpConfig& config) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator * communicator,
                         Dimension("ddp", config.mesh_dim()));
  PLAIT_ASSIGN_OR_RETURN(ddp_, ddp::Ddp::Create(model_, *communicator, config));
  ddp_dim_ = config.mesh_dim();
  return absl::OkStatus();
}

absl::Status Preparation::ApplyFsdp(const FsdpConfig& config) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator * communicator,
                         Dimension("fsdp", config.mesh_dim()));
  PLAIT_ASSIGN_OR_RETURN(fsdp_, fsdp::Fsdp::Create(model_, *communicator, config));
  fsdp_dim_ = config.mesh_dim();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<optim::TrainableParameter>> Preparation::TakeTrainableParameters() {
  if (parameters_taken_) {
    return absl::FailedPreconditionError(
        "the model's parameters were already taken: build one optimizer per model");
  }
  parameters_taken_ = true;
  if (fsdp_ != nullptr) return fsdp_->TrainableParameters();
  std::vector<optim::TrainableParameter> parameters;
  for (const Wrappable::NamedParameter& named : model_.NamedParameters()) {
    parameters.push_back({named.name, named.parameter, {}});
  }
  return parameters;
}

absl::Status Preparation::BackwardStatus() const {
  if (fsdp_ != nullptr) PLAIT_RETURN_IF_ERROR(fsdp_->last_status());
  if (ddp_ != nullptr) PLAIT_RETURN_IF_ERROR(ddp_->last_sync_status());
  return absl::OkStatus();
}

}  // namespace plait::wrap
