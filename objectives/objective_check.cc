#include "objectives/objective_check.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plait::objectives {
namespace {

// What the data source is, for messages.
const char* SourceName(const data::DataConfig& data) {
  switch (data.source_case()) {
    case data::DataConfig::kTokenFiles:
      return "token_files";
    case data::DataConfig::kPreferenceFiles:
      return "preference_files";
    case data::DataConfig::kSftFiles:
      return "sft_files";
    case data::DataConfig::kSyntheticPairs:
      return "synthetic_pairs";
    case data::DataConfig::kSyntheticSft:
      return "synthetic_sft";
    default:
      return "synthetic";
  }
}

}  // namespace

std::vector<base::Violation> CheckObjective(
    const ObjectiveConfig& config, const std::optional<models::ModelConfig>& policy,
    bool policy_adapted, const std::map<std::string, std::optional<models::ModelConfig>>& frozen,
    const data::DataConfig& data, absl::string_view field_path) {
  std::vector<base::Violation> problems;
  auto add = [&](absl::string_view field, std::string message, std::string rule = "") {
    problems.push_back({absl::StrCat(field_path, field), std::move(message), std::move(rule)});
  };
  const std::string source = SourceName(data);
  const char* needs = "synthetic or token_files";
  bool fits = source == "synthetic" || source == "token_files";
  if (config.has_sft()) {
    needs = "sft_files or synthetic_sft";
    fits = source == "sft_files" || source == "synthetic_sft";
  } else if (config.has_dpo()) {
    needs = "preference_files or synthetic_pairs";
    fits = source == "preference_files" || source == "synthetic_pairs";
  }
  if (!fits) {
    add(config.kind_case() == ObjectiveConfig::KIND_NOT_SET ? "" : ".kind",
        absl::StrCat("trains on ", needs, ", but plan.data is ", source), "objective_data");
  }
  if (!config.has_dpo()) return problems;
  const Dpo& dpo = config.dpo();
  const auto it = frozen.find(dpo.reference());
  if (dpo.policy_without_adapters()) {
    if (!policy_adapted) {
      add(".dpo.policy_without_adapters",
          "the reference is the policy with its adapters off, but no step of the policy's "
          "preparation adds adapters (a step whose rule's effect is ADAPTS): the policy would "
          "be its own reference; add such a step, or name a frozen reference model in "
          "dpo.reference",
          "dpo_policy_adapters");
    }
  } else if (it == frozen.end()) {
    std::vector<std::string> names;
    for (const auto& [name, model] : frozen) names.push_back(absl::StrCat("\"", name, "\""));
    add(".dpo.reference",
        absl::StrCat("\"", dpo.reference(), "\" names no frozen model of the plan (",
                     names.empty() ? "it has none" : absl::StrJoin(names, ", "),
                     "); DPO needs a frozen reference model in plan.frozen"),
        "dpo_reference_frozen");
  } else if (policy.has_value() && it->second.has_value() &&
             it->second->vocab_size() != policy->vocab_size()) {
    add(".dpo.reference",
        absl::StrCat("\"", dpo.reference(), "\" has vocab_size ", it->second->vocab_size(),
                     ", the policy ", policy->vocab_size(),
                     "; the reference must score the same token ids"),
        "dpo_reference_vocab");
  }
  if (dpo.has_beta() && !(dpo.beta() > 0.0)) {
    add(".dpo.beta", absl::StrCat(dpo.beta(), "; must be > 0"));
  }
  const bool smoothed = dpo.loss_type() == DPO_LOSS_SIGMOID || dpo.loss_type() == DPO_LOSS_ROBUST;
  if (smoothed ? !(dpo.label_smoothing() >= 0.0 && dpo.label_smoothing() < 0.5)
               : dpo.label_smoothing() != 0.0) {
    add(".dpo.label_smoothing",
        absl::StrCat(dpo.label_smoothing(), smoothed ? "; must be in [0, 0.5)"
                                                     : "; only the sigmoid and robust losses "
                                                       "smooth labels: leave it 0"));
  }
  return problems;
}

std::vector<base::PlanFeature> FeaturesOf(const ObjectiveConfig& config,
                                          absl::string_view field_path) {
  if (!config.has_dpo()) return {};
  const std::string field = absl::StrCat(field_path, ".dpo");
  std::vector<base::PlanFeature> features;
  if (config.dpo().precompute_reference()) {
    features.push_back(
        {"precomputed_reference", field + ".precompute_reference",
         "precomputes the reference's log-probabilities on whole models before the first step",
         "drop it: the reference then runs through its own stages at each step"});
  }
  if (config.dpo().policy_without_adapters()) {
    features.push_back({"policy_as_reference", field + ".policy_without_adapters",
                        "computes its reference with the policy, its adapters off",
                        "name a frozen reference"});
  }
  return features;
}

WorkPerSequence WorkOf(const ObjectiveConfig& config) {
  if (!config.has_dpo()) return {};
  WorkPerSequence work;
  work.trained_rows = 2.0;  // chosen and rejected
  if (config.dpo().precompute_reference()) return work;
  if (config.dpo().policy_without_adapters()) {
    work.trained_forward_rows = 2.0;
  } else {
    work.frozen_forward_rows[config.dpo().reference()] = 2.0;
  }
  return work;
}

std::map<std::string, std::string> DescribeFrozenRoles(const ObjectiveConfig& config) {
  if (!config.has_dpo() || config.dpo().policy_without_adapters()) return {};
  return {{config.dpo().reference(),
           config.dpo().precompute_reference()
               ? "the DPO reference: before the first step it scores every batch the run will "
                 "read (under no-grad, in eval mode), then it is released and the run holds "
                 "only its log-probabilities, 4 bytes per sequence"
               : "the DPO reference: it scores the 2 x micro-batch chosen and rejected "
                 "sequences of every micro-batch in one forward, under no-grad, in eval mode"}};
}

std::string DescribeTrainedModelRole(const ObjectiveConfig& config) {
  if (!config.has_dpo() || !config.dpo().policy_without_adapters()) return "";
  return config.dpo().precompute_reference()
             ? "the DPO reference is the policy with its adapters off, no frozen copy of the "
               "model is held: before the first step it scores every batch the run will read "
               "(under no-grad, in eval mode), and the run keeps only their log-probabilities, "
               "4 bytes per sequence"
             : "the DPO reference is the policy with its adapters off, no frozen copy of the "
               "model is held: before the training forward of every micro-batch, the policy "
               "scores its 2 x micro-batch chosen and rejected sequences once more, adapters "
               "off, under no-grad, in eval mode";
}

}  // namespace plait::objectives
