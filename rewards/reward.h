// A completion's rewards (rewards.proto): each RewardConfig becomes a Reward, and Rewards
// weighs and sums them, as TRL's GRPOTrainer sums its reward functions' outputs times
// reward_weights. A completion is scored with its example, the JSON object its prompt came
// from (its "prompt" and whatever fields the rewards read):
//
//   PLAIT_ASSIGN_OR_RETURN(Rewards rewards, Rewards::Create(config.rewards(),
//   "plan.objective.grpo")); PLAIT_ASSIGN_OR_RETURN(Scores scores,
//                          rewards.Score({.example = example, .completion = text, .tokens = ids}));
//   scores.total;  // the weighted sum; scores.each: every reward's own
#ifndef PLAIT_REWARDS_REWARD_H_
#define PLAIT_REWARDS_REWARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "nlohmann/json.hpp"
#include "rewards/rewards.pb.h"

namespace plait::rewards {

// One completion to score.
struct Completion {
  const nlohmann::json& example;  // an object: "prompt" and the example's other fields
  absl::string_view completion;   // its text
  const std::vector<int64_t>& tokens;
};

class Reward {
 public:
  virtual ~Reward() = default;
  // InvalidArgument or Unavailable (a program's) naming the reward and the example where it
  // cannot score the completion.
  virtual absl::StatusOr<double> Score(const Completion& completion) = 0;
};

// The reward `config` describes; InvalidArgument naming `field` (or a field below it) for one
// that is invalid: a regex that does not compile, a bound out of range, no command.
absl::StatusOr<std::unique_ptr<Reward>> MakeReward(const RewardConfig& config,
                                                   const std::string& field);

// The name a reward's metrics take: its config's name, else its kind's ("answer", "format",
// "soft_overlong_punishment", "program").
std::string RewardName(const RewardConfig& config);

// Every reward's score of a completion, in config order, and their weighted sum.
struct Scores {
  std::vector<double> each;
  double total = 0;
};

class Rewards {
 public:
  // At least one config; errors as MakeReward's, naming `field`.rewards[i].
  static absl::StatusOr<Rewards> Create(
      const google::protobuf::RepeatedPtrField<RewardConfig>& configs, const std::string& field);

  absl::StatusOr<Scores> Score(const Completion& completion);

  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::unique_ptr<Reward>> rewards_;
  std::vector<double> weights_;
  std::vector<std::string> names_;
};

}  // namespace plait::rewards

#endif  // PLAIT_REWARDS_REWARD_H_
