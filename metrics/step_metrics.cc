#include "metrics/step_metrics.h"

#include <cmath>

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

}  // namespace plait::metrics
