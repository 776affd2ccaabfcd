#include "models/router_statistics.h"

#include <utility>

#include "torch/csrc/autograd/custom_function.h"

namespace plait::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A layer's output, unchanged, whose backward also hands the layer's probability sums [E] the
// gradient aux gives them (RouterStatistics::gradient), read when the backward runs: after
// RouterStatistics::Loss has seen every layer.
struct RouterGradient : torch::autograd::Function<RouterGradient> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& output,
                               const torch::Tensor& probability_sums,
                               c10::intrusive_ptr<RouterStatistics> statistics) {
    ctx->saved_data["statistics"] = c10::IValue::make_capsule(std::move(statistics));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto statistics = c10::static_intrusive_pointer_cast<RouterStatistics>(
        ctx->saved_data["statistics"].toCapsule());
    // Undefined where no Loss was taken: the forward trains no auxiliary loss.
    return {grads[0], statistics->gradient(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RouterStatistics::Record(int64_t layer, const torch::Tensor& probabilities,
                                       const torch::Tensor& routed, const torch::Tensor& output) {
  {
    const torch::NoGradGuard counting;
    LayerLoad& load = layers_[layer];
    load.routed = routed.to(torch::kFloat32);
    load.probability = probabilities.sum(0, /*keepdim=*/false, torch::kFloat32);
    load.rows = probabilities.size(0);
  }
  if (coefficient_ == 0.0 || !probabilities.requires_grad()) return output;
  return RouterGradient::apply(output, probabilities.sum(0),
                               c10::intrusive_ptr<RouterStatistics>::reclaim_copy(this));
}

torch::Tensor RouterStatistics::Load() const {
  torch::Tensor total;
  for (const auto& [layer, load] : layers_) {
    const torch::Tensor rows =
        torch::full({1}, static_cast<double>(load.rows), load.routed.options());
    const torch::Tensor packed = torch::cat({load.routed, load.probability, rows});
    total = total.defined() ? total + packed : packed;
  }
  return total.defined() ? total : torch::zeros({2 * num_experts_ + 1}, torch::kFloat32);
}

torch::Tensor RouterStatistics::Loss(const torch::Tensor& total, double gradient_scale) {
  const torch::Tensor routed = total.narrow(0, 0, num_experts_);
  const torch::Tensor probability = total.narrow(0, num_experts_, num_experts_);
  // With no row routed anywhere, no term: 0, and a zero gradient.
  const torch::Tensor rows = total.narrow(0, 2 * num_experts_, 1).clamp_min(1.0);
  const torch::Tensor squared = rows * rows;
  gradient_ =
      routed * (gradient_scale * coefficient_ * static_cast<double>(num_experts_)) / squared;
  return (routed * probability).sum() * static_cast<double>(num_experts_) / squared.squeeze();
}

}  // namespace plait::models
