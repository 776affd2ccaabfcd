#include "metrics/step_metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plait::metrics {

NamedMetrics Scalars(const StepMetrics& metrics) {
  NamedMetrics scalars = {
      {"loss", metrics.loss}, {"lr", metrics.lr}, {"tokens_per_s", metrics.tokens_per_s}};
  for (const auto& [name, value] :
       {std::pair{"grad_norm", metrics.grad_norm}, std::pair{"mfu", metrics.mfu},
        std::pair{"eval_loss", metrics.eval_loss}}) {
    if (value) scalars.emplace_back(name, *value);
  }
  if (metrics.peak_device_memory_bytes) {
    scalars.emplace_back("peak_device_memory_bytes",
                         static_cast<double>(*metrics.peak_device_memory_bytes));
  }
  scalars.insert(scalars.end(), metrics.named.begin(), metrics.named.end());
  for (const auto& [name, value] : metrics.eval_named) scalars.emplace_back("eval_" + name, value);
  return scalars;
}

const char* SkipCause(const StepMetrics& metrics) {
  return std::isfinite(metrics.loss) ? "gradient norm" : "loss";
}

void SkippedUpdates::Count(const StepMetrics& metrics) {
  if (!metrics.skipped) {
    in_a_row_ = 0;
    causes_.clear();
    return;
  }
  ++in_a_row_;
  causes_.insert(SkipCause(metrics));
}

std::string SkippedUpdates::Why() const {
  return absl::StrCat("the ", absl::StrJoin(causes_, " or the "), " was not finite");
}

int64_t StepsRepeated(const RunMetrics& run) {
  int64_t steps = 0;
  for (const Restart& restart : run.restarts) {
    steps += static_cast<int64_t>(restart.repeated.size());
  }
  return steps;
}

int64_t StepsTrained(const RunMetrics& run) {
  return static_cast<int64_t>(run.steps.size()) + StepsRepeated(run);
}

int64_t SkippedSteps(const RunMetrics& run) {
  const auto skipped = [](const std::vector<StepMetrics>& steps) {
    return std::count_if(steps.begin(), steps.end(),
                         [](const StepMetrics& step) { return step.skipped; });
  };
  int64_t count = skipped(run.steps);
  for (const Restart& restart : run.restarts) count += skipped(restart.repeated);
  return count;
}

}  // namespace plait::metrics
