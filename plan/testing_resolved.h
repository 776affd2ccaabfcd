// A test helper: a plan resolved for a world of ranks (validate.h), where failing to resolve
// is a test failure.
//
//   EXPECT_THAT(ExplainPlan(testing::Resolved(plan, 2)), IsOk());
#ifndef PLAIT_PLAN_TESTING_RESOLVED_H_
#define PLAIT_PLAN_TESTING_RESOLVED_H_

#include "plan/plan.pb.h"
#include "plan/resolved_plan.h"

namespace plait::plan::testing {

// `plan` resolved for `world_size` ranks; an empty ResolvedPlan after a test failure when it
// does not resolve.
ResolvedPlan Resolved(const Plan& plan, int world_size);

}  // namespace plait::plan::testing

#endif  // PLAIT_PLAN_TESTING_RESOLVED_H_
