// A plain-text account of what a resolved plan will do, step by step, for
// `//tools:plan_check`: the model and its parameter count, the mesh, each preparation step
// as its strategy describes itself (what it does to the parameters, its collectives), where the
// optimizer is built (always after the last step that replaces or re-shards parameters) with its
// groups, the schedule, and the memory each rank needs, estimated from the plan alone.
//
//   PLAIT_ASSIGN_OR_RETURN(const ResolvedPlan resolved, Resolve(plan, world_size));
//   PLAIT_ASSIGN_OR_RETURN(std::string text, ExplainPlan(resolved));
#ifndef PLAIT_PLAN_EXPLAIN_H_
#define PLAIT_PLAN_EXPLAIN_H_

#include <string>

#include "absl/status/statusor.h"
#include "models/estimates.h"
#include "plan/resolved_plan.h"

namespace plait::plan {

// The explanation of `resolved`, its memory estimated for the ops of this build's LibTorch or
// `kernels`' (memory_estimate.h). Parameter groups are counted from the model's parameter
// shapes (models/parameter_shapes.h); nothing is built.
absl::StatusOr<std::string> ExplainPlan(const ResolvedPlan& resolved,
                                        const models::LibTorchKernels& kernels = {});

}  // namespace plait::plan

#endif  // PLAIT_PLAN_EXPLAIN_H_
