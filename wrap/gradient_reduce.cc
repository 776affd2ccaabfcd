#include "wrap/gradient_reduce.h"

#include "ATen/core/Tensor.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap {

absl::Status ReduceGradient(const parallel::TrainableParameter& part, parallel::Communicator& group,
                            parallel::ReduceOp op) {
  const at::NoGradGuard no_grad;
  at::Tensor& gradient = part.tensor.mutable_grad();
  if (!gradient.defined()) gradient = torch::zeros_like(part.tensor);
  at::Tensor reduced = gradient.to(at::kFloat).contiguous();
  if (absl::Status status = group.AllReduce(reduced, op)->Wait(); !status.ok()) return status;
  if (!reduced.is_same(gradient)) gradient.copy_(reduced);
  return absl::OkStatus();
}

}  // namespace plait::wrap
