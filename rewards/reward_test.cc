// The verifiable rewards against their definitions (TRL's think_format_reward and
// get_soft_overlong_punishment for the format and the length), and their weighted sum.
#include "rewards/reward.h"

#include <memory>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace plait::rewards {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

RewardConfig Config(const std::string& text) {
  RewardConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

double Score(Reward& reward, const nlohmann::json& example, const std::string& completion,
             int64_t tokens = 3) {
  const std::vector<int64_t> ids(tokens, 7);
  absl::StatusOr<double> score = reward.Score({example, completion, ids});
  EXPECT_THAT(score, IsOk());
  return score.value_or(-99);
}

TEST(AnswerRewardTest, ComparesTheCapturedAnswerExactlyOrAsANumber) {
  const nlohmann::json example = {{"prompt", "Q: 6 x 7?"}, {"answer", "42"}, {"value", 42}};
  absl::StatusOr<std::unique_ptr<Reward>> exact =
      MakeReward(Config(R"pb(answer { pattern: "####\\s*(\\S+)" })pb"), "rewards[0]");
  ASSERT_THAT(exact, IsOk());
  EXPECT_EQ(Score(**exact, example, "so 6 x 7 is #### 42\n"), 1.0);
  EXPECT_EQ(Score(**exact, example, "#### 42.0"), 0.0);  // not the same text
  EXPECT_EQ(Score(**exact, example, "42"), 0.0);         // no match
  absl::StatusOr<std::unique_ptr<Reward>> numeric =
      MakeReward(Config(R"pb(answer {
                               pattern: "<answer>(.*?)</answer>"
                               field: "value"
                               numeric: true
                               tolerance: 0.01
                             })pb"),
                 "rewards[0]");
  ASSERT_THAT(numeric, IsOk());
  EXPECT_EQ(Score(**numeric, example, "<answer> 42.004 </answer>"), 1.0);
  EXPECT_EQ(Score(**numeric, example, "<answer>41.9</answer>"), 0.0);
  EXPECT_EQ(Score(**numeric, example, "<answer>forty-two</answer>"), 0.0);
  EXPECT_EQ(Score(**numeric, {{"prompt", "Q"}}, "<answer>42</answer>"), 0.0);  // no field
}

TEST(FormatRewardTest, TrlsThinkFormatByDefault) {
  absl::StatusOr<std::unique_ptr<Reward>> format = MakeReward(Config("format {}"), "rewards[1]");
  ASSERT_THAT(format, IsOk());
  const nlohmann::json example = {{"prompt", "Q"}};
  EXPECT_EQ(Score(**format, example, "<think>\nsix sevens\n</think>\n42"), 1.0);
  EXPECT_EQ(Score(**format, example, "42 <think>late</think>"), 0.0);  // not at the start
  EXPECT_EQ(Score(**format, example, "<think>a</think><think>b</think>"), 0.0);
  EXPECT_EQ(Score(**format, example, "<think>never closed"), 0.0);
}

TEST(SoftOverlongPunishmentTest, TrlsPiecewiseLine) {
  absl::StatusOr<std::unique_ptr<Reward>> punishment = MakeReward(
      Config("soft_overlong_punishment { max_completion_length: 100 cache: 20 }"), "rewards[2]");
  ASSERT_THAT(punishment, IsOk());
  const nlohmann::json example = {{"prompt", "Q"}};
  EXPECT_EQ(Score(**punishment, example, "", 80), 0.0);
  EXPECT_EQ(Score(**punishment, example, "", 90), -0.5);  // TRL's docstring example
  EXPECT_EQ(Score(**punishment, example, "", 100), -1.0);
  EXPECT_EQ(Score(**punishment, example, "", 101), -1.0);
}

TEST(RewardsTest, WeighsAndSumsEachInOrder) {
  google::protobuf::RepeatedPtrField<RewardConfig> configs;
  *configs.Add() = Config(R"pb(answer { pattern: "#### (\\d+)" }
                               name: "accuracy")pb");
  *configs.Add() = Config("format {} weight: 0.25");
  absl::StatusOr<Rewards> rewards = Rewards::Create(configs, "plan.objective.grpo");
  ASSERT_THAT(rewards, IsOk());
  EXPECT_THAT(rewards->names(), ElementsAre("accuracy", "format"));
  const nlohmann::json example = {{"prompt", "Q"}, {"answer", 4}};
  const std::vector<int64_t> ids = {1, 2};
  absl::StatusOr<Scores> scores = rewards->Score({example, "<think>2+2</think>#### 4", ids});
  ASSERT_THAT(scores, IsOk());
  EXPECT_THAT(scores->each, ElementsAre(1.0, 1.0));
  EXPECT_EQ(scores->total, 1.25);
}

TEST(RewardsTest, RefusesWhatCannotScoreNamingTheField) {
  google::protobuf::RepeatedPtrField<RewardConfig> configs;
  EXPECT_THAT(Rewards::Create(configs, "grpo"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("grpo.rewards: is empty")));
  *configs.Add() = Config(R"pb(format { pattern: "(unclosed" })pb");
  EXPECT_THAT(Rewards::Create(configs, "grpo"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("grpo.rewards[0].format.pattern: the regex does not compile")));
  *configs.Mutable(0) = Config("soft_overlong_punishment { max_completion_length: 10 cache: 11 }");
  EXPECT_THAT(Rewards::Create(configs, "grpo"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("grpo.rewards[0].soft_overlong_punishment: cache 11")));
  *configs.Mutable(0) = Config("weight: 2");
  EXPECT_THAT(
      Rewards::Create(configs, "grpo"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("grpo.rewards[0]: names no reward")));
}

}  // namespace
}  // namespace plait::rewards
