#include "plan/testing_resolved.h"

#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "plan/validate.h"

namespace plait::plan::testing {

ResolvedPlan Resolved(const Plan& plan, int world_size) {
  absl::StatusOr<ResolvedPlan> resolved = Resolve(plan, world_size);
  EXPECT_THAT(resolved, base::testing::IsOk());
  return resolved.ok() ? *std::move(resolved) : ResolvedPlan();
}

}  // namespace plait::plan::testing
