#include "trainer/run_checkpoints.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/dtype.pb.h"
#include "base/own_output.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/module.h"
#include "wrap/strategies.h"

namespace plait::trainer {
namespace {

constexpr char kOptimizerStep[] = "optimizer_step";

// What a resume must not change, by plan field. The rest of the plan (steps, schedule,
// evaluation, logging, the mesh, the preparation steps, how the global batch is split into
// micro-batches) may change between a run and its resume.
absl::StatusOr<std::map<std::string, std::string>> Fingerprint(const plan::ResolvedPlan& resolved) {
  const plan::Plan& plan = resolved.plan;
  // Frozen models are not saved: each is rebuilt from its seed or its (fixed) Hugging Face
  // folder, which the manifest records so that a resume rebuilds the same one.
  std::vector<std::string> frozen;
  for (const plan::FrozenModel& model : plan.frozen()) {
    frozen.push_back(
        absl::StrCat(model.name(), ": ", model.model().ShortDebugString(), " from ",
                     model.hf_weights_dir().empty() ? "its seed" : model.hf_weights_dir()));
  }
  const optim::OptimizerConfig& optimizer = plan.optimizer();
  const auto* algorithm = optimizer.GetReflection()->GetOneofFieldDescriptor(
      optimizer, optim::OptimizerConfig::descriptor()->FindOneofByName("algorithm"));
  const plan::TrainingConfig& training = plan.training();
  std::map<std::string, std::string> fingerprint = {
      {kModelField, resolved.model.ShortDebugString()},
      {"plan.model.dtype", base::Dtype_Name(plan.model().dtype())},
      {"plan.optimizer", algorithm == nullptr ? "" : algorithm->name()},
      {kGlobalBatchField, absl::StrCat(resolved.global_batch)},
      {"plan.training.seq_len", absl::StrCat(training.seq_len())},
      {"plan.data", resolved.data.ShortDebugString()},
      {"plan.objective", plan.objective().ShortDebugString()},
      {"plan.frozen", absl::StrJoin(frozen, "; ")},
  };
  if (algorithm != nullptr) {
    // Its betas, eps or momentum: what the saved moments mean.
    fingerprint[absl::StrCat("plan.optimizer.", algorithm->name())] =
        optimizer.GetReflection()->GetMessage(optimizer, algorithm).ShortDebugString();
  }
  // A step that freezes the model's parameters (LoRA) leaves them out of the checkpoint: a
  // resume takes them again from the run's seed or Hugging Face folder, which must not change.
  for (const wrap::StepWith<wrap::ParameterLayout>& step :
       wrap::StepsWith<wrap::ParameterLayout>(plan.prepare())) {
    if (!step.facet->freezes_model_parameters()) continue;
    fingerprint[kFrozenBaseField] =
        plan.hf_weights_dir().empty()
            ? absl::StrCat("none: plan.model.init { ", plan.model().init().ShortDebugString(), " }")
            : plan.hf_weights_dir();
  }
  return fingerprint;
}

// The part of its parameter an optimizer state tensor holds: a buffer or master copy shaped
// as the local parameter, that parameter's part; a scalar (the parameter's update count, the
// same on every rank), the whole, saved by the rank holding the parameter's first element.
absl::StatusOr<parallel::TensorSlice> StateSlice(const std::string& key, const at::Tensor& tensor,
                                                 const parallel::TrainableParameter& parameter) {
  if (tensor.sizes() == parameter.tensor.sizes()) return parameter.slice;
  if (tensor.dim() == 0) {
    const parallel::Box& box = parameter.slice.box;
    const bool first = parameter.slice.replica == 0 && box.numel() > 0 &&
                       std::all_of(box.offsets.begin(), box.offsets.end(),
                                   [](int64_t offset) { return offset == 0; });
    parallel::TensorSlice slice = parallel::TensorSlice::Whole({});
    slice.replica = first ? 0 : 1;
    return slice;
  }
  return absl::InternalError(absl::StrCat("optimizer state ", key, " of shape ",
                                          c10::str(tensor.sizes()), " is neither a scalar nor ",
                                          "shaped as its parameter"));
}

// What RankTensors gives: the tensors' data, to save, or only their shapes and dtypes, to
// learn what a resume reads.
enum class Contents { kData, kLayout };

// The tensors of one rank, each with the part it holds: its trainable parameters and its
// optimizer state `state`. For kData in host memory (a GPU run's parameters copied there once,
// here; `state` is Optimizer::SaveState's, copied there once by it); for kLayout on the meta
// device, without memory (`state` is Optimizer::StateLayout's).
absl::StatusOr<std::map<std::string, checkpoint::SlicedTensor>> RankTensors(
    const optim::Optimizer& optimizer, const optim::OptimizerState& state, Contents contents) {
  std::map<std::string, checkpoint::SlicedTensor> tensors;
  std::map<std::string, const parallel::TrainableParameter*> by_name;
  for (const parallel::TrainableParameter& parameter : optimizer.parameters()) {
    const at::Tensor& tensor = parameter.tensor;
    tensors[kParameterPrefix + parameter.name] = {
        contents == Contents::kData
            ? tensor.detach().cpu()
            : torch::empty(tensor.sizes(), tensor.options().device(at::kMeta)),
        parameter.slice};
    by_name[parameter.name] = &parameter;
  }
  for (const auto& [key, tensor] : state.tensors) {
    // Keys are "<parameter name>:<slot>" (optim/optimizer.h).
    const auto parameter = by_name.find(key.substr(0, key.rfind(':')));
    if (parameter == by_name.end()) {
      return absl::InternalError(absl::StrCat("optimizer state ", key, " names no parameter"));
    }
    PLAIT_ASSIGN_OR_RETURN(parallel::TensorSlice slice,
                           StateSlice(key, tensor, *parameter->second));
    tensors[kOptimizerPrefix + key] = {tensor, std::move(slice)};
  }
  return tensors;
}

// Loads a rank's saved state of step `step`, whose tensors are the ones RankTensors names, into
// `optimizer`.
absl::Status LoadInto(const checkpoint::RankState& saved, int64_t step,
                      optim::Optimizer& optimizer) {
  optim::OptimizerState state;
  PLAIT_ASSIGN_OR_RETURN(state.step, SavedOptimizerStep(saved.metadata, step));
  {
    at::NoGradGuard no_grad;
    for (const parallel::TrainableParameter& parameter : optimizer.parameters()) {
      parameter.tensor.copy_(saved.tensors.at(kParameterPrefix + parameter.name).tensor);
    }
  }
  for (const auto& [name, tensor] : saved.tensors) {
    absl::string_view key = name;
    if (absl::ConsumePrefix(&key, kOptimizerPrefix))
      state.tensors[std::string(key)] = tensor.tensor;
  }
  return optimizer.LoadState(state);
}

}  // namespace

absl::StatusOr<int64_t> SavedOptimizerStep(const std::map<std::string, std::string>& metadata,
                                           int64_t step) {
  const auto saved = metadata.find(kOptimizerStep);
  if (saved == metadata.end()) {
    return absl::DataLossError(absl::StrCat("metadata.", kOptimizerStep, ": missing"));
  }
  int64_t updates = 0;
  if (!absl::SimpleAtoi(saved->second, &updates) || updates < 0 || updates > step) {
    return absl::DataLossError(absl::StrCat("metadata.", kOptimizerStep, ": \"", saved->second,
                                            "\" is not an integer from 0 to the step (", step,
                                            "); a step updates the optimizer once at most"));
  }
  return updates;
}

absl::StatusOr<RunCheckpoints> RunCheckpoints::Open(const plan::ResolvedPlan& resolved,
                                                    const parallel::DeviceMesh& mesh) {
  const plan::Plan& plan = resolved.plan;
  checkpoint::RunInfo run;
  run.config_field = "plan.training.checkpoint";
  run.steps = plan.training().steps();
  run.steps_field = "plan.training.steps";
  run.position_per_step = resolved.global_batch;  // sequences consumed over the data-parallel ranks
  PLAIT_ASSIGN_OR_RETURN(run.fingerprint, Fingerprint(resolved));
  std::vector<std::string> steps;
  for (const wrap::PrepareStep& step : plan.prepare()) steps.push_back(step.ShortDebugString());
  run.layout = steps.empty() ? "no preparation steps" : absl::StrJoin(steps, "; ");
  run.contents = "model and optimizer";
  run.kind_by_prefix = {{"", "optimizer state"}, {kParameterPrefix, "trainable parameter"}};
  PLAIT_ASSIGN_OR_RETURN(
      checkpoint::Checkpointer checkpointer,
      checkpoint::Checkpointer::Open(plan.training().checkpoint(), resolved.checkpoint_dir,
                                     std::move(run), mesh));
  std::map<std::string, std::string> inputs;
  for (const base::NamedPath& input : resolved.inputs) {
    inputs[kInputPrefix + input.field] = base::ResolvedPath(input.path);
  }
  return RunCheckpoints(std::move(checkpointer), resolved.global_batch,
                        resolved.global_batch / resolved.grad_accumulation, std::move(inputs));
}

absl::Status RunCheckpoints::Restore(optim::Optimizer& optimizer, data::DataLoader& train) const {
  if (checkpointer_.resume_step() == 0) return absl::OkStatus();
  // What this rank would save: the names, parts, shapes and dtypes to fill, without copying
  // the parameters or the optimizer state anywhere.
  PLAIT_ASSIGN_OR_RETURN(auto expected,
                         RankTensors(optimizer, optimizer.StateLayout(), Contents::kLayout));
  PLAIT_RETURN_IF_ERROR(checkpointer_.Restore(expected, [&](checkpoint::RankState saved) {
    return LoadInto(saved, checkpointer_.resume_step(), optimizer);
  }));
  // The sequences consumed, in this run's micro-batches of every data-parallel rank.
  train.Seek(checkpointer_.resume_position() / sequences_per_micro_batch_);
  return absl::OkStatus();
}

absl::Status RunCheckpoints::SaveIfDue(int64_t step, const optim::Optimizer& optimizer) const {
  return checkpointer_.IsDue(step) ? Save(step, optimizer) : absl::OkStatus();
}

absl::Status RunCheckpoints::Save(int64_t step, const optim::Optimizer& optimizer) const {
  const optim::OptimizerState state = optimizer.SaveState();
  PLAIT_ASSIGN_OR_RETURN(auto tensors, RankTensors(optimizer, state, Contents::kData));
  std::map<std::string, std::string> metadata = inputs_;
  metadata[kOptimizerStep] = absl::StrCat(state.step);
  return checkpointer_.Save(step, step * global_batch_, {std::move(tensors), std::move(metadata)});
}

}  // namespace plait::trainer
