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

TEST(TextProtoTest, ParsesAndClearsWhatWasThere) {
  TextProtoTestMessage message;
  ASSERT_THAT(ParseTextProto("name: \"a\" count: 2", "first", message), IsOk());
  ASSERT_THAT(ParseTextProto("count: 3", "second", message), IsOk());
  EXPECT_EQ(message.name(), "");
  EXPECT_EQ(message.count(), 3);
}

// What a lenient parser lets through silently: the last of two values winning.
TEST(TextProtoTest, AFieldTwiceTwoOneofMembersAndUndeclaredEnumNumbersAreErrors) {
  TextProtoTestMessage message;
  EXPECT_THAT(ParseTextProto("count: 2\ncount: 3", "c.textproto", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.textproto:2:6: Non-repeated field \"count\" is specified "
                                 "multiple times")));
  EXPECT_THAT(ParseTextProto("first {} second {}", "c.textproto", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is specified along with field \"first\"")));
  EXPECT_THAT(ParseTextProto("dtype: 7", "c.textproto", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "c.textproto: dtype: 7 is not a value of Dtype"));
  EXPECT_THAT(ParseTextProto("nested { dtype: 9 }", "c.textproto", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "c.textproto: nested.dtype: 9 is not a value of Dtype"));
}

TEST(TextProtoTest, ErrorsGiveSourceLineAndColumn) {
  TextProtoTestMessage message;
  EXPECT_THAT(
      ParseTextProto("name: \"a\"\n  cuont: 2", "config.textproto", message),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("config.textproto:2:8: Message type \"plait.base.TextProtoTestMessage\" "
                         "has no field named \"cuont\"")));
  EXPECT_THAT(
      ParseTextProto("dtype: DTYPE_FLOAT64", "config.textproto", message),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("config.textproto:1:21: Unknown enumeration value of \"DTYPE_FLOAT64\"")));
  EXPECT_THAT(ParseTextProto("count: ", "config.textproto", message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config.textproto:1:")));
}

TEST(TextProtoTest, FieldAssignmentsGoThroughTheParser) {
  TextProtoTestMessage message;
  ASSERT_THAT(MergeFieldAssignment("name=a \"b\" count: 3", "--set", "config", message), IsOk());
  ASSERT_THAT(MergeFieldAssignment("dtype=DTYPE_BFLOAT16", "--set", "config", message), IsOk());
  ASSERT_THAT(MergeFieldAssignment("nested.count=-4", "--set", "config", message), IsOk());
  EXPECT_EQ(message.name(), "a \"b\" count: 3");  // the whole value, never more fields
  EXPECT_EQ(message.count(), 0);
  EXPECT_EQ(message.dtype(), DTYPE_BFLOAT16);
  EXPECT_EQ(message.nested().count(), -4);
  EXPECT_THAT(MergeFieldAssignment("count=5 name: \"x\"", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--set: config.count: \"5 name: \"x\"\" is not an integer"));
  EXPECT_THAT(MergeFieldAssignment("dtype=7", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not a value of Dtype")));
  EXPECT_THAT(
      MergeFieldAssignment("cuont=2", "--set=cuont=2", "config", message),
      StatusIs(absl::StatusCode::kInvalidArgument, "--set=cuont=2: config has no field \"cuont\""));
  EXPECT_THAT(MergeFieldAssignment("count.x=2", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument, "--set: config.count is not a message"));
  EXPECT_THAT(MergeFieldAssignment("count=two", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--set: config.count: \"two\" is not an integer"));
  EXPECT_THAT(MergeFieldAssignment("count", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected path=value")));
}

}  // namespace
}  // namespace plait::base
