#include "optim/grad_norm.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"

namespace plait::optim {

absl::StatusOr<double> GlobalGradNorm(const std::vector<parallel::TrainableParameter>& parameters) {
  // One partial sum per distinct set of groups, in order of first appearance: the same
  // order on every rank, since every rank lists the same names.
  struct Partial {
    std::vector<parallel::Communicator*> groups;
    // fp64, on the gradients' device (read on the host once, after the reduction); zero while
    // undefined.
    torch::Tensor sum_of_squares;
  };
  std::vector<Partial> partials;
  for (const parallel::TrainableParameter& parameter : parameters) {
    // Every parameter registers its groups, with a gradient or not, so that every rank runs
    // the same all-reduces.
    auto partial = std::find_if(partials.begin(), partials.end(), [&](const Partial& p) {
      return p.groups == parameter.sharded_over;
    });
    if (partial == partials.end()) {
      partials.push_back({parameter.sharded_over, torch::Tensor()});
      partial = partials.end() - 1;
    }
    const torch::Tensor& grad = parameter.tensor.grad();
    if (!grad.defined()) continue;
    const torch::Tensor squares =
        torch::linalg_vector_norm(grad, 2, c10::nullopt, false, torch::kFloat64).square() /
        static_cast<double>(parameter.replicas);
    partial->sum_of_squares =
        partial->sum_of_squares.defined() ? partial->sum_of_squares + squares : squares;
  }

  // Summed on the device in fp64 and read on the host once, whatever the number of partials.
  torch::Tensor total;
  for (const Partial& partial : partials) {
    // fp32 is the widest floating type every backend reduces.
    const auto options =
        torch::TensorOptions(torch::kFloat32).device(parameters.front().tensor.device());
    torch::Tensor sum = partial.sum_of_squares.defined()
                            ? partial.sum_of_squares.to(options).reshape({1})
                            : torch::zeros({1}, options);
    for (parallel::Communicator* group : partial.groups) {
      if (absl::Status status = group->AllReduce(sum, parallel::ReduceOp::kSum)->Wait();
          !status.ok()) {
        return status;
      }
    }
    sum = sum.to(torch::kFloat64);
    total = total.defined() ? total + sum : sum;
  }
  return total.defined() ? std::sqrt(total.item<double>()) : 0.0;
}

void ScaleGradients(const std::vector<parallel::TrainableParameter>& parameters, double factor) {
  for (const parallel::TrainableParameter& parameter : parameters) {
    torch::Tensor grad = parameter.tensor.grad();
    if (grad.defined()) grad.mul_(factor);
  }
}

}  // namespace plait::optim
