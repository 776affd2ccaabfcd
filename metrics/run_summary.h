// The summary of a finished run as one JSON object, written beside its metrics file
// (MetricsLog::WriteSummary) for a person to read at a glance and for tools (//tools:plot
// draws its entropy floor). Its fields:
//   last_step              the last step trained
//   steps_trained          the optimizer steps trained, repeated ones included (below)
//   seconds                from the first step to the end, evaluations and checkpoints
//                          included (for a restarted run, below)
//   tokens_per_s           tokens trained / the seconds of the steps that trained them, the
//                          steps' own time only (no evaluation, no checkpoint)
//   mfu                    model FLOPs utilization at tokens_per_s, when the plan gives a peak
//   best_eval_loss, last_eval_loss   when the run evaluated
//   entropy_floor          the loss floor of the data, when known (synthetic data)
//   peak_memory_bytes      each rank's peak resident memory (the process's: its tensors, the
//                          runtime and libraries, files mapped in)
//   memory_estimate_bytes  the plan's memory estimate for one rank (plan_check's)
//   peak_tensor_bytes      each rank's tensors at the peak of the step the trainer compared
//                          with the estimate (the second; it warns past 15%), as the allocator
//                          counts them: what the estimate estimates
//   peak_device_memory_bytes   the largest over the ranks (CUDA only)
//   skipped_steps          the steps trained whose update was skipped (a non-finite number)
//   checkpoints_written
//   samples_file           the completions the run drew of its prompts (plan.training.samples)
// A resumed run's summary covers the steps it trained itself. A run its launcher restarted
// (--max_restarts; each restart resumes from the last checkpoint) is summarised over all its
// starts (WholeRun): its steps, time, tokens/s, MFU, evaluation losses, skipped steps and
// checkpoints count every start, and two more fields say what happened:
//   steps_repeated         the steps trained by a start after its last checkpoint, which the
//                          restart after it trained again; counted in steps_trained too
//   restarts               one object per restart: "restart" (1, 2, ...), "after_step" (the
//                          checkpoint's step it resumed from, 0 when it started over),
//                          "cause" (why the start before it ended, as its launcher said:
//                          "rank 1 was killed by signal 9 (Killed)") and "steps_repeated"
// Its seconds are the last start's, from its first step to its end, plus the seconds of the
// earlier starts' steps (their rows' tokens_per_s), repeated ones included: the time an
// earlier start spent in its evaluations and checkpoints is recorded nowhere. The memory
// fields are the last start's. A run without restarts has neither of the two fields.
//
//   RunSummaryPath("runs/a/metrics.jsonl") == "runs/a/metrics.run_summary.json"
//   {"last_step": 100, "steps_trained": 100, "seconds": 12.5, "tokens_per_s": 8192.0, ...}
#ifndef PLAIT_METRICS_RUN_SUMMARY_H_
#define PLAIT_METRICS_RUN_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "metrics/step_metrics.h"

namespace plait::metrics {

// The summary file of the metrics file `metrics_path`: its name with ".jsonl" (or any other
// extension) replaced by ".run_summary.json". Derived from the metrics file's name, rather
// than one fixed name in its folder, so runs whose metrics files share a folder (plans
// without a run_dir, run from one place) keep their summaries apart.
std::string RunSummaryPath(absl::string_view metrics_path);

// The restarts file of the metrics file `metrics_path` (metrics_log.h says what it holds):
// its name with the extension replaced by ".restarts.jsonl", as RunSummaryPath.
std::string RestartsPath(absl::string_view metrics_path);

// The summary's JSON object, indented, one field a line, as above.
std::string RunSummaryJson(const RunMetrics& run);

// What the earlier starts of a restarted run left (MetricsLog::earlier): their rows that
// the metrics file keeps, in order, the restarts so far with the rows each dropped, and the
// checkpoints those starts wrote, which no row records (the trainer counts them).
struct EarlierStarts {
  std::vector<StepMetrics> steps;
  std::vector<Restart> restarts;
  int64_t checkpoints_written = 0;
};

// The run over all its starts: `last` as its last start measured it (RunMetrics of the steps
// it trained), with `earlier`'s steps before its own, its restarts, and their checkpoints,
// seconds, tokens/s and best evaluation loss added (run_summary's fields above).
// `tokens_per_step` (the plan's, the same in every start: a resume refuses another global
// batch or seq_len) turns a row's tokens_per_s back into its step's seconds. The MFU is left
// unset: the caller, who knows the peak FLOP/s, sets it from the whole run's tokens_per_s.
RunMetrics WholeRun(RunMetrics last, EarlierStarts earlier, double tokens_per_step);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_RUN_SUMMARY_H_
