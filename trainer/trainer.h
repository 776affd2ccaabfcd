// The training loop of a resolved plan (plan/resolved_plan.h), on one rank of its mesh:
// prepares the model (and any frozen models) in the plan's order, builds the optimizer from
// the prepared model, starts the objective (Objective::Start: DPO's reference
// precomputation), then runs the steps: micro-batches with gradient accumulation, run by the
// preparation's executor (wrap/micro_batch_executor.h: one after another, or a pipeline's
// schedule over its stages, the last computing the loss; gradients synchronised in the last
// backward), each micro-batch's loss weighted by its share of the
// step's scored items (tokens for causal LM and SFT, pairs for DPO) over all micro-batches
// and data-parallel ranks, so the step's loss is the mean over every item of the step as in
// one process (objectives/step_items.h), clipping and the update at the scheduled learning
// rate, periodic evaluation on the held-out split, and a summary. A step whose loss (or,
// with clipping, gradient norm) is not finite skips its update on every rank; a run that
// skips plan.training.max_skipped_steps updates in a row, or every update it makes, ends with
// an error saying what was not finite. Parameters that an update made non-finite are found
// after a skipped update, before each checkpoint and at the end, and stop the run, naming the
// step of that update and the parameter, with no checkpoint or export of them. Rank 0 prints
// its progress
// (metrics/progress.h), writes the JSONL metrics and the run's summary (metrics/metrics_log.h)
// and TensorBoard's event files (metrics/tensorboard_log.h). The data-parallel rank and
// width, which choose the batches a rank reads, are those of the mesh dimensions whose
// strategies split the batch (ResolvedPlan::data_parallel_dims):
//
//   PLAIT_ASSIGN_OR_RETURN(const plan::ResolvedPlan resolved, plan::Resolve(plan, world_size));
//   PLAIT_ASSIGN_OR_RETURN(auto group, parallel::ProcessGroup::Start(world, plan.mesh(), ...));
//   TrainOptions options;
//   options.log = &std::cout;
//   options.log_is_terminal = parallel::StdoutIsTerminal();
//   PLAIT_ASSIGN_OR_RETURN(TrainReport report, Train(resolved, group->mesh(), options));
#ifndef PLAIT_TRAINER_TRAINER_H_
#define PLAIT_TRAINER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/step_metrics.h"
#include "parallel/device_mesh.h"
#include "plan/resolved_plan.h"

namespace plait::trainer {

// What a run measured: its steps and their summary. Rank 0's, when it writes a metrics file,
// covers every start of a run its launcher restarted (metrics::WholeRun); the other ranks'
// cover their own start.
using TrainReport = metrics::RunMetrics;

struct TrainOptions {
  // Where rank 0 prints progress; nullptr prints nothing (other ranks never print).
  std::ostream* log = nullptr;
  // Whether `log` reaches a terminal, where the progress is a status line redrawn in place
  // (parallel::StdoutIsTerminal tells for stdout).
  bool log_is_terminal = false;
  // Which start of the job this is (parallel::World::restart_count; 0: the first) and why the
  // one before ended (World::restart_cause; may be empty). A restart continues the metrics
  // file after the step it resumes from, even when it found no checkpoint and starts over,
  // and rank 0 prints which restart it is, why, and the step it resumed after.
  int restart_count = 0;
  std::string restart_cause;
  // Called on the rank's thread before each optimizer step, with its 0-based index (e.g. to
  // measure each step's memory, testing_memory.h); none when empty.
  std::function<void(int64_t step)> before_step;
};

// Trains `resolved` (resolved for the mesh's world size) as rank mesh.rank(), writing the
// files it names. Every rank of the mesh must call it. Errors name the plan field, file or
// step; communication errors name the rank.
absl::StatusOr<TrainReport> Train(const plan::ResolvedPlan& resolved,
                                  const parallel::DeviceMesh& mesh, const TrainOptions& options);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_TRAINER_H_
