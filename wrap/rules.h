// The preparation rules (rules.proto) as data: which strategies change the parameters, which
// must come before which, which may not share a mesh dimension, and how often each may be
// applied. BuiltinRules() returns wrap/rules.textproto, compiled in, after checking that it is
// self-consistent. CheckSteps holds a sequence of steps against them: Preparation runs it
// before applying each step, and the trainer's plan validator on a whole plan before anything
// runs, so both read the one set of rules:
//
//   PLAIT_ASSIGN_OR_RETURN(const PreparationRules* rules, BuiltinRules());
//   for (const base::Violation& v : CheckSteps(*rules, plan.prepare(), "plan.prepare", dims)) ...
//   // plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 per model (rule fsdp_at_most_once)
#ifndef PLAIT_WRAP_RULES_H_
#define PLAIT_WRAP_RULES_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/violation.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "wrap/rules.pb.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap {

// Parses rules text (`source` names it in `file:line:col` errors) and checks it: every
// strategy named once with an effect, a positive max_count and rule names; every relation
// naming a strategy and a rule; every feature rule naming features, a kind of step, a rule and
// why.
absl::StatusOr<PreparationRules> ParseRules(absl::string_view text, absl::string_view source);

// wrap/rules.textproto as compiled in, parsed once.
absl::StatusOr<const PreparationRules*> BuiltinRules();

// The rule of strategy `name`, or nullptr.
const StrategyRule* FindStrategy(const PreparationRules& rules, absl::string_view name);

// The name of a step's strategy, its PrepareStep oneof field ("fsdp", "ddp"), as the rules
// name it; "" when none is set.
std::string StrategyName(const PrepareStep& step);

// Every violation of `rules` by `steps`, applied in order to one model on a mesh whose
// dimensions are `mesh_dims`; fields are named from `field` ("plan.prepare"), and the mesh
// as `mesh_field` ("plan.mesh").
std::vector<base::Violation> CheckSteps(
    const PreparationRules& rules, const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
    const std::string& field, const std::set<std::string>& mesh_dims,
    const std::string& mesh_field);

// Every violation of `rules`' feature rules by a plan that has `features` and steps of the
// kinds `steps`: one at the first feature's field of each rule it breaks.
std::vector<base::Violation> CheckFeatures(const PreparationRules& rules,
                                           const std::vector<base::PlanFeature>& features,
                                           const std::set<StepKind>& steps);

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_RULES_H_
