// Checkpoints of a run on a device mesh: every rank saves its part of a set of named global
// tensors, plus string metadata, after a step, crash-safely, and a resumed run, on the same
// layout or any other (another world size, mesh or sharding), gets back exactly the parts
// each of its ranks holds, once the checkpoint has been checked against the run. What the
// tensors are is the caller's business (the trainer's adapter, trainer/run_checkpoints.h, stores
// parameters and optimizer state); this library owns the files and the protocol between the
// ranks.
//
// Layout: one folder per checkpoint, `dir/step-00000100/`, holding
//   - rank-00001-of-00002.safetensors (one per rank): the slices of the global tensors this
//     rank saves (replica 0 of each; never padding), each under its global name and shaped
//     as its box, with the global shapes, offsets and checksums in __metadata__;
//   - checkpoint.json (written by rank 0 from the rank files' headers; manifest.h): the
//     step, the world size, mesh and layout that saved it, the caller's position
//     ("data_position"), its metadata, the fingerprint of what a resume must not change
//     (each value under its config field), and per tensor its dtype, global shape and which
//     file holds which slice with the slice's checksum.
// A save writes into `dir/.tmp-step-00000100/` and rank 0 renames it into place only after
// every rank has written and flushed its file and the manifest is written (the ranks agree
// through the mesh's communicators), so a run killed mid-save never leaves a folder that
// looks complete; a stale temporary folder is removed by the next save. On resume each rank
// reads, from memory-mapped files, only the slices that overlap what it holds (checking each
// one's checksum). A checkpoint that does not fit the run (a changed fingerprint, a missing,
// extra or mis-shaped tensor, a truncated, corrupt or missing file) is an error naming the
// file, the field and both values, on every rank. A save that fails removes what it wrote.
// Rank 0 holds a lock on the folder (its `.lock` file) while the Checkpointer lives, so a
// second run on the same folder fails at its start, naming the pid and host of the run that
// holds it.
//
//   PLAIT_ASSIGN_OR_RETURN(Checkpointer checkpointer, Checkpointer::Open(config, dir, run, mesh));
//   PLAIT_RETURN_IF_ERROR(checkpointer.Restore(State().tensors, [&](RankState saved) {
//     return Load(saved);
//   }));
//   for (int64_t step = checkpointer.resume_step(); step < run.steps; ++step) {
//     ...  // one step
//     if (checkpointer.IsDue(step + 1)) {
//       PLAIT_RETURN_IF_ERROR(checkpointer.Save(step + 1, position, State()));
//     }
//   }
#ifndef PLAIT_CHECKPOINT_CHECKPOINTER_H_
#define PLAIT_CHECKPOINT_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/manifest.h"
#include "parallel/device_mesh.h"
#include "parallel/tensor_slice.h"

namespace plait::checkpoint {

// The name of the checkpoint folder of `step` ("step-00000100").
std::string CheckpointName(int64_t step);

// The step of a checkpoint folder's name; nullopt for any other name (temporary folders).
std::optional<int64_t> StepOfName(const std::string& name);

// What a resume finds wrong in `manifest`, read from the folder of step `folder_step`, that
// needs no plan: the step it records is not the folder's, or is below 1; the data position is
// not `position_per_step` per step (when that is > 0), or is negative. One line each, as the
// resume's error lists them.
std::vector<std::string> SavedStepProblems(const Manifest& manifest, int64_t folder_step,
                                           int64_t position_per_step);

// The file each rank writes into a checkpoint folder ("rank-00001-of-00002.safetensors").
std::string RankFileName(int rank, int world_size);

// The manifest rank 0 writes into a checkpoint folder.
inline constexpr char kManifest[] = "checkpoint.json";

// A tensor of one rank: its local tensor and the part of the global tensor it holds.
struct SlicedTensor {
  at::Tensor tensor;
  parallel::TensorSlice slice;
};

// `tensor` as the whole of a global tensor, held by this rank alone.
SlicedTensor Whole(at::Tensor tensor);

// One rank's part of a checkpoint: its tensors, and the caller's metadata, the same on every
// rank (rank 0's is saved).
struct RankState {
  std::map<std::string, SlicedTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// What a Checkpointer knows of the run beyond its CheckpointConfig.
struct RunInfo {
  // Where the CheckpointConfig sits in the caller's config ("plan.training.checkpoint"):
  // errors about its fields name them under it.
  std::string config_field;
  // The run's steps, and the field that sets them ("plan.training.steps"): the last step is
  // always saved, and a checkpoint past it cannot be resumed.
  int64_t steps = 0;
  std::string steps_field;
  // How far the caller's position advances per step (e.g. sequences read per step), so that a
  // resumed position is checked as step x this; 0 leaves it unchecked against the step
  // (a negative position is refused either way).
  int64_t position_per_step = 0;
  // What a resume must not change, value by field path of the caller's config: a checkpoint
  // whose saved value differs for any entry is refused, naming the field and both values.
  std::map<std::string, std::string> fingerprint;
  // How the run lays its tensors out ("fsdp over dp"), saved for tools; a resume may change it.
  std::string layout;
  // What a rank's tensors are, for a checkpoint that does not fit them: all of them ("model
  // and optimizer": "does not fit this rank's model and optimizer"), and one by its name's
  // longest matching prefix, "" matching every name ({"param/", "trainable parameter"}:
  // "param/w: in the checkpoint, but this rank has no such trainable parameter"); "tensor"
  // when none matches.
  std::string contents = "tensors";
  std::map<std::string, std::string> kind_by_prefix;
};

// One rank's view of the checkpoints of a run in one folder.
class Checkpointer {
 public:
  // Reads `config` for the calling rank of `mesh`, which must outlive the result; `dir` is
  // config.dir as the caller resolved it (empty: checkpoints are off). With resume, finds
  // the newest checkpoint in `dir` and checks its manifest against `run` (whatever world
  // size, mesh and layout saved it); without, FailedPrecondition when `dir` already holds
  // checkpoints (they are never overwritten). Reads only the file system.
  static absl::StatusOr<Checkpointer> Open(const CheckpointConfig& config, const std::string& dir,
                                           RunInfo run, const parallel::DeviceMesh& mesh);

  // The step of the checkpoint Restore loads: the run continues at resume_step() + 1.
  // 0 for a fresh run.
  int64_t resume_step() const { return resume_step_; }

  // The position saved with that checkpoint ("data_position"); 0 for a fresh run.
  int64_t resume_position() const { return resume_position_; }

  // Fills fresh tensors shaped as the local tensors of `expected` (the calling rank's, each
  // with the part of its global tensor it holds) from the checkpoint at resume_step(),
  // reading only the stored slices that overlap those parts (padding is zero), after
  // checking `expected` against the manifest (every tensor there, of the same global shape
  // and dtype, and none there that no rank of the mesh holds), and passes them with the saved
  // metadata to `load`, whose error is reported under the checkpoint folder. Nothing for a fresh
  // run. Every rank must call it; when any rank fails, every rank returns an error (its own, or one
  // naming the rank that failed).
  absl::Status Restore(const std::map<std::string, SlicedTensor>& expected,
                       const std::function<absl::Status(RankState)>& load) const;

  // Whether step `step` (1-based) is saved: a multiple of `every`, or the run's last step.
  // Never when checkpoints are off.
  bool IsDue(int64_t step) const;

  // Saves `state`, the calling rank's, after step `step` with the caller's `position`, due or
  // not, then removes all but the newest keep_last checkpoints. Every rank must call it with
  // the same metadata, and with the same tensor names, or (a pipeline's stages) with names of
  // its own; when any rank fails, every rank returns an error and
  // no folder named step-* is left for the step.
  absl::Status Save(int64_t step, int64_t position, const RankState& state) const;

 private:
  explicit Checkpointer(const parallel::DeviceMesh& mesh) : mesh_(&mesh) {}

  const parallel::DeviceMesh* mesh_;
  std::string dir_;  // empty: checkpoints are off
  CheckpointConfig config_;
  RunInfo run_;
  std::string mesh_shape_;  // "dp=2"
  int64_t resume_step_ = 0;
  int64_t resume_position_ = 0;
  std::shared_ptr<const Manifest> manifest_;  // of the checkpoint Restore loads
  std::shared_ptr<const int> lock_;  // rank 0's hold on the folder's lock file, while it lives
};

}  // namespace plait::checkpoint

#endif  // PLAIT_CHECKPOINT_CHECKPOINTER_H_
