// Early-return macros for absl::Status and absl::StatusOr, so error paths stay one line:
//
//   absl::StatusOr<Schedule> Build(const Config& config) {
//     PLAIT_RETURN_IF_ERROR(Validate(config));
//     PLAIT_ASSIGN_OR_RETURN(int64_t warmup, WarmupSteps(config));
//     return Schedule(...);
//   }
#ifndef PLAIT_TOOLS_STATUS_STATUS_MACROS_H_
#define PLAIT_TOOLS_STATUS_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status of `expr` from the enclosing function when it is not OK.
#define PLAIT_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status plait_status_ = (expr);         \
    if (!plait_status_.ok()) return plait_status_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status when it is not OK, otherwise
// moves its value into `lhs`, which may be a declaration (`auto x`) or an existing variable.
#define PLAIT_ASSIGN_OR_RETURN(lhs, rexpr) \
  PLAIT_ASSIGN_OR_RETURN_IMPL_(PLAIT_STATUS_CONCAT_(plait_statusor_, __LINE__), lhs, rexpr)

#define PLAIT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define PLAIT_STATUS_CONCAT_(a, b) PLAIT_STATUS_CONCAT_IMPL_(a, b)
#define PLAIT_STATUS_CONCAT_IMPL_(a, b) a##b

#endif  // PLAIT_TOOLS_STATUS_STATUS_MACROS_H_
