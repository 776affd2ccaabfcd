#include "objectives/objective.h"

#include "absl/strings/str_cat.h"
#include "data/batch.h"
#include "objectives/dpo_loss.h"

namespace plait::objectives {
namespace {

// Causal-LM and SFT: the mean cross-entropy of the scored targets.
class CrossEntropy : public Objective {
 public:
  ObjectiveOutput Compute(models::CausalLM& policy, const data::Batch& batch) override {
    return {policy.Loss(batch.inputs, batch.targets, data::kIgnoreTarget), {}};
  }
};

class DirectPreference : public Objective {
 public:
  DirectPreference(const Dpo& config, models::CausalLM& reference)
      : config_(config), reference_(reference) {
    reference_.eval();
  }

  ObjectiveOutput Compute(models::CausalLM& policy, const data::Batch& batch) override {
    torch::Tensor reference;
    {
      // First, so that no policy activations are held while it runs.
      torch::NoGradGuard no_grad;
      reference = reference_.SequenceLogProbs(batch.inputs, batch.targets, data::kIgnoreTarget);
    }
    const torch::Tensor policy_logps =
        policy.SequenceLogProbs(batch.inputs, batch.targets, data::kIgnoreTarget);
    const int64_t pairs = batch.inputs.size(0) / 2;
    const auto chosen = [&](const torch::Tensor& t) { return t.narrow(0, 0, pairs); };
    const auto rejected = [&](const torch::Tensor& t) { return t.narrow(0, pairs, pairs); };
    const auto loss_of = [&](const torch::Tensor& policy, const torch::Tensor& reference) {
      return DpoLoss(config_, chosen(policy), rejected(policy), chosen(reference),
                     rejected(reference));
    };
    // The rewards and log-probabilities reported are of whole sequences for every loss type,
    // as TRL (1.x) reports them.
    DpoTerms terms = loss_of(policy_logps, reference);
    if (config_.loss_type() == DPO_LOSS_IPO) {
      // TRL averages the log-probabilities over the completion tokens for the IPO loss.
      const torch::Tensor lengths =
          (batch.targets != data::kIgnoreTarget).sum(-1).to(torch::kFloat32);
      terms.losses = loss_of(policy_logps / lengths, reference / lengths).losses;
    }
    const auto mean = [](const torch::Tensor& t) { return t.mean().item<double>(); };
    return {terms.losses.mean(),
            {{"rewards/chosen", mean(terms.chosen_rewards)},
             {"rewards/rejected", mean(terms.rejected_rewards)},
             {"rewards/accuracies",
              mean((terms.chosen_rewards > terms.rejected_rewards).to(torch::kFloat32))},
             {"rewards/margins", mean(terms.chosen_rewards - terms.rejected_rewards)},
             {"logps/chosen", mean(chosen(policy_logps).detach())},
             {"logps/rejected", mean(rejected(policy_logps).detach())}}};
  }

 private:
  const Dpo config_;
  models::CausalLM& reference_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(
    const ObjectiveConfig& config, const std::map<std::string, models::CausalLM*>& frozen,
    absl::string_view field_path) {
  if (!config.has_dpo()) return std::make_unique<CrossEntropy>();
  const auto it = frozen.find(config.dpo().reference());
  if (it == frozen.end()) {
    return absl::InvalidArgumentError(absl::StrCat(field_path, ".dpo.reference: \"",
                                                   config.dpo().reference(),
                                                   "\" names no frozen model of the plan"));
  }
  return std::make_unique<DirectPreference>(config.dpo(), *it->second);
}

}  // namespace plait::objectives
