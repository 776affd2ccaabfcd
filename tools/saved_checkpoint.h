// A training run's checkpoint folder (what RunCheckpoints saves, run_checkpoints.h) examined
// without the run's plan, as tools/checkpoint's verify and export-hf do: the checks of a resume
// that need no plan plus every slice read and checked, and the trained parameters written as a
// Hugging Face folder of the model config the checkpoint's fingerprint records. Errors name
// the manifest (and its field) or the rank file that is wrong.
//
//   PLAIT_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest,
//                          checkpoint::ReadManifest(folder + "/checkpoint.json"));
//   PLAIT_RETURN_IF_ERROR(VerifySavedCheckpoint(folder, manifest));
//   PLAIT_ASSIGN_OR_RETURN(size_t written,
//                          ExportSavedCheckpoint(folder, manifest, "/models/run1-100", "OUT_DIR"));
#ifndef PLAIT_TOOLS_SAVED_CHECKPOINT_H_
#define PLAIT_TOOLS_SAVED_CHECKPOINT_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.h"

namespace plait::tools {

// What a resume from `folder` (a step-NNNNNNNN folder, whose manifest is `manifest`) would
// refuse that shows without the run's plan (the step and the data position at the
// fingerprint's global batch a step, the optimizer's update count, the model the fingerprint
// records and its parameters' shapes, unless the run froze them: LoRA's checkpoints hold the
// adapters alone), then every slice of every tensor: its checksum and that its values are
// finite.
// Not checked: the fingerprint against a plan's, the layout against its preparation, the step
// against plan.training.steps, the optimizer state against its optimizer.
absl::Status VerifySavedCheckpoint(const std::string& folder, const checkpoint::Manifest& manifest);

// Writes the trained parameters of the checkpoint in `folder` (fp32, with the config.json of
// the model its fingerprint records) into `out_dir`: a new or empty folder, or one an earlier
// export wrote, but neither `folder` nor a path the checkpoint's run read (its metadata's
// trainer::kInputPrefix entries, such as the earlier export it started from); see
// models::CheckHfExportFolder, whose errors name `out_field`. Every parameter is read and
// checked before anything is written, so a refused checkpoint leaves `out_dir` as it was. The
// number of parameters written. FailedPrecondition for a checkpoint of a run that froze the
// model's parameters (LoRA), which holds its adapters alone.
absl::StatusOr<size_t> ExportSavedCheckpoint(const std::string& folder,
                                             const checkpoint::Manifest& manifest,
                                             const std::string& out_dir,
                                             const std::string& out_field);

}  // namespace plait::tools

#endif  // PLAIT_TOOLS_SAVED_CHECKPOINT_H_
