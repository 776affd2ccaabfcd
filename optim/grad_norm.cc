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
    double sum_of_squares = 0.0;
  };
  std::vector<Partial> partials;
  for (const parallel::TrainableParameter& parameter : parameters) {
    // Every parameter registers its groups, with a gradient or not, so that every rank runs
    // the same all-reduces.
    auto partial = std::find_if(partials.begin(), partials.end(), [&](const Partial& p) {
      return p.groups == parameter.sharded_over;
    });
    if (partial == partials.end()) {
      partials.push_back({parameter.sharded_over, 0.0});
      partial = partials.end() - 1;
    }
    const torch::Tensor& grad = parameter.tensor.grad();
    if (!grad.defined()) continue;
    const double norm =
        torch::linalg_vector_norm(grad, 2, c10::nullopt, false, torch::kFloat64).item<double>();
    partial->sum_of_squares += norm * norm / static_cast<double>(parameter.replicas);
  }

  double total = 0.0;
  for (const Partial& partial : partials) {
    // fp32 is the widest floating type every backend reduces.
    torch::Tensor sum = torch::full({1}, partial.sum_of_squares,
                                    parameters.front().tensor.options().dtype(torch::kFloat32));
    for (parallel::Communicator* group : partial.groups) {
      if (absl::Status status = group->AllReduce(sum, parallel::ReduceOp::kSum)->Wait();
          !status.ok()) {
        return status;
      }
    }
    total += sum.item<double>();
  }
  return std::sqrt(total);
}

void ScaleGradients(const std::vector<parallel::TrainableParameter>& parameters, double factor) {
  for (const parallel::TrainableParameter& parameter : parameters) {
    torch::Tensor grad = parameter.tensor.grad();
    if (grad.defined()) grad.mul_(factor);
  }
}

}  // namespace plait::optim
