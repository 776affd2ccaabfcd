// Checkpoints of a training run (plan.training.checkpoint): what the trainer saves through
// checkpoint::Checkpointer (checkpoint/checkpointer.h, which owns the layout, the crash-safe
// save and the checks on resume) and how it puts it back. A run resumed from step k continues
// at step k+1 with the same parameters, optimizer state, schedule position (the schedule is a
// function of the step) and data (the loader skips the micro-batches consumed), so k steps, a
// resume and N-k more give the losses and parameters of N steps straight.
//
// Each rank saves its part of the trainable parameters ("param/<name>") and of their
// optimizer state ("optim/<key>", fp32), each under the global name with the slice the
// wrapper that made it names (parallel::TrainableParameter::slice), the optimizer's update
// count ("optimizer_step" in the manifest's metadata) and the paths the run read (kInputPrefix
// entries there, for tools that write from a checkpoint); the manifest's data position is
// the sequences consumed over all data-parallel ranks, and its fingerprint what a resume must
// not change (model config and dtype, optimizer algorithm and its betas/eps/momentum, global
// batch in sequences, seq_len, data source, objective, frozen models, and where a base that a
// step froze comes from), each under its plan field. A run whose preparation froze the model's
// parameters (LoRA) saves only the trainable ones (the adapters) and their state; a resume
// gives the base its values again (prepared::PreparedModel::Prepare, Role::kResumed). The world
// size, mesh and preparation steps may change: a run resumes on any layout (one process, DDP, FSDP
// at any width, tensor parallel, 2-D), each rank reading only the slices it needs, and reads the
// same next global batch. No random state is consumed while training (synthetic data are
// positional, shuffles are seeded per pass), so none is saved.
//
//   PLAIT_ASSIGN_OR_RETURN(RunCheckpoints checkpoints, RunCheckpoints::Open(resolved, mesh));
//   PLAIT_ASSIGN_OR_RETURN(auto optimizer, BuildOptimizer(*prepared, plan.optimizer()));
//   PLAIT_RETURN_IF_ERROR(checkpoints.Restore(*optimizer, train_loader));
//   for (int64_t step = checkpoints.resume_step(); step < steps; ++step) {
//     ...  // one optimizer step
//     PLAIT_RETURN_IF_ERROR(checkpoints.SaveIfDue(step + 1, *optimizer));
//   }
#ifndef PLAIT_TRAINER_RUN_CHECKPOINTS_H_
#define PLAIT_TRAINER_RUN_CHECKPOINTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpointer.h"
#include "data/data_loader.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "plan/resolved_plan.h"

namespace plait::trainer {

// The names a checkpoint stores a trainable parameter and an optimizer state tensor under:
// "param/" + the parameter's (Hugging Face) name, "optim/" + the optimizer's state key.
inline constexpr char kParameterPrefix[] = "param/";
inline constexpr char kOptimizerPrefix[] = "optim/";
// The fingerprint entry that holds the model's config (a ModelConfig in text format).
inline constexpr char kModelField[] = "plan.model";
// The fingerprint's global batch: the data position advances by it each step.
inline constexpr char kGlobalBatchField[] = "plan.training.global_batch";
// The fingerprint entry of a run whose preparation froze the model's parameters (LoRA's
// base), which its checkpoints do not hold: where they come from, the Hugging Face folder or
// the seeded initialisation. Absent from other runs' checkpoints.
inline constexpr char kFrozenBaseField[] = "plan.hf_weights_dir";
// The metadata entries that record what the run read: "input/" + the plan field
// (plan::ResolvedPlan::inputs) -> the path, resolved (base::ResolvedPath), so that a tool
// writing from the checkpoint never writes over them (tools/checkpoint export-hf).
inline constexpr char kInputPrefix[] = "input/";

// The optimizer's update count a checkpoint of step `step` records in its manifest's
// metadata (`metadata`, as saved): an integer from 0 to `step`, since a step updates the
// optimizer once at most (a skipped step not at all). DataLoss naming the field otherwise. A
// resume loads it; tools/checkpoint verify checks it the same way.
absl::StatusOr<int64_t> SavedOptimizerStep(const std::map<std::string, std::string>& metadata,
                                           int64_t step);

class RunCheckpoints {
 public:
  // Reads the checkpoint settings of `resolved` for the calling rank of `mesh`, which must
  // outlive the result; the folder is resolved.checkpoint_dir. With resume, finds the newest
  // checkpoint there and checks its manifest against the plan and mesh; without,
  // FailedPrecondition when the folder already holds checkpoints (they are never
  // overwritten). Reads only the file system.
  static absl::StatusOr<RunCheckpoints> Open(const plan::ResolvedPlan& resolved,
                                             const parallel::DeviceMesh& mesh);

  // The step of the checkpoint Restore loads: the run continues at resume_step() + 1.
  // 0 for a fresh run.
  int64_t resume_step() const { return checkpointer_.resume_step(); }

  // Loads the calling rank's parts of the parameters and optimizer state into `optimizer`
  // (whose parameters are the prepared model's trainable ones, however they are laid out)
  // and positions `train` after the sequences the checkpointed run had read; nothing for a
  // fresh run. Every rank must
  // call it; when any rank fails, every rank returns an error (its own, or one naming the
  // rank that failed).
  absl::Status Restore(optim::Optimizer& optimizer, data::DataLoader& train) const;

  // Saves after optimizer step `step` (1-based) when it is a multiple of `every` or the
  // plan's last step. Every rank must call it; when any rank fails, every rank returns an
  // error and no folder named step-* is left for the step.
  absl::Status SaveIfDue(int64_t step, const optim::Optimizer& optimizer) const;

  // Whether SaveIfDue saves after optimizer step `step` (1-based).
  bool IsDue(int64_t step) const { return checkpointer_.IsDue(step); }

  // Saves after optimizer step `step`, due or not (as SaveIfDue).
  absl::Status Save(int64_t step, const optim::Optimizer& optimizer) const;

 private:
  RunCheckpoints(checkpoint::Checkpointer checkpointer, int64_t global_batch,
                 int64_t sequences_per_micro_batch, std::map<std::string, std::string> inputs)
      : checkpointer_(std::move(checkpointer)),
        global_batch_(global_batch),
        sequences_per_micro_batch_(sequences_per_micro_batch),
        inputs_(std::move(inputs)) {}

  checkpoint::Checkpointer checkpointer_;
  int64_t global_batch_;               // sequences per step over the data-parallel ranks
  int64_t sequences_per_micro_batch_;  // over the data-parallel ranks
  std::map<std::string, std::string> inputs_;  // the kInputPrefix entries of every save
};

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_RUN_CHECKPOINTS_H_
