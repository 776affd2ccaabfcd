#include "trainer/explain.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/status/status_matchers.h"
#include "trainer/plan.h"

namespace plait::trainer {
namespace {

using ::plait::testing::IsOk;
using ::testing::HasSubstr;

TEST(ExplainPlanTest, DescribesTheFsdpPipelineInOrder) {
  absl::StatusOr<Plan> plan = LoadPlan(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/trainer/plans/llama_fsdp.textproto"));
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> text = ExplainPlan(*plan, 2);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(*text, HasSubstr("model: llama (preset \"tiny\")"));
  EXPECT_THAT(*text, HasSubstr("mesh: dp=2 (2 ranks)"));
  EXPECT_THAT(*text, HasSubstr("prepare[0]: fsdp over dp (2 ranks): 5 units (4 blocks and the "
                               "root), each rank keeps 1/2 of 5.0M parameters"));
  EXPECT_THAT(*text, HasSubstr("optimizer: built after prepare[0], the last step that replaces "
                               "or re-shards parameters"));
  EXPECT_THAT(*text, HasSubstr("group default:"));
  EXPECT_THAT(*text, HasSubstr("memory per rank (estimate):"));
  EXPECT_LT(text->find("model:"), text->find("prepare[0]"));
  EXPECT_LT(text->find("prepare[0]"), text->find("optimizer:"));
}

}  // namespace
}  // namespace plait::trainer
