#include "objectives/objective.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "data/batch.h"
#include "objectives/dpo_loss.h"

namespace plait::objectives {
namespace {

// Causal-LM and SFT: the mean cross-entropy of the scored targets.
class CrossEntropy : public Objective {
 public:
  absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy, const data::Batch& batch,
                                          const data::Batch& /*host*/) override {
    return ObjectiveOutput{policy.Loss(batch.inputs, batch.targets, data::kIgnoreTarget), {}};
  }

  int64_t ScoredItems(const data::Batch& batch) const override {
    return (batch.targets != data::kIgnoreTarget).sum().item<int64_t>();
  }
};

// The reference's log-probabilities of a batch's rows, on the batch's device: computed by
// the model from the batch, or looked up from its copy in host memory (the second argument).
using ReferenceSource =
    std::function<absl::StatusOr<torch::Tensor>(const data::Batch&, const data::Batch&)>;

// The log-probabilities of `table`'s rows, looked up by the host copy of a batch and moved
// to the batch's device.
ReferenceSource LookedUpIn(std::shared_ptr<const ReferenceLogProbs> table) {
  return [table = std::move(table)](const data::Batch& batch,
                                    const data::Batch& host) -> absl::StatusOr<torch::Tensor> {
    PLAIT_ASSIGN_OR_RETURN(const torch::Tensor found, table->Find(host));
    return data::ToDevice(found, batch.inputs.device());
  };
}

class DirectPreference : public Objective {
 public:
  // `live` is the reference model `reference` computes with, for Start to precompute from;
  // nullptr when `reference` already looks its rows up.
  DirectPreference(const Dpo& config, ReferenceSource reference, models::CausalLM* live)
      : config_(config), reference_(std::move(reference)), live_(live) {}

  absl::Status Start(RunStart& run) override {
    if (!config_.precompute_reference() || live_ == nullptr) return absl::OkStatus();
    const absl::Time start = absl::Now();
    auto table = std::make_shared<ReferenceLogProbs>();
    // Unshuffled pair files repeat their batches after one pass: one pass is all there is.
    int64_t train_batches = run.train_batches;
    if (run.train.RepeatsEachPass()) {
      train_batches = std::min(train_batches, *run.train.DistinctBatches());
    }
    for (auto [loader, batches] :
         {std::pair{&run.train, train_batches}, std::pair{&run.eval, run.eval_batches}}) {
      for (int64_t i = 0; i < batches; ++i) {
        PLAIT_ASSIGN_OR_RETURN(const data::Batch batch, loader->Next());
        table->Add(*live_, data::ToDevice(batch, run.device));
      }
    }
    run.print(absl::StrFormat(
        "precomputed the reference log-probabilities of %d rows on rank 0 (%d training and %d "
        "eval micro-batches per rank) in %.1f s",
        table->rows(), train_batches, run.eval_batches,
        absl::ToDoubleSeconds(absl::Now() - start)));
    reference_ = LookedUpIn(std::move(table));
    live_ = nullptr;
    return base::Annotate(run.release_frozen(config_.reference()),
                          "plan.objective.dpo.precompute_reference");
  }

  absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy, const data::Batch& batch,
                                          const data::Batch& host) override {
    // First, so that no policy activations are held while a live reference runs.
    PLAIT_ASSIGN_OR_RETURN(const torch::Tensor reference, reference_(batch, host));
    const torch::Tensor policy_logps =
        policy.SequenceLogProbs(batch.inputs, batch.targets, data::kIgnoreTarget);
    const int64_t pairs = batch.inputs.size(0) / 2;
    const auto chosen = [&](const torch::Tensor& t) { return t.narrow(0, 0, pairs); };
    const auto rejected = [&](const torch::Tensor& t) { return t.narrow(0, pairs, pairs); };
    const auto loss_of = [&](const torch::Tensor& of_policy, const torch::Tensor& of_reference) {
      return DpoLoss(config_, chosen(of_policy), rejected(of_policy), chosen(of_reference),
                     rejected(of_reference));
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
    const auto mean = [](const torch::Tensor& t) { return t.mean().to(torch::kFloat32); };
    return ObjectiveOutput{
        terms.losses.mean(),
        {{"rewards/chosen", mean(terms.chosen_rewards)},
         {"rewards/rejected", mean(terms.rejected_rewards)},
         {"rewards/accuracies",
          mean((terms.chosen_rewards > terms.rejected_rewards).to(torch::kFloat32))},
         {"rewards/margins", mean(terms.chosen_rewards - terms.rejected_rewards)},
         {"logps/chosen", mean(chosen(policy_logps).detach())},
         {"logps/rejected", mean(rejected(policy_logps).detach())}}};
  }

  // The loss is the mean of the pairs' losses.
  int64_t ScoredItems(const data::Batch& batch) const override { return batch.inputs.size(0) / 2; }

 private:
  const Dpo config_;
  ReferenceSource reference_;
  models::CausalLM* live_;
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
  models::CausalLM& reference = *it->second;
  reference.eval();
  return std::make_unique<DirectPreference>(
      config.dpo(),
      [&reference](const data::Batch& batch, const data::Batch&) -> absl::StatusOr<torch::Tensor> {
        return ReferenceLogProbs::Compute(reference, batch);
      },
      &reference);
}

std::unique_ptr<Objective> MakePrecomputedDpo(const Dpo& config,
                                              std::shared_ptr<const ReferenceLogProbs> reference) {
  return std::make_unique<DirectPreference>(config, LookedUpIn(std::move(reference)), nullptr);
}

}  // namespace plait::objectives
