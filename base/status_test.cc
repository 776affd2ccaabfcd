#include "base/status.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Pointee;

absl::StatusOr<int> Half(int value) {
  if (value % 2 != 0) return absl::InvalidArgumentError("odd value");
  return value / 2;
}

absl::StatusOr<int> Quarter(int value) {
  PLAIT_ASSIGN_OR_RETURN(int half, Half(value));
  PLAIT_ASSIGN_OR_RETURN(half, Half(half));  // assigns to an existing variable
  return half;
}

absl::Status CheckEven(int value) {
  PLAIT_RETURN_IF_ERROR(Half(value).status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> Boxed(int value) { return std::make_unique<int>(value); }

absl::StatusOr<int> Unbox(int value) {
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<int> box, Boxed(value));  // move-only values
  return *box;
}

TEST(StatusMacrosTest, AssignOrReturnPassesValuesThrough) {
  EXPECT_THAT(Quarter(12), IsOkAndHolds(3));
  EXPECT_THAT(Unbox(7), IsOkAndHolds(7));
  EXPECT_THAT(Boxed(5), IsOkAndHolds(Pointee(5)));
}

TEST(StatusMacrosTest, AssignOrReturnReturnsTheFirstError) {
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "odd value"));
  EXPECT_THAT(Quarter(7), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd")));
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsOnlyErrors) {
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(5), StatusIs(absl::StatusCode::kInvalidArgument, "odd value"));
}

TEST(AnnotateTest, PrefixesErrorsAndKeepsTheirCode) {
  EXPECT_THAT(base::Annotate(absl::NotFoundError("no such file"), "plan.data"),
              StatusIs(absl::StatusCode::kNotFound, "plan.data: no such file"));
  EXPECT_THAT(base::Annotate(absl::OkStatus(), "plan.data"), IsOk());
  EXPECT_THAT(base::Annotate(Half(3), "value"),
              StatusIs(absl::StatusCode::kInvalidArgument, "value: odd value"));
  EXPECT_THAT(base::Annotate(Half(4), "value"), IsOkAndHolds(2));
}

TEST(StatusMatchersTest, MatchersRejectWhatTheyShould) {
  EXPECT_THAT(Half(3), ::testing::Not(IsOk()));
  EXPECT_THAT(Half(4), ::testing::Not(IsOkAndHolds(3)));
  EXPECT_THAT(Half(3), ::testing::Not(StatusIs(absl::StatusCode::kNotFound, "odd value")));
  EXPECT_THAT(Half(3), ::testing::Not(StatusIs(absl::StatusCode::kInvalidArgument, "even value")));
}

}  // namespace
}  // namespace plait
