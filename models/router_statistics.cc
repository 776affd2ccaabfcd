#include "models/router_statistics.h"

#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A layer's output, unchanged, whose backward also hands the layer's probability sums [E] the
// gradient aux gives them (RouterStatistics::gradient), read when the backward runs: after
// RouterStatistics::Loss has seen every layer.
struct RouterGradient : torch::autograd::Function<RouterGradient> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& output,
                            const at::Tensor& probability_sums,
                            c10::intrusive_ptr<RouterStatistics> statistics) {
    ctx->saved_data["statistics"] = c10::IValue::make_capsule(std::move(statistics));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto statistics = c10::static_intrusive_pointer_cast<RouterStatistics>(
        ctx->saved_data["statistics"].toCapsule());
    // Undefined where no Loss was taken: the forward trains no auxiliary loss.
    return {grads[0], statistics->gradient(), at::Tensor()};
  }
};

}  // namespace

at::Tensor RouterStatistics::Record(int64_t layer, const at::Tensor& probabilities,
                                    const at::Tensor& routed, const at::Tensor& output) {
  {
    const at::NoGradGuard counting;
    LayerLoad& load = layers_[layer];
    load.routed = routed.to(at::kFloat);
    load.probability = probabilities.sum(0, /*keepdim=*/false, at::kFloat);
    load.rows = probabilities.size(0);
  }
  if (coefficient_ == 0.0 || !probabilities.requires_grad()) return output;
  return RouterGradient::apply(output, probabilities.sum(0),
                               c10::intrusive_ptr<RouterStatistics>::reclaim_copy(this));
}

at::Tensor RouterStatistics::Load() const {
  at::Tensor total;
  for (const auto& [layer, load] : layers_) {
    const at::Tensor rows = torch::full({1}, static_cast<double>(load.rows), load.routed.options());
    const at::Tensor packed = at::cat({load.routed, load.probability, rows});
    total = total.defined() ? total + packed : packed;
  }
  return total.defined() ? total : torch::zeros({2 * num_experts_ + 1}, at::kFloat);
}

at::Tensor RouterStatistics::Loss(const at::Tensor& total, double gradient_scale) {
  const at::Tensor routed = total.narrow(0, 0, num_experts_);
  const at::Tensor probability = total.narrow(0, num_experts_, num_experts_);
  // With no row routed anywhere, no term: 0, and a zero gradient.
  const at::Tensor rows = total.narrow(0, 2 * num_experts_, 1).clamp_min(1.0);
  const at::Tensor squared = rows * rows;
  gradient_ =
      routed * (gradient_scale * coefficient_ * static_cast<double>(num_experts_)) / squared;
  return (routed * probability).sum() * static_cast<double>(num_experts_) / squared.squeeze();
}

}  // namespace plait::models
