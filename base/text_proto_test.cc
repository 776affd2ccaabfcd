#include "base/text_proto.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

// A value given with --set reads as the same text does in the file: the text format's octal
// and hexadecimal integers, its spellings of true and false, enum numbers; and what the file
// refuses, the override refuses.
TEST(TextProtoTest, AnOverridesValueReadsAsTheFileReadsIt) {
  const std::vector<std::pair<std::string, std::string>> values = {{"count", "010"},
                                                                   {"count", "0x10"},
                                                                   {"count", "-010"},
                                                                   {"count", "9223372036854775808"},
                                                                   {"count", "1e3"},
                                                                   {"count", "+5"},
                                                                   {"small", "-1"},
                                                                   {"small", "4294967296"},
                                                                   {"ratio", "010"},
                                                                   {"ratio", "1e3"},
                                                                   {"ratio", "-inf"},
                                                                   {"ratio", "0x10"},
                                                                   {"ratio", ".5"},
                                                                   {"flag", "t"},
                                                                   {"flag", "True"},
                                                                   {"flag", "yes"},
                                                                   {"flag", "1"},
                                                                   {"dtype", "2"},
                                                                   {"dtype", "DTYPE_BFLOAT16"},
                                                                   {"number", "7"}};
  for (const auto& [field, value] : values) {
    SCOPED_TRACE(absl::StrCat(field, " = ", value));
    TextProtoTestMessage from_file;
    TextProtoTestMessage from_override;
    const absl::Status file = ParseTextProto(absl::StrCat(field, ": ", value), "f", from_file);
    const absl::Status override =
        MergeFieldAssignment(absl::StrCat(field, "=", value), "--set", "config", from_override);
    EXPECT_EQ(file.ok(), override.ok()) << file << "\n" << override;
    EXPECT_EQ(from_override.DebugString(), from_file.DebugString());
  }
  TextProtoTestMessage message;
  ASSERT_THAT(MergeFieldAssignment("count=010", "--set", "config", message), IsOk());
  EXPECT_EQ(message.count(), 8);
  EXPECT_THAT(MergeFieldAssignment("count=08", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--set: config.count: \"08\" is not an integer"));
  EXPECT_EQ(message.count(), 8);  // a bad value leaves the field as it was
}

// Setting a field inside a message member of a oneof whose other member the file set would
// silently drop the file's choice (and the fields under it) for a member given in part:
// refused, naming both. A scalar member is a whole value, and replaces the choice.
TEST(TextProtoTest, AnOverrideCannotReplaceTheFilesMemberOfAOneofWithPartOfAnother) {
  TextProtoTestMessage message;
  ASSERT_THAT(ParseTextProto("first {}", "f", message), IsOk());
  EXPECT_THAT(MergeFieldAssignment("other.count=3", "--set", "config", message),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--set: config.other: config.first is set, and both are members of the "
                       "oneof config.choice; an override cannot replace one with part of the "
                       "other: change it in the file"));
  EXPECT_TRUE(message.has_first());
  ASSERT_THAT(MergeFieldAssignment("number=3", "--set", "config", message), IsOk());
  EXPECT_EQ(message.number(), 3);
  EXPECT_FALSE(message.has_first());
  // The member the file chose, or any member of a oneof the file left unset, is set as any
  // other field.
  ASSERT_THAT(ParseTextProto("other { name: \"a\" }", "f", message), IsOk());
  ASSERT_THAT(MergeFieldAssignment("other.count=3", "--set", "config", message), IsOk());
  EXPECT_EQ(message.other().name(), "a");
  EXPECT_EQ(message.other().count(), 3);
  ASSERT_THAT(MergeFieldAssignment("other.number=4", "--set", "config", message), IsOk());
  EXPECT_EQ(message.other().number(), 4);
}

}  // namespace
}  // namespace plait::base
