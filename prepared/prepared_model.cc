#include "prepared/prepared_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/dtype.h"
#include "base/status.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "parallel/tensor_slice.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::prepared {

namespace {

// Where `parameter`'s values are loaded to: its fp32 master when it has one, else itself.
at::Tensor LoadTarget(const parallel::TrainableParameter& parameter) {
  return (parameter.master.defined() ? parameter.master : parameter.tensor).detach();
}

// Loads each of `parameters`' slices from the Hugging Face folder `dir` into `LoadTarget`, or
// hands it to the part's `store`.
absl::Status LoadHfSlices(const std::string& dir, const models::ModelConfig& config,
                          const std::vector<parallel::TrainableParameter>& parameters) {
  PLAIT_ASSIGN_OR_RETURN(models::SafetensorsCheckpoint checkpoint,
                         models::SafetensorsCheckpoint::Open(dir));
  std::vector<models::HfParameterPart> parts;
  for (const parallel::TrainableParameter& parameter : parameters) {
    const parallel::TensorSlice& slice = parameter.slice;
    // A part a step stores in its own form (`store`) is read into a tensor of its own.
    parts.push_back({parameter.name, slice.global_shape, slice.box.offsets, slice.box.lengths,
                     parameter.store ? parameter.tensor : slice.DataOf(LoadTarget(parameter)),
                     parameter.store});
  }
  return models::LoadHfParts(checkpoint, config, parts);
}

// Writes into each of `parameters`' `LoadTarget` (or hands to its `store`, in its dtype) its
// slice of the values the model is initialised with, drawing only (the tiles of) the slice.
void WriteInitialSlices(const models::ModelConfig& config, const models::InitConfig& init,
                        const std::vector<parallel::TrainableParameter>& parameters) {
  at::NoGradGuard no_grad;
  for (const parallel::TrainableParameter& parameter : parameters) {
    const at::Tensor values =
        models::CausalLM::InitialValues(config, init, parameter.name, parameter.slice);
    if (parameter.store) {
      parameter.store(values.to(parameter.tensor.options()));
    } else {
      parameter.slice.DataOf(LoadTarget(parameter)).copy_(values);
    }
  }
}

// `names`' tensors of `full` (gathered whole parameters), in that order, to be saved to
// `dir`; InternalError naming one that was not gathered.
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> InOrder(
    const std::map<std::string, at::Tensor>& full, const std::vector<std::string>& names,
    const std::string& dir) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& name : names) {
    const auto it = full.find(name);
    if (it == full.end()) {
      return absl::InternalError(absl::StrCat("saving ", dir, ": no gathered ", name));
    }
    tensors.emplace_back(name, it->second);
  }
  return tensors;
}

// The names of `full` that are not among the model's `own` (in its order): the parameters
// steps added, each after the weight of the module it was added under (an adapter
// "<module>.lora_A.weight" after "<module>.weight"), as one process's model lists them, also
// when other ranks held them (a pipeline's other stages).
std::vector<std::string> AddedInModelOrder(const std::map<std::string, at::Tensor>& full,
                                           const std::vector<std::string>& own) {
  std::map<std::string, size_t> own_index;
  for (size_t i = 0; i < own.size(); ++i) own_index[own[i]] = i;
  std::vector<std::pair<size_t, std::string>> added;
  for (const auto& [name, tensor] : full) {
    if (own_index.count(name) > 0) continue;
    // The nearest enclosing module with a weight of the model's own (none: at the end).
    size_t index = own.size();
    std::string module = name;
    for (size_t dot = module.rfind('.'); dot != std::string::npos; dot = module.rfind('.')) {
      module.resize(dot);
      const auto weight = own_index.find(absl::StrCat(module, ".weight"));
      if (weight == own_index.end()) continue;
      index = weight->second;
      break;
    }
    added.emplace_back(index, name);
  }
  std::sort(added.begin(), added.end());
  std::vector<std::string> names;
  for (auto& [index, name] : added) names.push_back(std::move(name));
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedModel>> PreparedModel::Prepare(
    const models::ModelSpec& spec, const models::ModelConfig& config,
    const std::string& hf_weights_dir,
    const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
    const parallel::DeviceMesh& mesh, Role role, const std::string& field_path) {
  const at::ScalarType dtype = base::ToScalarType(spec.dtype(), at::kFloat);
  // Deferred initialisation: the preparation shards and slices parameters that hold no
  // memory yet, on the mesh's device in the compute dtype, and only then does each rank give
  // the parts it holds their values. A rank holds the whole model only when its preparation
  // keeps it whole; otherwise its shards and, while they are written, one whole parameter.
  PLAIT_ASSIGN_OR_RETURN(
      std::shared_ptr<models::CausalLM> model,
      base::Annotate(models::CausalLM::CreateDeferred(
                         config, at::TensorOptions().dtype(dtype).device(mesh.device())),
                     field_path + ".model"));
  std::unique_ptr<PreparedModel> prepared(new PreparedModel(std::move(model), role));
  // The model's own parameters, named before a step adds its own (LoRA's adapters, which keep
  // the values their step gave them).
  std::set<std::string> own;
  for (const auto& named : prepared->model_->NamedParameters()) {
    prepared->parameter_names_.push_back(named.name);
    own.insert(named.name);
  }
  PLAIT_ASSIGN_OR_RETURN(prepared->preparation_, wrap::Preparation::Begin(*prepared->model_, mesh,
                                                                          field_path + ".prepare"));
  for (const wrap::PrepareStep& step : steps) {
    PLAIT_RETURN_IF_ERROR(prepared->preparation_->Apply(step));
  }
  PLAIT_ASSIGN_OR_RETURN(std::vector<parallel::TrainableParameter> parameters,
                         prepared->preparation_->TakeTrainableParameters());
  // A step's frozen base (LoRA's) gets its values as the trainable parameters do, but no
  // optimizer ever sees it: it stays here.
  PLAIT_ASSIGN_OR_RETURN(std::vector<parallel::TrainableParameter> frozen,
                         prepared->preparation_->FrozenParameters());
  // The parameters no step replaced (all of them without a step; the ones tensor parallelism
  // keeps whole) get memory of their own.
  prepared->model_->MaterializeParameters();
  // A trained model that computes in 16 bits trains its own parameters through fp32 masters
  // (the optimizer's, or FSDP's fp32 shards), which get the fp32 values, and the parameters
  // their rounded copy. A frozen base never updates: it takes its values in the compute dtype.
  if (role != Role::kFrozen && dtype != at::kFloat) {
    for (parallel::TrainableParameter& parameter : parameters) {
      if (parameter.tensor.scalar_type() != at::kFloat && own.count(parameter.name) > 0) {
        parameter.master = torch::zeros_like(parameter.tensor, at::kFloat);
      }
    }
  }
  // Those that get values here: every part of the model's own parameters, but for a resumed
  // run only the frozen ones, since the checkpoint holds the trainable ones and their masters.
  std::vector<parallel::TrainableParameter> valued;
  for (const std::vector<parallel::TrainableParameter>* parts : {&parameters, &frozen}) {
    for (const parallel::TrainableParameter& parameter : *parts) {
      // Written through a view of the rank's tensor, whose first elements are the slice's
      // (padding after them); only a contiguous tensor's reshape is a view.
      if (!parameter.tensor.is_contiguous()) {
        return absl::InternalError(absl::StrCat("the prepared parameter ", parameter.name,
                                                " is not contiguous; its slice cannot be written"));
      }
      const bool restored = role == Role::kResumed && parts == &parameters;
      if (own.count(parameter.name) > 0 && !restored) valued.push_back(parameter);
    }
  }
  if (valued.empty()) {
    // A resumed run that froze nothing: the checkpoint restores every parameter.
  } else if (!hf_weights_dir.empty()) {
    // Each rank reads only the slice of each tensor it holds (tensor parallelism's, FSDP's
    // shard), so a NaN in one rank's slice fails that rank alone: every rank stops with it.
    const std::string field = field_path + ".hf_weights_dir";
    PLAIT_RETURN_IF_ERROR(
        mesh.Agree(base::Annotate(LoadHfSlices(hf_weights_dir, config, valued), field),
                   absl::StrCat(field, ": loading ", hf_weights_dir)));
  } else {
    WriteInitialSlices(config, spec.init(), valued);
  }
  {
    at::NoGradGuard no_grad;
    for (const parallel::TrainableParameter& parameter : parameters) {
      if (parameter.master.defined()) parameter.tensor.copy_(parameter.master);
    }
  }
  if (role != Role::kFrozen) {
    prepared->trainable_ = std::move(parameters);
  } else {
    for (parallel::TrainableParameter& parameter : parameters)
      parameter.tensor.requires_grad_(false);
    for (auto& named : prepared->model_->NamedParameters()) named.parameter.requires_grad_(false);
  }
  return prepared;
}

absl::Status PreparedModel::SaveHf(const std::string& dir, int rank, int writer) {
  // Adapters are no part of a Hugging Face model: merged into the weights they adapt.
  PLAIT_ASSIGN_OR_RETURN(auto full, preparation_->MergedParameters());
  if (rank != writer) return absl::OkStatus();
  PLAIT_ASSIGN_OR_RETURN(auto parameters, InOrder(full, parameter_names_, dir));
  return models::SaveHfParameters(model_->config(), parameters, dir);
}

absl::Status PreparedModel::SaveAdapters(const std::string& dir, const std::string& base_model,
                                         int rank, int writer) {
  const wrap::AdapterExport* adapters = preparation_->Adapters();
  if (adapters == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("saving adapters to ", dir, ": no preparation step added adapters"));
  }
  PLAIT_ASSIGN_OR_RETURN(auto full, preparation_->FullParameters());
  if (rank != writer) return absl::OkStatus();
  PLAIT_ASSIGN_OR_RETURN(auto tensors,
                         InOrder(full, AddedInModelOrder(full, parameter_names_), dir));
  return adapters->SaveAdapters(dir, tensors, base_model);
}

absl::Status CheckEveryParameterHasGradient(
    const std::vector<parallel::TrainableParameter>& parameters, int64_t step) {
  std::vector<std::string> missing;
  for (const parallel::TrainableParameter& parameter : parameters) {
    if (!parameter.tensor.grad().defined()) missing.push_back(parameter.name);
  }
  if (missing.empty()) return absl::OkStatus();
  const bool one = missing.size() == 1;
  return absl::InternalError(absl::StrCat(
      "after step ", step, ", the trainable parameter", one ? " " : "s ",
      absl::StrJoin(missing, ", "), " got no gradient: no loss reaches ", one ? "it" : "them",
      ", so the optimizer would never change ", one ? "it" : "them"));
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> BuildOptimizer(
    const PreparedModel& prepared, const optim::OptimizerConfig& config) {
  if (prepared.role() == Role::kFrozen) {
    return absl::FailedPreconditionError(
        "a frozen model is prepared but not trained; it has no optimizer");
  }
  return optim::Optimizer::Create(prepared.trainable_parameters(), config);
}

}  // namespace plait::prepared
