// The preparation rules (rules.proto) as data: which strategies change the parameters, which
// must come before which, which may not share a mesh dimension, and how often each may be
// applied. BuiltinRules() returns trainer/rules.textproto, compiled into the binary, after
// checking that it is self-consistent; ValidatePlan (validate.h) checks plans against it:
//
//   PLAIT_ASSIGN_OR_RETURN(const PreparationRules* rules, BuiltinRules());
//   const StrategyRule* fsdp = FindStrategy(*rules, "fsdp");  // effect RESHARDS, max_count 1
#ifndef PLAIT_TRAINER_RULES_H_
#define PLAIT_TRAINER_RULES_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/rules.pb.h"

namespace plait::trainer {

// Parses rules text (`source` names it in `file:line:col` errors) and checks it: every
// strategy named once with an effect, a positive max_count and rule names; every relation
// naming a strategy and a rule.
absl::StatusOr<PreparationRules> ParseRules(absl::string_view text, absl::string_view source);

// trainer/rules.textproto as compiled in, parsed once.
absl::StatusOr<const PreparationRules*> BuiltinRules();

// The rule of strategy `name`, or nullptr.
const StrategyRule* FindStrategy(const PreparationRules& rules, absl::string_view name);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_RULES_H_
