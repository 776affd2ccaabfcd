// GRPO's arithmetic as TRL 1.16's GRPOTrainer computes it (token-level importance sampling; no
// vLLM correction, entropy mask or entropy bonus): each completion's advantage within its
// group, and the loss of one micro-batch of completions from the per-token log-probabilities
// of their tokens under the policy, at generation and under the reference. The objective
// computes the log-probabilities; this is only the arithmetic, checked against TRL's own code
// (tests/reference/test_grpo.py):
//
//   const at::Tensor advantages = GroupAdvantages(config, rewards);  // [N], groups in a row
//   GrpoTerms terms = GrpoLoss(config, {.logps = logps, .advantages = advantages,
//                                       .mask = mask});
//   terms.loss.backward();
#ifndef PLAIT_OBJECTIVES_GRPO_LOSS_H_
#define PLAIT_OBJECTIVES_GRPO_LOSS_H_

#include "ATen/core/Tensor.h"
#include "objectives/objective.pb.h"

namespace plait::objectives {

// The defaults of Grpo (TRL's GRPOConfig): num_generations, epsilon_low.
inline constexpr int kDefaultGrpoGenerations = 8;
inline constexpr double kDefaultGrpoEpsilon = 0.2;

// Each completion's advantage from its reward (fp32 [N], num_generations completions of a
// prompt after one another): the reward less its group's mean, divided by the group's
// standard deviation (unbiased) + 1e-4, the whole batch's, or nothing, as scale_rewards says.
at::Tensor GroupAdvantages(const Grpo& config, const at::Tensor& rewards);

// One micro-batch of N completions of up to T tokens.
struct GrpoBatch {
  at::Tensor logps;       // [N, T] fp32: each token's log-probability under the policy
  at::Tensor old_logps;   // [N, T] at generation; undefined: logps itself, detached (one update a
                          // generation)
  at::Tensor ref_logps;   // [N, T] under the reference; read where beta > 0
  at::Tensor advantages;  // [N]
  at::Tensor mask;        // [N, T] 1 on a completion's tokens, 0 on its padding
};

struct GrpoTerms {
  // The micro-batch's loss as TRL computes it in one process without accumulation (for
  // GRPO_LOSS_DAPO, over its own tokens): differentiable through logps. The objective weighs
  // micro-batches over the step (objectives/step_items.h).
  at::Tensor loss;
  // Sums over the completion tokens, which a step adds up over micro-batches and ranks to
  // TRL's global masked means: the tokens, those whose ratio was clipped below (advantage < 0)
  // or above (advantage > 0), and the KL estimate (times the ratio, as the loss takes it)
  // where beta > 0.
  double tokens = 0;
  double low_clipped = 0;
  double high_clipped = 0;
  double kl = 0;
};

GrpoTerms GrpoLoss(const Grpo& config, const GrpoBatch& batch);

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_GRPO_LOSS_H_
