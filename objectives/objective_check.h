// The check of a plan's objective before anything runs, and its description for a plan's
// explanation, beside the model and data it trains on: the data source matches the objective (rule
// objective_data), DPO's reference names a frozen model of the plan (rule dpo_reference_frozen)
// with the policy's vocabulary (rule dpo_reference_vocab), or is the policy without its
// adapters, which a preparation step must add (rule dpo_policy_adapters), and its
// hyperparameters are in range:
//
//   for (const base::Violation& v : CheckObjective(plan.objective(), policy, adapted, frozen,
//                                                  plan.data(), "plan.objective")) {
//     // plan.objective.dpo.reference: "ref" has vocab_size 512, the policy 4096; ...
//   }
#ifndef PLAIT_OBJECTIVES_OBJECTIVE_CHECK_H_
#define PLAIT_OBJECTIVES_OBJECTIVE_CHECK_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/violation.h"
#include "data/data.pb.h"
#include "models/model.pb.h"
#include "objectives/objective.pb.h"

namespace plait::objectives {

// Every problem of `config` at `field_path`, for the trained model's config `policy`, which
// a preparation step gives adapters when `policy_adapted` (a step whose rule's effect is
// ADAPTS), and the frozen models' configs by name (nullopt where a config is invalid and
// reported elsewhere), trained on `data` (the plan's, unresolved: unset means synthetic).
std::vector<base::Violation> CheckObjective(
    const ObjectiveConfig& config, const std::optional<models::ModelConfig>& policy,
    bool policy_adapted, const std::map<std::string, std::optional<models::ModelConfig>>& frozen,
    const data::DataConfig& data, absl::string_view field_path);

// What the objective `config` (at `field_path`) asks of the trained model that the
// preparation rules may refuse beside some steps (wrap/rules.proto's FeatureRule):
// "precomputed_reference" (DPO's reference log-probabilities computed on whole models before
// the first step) and "policy_as_reference" (DPO against the policy with its adapters off).
std::vector<base::PlanFeature> FeaturesOf(const ObjectiveConfig& config,
                                          absl::string_view field_path);

// What the objective `config` computes for each sequence of a batch (a DPO pair counts as
// one), for a run's throughput and MFU: the rows of seq_len tokens the trained model runs
// forward and backward, those it runs forward only, and the rows each frozen model it reads
// runs forward in a step, by name (DPO: chosen and rejected through the policy and, unless
// precomputed once before the first step, through the reference: a frozen model, or the
// policy again, without its adapters).
struct WorkPerSequence {
  double trained_rows = 1.0;
  double trained_forward_rows = 0.0;
  std::map<std::string, double> frozen_forward_rows;
};
WorkPerSequence WorkOf(const ObjectiveConfig& config);

// What the objective `config` does with the frozen models it reads, by name (DPO: its
// reference), in a sentence each, for a plan's explanation.
std::map<std::string, std::string> DescribeFrozenRoles(const ObjectiveConfig& config);

// What the objective `config` does with the trained model besides training it, in a
// sentence, for a plan's explanation; "" when nothing else (DPO: its reference is the policy
// without its adapters, and no frozen copy is held).
std::string DescribeTrainedModelRole(const ObjectiveConfig& config);

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_OBJECTIVE_CHECK_H_
