// A plain-text account of what a validated plan will do, step by step, for
// `//tools:plan_check`: the model and its parameter count, the mesh, each preparation step
// and what it does to the parameters, where the optimizer is built (always after the last
// step that replaces or re-shards parameters) with its groups, the schedule, and the memory
// each rank needs, estimated from the plan alone.
//
//   PLAIT_RETURN_IF_ERROR(ValidatePlan(plan, world_size));
//   PLAIT_ASSIGN_OR_RETURN(std::string text, ExplainPlan(plan, world_size));
#ifndef PLAIT_TRAINER_EXPLAIN_H_
#define PLAIT_TRAINER_EXPLAIN_H_

#include <string>

#include "absl/status/statusor.h"
#include "trainer/plan.pb.h"

namespace plait::trainer {

// The explanation of `plan` (which must pass ValidatePlan for `world_size`). Parameter groups
// are counted on the model itself, built with the plan's initialisation when it has at most
// kMaxParametersToBuild parameters; larger models get the group rules without counts.
absl::StatusOr<std::string> ExplainPlan(const Plan& plan, int world_size);

inline constexpr int64_t kMaxParametersToBuild = 200'000'000;

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_EXPLAIN_H_
