// One problem found in a config before anything runs: the field it is in, what is wrong with
// it, and the rule it breaks when the problem is a broken rule (the preparation rules of
// wrap/rules.textproto). Validators collect every violation rather than stop at the first:
//
//   std::vector<Violation> violations = CheckSteps(rules, plan.prepare(), "plan.prepare", dims);
//   // plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 per model (rule fsdp_at_most_once)
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

// OK for no violations, else one InvalidArgument error listing them, one per line.
inline absl::Status ViolationsToStatus(const std::vector<Violation>& violations) {
  if (violations.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const Violation& violation : violations) lines.push_back(violation.ToString());
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace plait::base

#endif  // PLAIT_BASE_VIOLATION_H_
