#include "objectives/dpo_loss.h"

#include <cmath>

#include "ATen/core/Tensor.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::objectives {
namespace {

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Two pairs whose log-probabilities give z = 2 and z = -1 (beta 0.5: beta z = 1, -0.5).
struct TwoPairs {
  at::Tensor policy_chosen = torch::tensor({-3.0, -5.0}, at::kDouble).requires_grad_();
  at::Tensor policy_rejected = torch::tensor({-4.0, -4.5}, at::kDouble).requires_grad_();
  at::Tensor reference_chosen = torch::tensor({-4.0, -4.0}, at::kDouble);
  at::Tensor reference_rejected = torch::tensor({-3.0, -4.5}, at::kDouble);
  const double z[2] = {2.0, -1.0};

  DpoTerms Loss(const Dpo& config) {
    return DpoLoss(config, policy_chosen, policy_rejected, reference_chosen, reference_rejected);
  }
};

TEST(DpoLossTest, SigmoidLossAndGradientEqualTheClosedForm) {
  Dpo config;
  config.set_beta(0.5);
  config.set_label_smoothing(0.1);
  TwoPairs pairs;
  const DpoTerms terms = pairs.Loss(config);
  terms.losses.mean().backward();
  double loss = 0.0;
  for (int i = 0; i < 2; ++i) {
    const double bz = 0.5 * pairs.z[i];
    loss += (-std::log(Sigmoid(bz)) * 0.9 - std::log(Sigmoid(-bz)) * 0.1) / 2.0;
    // d/dz of the smoothed loss: -beta (0.9 sigmoid(-bz) - 0.1 sigmoid(bz)), halved by the mean.
    const double dz = -0.5 * (0.9 * Sigmoid(-bz) - 0.1 * Sigmoid(bz)) / 2.0;
    EXPECT_NEAR(pairs.policy_chosen.grad()[i].item<double>(), dz, 1e-12) << i;
    EXPECT_NEAR(pairs.policy_rejected.grad()[i].item<double>(), -dz, 1e-12) << i;
  }
  EXPECT_NEAR(terms.losses.mean().item<double>(), loss, 1e-12);
  EXPECT_NEAR(terms.chosen_rewards[0].item<double>(), 0.5, 1e-12);
  EXPECT_NEAR(terms.rejected_rewards[0].item<double>(), -0.5, 1e-12);
  EXPECT_FALSE(terms.chosen_rewards.requires_grad());
}

TEST(DpoLossTest, IpoHingeAndRobustLossesEqualTheirClosedForms) {
  Dpo config;
  config.set_beta(0.5);
  TwoPairs pairs;
  config.set_loss_type(DPO_LOSS_IPO);
  DpoTerms terms = pairs.Loss(config);
  EXPECT_NEAR(terms.losses[0].item<double>(), std::pow(2.0 - 1.0, 2), 1e-12);
  EXPECT_NEAR(terms.losses[1].item<double>(), std::pow(-1.0 - 1.0, 2), 1e-12);
  config.set_loss_type(DPO_LOSS_HINGE);
  terms = pairs.Loss(config);
  EXPECT_NEAR(terms.losses[0].item<double>(), 0.0, 1e-12);
  EXPECT_NEAR(terms.losses[1].item<double>(), 1.5, 1e-12);
  config.set_loss_type(DPO_LOSS_ROBUST);
  config.set_label_smoothing(0.2);
  terms = pairs.Loss(config);
  EXPECT_NEAR(terms.losses[0].item<double>(),
              (-std::log(Sigmoid(1.0)) * 0.8 + std::log(Sigmoid(-1.0)) * 0.2) / 0.6, 1e-12);
}

TEST(DpoLossTest, BetaDefaultsToTrlsValue) {
  TwoPairs pairs;
  const DpoTerms terms = pairs.Loss(Dpo());
  EXPECT_NEAR(terms.losses[0].item<double>(), -std::log(Sigmoid(0.1 * 2.0)), 1e-12);
}

}  // namespace
}  // namespace plait::objectives
