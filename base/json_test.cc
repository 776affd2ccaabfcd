#include "base/json.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::base {
namespace {

using Json = nlohmann::json;

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
