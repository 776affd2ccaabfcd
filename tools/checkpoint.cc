// Looks into a training run's checkpoint (one step-NNNNNNNN folder) without starting a run:
//
//   bazel run //tools:checkpoint -- info /ckpt/run1/step-00000100
//   bazel run //tools:checkpoint -- verify /ckpt/run1/step-00000100
//   bazel run //tools:checkpoint -- export-hf /ckpt/run1/step-00000100 /models/run1-100
//
// info prints the step, the world size, mesh and preparation that saved it, the data position,
// the fingerprint, and every tensor with its dtype, global shape, size and slices; verify runs
// the checks of a resume that need no plan (the step and data position, the model's
// parameters), reads every slice and checks its checksum and that its values are finite, and
// names the checks that need the run's plan; export-hf writes the
// trained parameters as a Hugging Face folder (config.json + model.safetensors, fp32) of the
// model config the checkpoint records, into a new or empty folder or one an earlier export
// wrote, never over other files. Exits 1 naming what is wrong with the checkpoint, 2 on a
// usage error.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/guarded_main.h"
#include "base/human.h"
#include "base/status.h"
#include "base/violation.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "google/protobuf/text_format.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "trainer/run_checkpoints.h"

namespace plait::tools {
namespace {

constexpr char kUsage[] =
    "usage: checkpoint info CHECKPOINT | verify CHECKPOINT | export-hf CHECKPOINT OUT_DIR\n"
    "  CHECKPOINT: one checkpoint folder, e.g. /ckpt/run1/step-00000100";

absl::Status Info(const checkpoint::Manifest& manifest) {
  std::cout << "step " << manifest.step << ", saved by " << manifest.world_size << " ranks (mesh "
            << (manifest.mesh.empty() ? "none" : manifest.mesh) << ")\n"
            << "layout: " << manifest.layout << "\n"
            << "data position: " << manifest.data_position << "\n";
  for (const auto& [field, value] : manifest.fingerprint) {
    std::cout << "fingerprint " << field << ": " << value << "\n";
  }
  for (const auto& [key, value] : manifest.metadata) {
    std::cout << "metadata " << key << ": " << value << "\n";
  }
  int64_t total_bytes = 0;
  for (const auto& [name, tensor] : manifest.tensors) {
    int64_t elements = 1;
    for (const int64_t extent : tensor.shape) elements *= extent;
    const int64_t bytes = elements * c10::elementSize(tensor.dtype);
    total_bytes += bytes;
    std::vector<std::string> files;
    for (const checkpoint::StoredSlice& slice : tensor.slices) files.push_back(slice.file);
    std::cout << name << " " << c10::toString(tensor.dtype) << " ["
              << absl::StrJoin(tensor.shape, ", ") << "] " << base::HumanBytes(bytes) << " in "
              << tensor.slices.size() << " slice" << (tensor.slices.size() == 1 ? "" : "s") << " ("
              << absl::StrJoin(files, ", ") << ")\n";
  }
  std::cout << manifest.tensors.size() << " tensors, " << base::HumanBytes(total_bytes) << "\n";
  return absl::OkStatus();
}

// The trained model's config the checkpoint's fingerprint records, and its parameters' shapes,
// each checked to be in the checkpoint with that shape.
absl::StatusOr<models::ModelConfig> SavedModel(const checkpoint::Manifest& manifest) {
  const auto model = manifest.fingerprint.find(trainer::kModelField);
  models::ModelConfig config;
  if (model == manifest.fingerprint.end() ||
      !google::protobuf::TextFormat::ParseFromString(model->second, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(manifest.path, ": fingerprint.", trainer::kModelField,
                     ": missing or not a model config; not a checkpoint of a training run"));
  }
  PLAIT_RETURN_IF_ERROR(models::ValidateModelConfig(
      config, absl::StrCat(manifest.path, ": fingerprint.", trainer::kModelField)));
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
// (at the fingerprint's global batch a step) and the trained model's parameters.
absl::Status CheckResumable(const std::string& folder, const checkpoint::Manifest& manifest) {
  const std::filesystem::path path = std::filesystem::path(folder).lexically_normal();
  const std::optional<int64_t> folder_step = checkpoint::StepOfName(
      (path.has_filename() ? path : path.parent_path()).filename().string());
  if (!folder_step.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(folder, ": not named step-NNNNNNNN, so a resume would not find it"));
  }
  const auto global_batch = manifest.fingerprint.find(trainer::kGlobalBatchField);
  int64_t per_step = 0;
  if (global_batch == manifest.fingerprint.end() ||
      !absl::SimpleAtoi(global_batch->second, &per_step) || per_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(manifest.path, ": fingerprint.", trainer::kGlobalBatchField,
                     ": missing or not a positive integer"));
  }
  const std::vector<std::string> problems =
      checkpoint::SavedStepProblems(manifest, *folder_step, per_step);
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(manifest.path, ": cannot resume from it:\n  ",
                                                   absl::StrJoin(problems, "\n  ")));
  }
  return SavedModel(manifest).status();
}

absl::Status Verify(const std::string& folder, const checkpoint::Manifest& manifest) {
  PLAIT_RETURN_IF_ERROR(CheckResumable(folder, manifest));
  checkpoint::SliceReader reader(folder, manifest);
  PLAIT_RETURN_IF_ERROR(reader.VerifyAll());
  std::cout << folder << ": every checksum matches and every value is finite ("
            << manifest.tensors.size()
            << " tensors); the step, the data position and the model's parameters are as a "
               "resume needs them.\nNot checked without the run's plan: the fingerprint against "
               "the plan's, the layout against its preparation, the step against "
               "plan.training.steps, the optimizer state against its optimizer.\n";
  return absl::OkStatus();
}

absl::Status ExportHf(const std::string& folder, const checkpoint::Manifest& manifest,
                      const std::string& out_dir) {
  // Refused before anything is read: the checkpoint's own folder, a folder of other files, a
  // downloaded model's; an earlier export's files are replaced.
  const std::vector<base::Violation> refused =
      models::CheckHfExportFolder(out_dir, {folder}, "OUT_DIR");
  if (!refused.empty()) return absl::FailedPreconditionError(refused[0].ToString());
  PLAIT_ASSIGN_OR_RETURN(const models::ModelConfig config, SavedModel(manifest));
  checkpoint::SliceReader reader(folder, manifest);
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  for (const models::ParameterShape& expected : models::ParameterShapes(config)) {
    PLAIT_ASSIGN_OR_RETURN(torch::Tensor tensor,
                           reader.ReadWhole(trainer::kParameterPrefix + expected.name));
    parameters.emplace_back(expected.name, std::move(tensor));
  }
  PLAIT_RETURN_IF_ERROR(models::SaveHfParameters(config, parameters, out_dir));
  std::cout << "wrote " << parameters.size() << " parameters of step " << manifest.step << " to "
            << out_dir << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << kUsage << "\n";
    return 0;
  }
  for (const std::string& arg : args) {
    if (absl::StartsWith(arg, "--")) {  // worded as Abseil's flags word it in the other tools
      std::cerr << "Unknown command line flag '" << arg.substr(2, arg.find('=') - 2)
                << "' (--help lists the usage)\n";
      return 2;
    }
  }
  const bool export_hf = !args.empty() && args[0] == "export-hf";
  if (args.size() != (export_hf ? 3u : 2u) ||
      !(export_hf || args[0] == "info" || args[0] == "verify")) {
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string folder = base::UserPath(args[1]);
  const absl::Status status = [&]() -> absl::Status {
    PLAIT_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest,
                           checkpoint::ReadManifest(folder + "/" + checkpoint::kManifest));
    if (args[0] == "info") return Info(manifest);
    if (export_hf) return ExportHf(folder, manifest, base::UserPath(args[2]));
    return Verify(folder, manifest);
  }();
  if (!status.ok()) {
    std::cerr << "checkpoint " << args[0] << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace plait::tools

int main(int argc, char** argv) {
  return plait::base::RunCatchingExceptions("checkpoint",
                                            [&] { return plait::tools::Main(argc, argv); });
}
