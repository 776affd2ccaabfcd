// GRPO's arithmetic against closed forms: advantages within groups, the loss and its gradient
// at ratio 1 for each normalisation, the clipped tokens (which pass no gradient), and the KL
// estimate. tests/reference/test_grpo.py checks the same against TRL's GRPOTrainer.
#include "objectives/grpo_loss.h"

#include <cmath>

#include "ATen/ATen.h"
#include "gtest/gtest.h"

namespace plait::objectives {
namespace {

Grpo Config(int generations, GrpoLossType loss_type = GRPO_LOSS_DAPO) {
  Grpo config;
  config.set_num_generations(generations);
  config.set_loss_type(loss_type);
  return config;
}

TEST(GroupAdvantagesTest, EachRewardLessItsGroupsMeanOverItsSpread) {
  const at::Tensor rewards = at::tensor({1.f, 0.f, 0.f, 1.f, 2.f, 2.f});
  Grpo config = Config(2);
  // Each group of two that differ by 1: mean 0.5, unbiased std sqrt(0.5); a group alike: 0.
  const double spread = std::sqrt(0.5) + 1e-4;
  EXPECT_TRUE(GroupAdvantages(config, rewards)
                  .allclose(at::tensor({0.5f, -0.5f, -0.5f, 0.5f, 0.f, 0.f}) / spread));
  config.set_scale_rewards(GRPO_REWARD_SCALE_NONE);
  EXPECT_TRUE(
      GroupAdvantages(config, rewards).allclose(at::tensor({0.5f, -0.5f, -0.5f, 0.5f, 0.f, 0.f})));
  config.set_scale_rewards(GRPO_REWARD_SCALE_BATCH);
  const double batch = rewards.std().item<double>() + 1e-4;
  EXPECT_TRUE(GroupAdvantages(config, rewards)
                  .allclose(at::tensor({0.5f, -0.5f, -0.5f, 0.5f, 0.f, 0.f}) / batch));
}

// Two completions of 3 and 1 tokens, advantages 1 and -2, at ratio 1: each token's loss is
// minus its completion's advantage.
TEST(GrpoLossTest, AtRatioOneEachNormalisationOfMinusTheAdvantage) {
  const at::Tensor mask = at::tensor({1.f, 1.f, 1.f, 1.f, 0.f, 0.f}).view({2, 3});
  const at::Tensor advantages = at::tensor({1.f, -2.f});
  struct Case {
    GrpoLossType type;
    double loss;      // (-1 * 3 + 2 * 1) over the type's normaliser
    double gradient;  // of a token of the first completion
  };
  for (const Case& c :
       {Case{GRPO_LOSS_DAPO, -1.0 / 4, -1.0 / 4}, Case{GRPO_LOSS_BNPO, -1.0 / 4, -1.0 / 4},
        Case{GRPO_LOSS_GRPO, (-1.0 + 2.0) / 2, -1.0 / 3 / 2},
        Case{GRPO_LOSS_DR_GRPO, -1.0 / (2 * 5), -1.0 / (2 * 5)}}) {
    Grpo config = Config(2, c.type);
    config.set_max_completion_length(5);
    const at::Tensor logps = at::full({2, 3}, -1.5f).requires_grad_(true);
    const GrpoTerms terms =
        GrpoLoss(config, {.logps = logps, .advantages = advantages, .mask = mask});
    EXPECT_NEAR(terms.loss.item<double>(), c.loss, 1e-6) << c.type;
    terms.loss.backward();
    EXPECT_NEAR(logps.grad()[0][0].item<double>(), c.gradient, 1e-6) << c.type;
    EXPECT_EQ(logps.grad()[1][1].item<double>(), 0.0) << c.type;  // padding
    EXPECT_EQ(terms.tokens, 4);
    EXPECT_EQ(terms.low_clipped + terms.high_clipped, 0);
  }
}

// A token whose ratio left [0.8, 1.28] in the direction its advantage pushes is clipped: its
// loss is the clipped ratio's, with no gradient; one that left it the other way is not.
TEST(GrpoLossTest, ClippedTokensPassNoGradient) {
  Grpo config = Config(2);
  config.set_epsilon_high(0.28);
  const at::Tensor old = at::zeros({2, 2});
  // Ratios 1.5 and 0.5 for each completion.
  const at::Tensor logps =
      at::log(at::tensor({1.5f, 0.5f, 1.5f, 0.5f})).view({2, 2}).requires_grad_(true);
  const at::Tensor advantages = at::tensor({1.f, -1.f});
  const GrpoTerms terms = GrpoLoss(
      config,
      {.logps = logps, .old_logps = old, .advantages = advantages, .mask = at::ones({2, 2})});
  // -min(r A, clip(r) A): -1.28, -0.5, +1.5, +0.8, over 4 tokens.
  EXPECT_NEAR(terms.loss.item<double>(), (-1.28 - 0.5 + 1.5 + 0.8) / 4, 1e-6);
  EXPECT_EQ(terms.high_clipped, 1);  // ratio 1.5 with advantage 1
  EXPECT_EQ(terms.low_clipped, 1);   // ratio 0.5 with advantage -1
  terms.loss.backward();
  // d/dlogp of -r A / 4 is -r A / 4 where unclipped.
  EXPECT_EQ(logps.grad()[0][0].item<double>(), 0.0);
  EXPECT_NEAR(logps.grad()[0][1].item<double>(), -0.5 / 4, 1e-6);
  EXPECT_NEAR(logps.grad()[1][0].item<double>(), 1.5 / 4, 1e-6);
  EXPECT_EQ(logps.grad()[1][1].item<double>(), 0.0);
}

// At ratio 1 the estimate is the k3 estimate itself; the ratio multiplies it unless
// kl_without_ratio (its gradient then differs; tests/reference/test_grpo.py checks it).
TEST(GrpoLossTest, BetaAddsTheK3Estimate) {
  Grpo config = Config(2);
  config.set_beta(0.04);
  const at::Tensor logps = at::tensor({-1.f, -2.f}).view({1, 2});
  const at::Tensor reference = at::tensor({-1.5f, -1.f}).view({1, 2});
  const GrpoTerms terms = GrpoLoss(config, {.logps = logps,
                                            .ref_logps = reference,
                                            .advantages = at::zeros({1}),
                                            .mask = at::ones({1, 2})});
  const double kl = (std::exp(-0.5) + 0.5 - 1) + (std::exp(1.0) - 1.0 - 1);
  EXPECT_NEAR(terms.kl, kl, 1e-6);
  EXPECT_NEAR(terms.loss.item<double>(), 0.04 * kl / 2, 1e-6);
  config.set_kl_without_ratio(true);
  EXPECT_NEAR(GrpoLoss(config, {.logps = logps,
                                .ref_logps = reference,
                                .advantages = at::zeros({1}),
                                .mask = at::ones({1, 2})})
                  .loss.item<double>(),
              0.04 * kl / 2, 1e-6);
}

}  // namespace
}  // namespace plait::objectives
