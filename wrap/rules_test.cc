#include "wrap/rules.h"

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

TEST(BuiltinRulesTest, ParsesAndStatesFsdpDdpAndPipeline) {
  absl::StatusOr<const PreparationRules*> rules = BuiltinRules();
  ASSERT_THAT(rules, IsOk());
  const StrategyRule* fsdp = FindStrategy(**rules, "fsdp");
  ASSERT_NE(fsdp, nullptr);
  EXPECT_EQ(fsdp->effect(), RESHARDS);
  EXPECT_EQ(fsdp->max_count(), 1);
  const StrategyRule* ddp = FindStrategy(**rules, "ddp");
  ASSERT_NE(ddp, nullptr);
  EXPECT_EQ(ddp->effect(), KEEPS);
  const StrategyRule* pipeline = FindStrategy(**rules, "pipeline");
  ASSERT_NE(pipeline, nullptr);
  EXPECT_EQ(pipeline->effect(), SELECTS);
  EXPECT_EQ(FindStrategy(**rules, "no_such_strategy"), nullptr);
}

// A strategy added to PrepareStep without a rule would be unvalidated: this fails first.
TEST(BuiltinRulesTest, EveryPrepareStepStrategyHasARule) {
  const PreparationRules& rules = **BuiltinRules();
  const auto* oneof = PrepareStep::descriptor()->FindOneofByName("strategy");
  ASSERT_NE(oneof, nullptr);
  for (int i = 0; i < oneof->field_count(); ++i) {
    EXPECT_NE(FindStrategy(rules, oneof->field(i)->name()), nullptr) << oneof->field(i)->name();
  }
}

TEST(ParseRulesTest, RejectsInconsistentRules) {
  EXPECT_THAT(ParseRules("strategies { name: \"fsdp\" effect: RESHARDS max_count: 1 "
                         "max_count_rule: \"once\" }\n"
                         "strategies { name: \"fsdp\" max_count: 0 }",
                         "r.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("strategies[1].name: \"fsdp\" appears twice"),
                             HasSubstr("strategies[1].effect is not set"),
                             HasSubstr("strategies[1]: max_count must be > 0"))));
  EXPECT_THAT(ParseRules("strategies { name: \"fsdp\" effect: RESHARDS max_count: 1 "
                         "max_count_rule: \"once\" lenders { strategy: \"expert_parallel\" "
                         "rule: \"lend\" } }",
                         "r.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("strategies[0]: lenders and borrowed_dim_field go together")));
  EXPECT_THAT(ParseRules("strategies { nme: \"x\" }", "r.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("r.textproto:1:17")));
}

}  // namespace
}  // namespace plait::wrap
