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
// are counted from the model's parameter shapes (models/parameter_shapes.h); nothing is built.
absl::StatusOr<std::string> ExplainPlan(const Plan& plan, int world_size);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_EXPLAIN_H_
