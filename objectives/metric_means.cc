#include "objectives/metric_means.h"

#include "base/status.h"

namespace plait::objectives {

void MetricMeans::Add(const ObjectiveOutput& output, int64_t items) {
  // Summed where the loss was computed, so that a GPU run reads it on the host once, in Mean.
  // A batch with no item has the loss 0 (Objective's contract) and adds nothing.
  const torch::Tensor loss = output.loss.detach().to(torch::kFloat64) * static_cast<double>(items);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
  if (sums_.empty()) {
    sums_ = output.metrics;
    for (auto& [name, sum] : sums_) sum = 0.0;
  }
  for (size_t i = 0; i < sums_.size(); ++i) {
    sums_[i].second += output.metrics[i].second * static_cast<double>(items);
  }
  items_ += items;
}

absl::StatusOr<MeanMetrics> MetricMeans::Mean(const parallel::DeviceMesh& mesh) const {
  // One fp32 sum over the mesh (the communicators reduce no fp64): the weighted loss, the
  // items, then the weighted metrics, on the mesh's device. fp32 holds the counts exactly up to
  // 2^24 items on the mesh and to 2^-24 relative beyond, far below what the logs print.
  std::vector<float> values = {static_cast<float>(items_)};
  for (const auto& [name, sum] : sums_) values.push_back(static_cast<float>(sum));
  const torch::Tensor loss_sum =
      loss_sum_.defined()
          ? loss_sum_
          : torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(mesh.device()));
  torch::Tensor tensor = torch::cat({loss_sum.to(torch::kFloat32).reshape({1}),
                                     torch::tensor(values, torch::kFloat32).to(loss_sum.device())});
  PLAIT_RETURN_IF_ERROR(mesh.AllReduce(tensor, parallel::ReduceOp::kSum));
  tensor = tensor.cpu().to(torch::kFloat64);
  const double items = tensor[1].item<double>();
  if (items == 0.0) {
    return absl::FailedPreconditionError(
        "no rank's batches score an item (every target is the ignore index): the mean loss "
        "would be 0 / 0");
  }
  MeanMetrics mean{tensor[0].item<double>() / items, sums_};
  for (size_t i = 0; i < sums_.size(); ++i) {
    mean.metrics[i].second = tensor[i + 2].item<double>() / items;
  }
  return mean;
}

}  // namespace plait::objectives
