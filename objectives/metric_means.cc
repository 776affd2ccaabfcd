#include "objectives/metric_means.h"

#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::objectives {

void MetricMeans::Add(const ObjectiveOutput& output, int64_t items) {
  // Summed where the loss was computed, so that a GPU run reads them on the host once, in
  // Mean. A batch with no item has the loss 0 (Objective's contract) and adds nothing.
  std::vector<at::Tensor> values = {output.loss.detach().reshape({1})};
  for (const auto& [name, value] : output.metrics) values.push_back(value.reshape({1}));
  const at::Tensor weighted = at::cat(values).to(at::kDouble) * static_cast<double>(items);
  sums_ = sums_.defined() ? sums_ + weighted : weighted;
  if (names_.empty()) {
    for (const auto& [name, value] : output.metrics) names_.push_back(name);
  }
  items_ += items;
}

absl::StatusOr<MeanMetrics> MetricMeans::Mean(const parallel::DeviceMesh& mesh) const {
  // One fp32 sum over the mesh (the communicators reduce no fp64): the items, the weighted
  // loss, then the weighted metrics, on the mesh's device. fp32 holds the counts exactly up to
  // 2^24 items on the mesh and to 2^-24 relative beyond, far below what the logs print.
  const at::Tensor sums = sums_.defined()
                              ? sums_
                              : torch::zeros({1 + static_cast<int64_t>(names_.size())},
                                             at::TensorOptions(at::kDouble).device(mesh.device()));
  at::Tensor tensor =
      at::cat({torch::full({1}, static_cast<double>(items_), sums.options()), sums}).to(at::kFloat);
  PLAIT_RETURN_IF_ERROR(mesh.AllReduce(tensor, parallel::ReduceOp::kSum));
  tensor = tensor.to(at::kCPU, at::kDouble).contiguous();
  const double* values = tensor.data_ptr<double>();
  const double items = values[0];
  if (items == 0.0) {
    return absl::FailedPreconditionError(
        "no rank's batches score an item (every target is the ignore index): the mean loss "
        "would be 0 / 0");
  }
  MeanMetrics mean{values[1] / items, {}};
  for (size_t i = 0; i < names_.size(); ++i) {
    mean.metrics.emplace_back(names_[i], values[i + 2] / items);
  }
  return mean;
}

}  // namespace plait::objectives
