#include "wrap/preparation.h"

#include <iterator>
#include <set>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/violation.h"
#include "torch/nn/module.h"
#include "wrap/rules.h"

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
                                                                const parallel::DeviceMesh& mesh,
                                                                std::string field) {
  // The wrappers allocate on their parameters' device and communicate on the mesh's: a model
  // left elsewhere would fail at its first collective, or inside a hook, where the error
  // surfaces only after the pass.
  const at::Device device = mesh.device();
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    if (named.parameter.device() != device) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": parameter ", named.name, " is on ", named.parameter.device().str(),
                       ", but the mesh's communicators run on ", device.str(),
                       "; move the model there before preparing it"));
    }
  }
  absl::MutexLock lock(&registry_mutex);
  if (!Prepared().insert(&model.RootModule()).second) {
    return absl::FailedPreconditionError(
        "this model is already being prepared: apply every step through its one Preparation");
  }
  return std::unique_ptr<Preparation>(new Preparation(model, mesh, std::move(field)));
}

Preparation::Preparation(Wrappable& model, const parallel::DeviceMesh& mesh, std::string field)
    : model_(model), mesh_(mesh), field_(std::move(field)) {}

Preparation::~Preparation() {
  // The later strategies wrap the earlier ones' parameters: undone in reverse.
  while (!strategies_.empty()) strategies_.pop_back();
  absl::MutexLock lock(&registry_mutex);
  Prepared().erase(&model_.RootModule());
}

absl::Status Preparation::Apply(const PrepareStep& step) {
  const std::string step_field = absl::StrCat(field_, "[", steps_.size(), "]");
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy,
                         base::Annotate(MakeStrategy(step), step_field));
  if (parameters_taken_) {
    return absl::FailedPreconditionError(absl::StrCat(
        step_field, ".", strategy->name(),
        ": the model's parameters were already handed to an optimizer; apply every step "
        "before TakeTrainableParameters()"));
  }
  PLAIT_ASSIGN_OR_RETURN(const PreparationRules* rules, BuiltinRules());
  const std::vector<std::string>& names = mesh_.layout().dim_names();
  google::protobuf::RepeatedPtrField<PrepareStep> steps = steps_;
  *steps.Add() = step;
  // The steps applied so far passed: every violation is this step's.
  PLAIT_RETURN_IF_ERROR(base::ViolationsToStatus(CheckSteps(
      *rules, steps, field_, std::set<std::string>(names.begin(), names.end()), "the mesh")));
  // A step that borrows an earlier one's dimension shards by its layout from Apply on.
  HandOver(strategies_, *strategy);
  PLAIT_RETURN_IF_ERROR(base::Annotate(strategy->Apply(model_, mesh_), step_field));
  steps_ = std::move(steps);
  strategies_.push_back(std::move(strategy));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<parallel::TrainableParameter>> Preparation::TakeTrainableParameters() {
  if (parameters_taken_) {
    return absl::FailedPreconditionError(
        "the model's parameters were already taken: build one optimizer per model");
  }
  parameters_taken_ = true;
  trainable_ = PartsOf(/*trainable=*/true);
  return trainable_;
}

absl::StatusOr<std::vector<parallel::TrainableParameter>> Preparation::FrozenParameters() {
  if (!parameters_taken_) {
    return absl::FailedPreconditionError(
        "the frozen parameters are laid out once every step is applied: take the trainable "
        "ones first (TakeTrainableParameters)");
  }
  return PartsOf(/*trainable=*/false);
}

std::vector<parallel::TrainableParameter> Preparation::PartsOf(bool trainable) {
  std::vector<parallel::TrainableParameter> parameters;
  for (const Wrappable::NamedParameter& named : model_.NamedParameters()) {
    // A step may have frozen some (LoRA's base).
    if (named.parameter.requires_grad() != trainable) continue;
    parameters.push_back({named.name,
                          named.parameter,
                          {},
                          1,
                          parallel::TensorSlice::Whole(named.parameter.sizes())});
  }
  const std::vector<ParameterLayout*> layouts = Facets<ParameterLayout>();
  for (ParameterLayout* layout : layouts) layout->UpdateParameters(parameters);
  if (!trainable) {
    // What a step holds in a form of its own (QLoRA's NF4 base), as the steps after it left it.
    for (auto it = layouts.begin(); it != layouts.end(); ++it) {
      std::vector<parallel::TrainableParameter> held = (*it)->HeldParameters();
      for (auto later = std::next(it); later != layouts.end(); ++later) {
        (*later)->UpdateHeldParameters(held);
      }
      for (parallel::TrainableParameter& part : held) parameters.push_back(std::move(part));
    }
  }
  return parameters;
}

std::vector<std::string> Preparation::DataParallelDims() const {
  return DataParallelDimsOf(steps_, mesh_.layout().dim_names());
}

std::vector<std::string> Preparation::RoutingDims() const {
  return RoutingDimsOf(steps_, mesh_.layout().dim_names());
}

at::Tensor Preparation::OwnSlice(const at::Tensor& x) const {
  at::Tensor own = x;
  for (const DataSplit* split : Facets<DataSplit>()) own = split->OwnSlice(own);
  return own;
}

MicroBatchExecutor& Preparation::Executor() {
  const std::vector<MicroBatchRunner*> runners = Facets<MicroBatchRunner>();
  return runners.empty() ? sequential_ : runners.front()->executor();
}

absl::Status Preparation::TrainMicroBatches(int num_micro, const MicroBatchForward& forward) {
  const auto sync = [this](bool sync_gradients) {
    for (Gradients* gradients : Facets<Gradients>()) gradients->SetGradientSync(sync_gradients);
  };
  // The next backward outside synchronises, whatever the executor left.
  const absl::Cleanup synchronising = [&sync] { sync(true); };
  PLAIT_RETURN_IF_ERROR(Executor().Train(num_micro, forward, sync));
  PLAIT_RETURN_IF_ERROR(BackwardStatus());
  for (Gradients* gradients : Facets<Gradients>()) {
    PLAIT_RETURN_IF_ERROR(gradients->FinishGradients(trainable_));
  }
  return absl::OkStatus();
}

absl::Status Preparation::EvaluateMicroBatches(int num_micro, const MicroBatchForward& forward) {
  PLAIT_RETURN_IF_ERROR(Executor().Evaluate(num_micro, forward));
  return BackwardStatus();
}

absl::Status Preparation::BackwardStatus() const {
  for (const Gradients* gradients : Facets<Gradients>()) {
    PLAIT_RETURN_IF_ERROR(gradients->BackwardStatus());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, at::Tensor>> Preparation::FullParameters() {
  std::map<std::string, at::Tensor> parameters;
  for (const Wrappable::NamedParameter& named : model_.NamedParameters()) {
    parameters[named.name] = named.parameter;
  }
  // The last strategy splits what the earlier ones left: gathered in reverse.
  const std::vector<ParameterLayout*> layouts = Facets<ParameterLayout>();
  for (auto it = layouts.rbegin(); it != layouts.rend(); ++it) {
    PLAIT_RETURN_IF_ERROR((*it)->GatherFullParameters(parameters));
  }
  for (auto& [name, tensor] : parameters) tensor = tensor.detach().clone();
  return parameters;
}

absl::StatusOr<std::map<std::string, at::Tensor>> Preparation::MergedParameters() {
  PLAIT_ASSIGN_OR_RETURN(auto parameters, FullParameters());
  // Undone in reverse, as the strategies' hooks are.
  const std::vector<ParameterLayout*> layouts = Facets<ParameterLayout>();
  for (auto it = layouts.rbegin(); it != layouts.rend(); ++it) {
    PLAIT_RETURN_IF_ERROR((*it)->MergeAddedParameters(parameters));
  }
  return parameters;
}

const AdapterExport* Preparation::Adapters() const {
  const std::vector<AdapterExport*> exports = Facets<AdapterExport>();
  return exports.empty() ? nullptr : exports.front();
}

int64_t Preparation::gathered_bytes() const {
  int64_t bytes = 0;
  for (const GatheredMemory* memory : Facets<GatheredMemory>()) bytes += memory->gathered_bytes();
  return bytes;
}

int64_t Preparation::peak_gathered_bytes() const {
  int64_t bytes = 0;
  for (const GatheredMemory* memory : Facets<GatheredMemory>()) {
    bytes += memory->peak_gathered_bytes();
  }
  return bytes;
}

Preparation::KeepGathered::KeepGathered(Preparation& preparation) : preparation_(preparation) {
  for (GatheredMemory* memory : preparation_.Facets<GatheredMemory>()) memory->KeepGathered(true);
}

Preparation::KeepGathered::~KeepGathered() {
  for (GatheredMemory* memory : preparation_.Facets<GatheredMemory>()) memory->KeepGathered(false);
}

void Preparation::ResetPeak() {
  for (GatheredMemory* memory : Facets<GatheredMemory>()) memory->ResetPeak();
}

}  // namespace plait::wrap
