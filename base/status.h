// Early-return macros for absl::Status and absl::StatusOr, so error paths stay one line, and
// Annotate, the one way plait adds context to an error: it prefixes the message with where
// the error happened ("plan.model: ...", "step 3: ...") and keeps the code.
//
//   absl::StatusOr<Schedule> Build(const Config& config) {
//     PLAIT_RETURN_IF_ERROR(Validate(config));
//     PLAIT_ASSIGN_OR_RETURN(int64_t warmup, Annotate(WarmupSteps(config), "schedule.warmup"));
//     return Schedule(...);
//   }
#ifndef PLAIT_BASE_STATUS_H_
#define PLAIT_BASE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace plait::base {

// `status` with "context: " before its message; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// A StatusOr's error with "context: " before its message; a value passes through.
template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> status_or, absl::string_view context) {
  if (status_or.ok()) return status_or;
  return Annotate(status_or.status(), context);
}

}  // namespace plait::base

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

#endif  // PLAIT_BASE_STATUS_H_
