#include "objectives/metric_means.h"

#include "base/status.h"

namespace plait::objectives {

void MetricMeans::Add(const ObjectiveOutput& output) {
  loss_sum_ += output.loss.item<double>();
  if (count_++ == 0) {
    sums_ = output.metrics;
    return;
  }
  for (size_t i = 0; i < sums_.size(); ++i) sums_[i].second += output.metrics[i].second;
}

absl::StatusOr<MeanMetrics> MetricMeans::Mean(const parallel::DeviceMesh& mesh) const {
  std::vector<float> values = {static_cast<float>(loss_sum_ / count_)};
  for (const auto& [name, sum] : sums_) values.push_back(static_cast<float>(sum / count_));
  // fp32, as the trainer has always averaged its loss: the reported numbers stay the same.
  torch::Tensor tensor = torch::tensor(values, torch::kFloat32);
  PLAIT_RETURN_IF_ERROR(mesh.AllReduce(tensor, parallel::ReduceOp::kAverage));
  MeanMetrics mean{tensor[0].item<double>(), sums_};
  for (size_t i = 0; i < sums_.size(); ++i) mean.metrics[i].second = tensor[i + 1].item<double>();
  return mean;
}

}  // namespace plait::objectives
