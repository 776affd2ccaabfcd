#include "trainer/prepared_model.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/status.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "parallel/tensor_slice.h"

namespace plait::trainer {

namespace {

// Where `parameter`'s values are loaded to: its fp32 master when it has one, else itself.
torch::Tensor LoadTarget(const parallel::TrainableParameter& parameter) {
  return (parameter.master.defined() ? parameter.master : parameter.tensor).detach();
}

// Loads each of `parameters`' slices from the Hugging Face folder `dir`; a parameter with a
// master gets the values there, and their rounded copy.
absl::Status LoadHfSlices(const std::string& dir, const models::ModelConfig& config,
                          const std::vector<parallel::TrainableParameter>& parameters) {
  PLAIT_ASSIGN_OR_RETURN(models::SafetensorsCheckpoint checkpoint,
                         models::SafetensorsCheckpoint::Open(dir));
  std::vector<models::HfParameterPart> parts;
  for (const parallel::TrainableParameter& parameter : parameters) {
    const parallel::TensorSlice& slice = parameter.slice;
    // Written through a view of the rank's tensor, whose first elements are the slice's
    // (padding after them); only a contiguous tensor's reshape is a view.
    if (!parameter.tensor.is_contiguous()) {
      return absl::InternalError(absl::StrCat("the prepared parameter ", parameter.name,
                                              " is not contiguous; its slice cannot be loaded"));
    }
    parts.push_back({parameter.name, slice.global_shape, slice.box.offsets, slice.box.lengths,
                     slice.DataOf(LoadTarget(parameter))});
  }
  PLAIT_RETURN_IF_ERROR(models::LoadHfParts(checkpoint, config, parts));
  torch::NoGradGuard no_grad;
  for (const parallel::TrainableParameter& parameter : parameters) {
    if (parameter.master.defined()) parameter.tensor.copy_(parameter.master);
  }
  return absl::OkStatus();
}

// Writes into each of `parameters` the values of its slice in `initial`, the model's fp32
// parameters by name before the preparation.
absl::Status CopyInitialSlices(const std::map<std::string, torch::Tensor>& initial,
                               const std::vector<parallel::TrainableParameter>& parameters) {
  torch::NoGradGuard no_grad;
  for (const parallel::TrainableParameter& parameter : parameters) {
    const auto it = initial.find(parameter.name);
    if (it == initial.end()) {
      return absl::InternalError(
          absl::StrCat("the prepared parameter ", parameter.name, " is not one of the model's"));
    }
    const parallel::TensorSlice& slice = parameter.slice;
    slice.DataOf(LoadTarget(parameter))
        .copy_(parallel::NarrowTo(it->second, parallel::TensorSlice::Whole(slice.global_shape).box,
                                  slice.box));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedModel>> PreparedModel::Prepare(
    const models::ModelSpec& spec, const std::string& hf_weights_dir,
    const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
    const parallel::DeviceMesh& mesh, Role role, const std::string& field_path) {
  PLAIT_ASSIGN_OR_RETURN(models::ModelConfig config,
                         models::ResolveModelSpec(spec, field_path + ".model"));
  PLAIT_ASSIGN_OR_RETURN(
      std::shared_ptr<models::CausalLM> model,
      base::Annotate(models::CausalLM::Create(config, spec.init()), field_path + ".model"));
  const torch::ScalarType dtype = base::ToScalarType(spec.dtype(), torch::kFloat32);
  // A trained model that computes in 16 bits trains through fp32 masters (the optimizer's,
  // or FSDP's fp32 shards), which start from the fp32 values it was initialised with or reads
  // from hf_weights_dir, not from their rounded copy. The initial values are those the model
  // was created with, on the host, kept (not copied) until the preparation is done.
  const bool fp32_masters = role == Role::kTrained && dtype != torch::kFloat32;
  std::map<std::string, torch::Tensor> initial;
  if (fp32_masters && hf_weights_dir.empty()) {
    for (const auto& item : model->named_parameters()) {
      initial.emplace(item.key(), item.value().detach());
    }
  }
  model->to(mesh.device(), dtype);
  std::unique_ptr<PreparedModel> prepared(new PreparedModel(std::move(model), role));
  PLAIT_ASSIGN_OR_RETURN(prepared->preparation_, wrap::Preparation::Begin(*prepared->model_, mesh,
                                                                          field_path + ".prepare"));
  for (const wrap::PrepareStep& step : steps) {
    PLAIT_RETURN_IF_ERROR(prepared->preparation_->Apply(step));
  }
  PLAIT_ASSIGN_OR_RETURN(std::vector<parallel::TrainableParameter> parameters,
                         prepared->preparation_->TakeTrainableParameters());
  if (fp32_masters) {
    for (parallel::TrainableParameter& parameter : parameters) {
      if (parameter.tensor.scalar_type() != torch::kFloat32) {
        parameter.master = parameter.tensor.detach().to(torch::kFloat32, /*non_blocking=*/false,
                                                        /*copy=*/true);
      }
    }
  }
  if (!hf_weights_dir.empty()) {
    // Loaded into the prepared parameters, so that each rank reads only the slice of each
    // tensor it holds (tensor parallelism's, FSDP's shard).
    PLAIT_RETURN_IF_ERROR(base::Annotate(LoadHfSlices(hf_weights_dir, config, parameters),
                                         field_path + ".hf_weights_dir"));
  } else if (fp32_masters) {
    PLAIT_RETURN_IF_ERROR(CopyInitialSlices(initial, parameters));
  }
  if (role == Role::kTrained) {
    prepared->trainable_ = std::move(parameters);
  } else {
    for (parallel::TrainableParameter& parameter : parameters)
      parameter.tensor.requires_grad_(false);
    for (auto& named : prepared->model_->NamedParameters()) named.parameter.requires_grad_(false);
  }
  return prepared;
}

absl::Status PreparedModel::SaveHf(const std::string& dir, int rank, int writer) {
  PLAIT_ASSIGN_OR_RETURN(auto full, preparation_->FullParameters());
  if (rank != writer) return absl::OkStatus();
  std::vector<std::pair<std::string, torch::Tensor>> parameters;  // in the model's order
  for (const auto& item : model_->named_parameters()) {
    const auto it = full.find(item.key());
    if (it == full.end()) {
      return absl::InternalError(absl::StrCat("saving ", dir, ": no gathered ", item.key()));
    }
    parameters.emplace_back(item.key(), it->second);
  }
  return models::SaveHfParameters(model_->config(), parameters, dir);
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> BuildOptimizer(
    const PreparedModel& prepared, const optim::OptimizerConfig& config) {
  if (prepared.role() == Role::kFrozen) {
    return absl::FailedPreconditionError(
        "a frozen model is prepared but not trained; it has no optimizer");
  }
  return optim::Optimizer::Create(prepared.trainable_parameters(), config);
}

}  // namespace plait::trainer
