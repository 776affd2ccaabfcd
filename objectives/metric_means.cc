#include "objectives/metric_means.h"

#include "base/status.h"

namespace plait::objectives {

void MetricMeans::Add(const ObjectiveOutput& output) {
  // Summed where the loss was computed, so that a GPU run reads it on the host once, in Mean.
  const torch::Tensor loss = output.loss.detach().to(torch::kFloat64);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
  if (count_++ == 0) {
    sums_ = output.metrics;
    return;
  }
  for (size_t i = 0; i < sums_.size(); ++i) sums_[i].second += output.metrics[i].second;
}

absl::StatusOr<MeanMetrics> MetricMeans::Mean(const parallel::DeviceMesh& mesh) const {
  std::vector<float> values;
  for (const auto& [name, sum] : sums_) values.push_back(static_cast<float>(sum / count_));
  // fp32, as the trainer has always averaged its loss: the reported numbers stay the same.
  // The loss first, then the metrics, on the mesh's device.
  const torch::Tensor loss_sum =
      loss_sum_.defined()
          ? loss_sum_
          : torch::zeros({}, torch::TensorOptions(torch::kFloat64).device(mesh.device()));
  torch::Tensor tensor =
      torch::cat({(loss_sum / static_cast<double>(count_)).to(torch::kFloat32).reshape({1}),
                  torch::tensor(values, torch::kFloat32).to(loss_sum.device())});
  PLAIT_RETURN_IF_ERROR(mesh.AllReduce(tensor, parallel::ReduceOp::kAverage));
  tensor = tensor.cpu();
  MeanMetrics mean{tensor[0].item<double>(), sums_};
  for (size_t i = 0; i < sums_.size(); ++i) mean.metrics[i].second = tensor[i + 1].item<double>();
  return mean;
}

}  // namespace plait::objectives
