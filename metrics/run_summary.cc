#include "metrics/run_summary.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {
namespace {

// `metrics_path` with its extension, if any, replaced by `suffix`.
std::string BesideMetricsFile(absl::string_view metrics_path, absl::string_view suffix) {
  const size_t slash = metrics_path.rfind('/');
  const size_t dot = metrics_path.rfind('.');
  const bool has_extension =
      dot != absl::string_view::npos && (slash == absl::string_view::npos || dot > slash + 1);
  return absl::StrCat(has_extension ? metrics_path.substr(0, dot) : metrics_path, suffix);
}

// The seconds of the steps of `rows`, each `tokens_per_step` over its tokens_per_s. A row
// without a positive tokens_per_s (none the trainer writes) adds nothing.
double StepSeconds(const std::vector<StepMetrics>& rows, double tokens_per_step) {
  double seconds = 0.0;
  for (const StepMetrics& row : rows) {
    if (row.tokens_per_s > 0.0) seconds += tokens_per_step / row.tokens_per_s;
  }
  return seconds;
}

// `best` lowered to the lowest evaluation loss of `rows`.
void LowerToBestEvalLoss(const std::vector<StepMetrics>& rows, std::optional<double>& best) {
  for (const StepMetrics& row : rows) {
    if (row.eval_loss && (!best || *row.eval_loss < *best)) best = row.eval_loss;
  }
}

}  // namespace

std::string RunSummaryPath(absl::string_view metrics_path) {
  return BesideMetricsFile(metrics_path, ".run_summary.json");
}

std::string RestartsPath(absl::string_view metrics_path) {
  return BesideMetricsFile(metrics_path, ".restarts.jsonl");
}

std::string RunSummaryJson(const RunMetrics& run) {
  nlohmann::ordered_json summary;
  summary["last_step"] = run.steps.empty() ? 0 : run.steps.back().step;
  summary["steps_trained"] = StepsTrained(run);
  summary["seconds"] = run.seconds;
  summary["tokens_per_s"] = run.tokens_per_s;
  if (run.mfu) summary["mfu"] = *run.mfu;
  if (run.best_eval_loss) summary["best_eval_loss"] = *run.best_eval_loss;
  const auto last_eval = std::find_if(run.steps.rbegin(), run.steps.rend(),
                                      [](const StepMetrics& step) { return step.eval_loss; });
  if (last_eval != run.steps.rend()) summary["last_eval_loss"] = *last_eval->eval_loss;
  if (run.entropy_floor) summary["entropy_floor"] = *run.entropy_floor;
  summary["peak_memory_bytes"] = run.peak_memory_bytes;
  if (run.memory_estimate_bytes) summary["memory_estimate_bytes"] = *run.memory_estimate_bytes;
  if (!run.peak_tensor_bytes.empty()) summary["peak_tensor_bytes"] = run.peak_tensor_bytes;
  if (run.peak_device_memory_bytes) {
    summary["peak_device_memory_bytes"] = *run.peak_device_memory_bytes;
  }
  summary["skipped_steps"] = SkippedSteps(run);
  summary["checkpoints_written"] = run.checkpoints_written;
  if (!run.samples_file.empty()) summary["samples_file"] = run.samples_file;
  if (!run.restarts.empty()) {
    summary["steps_repeated"] = StepsRepeated(run);
    nlohmann::ordered_json restarts = nlohmann::ordered_json::array();
    for (const Restart& restart : run.restarts) {
      restarts.push_back({{"restart", restart.number},
                          {"after_step", restart.after_step},
                          {"cause", restart.cause},
                          {"steps_repeated", restart.repeated.size()}});
    }
    summary["restarts"] = std::move(restarts);
  }
  return summary.dump(2) + "\n";
}

RunMetrics WholeRun(RunMetrics last, EarlierStarts earlier, double tokens_per_step) {
  // The metrics rows are where the earlier starts' time is read from: each row's
  // tokens_per_s gives its step's seconds, for the steps a restart dropped as well (the
  // restarts file keeps their rows), whereas a checkpoint's metadata could only tell the
  // time up to the checkpoint, not the steps after it that a restart trained again, and
  // would add a field to every checkpoint of every run.
  double earlier_seconds = StepSeconds(earlier.steps, tokens_per_step);
  for (const Restart& restart : earlier.restarts) {
    earlier_seconds += StepSeconds(restart.repeated, tokens_per_step);
    LowerToBestEvalLoss(restart.repeated, last.best_eval_loss);
  }
  LowerToBestEvalLoss(earlier.steps, last.best_eval_loss);
  // The last start's tokens_per_s is over its own steps' seconds.
  const double last_seconds =
      last.tokens_per_s > 0.0
          ? tokens_per_step * static_cast<double>(last.steps.size()) / last.tokens_per_s
          : 0.0;
  earlier.steps.insert(earlier.steps.end(), std::make_move_iterator(last.steps.begin()),
                       std::make_move_iterator(last.steps.end()));
  last.steps = std::move(earlier.steps);
  last.restarts = std::move(earlier.restarts);
  last.checkpoints_written += earlier.checkpoints_written;
  last.seconds += earlier_seconds;
  const double step_seconds = last_seconds + earlier_seconds;
  last.tokens_per_s = step_seconds > 0.0
                          ? tokens_per_step * static_cast<double>(StepsTrained(last)) / step_seconds
                          : 0.0;
  last.mfu.reset();
  return last;
}

}  // namespace plait::metrics
