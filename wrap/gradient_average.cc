#include "wrap/gradient_average.h"

#include "torch/types.h"

namespace plait::wrap {

absl::Status AverageGradient(const parallel::TrainableParameter& part,
                             parallel::Communicator& group) {
  const torch::NoGradGuard no_grad;
  torch::Tensor& gradient = part.tensor.mutable_grad();
  if (!gradient.defined()) gradient = torch::zeros_like(part.tensor);
  torch::Tensor summed = gradient.to(torch::kFloat32).contiguous();
  if (absl::Status status = group.AllReduce(summed, parallel::ReduceOp::kAverage)->Wait();
      !status.ok()) {
    return status;
  }
  if (!summed.is_same(gradient)) gradient.copy_(summed);
  return absl::OkStatus();
}

}  // namespace plait::wrap
