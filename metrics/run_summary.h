// The summary of a finished run as one JSON object, written beside its metrics file
// (MetricsLog::WriteSummary) for a person to read at a glance and for tools (//tools:plot
// draws its entropy floor): the steps, time, speed, MFU, best and last evaluation loss, the
// loss floor of the data when known, each rank's peak memory, the skipped updates and the
// checkpoints written.
//
//   RunSummaryPath("runs/a/metrics.jsonl") == "runs/a/metrics.run_summary.json"
//   {"last_step": 100, "steps_trained": 100, "seconds": 12.5, "tokens_per_s": 8192.0, ...}
#ifndef PLAIT_METRICS_RUN_SUMMARY_H_
#define PLAIT_METRICS_RUN_SUMMARY_H_

#include <string>

#include "absl/strings/string_view.h"
#include "metrics/step_metrics.h"

namespace plait::metrics {

// The summary file of the metrics file `metrics_path`: its name with ".jsonl" (or any other
// extension) replaced by ".run_summary.json". Derived from the metrics file's name, rather
// than one fixed name in its folder, so runs whose metrics files share a folder (plans
// without a run_dir, run from one place) keep their summaries apart.
std::string RunSummaryPath(absl::string_view metrics_path);

// The summary's JSON object, indented, one field a line: last_step and steps_trained,
// seconds, tokens_per_s, peak_memory_bytes (one number per rank), skipped_steps,
// checkpoints_written, and those known of mfu, best_eval_loss, last_eval_loss,
// entropy_floor and peak_device_memory_bytes (CUDA: the largest over the ranks).
std::string RunSummaryJson(const RunMetrics& run);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_RUN_SUMMARY_H_
