#include "objectives/dpo_loss.h"

#include "ATen/core/Tensor.h"
#include "ATen/ops/log_sigmoid.h"
#include "ATen/ops/relu.h"

namespace plait::objectives {

DpoTerms DpoLoss(const Dpo& config, const at::Tensor& policy_chosen,
                 const at::Tensor& policy_rejected, const at::Tensor& reference_chosen,
                 const at::Tensor& reference_rejected) {
  const double beta = config.has_beta() ? config.beta() : kDefaultDpoBeta;
  const double eps = config.label_smoothing();
  const at::Tensor z = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected);
  DpoTerms terms;
  switch (config.loss_type()) {
    case DPO_LOSS_IPO:
      terms.losses = (z - 1.0 / (2.0 * beta)).pow(2);
      break;
    case DPO_LOSS_HINGE:
      terms.losses = at::relu(1.0 - beta * z);
      break;
    case DPO_LOSS_ROBUST:
      terms.losses = (-at::log_sigmoid(beta * z) * (1.0 - eps) + at::log_sigmoid(-beta * z) * eps) /
                     (1.0 - 2.0 * eps);
      break;
    default:
      terms.losses = -at::log_sigmoid(beta * z) * (1.0 - eps) - at::log_sigmoid(-beta * z) * eps;
  }
  terms.chosen_rewards = beta * (policy_chosen - reference_chosen).detach();
  terms.rejected_rewards = beta * (policy_rejected - reference_rejected).detach();
  return terms;
}

}  // namespace plait::objectives
