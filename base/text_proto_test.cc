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

}  // namespace
}  // namespace plait::base
