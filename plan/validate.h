// The check of a whole plan before anything runs, and its resolution: the preparation steps
// against the rules (wrap/rules.h) and each strategy's own checks, the objective's, and the
// plan's own consistency (world size equal to the mesh, mesh dimensions that exist, positive
// steps, a batch that divides, a known preset, data files that exist). Every violation is
// reported, each naming the plan field and, for a rule, the rule; a plan without any is
// resolved in the same pass (resolved_plan.h), so nothing is derived twice:
//
//   PLAIT_ASSIGN_OR_RETURN(const ResolvedPlan resolved, Resolve(plan, /*world_size=*/2));
//   // plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 (rule fsdp_at_most_once)
//   // plan.training.steps: 0; must be > 0
//
// Naming, across plait: Check* returns every violation (std::vector<base::Violation>);
// Validate*, Resolve* and the rest return one absl::Status, an InvalidArgument listing them.
#ifndef PLAIT_PLAN_VALIDATE_H_
#define PLAIT_PLAN_VALIDATE_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/violation.h"
#include "data/data.pb.h"
#include "plan/plan.pb.h"
#include "plan/resolved_plan.h"
#include "wrap/rules.pb.h"

namespace plait::plan {

using base::Violation;

// Every violation of `plan` on a world of `world_size` ranks under `rules`; empty when the
// plan is valid. Reads only the plan and the file system (data files exist, a Hugging Face
// config.json).
std::vector<Violation> CheckPlan(const Plan& plan, int world_size,
                                 const wrap::PreparationRules& rules);

// `plan` resolved for a world of `world_size` ranks under the built-in rules, or one
// InvalidArgument error listing every violation, one per line.
absl::StatusOr<ResolvedPlan> Resolve(const Plan& plan, int world_size);

// Resolve, then that plan.device can be had for `local_ranks` ranks on this machine
// (FailedPrecondition: CUDA without --config=gpu, without a GPU or with too few), then,
// unless `skip_memory_check`, that the ranks fit in the memory they compute in (in the dtypes
// DTYPE_AUTO chooses there): the memory the machine has now for `local_ranks` CPU ranks
// (memory_estimate.h, base/memory.h), a GPU's for each CUDA rank. A plan that would run out of
// memory mid-run is refused before anything starts, with ResourceExhausted.
absl::StatusOr<ResolvedPlan> ResolveForMachine(const Plan& plan, int world_size, int local_ranks,
                                               bool skip_memory_check);

// plan.data as the run reads it (ResolvedPlan::data), also for a plan that is not valid:
// data::ResolvedDataConfig's defaults, and text pair files that name no tokenizer read the
// model's own, beside plan.model.hf_config_path (the Hugging Face folder the model is read
// from), when there is one.
data::DataConfig ResolveData(const Plan& plan);

}  // namespace plait::plan

#endif  // PLAIT_PLAN_VALIDATE_H_
