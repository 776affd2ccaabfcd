#include "optim/grad_norm.h"

#include <algorithm>
#include <cmath>

#include "ATen/core/Tensor.h"
#include "ATen/ops/linalg_vector_norm.h"
#include "absl/status/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::optim {

absl::StatusOr<double> GlobalGradNorm(const std::vector<parallel::TrainableParameter>& parameters) {
  if (parameters.empty()) return 0.0;
  using Groups = std::vector<parallel::Communicator*>;
  // The groups every parameter is split across (a pipeline's, whose ranks hold different
  // parameters; FSDP's when it shards them all) are summed over once, last: ranks whose lists
  // differ (a pipeline's stages) then issue the same all-reduces on them. The ranks of any
  // other group hold the same parameters, in the same order.
  Groups common;
  for (parallel::Communicator* group : parameters.front().sharded_over) {
    const bool everywhere =
        std::all_of(parameters.begin(), parameters.end(), [group](const auto& parameter) {
          return std::count(parameter.sharded_over.begin(), parameter.sharded_over.end(), group) >
                 0;
        });
    if (everywhere) common.push_back(group);
  }
  // One partial sum per distinct set of the other groups, in order of first appearance.
  struct Partial {
    Groups groups;
    // fp64, on the gradients' device (read on the host once, after the reduction); zero while
    // undefined.
    at::Tensor sum_of_squares;
  };
  std::vector<Partial> partials;
  for (const parallel::TrainableParameter& parameter : parameters) {
    Groups groups;
    for (parallel::Communicator* group : parameter.sharded_over) {
      if (std::count(common.begin(), common.end(), group) == 0) groups.push_back(group);
    }
    // Every parameter registers its groups, with a gradient or not, so that every rank runs
    // the same all-reduces.
    auto partial = std::find_if(partials.begin(), partials.end(),
                                [&](const Partial& p) { return p.groups == groups; });
    if (partial == partials.end()) {
      partials.push_back({groups, at::Tensor()});
      partial = partials.end() - 1;
    }
    const at::Tensor& grad = parameter.tensor.grad();
    if (!grad.defined()) continue;
    const at::Tensor squares =
        at::linalg_vector_norm(grad, 2, c10::nullopt, false, at::kDouble).square() /
        static_cast<double>(parameter.replicas);
    partial->sum_of_squares =
        partial->sum_of_squares.defined() ? partial->sum_of_squares + squares : squares;
  }

  // fp32 is the widest floating type every backend reduces.
  const auto options = at::TensorOptions(at::kFloat).device(parameters.front().tensor.device());
  const auto all_reduce = [](at::Tensor& sum, const Groups& groups) -> absl::Status {
    for (parallel::Communicator* group : groups) {
      if (absl::Status status = group->AllReduce(sum, parallel::ReduceOp::kSum)->Wait();
          !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  };
  // Summed on the device in fp64 and read on the host once, whatever the number of partials.
  at::Tensor total = torch::zeros({1}, options.dtype(at::kDouble));
  for (const Partial& partial : partials) {
    at::Tensor sum = partial.sum_of_squares.defined()
                         ? partial.sum_of_squares.to(options).reshape({1})
                         : torch::zeros({1}, options);
    if (absl::Status status = all_reduce(sum, partial.groups); !status.ok()) return status;
    total = total + sum.to(at::kDouble);
  }
  if (!common.empty()) {
    at::Tensor sum = total.to(options);
    if (absl::Status status = all_reduce(sum, common); !status.ok()) return status;
    total = sum.to(at::kDouble);
  }
  return std::sqrt(total.item<double>());
}

void ScaleGradients(const std::vector<parallel::TrainableParameter>& parameters, double factor) {
  for (const parallel::TrainableParameter& parameter : parameters) {
    at::Tensor grad = parameter.tensor.grad();
    if (grad.defined()) grad.mul_(factor);
  }
}

}  // namespace plait::optim
