// The loss and metrics of one optimizer step (or one evaluation): what Objective::Compute
// returned for each micro-batch, averaged over the micro-batches and then over every rank of
// the mesh in one all-reduce, so every rank reports the global batch's means:
//
//   MetricMeans means;
//   for (...) {
//     PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput out, objective->Compute(policy, batch));
//     means.Add(out);
//   }
//   PLAIT_ASSIGN_OR_RETURN(MeanMetrics step, means.Mean(mesh));
#ifndef PLAIT_OBJECTIVES_METRIC_MEANS_H_
#define PLAIT_OBJECTIVES_METRIC_MEANS_H_

#include <vector>

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
  // Every output of one step carries the same metric names (one objective computed them).
  void Add(const ObjectiveOutput& output);

  // The means over the outputs added and over the ranks of `mesh` (every rank must call it).
  absl::StatusOr<MeanMetrics> Mean(const parallel::DeviceMesh& mesh) const;

 private:
  torch::Tensor loss_sum_;  // fp64, on the loss's device; undefined before the first Add
  Metrics sums_;
  int64_t count_ = 0;
};

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_METRIC_MEANS_H_
