// Looks into a training run's checkpoint (one step-NNNNNNNN folder) without starting a run:
//
//   bazel run //tools:checkpoint -- info /ckpt/run1/step-00000100
//   bazel run //tools:checkpoint -- verify /ckpt/run1/step-00000100
//   bazel run //tools:checkpoint -- export-hf /ckpt/run1/step-00000100 /models/run1-100
//
// info prints the step, the world size, mesh and preparation that saved it, the data position,
// the fingerprint, and every tensor with its dtype, global shape, size and slices; verify runs
// the checks of a resume that need no plan (the step and data position, the optimizer's update
// count, the model's parameters), reads every slice and checks its checksum and that its values are
// finite, and names the checks that need the run's plan; export-hf writes the trained parameters as
// a Hugging Face folder (config.json + model.safetensors, fp32) of the model config the checkpoint
// records, into a new or empty folder or one an earlier export wrote, never over other files
// nor over a folder the checkpoint's run read, such as the export it started from (verify and
// export-hf are tools/saved_checkpoint.h's). Exits 1 naming what is wrong with the
// checkpoint, 2 on a usage error.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/guarded_main.h"
#include "base/human.h"
#include "base/status.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "tools/saved_checkpoint.h"

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

absl::Status Verify(const std::string& folder, const checkpoint::Manifest& manifest) {
  PLAIT_RETURN_IF_ERROR(VerifySavedCheckpoint(folder, manifest));
  std::cout << folder << ": every checksum matches and every value is finite ("
            << manifest.tensors.size()
            << " tensors); the step, the data position, the optimizer's update count and the "
               "model's parameters are as a resume needs them.\nNot checked without the run's "
               "plan: the fingerprint against the plan's, the layout against its preparation, "
               "the step against plan.training.steps, the optimizer state against its "
               "optimizer.\n";
  return absl::OkStatus();
}

absl::Status ExportHf(const std::string& folder, const checkpoint::Manifest& manifest,
                      const std::string& out_dir) {
  PLAIT_ASSIGN_OR_RETURN(const size_t written,
                         ExportSavedCheckpoint(folder, manifest, out_dir, "OUT_DIR"));
  std::cout << "wrote " << written << " parameters of step " << manifest.step << " to " << out_dir
            << "\n";
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
