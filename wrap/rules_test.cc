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
using ::testing::IsEmpty;

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
  EXPECT_THAT(
      ParseRules("features { features: \"packed_rows\" rule: \"r\" why: \"w\" }", "r.textproto"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("features[0] needs features, the kind of steps, a rule and why")));
  EXPECT_THAT(ParseRules("strategies { nme: \"x\" }", "r.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("r.textproto:1:17")));
}

// A feature rule refuses its features only beside steps of its kind, and only when the plan
// has all of them, at each field that asks for the first.
TEST(CheckFeaturesTest, RefusesEveryFeatureOfARuleBesideItsKindOfStep) {
  absl::StatusOr<PreparationRules> rules = ParseRules(R"pb(
                                                        features {
                                                          features: "packed_rows"
                                                          features: "mixture_of_experts"
                                                          steps: SPLITS_BATCH
                                                          rule: "no_packed_routing"
                                                          why: "and the router counts the padding"
                                                        }
                                                      )pb",
                                                      "r.textproto");
  ASSERT_THAT(rules, IsOk());
  const std::vector<base::PlanFeature> packed = {
      {"packed_rows", "plan.data.sft_files.packing", "PACKING_BFD packs rows", "use PACKING_NONE"},
      {"packed_rows", "plan.data.preference_files.packing", "PACKING_BFD packs pairs",
       "use PACKING_NONE"}};
  std::vector<base::PlanFeature> routed = packed;
  routed.push_back({"mixture_of_experts", "plan.model", "routes tokens", "train a dense model"});
  EXPECT_THAT(CheckFeatures(*rules, routed, {SPLITS_SEQUENCE}), IsEmpty());
  EXPECT_THAT(CheckFeatures(*rules, packed, {SPLITS_BATCH}), IsEmpty());
  const std::vector<base::Violation> violations = CheckFeatures(*rules, routed, {SPLITS_BATCH});
  ASSERT_EQ(violations.size(), 2u);
  EXPECT_EQ(violations[0].ToString(),
            "plan.data.sft_files.packing: PACKING_BFD packs rows, and the router counts the "
            "padding; use PACKING_NONE (rule no_packed_routing)");
  EXPECT_EQ(violations[1].field, "plan.data.preference_files.packing");
}

}  // namespace
}  // namespace plait::wrap
