// gMock matchers for absl::Status and absl::StatusOr<T>, for tests:
//
//   EXPECT_THAT(Parse(text), IsOk());
//   EXPECT_THAT(Parse(text), IsOkAndHolds(Field(&Plan::steps, 10)));
//   EXPECT_THAT(Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
//                                    HasSubstr("warmup.steps")));
#ifndef PLAIT_BASE_STATUS_MATCHERS_H_
#define PLAIT_BASE_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace plait::base::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace internal

// Matches an OK absl::Status or absl::StatusOr<T>.
MATCHER(IsOk, "is OK") {
  const absl::Status& status = internal::GetStatus(arg);
  if (!status.ok()) *result_listener << "whose status is " << status;
  return status.ok();
}

// Matches an OK absl::StatusOr<T> whose value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

// Matches a status (or a StatusOr's status) with `code` and a message matching
// `message_matcher` (a string or a matcher such as HasSubstr).
MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = internal::GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

}  // namespace plait::base::testing

#endif  // PLAIT_BASE_STATUS_MATCHERS_H_
