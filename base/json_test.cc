#include "base/json.h"

#include <cstdint>
#include <limits>
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

TEST(JsonFieldsTest, ReadsEachTypeAndTakesFallbacksForAbsentOrNullFields) {
  const Json object = Json::parse(
      R"({"layers": 4, "eps": 1e-5, "tie": true, "act": "silu", "bias": null, "theta": 10000})");
  const JsonFields fields(object, "config.json");
  EXPECT_EQ(*fields.Int("layers"), 4);
  EXPECT_EQ(*fields.Double("eps"), 1e-5);
  EXPECT_EQ(*fields.Double("theta"), 10000.0);  // an integer is a number
  EXPECT_EQ(*fields.Bool("tie"), true);
  EXPECT_EQ(*fields.String("act"), "silu");
  EXPECT_EQ(*fields.Bool("bias", false), false);  // null reads as absent
  EXPECT_EQ(*fields.Int("heads", 8), 8);
  EXPECT_TRUE(fields.Has("layers"));
  EXPECT_FALSE(fields.Has("bias"));
  EXPECT_FALSE(fields.Has("heads"));
}

TEST(JsonFieldsTest, ErrorsNameWhereTheFieldAndTheValue) {
  const Json object = Json::parse(R"({"layers": "4", "eps": [1], "tie": 1, "act": 7})");
  const JsonFields fields(object, "c.json");
  EXPECT_EQ(fields.Int("layers").status(),
            absl::InvalidArgumentError("c.json: layers: expected an integer, got \"4\""));
  EXPECT_EQ(fields.Double("eps").status(),
            absl::InvalidArgumentError("c.json: eps: expected a number, got an array"));
  EXPECT_EQ(fields.Bool("tie").status(),
            absl::InvalidArgumentError("c.json: tie: expected true or false, got 1"));
  EXPECT_EQ(fields.String("act").status(),
            absl::InvalidArgumentError("c.json: act: expected a string, got 7"));
  EXPECT_EQ(fields.Int("heads").status(),
            absl::InvalidArgumentError("c.json: heads: is required and missing"));
}

TEST(JsonFieldsTest, AnIntegerPastInt64IsAnErrorNotAWrappedValue) {
  const Json object = Json::parse(R"({"step": 18446744073709551615, "last": 9223372036854775807})");
  const JsonFields fields(object, "checkpoint.json");
  EXPECT_EQ(*fields.Int("last"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(
      fields.Int("step").status(),
      absl::InvalidArgumentError("checkpoint.json: step: 18446744073709551615 is past 2^63 - 1"));
  EXPECT_THAT(
      std::string(JsonFields(Json::parse(R"({"n": 1.5})"), "f").Int("n").status().message()),
      HasSubstr("f: n: expected an integer, got 1.5"));
}

TEST(JsonFieldsTest, AFilePlaitWroteIsCorruptWhenAFieldIsBad) {
  const Json object = Json::parse(R"({"shape": [2, "x"]})");
  const JsonFields fields(object, "ckpt/manifest.json", JsonAuthor::kPlait);
  EXPECT_EQ(
      fields.IntValue(object["shape"][1], "shape[1]").status(),
      absl::DataLossError(
          "ckpt/manifest.json: shape[1]: expected an integer, got \"x\"; the file is corrupt"));
  EXPECT_EQ(fields.Int("step").status().code(), absl::StatusCode::kDataLoss);
}

// A reader of something that is not an object finds no field in it (the caller says what it
// expected of the value itself).
TEST(JsonFieldsTest, ANonObjectHasNoFields) {
  const Json array = Json::array({1, 2});
  const JsonFields fields(array, "tokenizer.json: model");
  EXPECT_FALSE(fields.Has("type"));
  EXPECT_EQ(*fields.String("type", "BPE"), "BPE");
}

}  // namespace
}  // namespace plait::base
