#include "wrap/gradient_reduce.h"

#include "torch/types.h"

namespace plait::wrap {

absl::Status ReduceGradient(const parallel::TrainableParameter& part, parallel::Communicator& group,
                            parallel::ReduceOp op) {
  const torch::NoGradGuard no_grad;
  torch::Tensor& gradient = part.tensor.mutable_grad();
  if (!gradient.defined()) gradient = torch::zeros_like(part.tensor);
  torch::Tensor reduced = gradient.to(torch::kFloat32).contiguous();
  if (absl::Status status = group.AllReduce(reduced, op)->Wait(); !status.ok()) return status;
  if (!reduced.is_same(gradient)) gradient.copy_(reduced);
  return absl::OkStatus();
}

}  // namespace plait::wrap
