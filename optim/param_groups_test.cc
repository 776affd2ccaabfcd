#include "optim/param_groups.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace plait::optim {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

OptimizerConfig Parse(const std::string& text) {
  OptimizerConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

const std::vector<std::string> kNames = {
    "model.embed_tokens.weight",                       // 0
    "model.layers.0.input_layernorm.weight",           // 1
    "model.layers.0.self_attn.q_proj.weight",          // 2
    "model.layers.0.self_attn.q_proj.bias",            // 3
    "model.layers.0.post_attention_layernorm.weight",  // 4
    "model.norm.weight",                               // 5
    "lm_head.weight",                                  // 6
};

TEST(AssignParamGroupsTest, FirstMatchingRuleWinsAndTheRestIsDefault) {
  absl::StatusOr<std::vector<ParamGroup>> groups =
      AssignParamGroups(kNames, Parse(R"pb(
                          weight_decay: 0.1
                          param_groups { name: "norms" glob: "*norm*" weight_decay: 0 }
                          param_groups {
                            name: "biases_and_embeddings"
                            regex: ".*\\.bias|.*embed_tokens.*"
                            weight_decay: 0
                            lr_scale: 0.5
                          }
                          param_groups { name: "all_layers" glob: "model.layers.*" }
                        )pb"));
  ASSERT_THAT(groups, IsOk());
  ASSERT_EQ(groups->size(), 4);
  EXPECT_EQ((*groups)[0].name, "norms");
  EXPECT_THAT((*groups)[0].members, ElementsAre(1, 4, 5));
  EXPECT_EQ((*groups)[0].weight_decay, 0.0);
  EXPECT_EQ((*groups)[1].name, "biases_and_embeddings");
  EXPECT_THAT((*groups)[1].members, ElementsAre(0, 3));
  EXPECT_EQ((*groups)[1].lr_scale, 0.5);
  EXPECT_EQ((*groups)[2].name, "all_layers");
  EXPECT_THAT((*groups)[2].members, ElementsAre(2));  // 1, 3, 4 were taken earlier
  EXPECT_EQ((*groups)[2].weight_decay, 0.1);          // the optimizer's default
  EXPECT_EQ((*groups)[3].name, "default");
  EXPECT_THAT((*groups)[3].members, ElementsAre(6));
  EXPECT_EQ((*groups)[3].weight_decay, 0.1);
  EXPECT_EQ((*groups)[3].lr_scale, 1.0);
}

TEST(AssignParamGroupsTest, NoRulesMeansOneDefaultGroup) {
  absl::StatusOr<std::vector<ParamGroup>> groups = AssignParamGroups(kNames, Parse(""));
  ASSERT_THAT(groups, IsOk());
  ASSERT_EQ(groups->size(), 1);
  EXPECT_EQ((*groups)[0].members.size(), kNames.size());
}

TEST(AssignParamGroupsTest, RegexMustMatchTheWholeName) {
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(param_groups { regex: "bias" })pb")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer.param_groups[0] (param_groups[0]): regex \"bias\" matches no "
                       "parameter"));
}

TEST(AssignParamGroupsTest, ARuleThatMatchesNothingIsAnError) {
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(
                                  param_groups { name: "norms" glob: "*norm*" }
                                  param_groups { name: "typo" glob: "*.bais" }
                                )pb")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer.param_groups[1] (typo): glob \"*.bais\" matches no parameter "
                       "that an earlier rule did not take"));
}

TEST(AssignParamGroupsTest, InvalidRulesNameTheField) {
  const auto invalid = [](const std::string& message) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message));
  };
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(param_groups { name: "x" })pb")),
              invalid("optimizer.param_groups[0]: set glob or regex"));
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(param_groups { glob: "" })pb")),
              invalid("optimizer.param_groups[0].glob: is empty"));
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(param_groups { regex: "(unclosed" })pb")),
              invalid("optimizer.param_groups[0].regex: \"(unclosed\" is not a valid regex"));
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(param_groups { glob: "*" lr_scale: -1 })pb")),
              invalid("optimizer.param_groups[0].lr_scale: -1 must be >= 0"));
  EXPECT_THAT(
      AssignParamGroups(kNames, Parse(R"pb(param_groups { glob: "*" weight_decay: -0.5 })pb")),
      invalid("optimizer.param_groups[0].weight_decay: -0.5 must be >= 0"));
  EXPECT_THAT(AssignParamGroups(kNames, Parse("weight_decay: -1")),
              invalid("optimizer.weight_decay: -1 must be >= 0"));
  EXPECT_THAT(AssignParamGroups(kNames, Parse(R"pb(param_groups { glob: "*" lr_scale: inf })pb")),
              invalid("optimizer.param_groups[0].lr_scale: inf must be finite"));
}

}  // namespace
}  // namespace plait::optim
