// The DPO loss of a batch of preference pairs from their sequence log-probabilities under
// the policy and the reference, as TRL's DPOTrainer.dpo_loss computes it, with the rewards
// it reports. The objective (objective.h) computes the log-probabilities; this is only the
// arithmetic, so it can be checked against a closed form:
//
//   DpoTerms terms = DpoLoss(config, policy_chosen, policy_rejected, ref_chosen, ref_rejected);
//   terms.losses.mean().backward();
#ifndef PLAIT_OBJECTIVES_DPO_LOSS_H_
#define PLAIT_OBJECTIVES_DPO_LOSS_H_

#include "ATen/core/Tensor.h"
#include "objectives/objective.pb.h"

namespace plait::objectives {

// The default beta of Dpo (TRL's DPOConfig.beta).
inline constexpr double kDefaultDpoBeta = 0.1;

// Per pair, [B] each.
struct DpoTerms {
  at::Tensor losses;            // differentiable through the policy's log-probabilities
  at::Tensor chosen_rewards;    // beta * (policy - reference) of chosen, detached
  at::Tensor rejected_rewards;  // the same for rejected
};

// `config`'s loss of pairs whose log-probabilities (fp32 [B]) are given; for the IPO loss
// they must already be averaged over each sequence's completion tokens.
DpoTerms DpoLoss(const Dpo& config, const at::Tensor& policy_chosen,
                 const at::Tensor& policy_rejected, const at::Tensor& reference_chosen,
                 const at::Tensor& reference_rejected);

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_DPO_LOSS_H_
