// One problem found in a config before anything runs: the field it is in, what is wrong with
// it, and the rule it breaks when the problem is a broken rule (the preparation rules of
// wrap/rules.textproto). Validators collect every violation rather than stop at the first:
//
//   std::vector<Violation> violations = CheckSteps(rules, plan.prepare(), "plan.prepare", dims);
//   // plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 per model (rule fsdp_at_most_once)
//
// A PlanFeature is what such a rule may refuse outside the preparation.
#ifndef PLAIT_BASE_VIOLATION_H_
#define PLAIT_BASE_VIOLATION_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plait::base {

struct Violation {
  std::string field;    // e.g. "plan.prepare[1].fsdp.mesh_dim"
  std::string message;  // what is wrong and what would be right
  std::string rule;     // the rule broken; empty for a config's own checks

  // "field: message (rule name)".
  std::string ToString() const {
    return rule.empty() ? absl::StrCat(field, ": ", message)
                        : absl::StrCat(field, ": ", message, " (rule ", rule, ")");
  }
};

// A feature a part of a plan asks for beyond the preparation (packed rows, a precomputed
// reference, a mixture of experts), by the name the preparation rules know it by
// (wrap/rules.proto's FeatureRule), which may refuse it beside some kinds of step:
// "<field>: <what>, <the rule's why>; <fix>".
struct PlanFeature {
  std::string name;   // e.g. "packed_rows"
  std::string field;  // the field that asks for it, e.g. "plan.data.sft_files.packing"
  std::string what;   // what it does: "PACKING_BFD packs several sequences into a row"
  std::string fix;    // what a plan that may not have it does instead: "use PACKING_NONE"
};

// OK for no violations, else one InvalidArgument error listing them, one per line.
inline absl::Status ViolationsToStatus(const std::vector<Violation>& violations) {
  if (violations.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const Violation& violation : violations) lines.push_back(violation.ToString());
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace plait::base

#endif  // PLAIT_BASE_VIOLATION_H_
