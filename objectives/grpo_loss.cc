#include "objectives/grpo_loss.h"

#include <algorithm>

#include "ATen/core/Tensor.h"
#include "ATen/ops/clamp.h"
#include "ATen/ops/exp.h"
#include "ATen/ops/minimum.h"
#include "ATen/ops/zeros_like.h"
#include "c10/util/Exception.h"

namespace plait::objectives {
namespace {

double EpsilonLow(const Grpo& config) {
  return config.has_epsilon_low() ? config.epsilon_low() : kDefaultGrpoEpsilon;
}

double EpsilonHigh(const Grpo& config) {
  return config.has_epsilon_high() ? config.epsilon_high() : EpsilonLow(config);
}

}  // namespace

at::Tensor GroupAdvantages(const Grpo& config, const at::Tensor& rewards) {
  const int64_t group =
      config.has_num_generations() ? config.num_generations() : kDefaultGrpoGenerations;
  TORCH_CHECK(rewards.dim() == 1 && group > 1 && rewards.size(0) % group == 0,
              "GroupAdvantages: rewards ", rewards.sizes(), " are not groups of ", group);
  const at::Tensor grouped = rewards.view({-1, group});
  const at::Tensor advantages =
      (grouped - grouped.mean(/*dim=*/{1}, /*keepdim=*/true)).reshape({-1});
  switch (config.scale_rewards()) {
    case GRPO_REWARD_SCALE_GROUP:
      return advantages / (grouped.std(/*dim=*/{1}, /*unbiased=*/true, /*keepdim=*/true)
                               .expand_as(grouped)
                               .reshape({-1}) +
                           1e-4);
    case GRPO_REWARD_SCALE_BATCH:
      return advantages / (rewards.std(/*unbiased=*/true) + 1e-4);
    default:
      return advantages;
  }
}

GrpoTerms GrpoLoss(const Grpo& config, const GrpoBatch& batch) {
  const at::Tensor& logps = batch.logps;
  const at::Tensor mask = batch.mask.to(logps.scalar_type());
  const at::Tensor old = batch.old_logps.defined() ? batch.old_logps : logps.detach();
  const at::Tensor advantages = batch.advantages.to(logps.scalar_type()).unsqueeze(1);
  const double low = EpsilonLow(config);
  const double high = EpsilonHigh(config);
  // The ratio of each token's probability to its probability at generation, and clipped.
  const at::Tensor ratio = at::exp(logps - old);
  const at::Tensor clipped = at::clamp(ratio, 1.0 - low, 1.0 + high);
  at::Tensor per_token = -at::minimum(ratio * advantages, clipped * advantages);
  GrpoTerms terms;
  if (config.beta() != 0.0) {
    const at::Tensor difference = batch.ref_logps - logps;
    at::Tensor kl = at::exp(difference) - difference - 1.0;
    if (!config.kl_without_ratio()) kl = kl * ratio;
    per_token = per_token + config.beta() * kl;
    terms.kl = (kl * mask).sum().item<double>();
  }
  const at::Tensor masked = per_token * mask;
  const at::Tensor tokens = mask.sum();
  switch (config.loss_type()) {
    case GRPO_LOSS_GRPO:
      terms.loss = (masked.sum(/*dim=*/{1}) / mask.sum(/*dim=*/{1}).clamp_min(1.0)).mean();
      break;
    case GRPO_LOSS_DR_GRPO:
      TORCH_CHECK(config.max_completion_length() > 0,
                  "GrpoLoss: GRPO_LOSS_DR_GRPO needs max_completion_length");
      terms.loss =
          masked.sum() / static_cast<double>(logps.size(0) * config.max_completion_length());
      break;
    default:  // GRPO_LOSS_DAPO over the micro-batch's tokens, as GRPO_LOSS_BNPO
      terms.loss = masked.sum() / tokens.clamp_min(1.0);
      break;
  }
  terms.tokens = tokens.item<double>();
  const at::Tensor ratio_seen = ratio.detach();
  terms.low_clipped = ((ratio_seen < 1.0 - low) & (advantages < 0))
                          .to(mask.scalar_type())
                          .mul(mask)
                          .sum()
                          .item<double>();
  terms.high_clipped = ((ratio_seen > 1.0 + high) & (advantages > 0))
                           .to(mask.scalar_type())
                           .mul(mask)
                           .sum()
                           .item<double>();
  return terms;
}

}  // namespace plait::objectives
