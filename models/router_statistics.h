// The routing of one forward of a mixture-of-experts model, and its load-balancing auxiliary
// loss (the Switch Transformer's, as Hugging Face's load_balancing_loss_func computes it): over
// the forward's L mixture-of-experts layers and T tokens,
//
//   aux = E * sum_e (routed_e / (T L)) * (probability_e / (T L))
//
// where routed_e counts the top-k choices of expert e and probability_e sums e's router
// probability, each over every layer and token. The model's loss adds router_aux_loss_coef * aux.
//
// routed_e is a constant for autograd, so aux's gradient on layer l's probability sums is
// coef * E * routed_e / (T L)^2, the same for every layer and known only once the forward has
// counted all of them. Each layer's output therefore carries a node whose backward hands its
// router that gradient (as Megatron's MoEAuxLossAutoScaler does): it runs inside the layer's own
// backward, so it holds under activation checkpointing, whose recomputation builds the node
// again. The gradient is set by Loss, from totals the caller may sum over the ranks that routed
// other tokens (data and context parallelism), so that a parallel run equals one process on the
// same batch; a forward whose Loss is never taken trains no auxiliary loss.
//
//   // In CausalLM's forward, in each mixture-of-experts layer:
//   out = statistics.Record(layer, probabilities, routed, out);
//   // After it, where the loss is formed (objectives/model_losses.h):
//   at::Tensor total = statistics.Load();  // all-reduced over the data ranks
//   loss = loss + statistics.coefficient() * statistics.Loss(total, gradient_scale);
#ifndef PLAIT_MODELS_ROUTER_STATISTICS_H_
#define PLAIT_MODELS_ROUTER_STATISTICS_H_

#include <cstdint>
#include <map>

#include "ATen/core/Tensor.h"
#include "torch/custom_class.h"

namespace plait::models {

class RouterStatistics : public torch::CustomClassHolder {
 public:
  // For a model of `num_experts` experts whose loss adds `coefficient` * aux.
  RouterStatistics(int64_t num_experts, double coefficient)
      : num_experts_(num_experts), coefficient_(coefficient) {}

  // Layer `layer`'s routing: its router's `probabilities` [N, E] (fp32) and how many of its
  // tokens' top-k choices went to each expert, `routed` ([E], on the same device). Returns `output`
  // (the layer's, any shape), which where autograd records the forward and the coefficient is not 0
  // carries the node that back-propagates aux's gradient into `probabilities`. A layer recorded
  // again (activation checkpointing's recomputation) replaces its earlier record, which it equals.
  at::Tensor Record(int64_t layer, const at::Tensor& probabilities, const at::Tensor& routed,
                    const at::Tensor& output);

  // The forward's totals, fp32 (as transformers sums them; the communicators reduce no fp64)
  // on the probabilities' device, [2 E + 1]: routed_e, then probability_e, then T L (the rows
  // the layers routed); summed over ranks, the totals of their forwards together. Zeros before
  // any Record.
  at::Tensor Load() const;

  // aux for `total` (Load's layout, this forward's or a sum of several ranks'), an fp32 scalar
  // without autograd history; and the gradient this forward's nodes hand the routers becomes
  // `gradient_scale` * coefficient * E * routed_e / (T L)^2: the scale the loss aux joins is
  // multiplied by before its backward (accumulation, data-parallel averaging), which aux's
  // gradient, arriving apart from the loss, must be given.
  at::Tensor Loss(const at::Tensor& total, double gradient_scale);

  int64_t num_experts() const { return num_experts_; }
  double coefficient() const { return coefficient_; }

  // What the node of a layer's output hands its router's probability sums: undefined until
  // Loss.
  const at::Tensor& gradient() const { return gradient_; }

 private:
  struct LayerLoad {
    at::Tensor routed;          // [E] fp32, the top-k choices of each expert
    at::Tensor probability;     // [E] fp32, the sums of each expert's probability
    int64_t rows = 0;           // the tokens routed
  };

  const int64_t num_experts_;
  const double coefficient_;
  std::map<int64_t, LayerLoad> layers_;
  at::Tensor gradient_;
};

}  // namespace plait::models

#endif  // PLAIT_MODELS_ROUTER_STATISTICS_H_
