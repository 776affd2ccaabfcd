#include "base/json.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::base {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

TEST(ParseJsonTest, ParsesAValue) {
  const absl::StatusOr<Json> json = ParseJson("config.json", R"({"hidden_size": 64})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["hidden_size"], 64);
}

TEST(ParseJsonTest, ErrorNamesWhereAndTheByte) {
  const absl::StatusOr<Json> json = ParseJson("data.jsonl:3", R"({"prompt": [1, 2)");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(json.status().message()),
              HasSubstr("data.jsonl:3: not valid JSON at byte 17: "));
}

TEST(ParseJsonTest, ANumberBeyondADoubleIsAnError) {
  const absl::StatusOr<Json> json = ParseJson("config.json", R"({"rope_theta": 1e309})");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(json.status().message()),
              HasSubstr("config.json: not valid JSON: [json.exception.out_of_range.406]"));
}

TEST(ParseJsonTest, EmptyTextIsNotJson) {
  EXPECT_THAT(std::string(ParseJson("tokenizer.json", "").status().message()),
              HasSubstr("tokenizer.json: not valid JSON at byte 1"));
}

TEST(DescribeJsonTest, ScalarsAsWrittenContainersByType) {
  EXPECT_EQ(DescribeJson(Json(-5)), "-5");
  EXPECT_EQ(DescribeJson(Json("F64")), "\"F64\"");
  EXPECT_EQ(DescribeJson(Json(nullptr)), "null");
  EXPECT_EQ(DescribeJson(Json::array({1, 2})), "an array");
  EXPECT_EQ(DescribeJson(Json::object()), "an object");
}

// Nested far deeper than any real file: described without walking it.
TEST(DescribeJsonTest, DeeplyNestedValueIsDescribedWithoutRecursion) {
  constexpr int kDepth = 100000;
  const std::string text = std::string(kDepth, '[') + std::string(kDepth, ']');
  const Json deep = Json::parse(text);
  EXPECT_EQ(DescribeJson(deep), "an array");
}

}  // namespace
}  // namespace plait::base
