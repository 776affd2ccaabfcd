#include "base/text_proto.h"

#include "base/dtype.pb.h"
#include "base/status_matchers.h"
#include "base/text_proto_test.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TextProtoTest, MergeKeepsWhatTheTextDoesNotSet) {
  TextProtoTestMessage message;
  ASSERT_THAT(MergeTextProto("name: \"a\" count: 2", "first", message), IsOk());
  ASSERT_THAT(MergeTextProto("count: 3", "second", message), IsOk());
  EXPECT_EQ(message.name(), "a");
  EXPECT_EQ(message.count(), 3);
}

TEST(TextProtoTest, ErrorsGiveSourceLineAndColumn) {
  TextProtoTestMessage message;
  EXPECT_THAT(
      MergeTextProto("name: \"a\"\n  cuont: 2", "config.textproto", message),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("config.textproto:2:8: Message type \"plait.base.TextProtoTestMessage\" "
                         "has no field named \"cuont\"")));
  EXPECT_THAT(
      MergeTextProto("dtype: DTYPE_FLOAT64", "config.textproto", message),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("config.textproto:1:21: Unknown enumeration value of \"DTYPE_FLOAT64\"")));
  EXPECT_THAT(MergeTextProto("count: ", "config.textproto", message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config.textproto:1:")));
}

TEST(TextProtoTest, FieldAssignmentsGoThroughTheParser) {
  TextProtoTestMessage message;
  ASSERT_THAT(MergeFieldAssignment("name=a b", "--set", "config", message), IsOk());
  ASSERT_THAT(MergeFieldAssignment("dtype=DTYPE_BFLOAT16", "--set", "config", message), IsOk());
  EXPECT_EQ(message.name(), "a b");
  EXPECT_EQ(message.dtype(), DTYPE_BFLOAT16);
  EXPECT_THAT(
      MergeFieldAssignment("cuont=2", "--set=cuont=2", "config", message),
      StatusIs(absl::StatusCode::kInvalidArgument, "--set=cuont=2: config has no field \"cuont\""));
  EXPECT_THAT(MergeFieldAssignment("count.x=2", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument, "--set: config.count is not a message"));
  EXPECT_THAT(MergeFieldAssignment("count=two", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--set:1:")));
  EXPECT_THAT(MergeFieldAssignment("count", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected path=value")));
}

}  // namespace
}  // namespace plait::base
