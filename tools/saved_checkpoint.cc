#include "tools/saved_checkpoint.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/own_output.h"
#include "base/status.h"
#include "base/text_proto.h"
#include "base/violation.h"
#include "checkpoint/checkpointer.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "trainer/run_checkpoints.h"

namespace plait::tools {
namespace {

// Whether the checkpoint is of a run whose preparation froze the model's parameters (LoRA): it
// holds the trainable adapters alone, the base being the seed's or Hugging Face folder's the
// fingerprint names.
bool HoldsNoBase(const checkpoint::Manifest& manifest) {
  return manifest.fingerprint.count(trainer::kFrozenBaseField) > 0;
}

// The trained model's config the checkpoint's fingerprint records, and its parameters' shapes,
// each checked to be in the checkpoint with that shape (unless HoldsNoBase).
absl::StatusOr<models::ModelConfig> SavedModel(const checkpoint::Manifest& manifest) {
  const std::string field = absl::StrCat(manifest.path, ": fingerprint.", trainer::kModelField);
  const auto model = manifest.fingerprint.find(trainer::kModelField);
  if (model == manifest.fingerprint.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": missing; not a checkpoint of a training run"));
  }
  // Its parser's errors say where the text is wrong ("...: fingerprint.plan.model:1:24: ...").
  models::ModelConfig config;
  PLAIT_RETURN_IF_ERROR(base::ParseTextProto(model->second, field, config));
  PLAIT_RETURN_IF_ERROR(models::ValidateModelConfig(config, field));
  if (HoldsNoBase(manifest)) return config;
  for (const models::ParameterShape& expected : models::ParameterShapes(config)) {
    const std::string name = trainer::kParameterPrefix + expected.name;
    const auto stored = manifest.tensors.find(name);
    if (stored == manifest.tensors.end() || stored->second.shape != expected.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(manifest.path, ": tensors.", name, ": ",
                       stored == manifest.tensors.end() ? "missing" : "of another shape",
                       "; the model has it with shape [", absl::StrJoin(expected.shape, ", "),
                       "] (a frozen parameter is not saved)"));
    }
  }
  return config;
}

// What a resume would refuse that shows without the run's plan: the step and data position
// (at the fingerprint's global batch a step), the optimizer's update count and the trained
// model's parameters.
absl::Status CheckResumable(const std::string& folder, const checkpoint::Manifest& manifest) {
  const std::filesystem::path path = std::filesystem::path(folder).lexically_normal();
  const std::optional<int64_t> folder_step =
      checkpoint::StepOfName((path.has_filename() ? path : path.parent_path()).filename().string());
  if (!folder_step.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(folder, ": not named step-NNNNNNNN, so a resume would not find it"));
  }
  const auto global_batch = manifest.fingerprint.find(trainer::kGlobalBatchField);
  int64_t per_step = 0;
  if (global_batch == manifest.fingerprint.end() ||
      !absl::SimpleAtoi(global_batch->second, &per_step) || per_step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(manifest.path, ": fingerprint.",
                                                   trainer::kGlobalBatchField,
                                                   ": missing or not a positive integer"));
  }
  const std::vector<std::string> problems =
      checkpoint::SavedStepProblems(manifest, *folder_step, per_step);
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(manifest.path, ": cannot resume from it:\n  ",
                                                   absl::StrJoin(problems, "\n  ")));
  }
  PLAIT_RETURN_IF_ERROR(base::Annotate(
      trainer::SavedOptimizerStep(manifest.metadata, manifest.step).status(), manifest.path));
  return SavedModel(manifest).status();
}

}  // namespace

absl::Status VerifySavedCheckpoint(const std::string& folder,
                                   const checkpoint::Manifest& manifest) {
  PLAIT_RETURN_IF_ERROR(CheckResumable(folder, manifest));
  checkpoint::SliceReader reader(folder, manifest);
  return reader.VerifyAll();
}

absl::StatusOr<size_t> ExportSavedCheckpoint(const std::string& folder,
                                             const checkpoint::Manifest& manifest,
                                             const std::string& out_dir,
                                             const std::string& out_field) {
  // Refused before anything is read: the checkpoint's own folder, what its run read (the
  // earlier export it started from), a folder of other files, a downloaded model's; an earlier
  // export's files are replaced.
  std::vector<base::NamedPath> inputs = {{"the checkpoint", folder}};
  for (const auto& [key, path] : manifest.metadata) {
    absl::string_view field = key;
    if (absl::ConsumePrefix(&field, trainer::kInputPrefix)) {
      inputs.push_back({absl::StrCat(field, " of the run that saved the checkpoint"), path});
    }
  }
  const std::vector<base::Violation> refused =
      models::CheckHfExportFolder(out_dir, inputs, out_field);
  if (!refused.empty()) return absl::FailedPreconditionError(refused[0].ToString());
  PLAIT_ASSIGN_OR_RETURN(const models::ModelConfig config, SavedModel(manifest));
  if (HoldsNoBase(manifest)) {
    return absl::FailedPreconditionError(absl::StrCat(
        manifest.path, ": fingerprint.", trainer::kFrozenBaseField, ": \"",
        manifest.fingerprint.at(trainer::kFrozenBaseField),
        "\": a run that froze the model's parameters (LoRA) saves its adapters alone, which are "
        "no model; its training.save_hf_dir export holds the base with the adapters merged"));
  }
  checkpoint::SliceReader reader(folder, manifest);
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  for (const models::ParameterShape& expected : models::ParameterShapes(config)) {
    PLAIT_ASSIGN_OR_RETURN(at::Tensor tensor,
                           reader.ReadWhole(trainer::kParameterPrefix + expected.name));
    parameters.emplace_back(expected.name, std::move(tensor));
  }
  PLAIT_RETURN_IF_ERROR(models::SaveHfParameters(config, parameters, out_dir));
  return parameters.size();
}

}  // namespace plait::tools
