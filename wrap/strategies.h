// The registry of preparation strategies: the Strategy (strategy.h) a plan's step names.
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy, MakeStrategy(plan.prepare(0)));
#ifndef PLAIT_WRAP_STRATEGIES_H_
#define PLAIT_WRAP_STRATEGIES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap {

// The strategy `step` names, configured and not applied. InvalidArgument when it names none.
absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const PrepareStep& step);

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_STRATEGIES_H_
