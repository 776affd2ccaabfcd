// The loss and metrics of one optimizer step (or one evaluation): what Objective::Compute
// returned for each micro-batch, weighted by the micro-batch's items (Objective::ScoredItems)
// and averaged over the micro-batches and every rank of the mesh in one all-reduce, so every
// rank reports the global batch's means over its items: for SFT the summed loss of every
// completion token over their count, the loss the step trained on (step_items.h).
//
//   MetricMeans means;
//   for (...) {
//     PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput out, objective->Compute(policy, batch));
//     means.Add(out, objective->ScoredItems(batch));
//   }
//   PLAIT_ASSIGN_OR_RETURN(MeanMetrics step, means.Mean(mesh));
#ifndef PLAIT_OBJECTIVES_METRIC_MEANS_H_
#define PLAIT_OBJECTIVES_METRIC_MEANS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "objectives/objective.h"
#include "parallel/device_mesh.h"

namespace plait::objectives {

struct MeanMetrics {
  double loss = 0.0;
  Metrics metrics;
};

class MetricMeans {
 public:
  // `names`: the metrics every output carries (Objective::MetricNames), so that a rank that
  // adds no output (a pipeline stage before the last) reduces and reports them too; empty:
  // those of the first output added.
  explicit MetricMeans(std::vector<std::string> names = {}) : names_(std::move(names)) {}

  // `output` is the mean over `items` items. Every output of one step carries the same metric
  // names (one objective computed them).
  void Add(const ObjectiveOutput& output, int64_t items);

  // The means over the items of the outputs added on every rank of `mesh` (every rank must
  // call it; ranks that read the same batch, as tensor-parallel ones do, weigh alike, which
  // leaves the means as they are). FailedPrecondition when no rank added an item.
  absl::StatusOr<MeanMetrics> Mean(const parallel::DeviceMesh& mesh) const;

 private:
  // The weighted sums of the loss and then of each metric, fp64 on the loss's device;
  // undefined before any Add.
  at::Tensor sums_;
  std::vector<std::string> names_;  // of the metrics
  int64_t items_ = 0;
};

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_METRIC_MEANS_H_
