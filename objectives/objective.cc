#include "objectives/objective.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "data/batch.h"
#include "objectives/dpo_loss.h"
#include "wrap/wrappable.h"

namespace plait::objectives {
namespace {

// Causal-LM and SFT: the mean cross-entropy of the scored targets (of packed rows too: each
// sequence of a row attends only to itself).
class CrossEntropy : public Objective {
 public:
  absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy, const data::Batch& batch,
                                          const data::Batch& /*host*/,
                                          const at::Tensor& /*frozen_read*/,
                                          const StepItems* /*step*/, int /*micro*/) override {
    return ObjectiveOutput{
        policy.Loss(batch.inputs, batch.targets, data::kIgnoreTarget, batch.positions), {}};
  }

  int64_t ScoredItems(const data::Batch& batch) const override {
    return (batch.targets != data::kIgnoreTarget).sum().item<int64_t>();
  }
};

// While it lives, the policy computes as a frozen copy of its base model would for DPO's
// reference (Dpo.policy_without_adapters): its adapters off (wrap::WithoutAdapters), in
// eval mode as a frozen reference runs; its mode is restored when it ends.
class AsFrozenBase {
 public:
  explicit AsFrozenBase(models::CausalLM& policy)
      : policy_(policy), without_adapters_(policy.seams()), was_training_(policy.is_training()) {
    policy_.eval();
  }
  ~AsFrozenBase() { policy_.train(was_training_); }
  AsFrozenBase(const AsFrozenBase&) = delete;
  AsFrozenBase& operator=(const AsFrozenBase&) = delete;

 private:
  models::CausalLM& policy_;
  const wrap::WithoutAdapters without_adapters_;
  const bool was_training_;
};

class DirectPreference : public Objective {
 public:
  // Against the frozen model `reference`, or, where it is nullptr, against the policy without
  // its adapters; with precompute_reference, against their log-probabilities computed in
  // Start. Errors name fields under `field_path`.
  DirectPreference(const Dpo& config, models::CausalLM* reference, absl::string_view field_path)
      : config_(config), frozen_(reference), field_path_(field_path) {}
  // Against the log-probabilities `table` holds.
  DirectPreference(const Dpo& config, std::shared_ptr<const ReferenceLogProbs> table)
      : config_(config), table_(std::move(table)) {}

  absl::Status Start(RunStart& run) override {
    if (!config_.precompute_reference() || table_ != nullptr) return absl::OkStatus();
    const absl::Time start = absl::Now();
    models::CausalLM& reference = frozen_ != nullptr ? *frozen_ : *run.policy;
    std::optional<AsFrozenBase> frozen_base;
    if (frozen_ == nullptr) {
      PLAIT_RETURN_IF_ERROR(CheckHasAdapters(reference));
      frozen_base.emplace(reference);
    }
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
        table->Add(reference, data::ToDevice(batch, run.device));
      }
    }
    frozen_base.reset();
    run.print(absl::StrFormat(
        "precomputed the reference log-probabilities of %d sequences on rank 0 (%d training and %d "
        "eval micro-batches per rank) in %.1f s%s",
        table->rows(), train_batches, run.eval_batches, absl::ToDoubleSeconds(absl::Now() - start),
        frozen_ == nullptr ? ", with the policy's adapters off" : ""));
    table_ = std::move(table);
    if (frozen_ == nullptr) return absl::OkStatus();
    frozen_ = nullptr;
    return base::Annotate(run.release_frozen(config_.reference()),
                          absl::StrCat(field_path_, ".dpo.precompute_reference"));
  }

  std::vector<std::string> MetricNames() const override {
    return {"rewards/chosen",  "rewards/rejected", "rewards/accuracies",
            "rewards/margins", "logps/chosen",     "logps/rejected"};
  }

  std::optional<std::string> FrozenRead() const override {
    if (frozen_ == nullptr) return std::nullopt;
    return config_.reference();
  }

  absl::StatusOr<at::Tensor> ReadFrozen(models::CausalLM& frozen,
                                        const data::Batch& batch) const override {
    return ReferenceLogProbs::Compute(frozen, batch);
  }

  absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy, const data::Batch& batch,
                                          const data::Batch& host, const at::Tensor& frozen_read,
                                          const StepItems* /*step*/, int /*micro*/) override {
    // First, so that no policy activations are held while a live reference runs.
    PLAIT_ASSIGN_OR_RETURN(const at::Tensor reference,
                           frozen_read.defined() ? frozen_read : ReferenceOf(policy, batch, host));
    const at::Tensor policy_logps = SequenceLogProbs(policy, batch);
    const int64_t pairs = policy_logps.size(0) / 2;
    const auto chosen = [&](const at::Tensor& t) { return t.narrow(0, 0, pairs); };
    const auto rejected = [&](const at::Tensor& t) { return t.narrow(0, pairs, pairs); };
    const auto loss_of = [&](const at::Tensor& of_policy, const at::Tensor& of_reference) {
      return DpoLoss(config_, chosen(of_policy), rejected(of_policy), chosen(of_reference),
                     rejected(of_reference));
    };
    // The rewards and log-probabilities reported are of whole sequences for every loss type,
    // as TRL (1.x) reports them.
    DpoTerms terms = loss_of(policy_logps, reference);
    if (config_.loss_type() == DPO_LOSS_IPO) {
      // TRL averages the log-probabilities over the completion tokens for the IPO loss.
      const at::Tensor lengths =
          data::SequenceSums(batch, (batch.targets != data::kIgnoreTarget).to(at::kFloat));
      terms.losses = loss_of(policy_logps / lengths, reference / lengths).losses;
    }
    const auto mean = [](const at::Tensor& t) { return t.mean().to(at::kFloat); };
    return ObjectiveOutput{
        terms.losses.mean(),
        {{"rewards/chosen", mean(terms.chosen_rewards)},
         {"rewards/rejected", mean(terms.rejected_rewards)},
         {"rewards/accuracies",
          mean((terms.chosen_rewards > terms.rejected_rewards).to(at::kFloat))},
         {"rewards/margins", mean(terms.chosen_rewards - terms.rejected_rewards)},
         {"logps/chosen", mean(chosen(policy_logps).detach())},
         {"logps/rejected", mean(rejected(policy_logps).detach())}}};
  }

  // The loss is the mean of the pairs' losses.
  int64_t ScoredItems(const data::Batch& batch) const override {
    return data::Sequences(batch) / 2;
  }

 private:
  // The reference's log-probabilities of `batch`'s sequences (`host` its copy in host memory) for
  // `policy`, on the batch's device.
  absl::StatusOr<at::Tensor> ReferenceOf(models::CausalLM& policy, const data::Batch& batch,
                                         const data::Batch& host) const {
    if (table_ != nullptr) {
      PLAIT_ASSIGN_OR_RETURN(const at::Tensor found, table_->Find(host));
      return data::ToDevice(found, batch.inputs.device());
    }
    if (frozen_ != nullptr) return ReferenceLogProbs::Compute(*frozen_, batch);
    PLAIT_RETURN_IF_ERROR(CheckHasAdapters(policy));
    const AsFrozenBase frozen_base(policy);
    return ReferenceLogProbs::Compute(policy, batch);
  }

  // A policy without adapters would be its own reference, and DPO would learn nothing.
  absl::Status CheckHasAdapters(const models::CausalLM& policy) const {
    if (policy.seams().HasAdapters()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(field_path_,
                     ".dpo.policy_without_adapters: the policy has no adapters to switch off "
                     "(no preparation step added any); it would be its own reference"));
  }

  const Dpo config_;
  // The frozen reference while it computes live; nullptr for the policy without its adapters
  // and once precomputed.
  models::CausalLM* frozen_ = nullptr;
  // The reference's log-probabilities, once precomputed; then the only source.
  std::shared_ptr<const ReferenceLogProbs> table_;
  const std::string field_path_;
};

}  // namespace

absl::StatusOr<at::Tensor> Objective::ReadFrozen(models::CausalLM& /*frozen*/,
                                                 const data::Batch& /*batch*/) const {
  return absl::FailedPreconditionError("the objective reads no frozen model");
}

absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(
    const ObjectiveConfig& config, const std::map<std::string, models::CausalLM*>& frozen,
    absl::string_view field_path) {
  if (!config.has_dpo()) return std::make_unique<CrossEntropy>();
  if (config.dpo().policy_without_adapters()) {
    return std::make_unique<DirectPreference>(config.dpo(), nullptr, field_path);
  }
  const auto it = frozen.find(config.dpo().reference());
  if (it == frozen.end()) {
    return absl::InvalidArgumentError(absl::StrCat(field_path, ".dpo.reference: \"",
                                                   config.dpo().reference(),
                                                   "\" names no frozen model of the plan"));
  }
  it->second->eval();
  return std::make_unique<DirectPreference>(config.dpo(), it->second, field_path);
}

std::unique_ptr<Objective> MakePrecomputedDpo(const Dpo& config,
                                              std::shared_ptr<const ReferenceLogProbs> reference) {
  return std::make_unique<DirectPreference>(config, std::move(reference));
}

}  // namespace plait::objectives
