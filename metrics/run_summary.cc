#include "metrics/run_summary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {

std::string RunSummaryPath(absl::string_view metrics_path) {
  const size_t slash = metrics_path.rfind('/');
  const size_t dot = metrics_path.rfind('.');
  const bool has_extension =
      dot != absl::string_view::npos && (slash == absl::string_view::npos || dot > slash + 1);
  return absl::StrCat(has_extension ? metrics_path.substr(0, dot) : metrics_path,
                      ".run_summary.json");
}

std::string RunSummaryJson(const RunMetrics& run) {
  nlohmann::ordered_json summary;
  summary["last_step"] = run.steps.empty() ? 0 : run.steps.back().step;
  summary["steps_trained"] = run.steps.size();
  summary["seconds"] = run.seconds;
  summary["tokens_per_s"] = run.tokens_per_s;
  if (run.mfu) summary["mfu"] = *run.mfu;
  if (run.best_eval_loss) summary["best_eval_loss"] = *run.best_eval_loss;
  const auto last_eval = std::find_if(run.steps.rbegin(), run.steps.rend(),
                                      [](const StepMetrics& step) { return step.eval_loss; });
  if (last_eval != run.steps.rend()) summary["last_eval_loss"] = *last_eval->eval_loss;
  if (run.entropy_floor) summary["entropy_floor"] = *run.entropy_floor;
  summary["peak_memory_bytes"] = run.peak_memory_bytes;
  if (run.peak_device_memory_bytes) {
    summary["peak_device_memory_bytes"] = *run.peak_device_memory_bytes;
  }
  summary["skipped_steps"] = std::count_if(run.steps.begin(), run.steps.end(),
                                           [](const StepMetrics& step) { return step.skipped; });
  summary["checkpoints_written"] = run.checkpoints_written;
  return summary.dump(2) + "\n";
}

}  // namespace plait::metrics
