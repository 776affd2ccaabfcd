// The check of a whole plan before anything runs: the preparation steps against the rules
// (wrap/rules.h), and the plan's own consistency (world size equal to the mesh, mesh dimensions
// that exist, positive steps, a batch that divides, a known preset, data files that exist).
// Every violation is reported, each naming the plan field and, for a rule, the rule:
//
//   absl::Status status = ValidatePlan(plan, /*world_size=*/2);
//   // plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 (rule fsdp_at_most_once)
//   // plan.training.steps: 0; must be > 0
#ifndef PLAIT_TRAINER_VALIDATE_H_
#define PLAIT_TRAINER_VALIDATE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/violation.h"
#include "trainer/plan.pb.h"
#include "wrap/rules.pb.h"

namespace plait::trainer {

using base::Violation;

// Every violation of `plan` on a world of `world_size` ranks under `rules`; empty when the
// plan is valid. Reads only the plan and the file system (data files exist).
std::vector<Violation> CheckPlan(const Plan& plan, int world_size,
                                 const wrap::PreparationRules& rules);

// CheckPlan under the built-in rules, as one InvalidArgument error listing every violation,
// one per line.
absl::Status ValidatePlan(const Plan& plan, int world_size);

// ValidatePlan, then that plan.device can be had for `local_ranks` ranks on this machine
// (FailedPrecondition: CUDA without --config=gpu, without a GPU or with too few), then, unless
// `skip_memory_check`, that the ranks fit in the memory they compute in: the memory the
// machine has now for `local_ranks` CPU ranks (memory_estimate.h, base/memory.h), a GPU's for
// each CUDA rank. A plan that would run out of memory mid-run is refused before anything
// starts, with ResourceExhausted.
absl::Status ValidatePlanForMachine(const Plan& plan, int world_size, int local_ranks,
                                    bool skip_memory_check);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_VALIDATE_H_
