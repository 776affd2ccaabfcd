#include "rewards/reward.h"

#include <pcre2.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "rewards/program.h"

namespace plait::rewards {
namespace {

// TRL's think_format_reward's pattern.
constexpr char kThinkFormat[] = "^<think>(?!.*<think>)(.*?)</think>.*$";

// A compiled PCRE2 regex (UTF-8, as Python's re takes text).
class Regex {
 public:
  static absl::StatusOr<Regex> Compile(const std::string& pattern, uint32_t options,
                                       const std::string& field) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | options, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": the regex does not compile at offset ", offset, ": ",
                       reinterpret_cast<const char*>(message)));
    }
    return Regex(code);
  }

  // The first match in `text` (its first group where it has one), anchored at the start with
  // `options` PCRE2_ANCHORED; nullopt where there is none or the text is not UTF-8.
  std::optional<std::string> FirstMatch(absl::string_view text, uint32_t options = 0) const {
    const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), &pcre2_match_data_free);
    const int matched = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                    text.size(), 0, options, data.get(), nullptr);
    if (matched <= 0) return std::nullopt;
    const PCRE2_SIZE* spans = pcre2_get_ovector_pointer(data.get());
    const int group = matched > 1 && spans[2] != PCRE2_UNSET ? 1 : 0;
    return std::string(text.substr(spans[2 * group], spans[2 * group + 1] - spans[2 * group]));
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code, &pcre2_code_free) {}
  std::shared_ptr<pcre2_code> code_;
};

class AnswerRewardImpl final : public Reward {
 public:
  AnswerRewardImpl(const AnswerReward& config, Regex regex)
      : config_(config), regex_(std::move(regex)) {}

  absl::StatusOr<double> Score(const Completion& completion) override {
    const std::optional<std::string> found = regex_.FirstMatch(completion.completion);
    const std::string field = config_.field().empty() ? "answer" : config_.field();
    const auto expected = completion.example.find(field);
    if (!found.has_value() || expected == completion.example.end()) return 0.0;
    const std::string answer(absl::StripAsciiWhitespace(*found));
    if (!config_.numeric()) {
      const std::string wanted =
          expected->is_string() ? expected->get<std::string>() : expected->dump();
      return answer == absl::StripAsciiWhitespace(wanted) ? 1.0 : 0.0;
    }
    double given = 0;
    double wanted = 0;
    if (!absl::SimpleAtod(answer, &given)) return 0.0;
    if (expected->is_number()) {
      wanted = expected->get<double>();
    } else if (!expected->is_string() || !absl::SimpleAtod(expected->get<std::string>(), &wanted)) {
      return absl::InvalidArgumentError(absl::StrCat("answer reward: the example's ", field, " ",
                                                     expected->dump(), " is not a number"));
    }
    return std::abs(given - wanted) <= config_.tolerance() ? 1.0 : 0.0;
  }

 private:
  AnswerReward config_;
  Regex regex_;
};

class FormatRewardImpl final : public Reward {
 public:
  explicit FormatRewardImpl(Regex regex) : regex_(std::move(regex)) {}
  absl::StatusOr<double> Score(const Completion& completion) override {
    return regex_.FirstMatch(completion.completion, PCRE2_ANCHORED).has_value() ? 1.0 : 0.0;
  }

 private:
  Regex regex_;
};

class SoftOverlongImpl final : public Reward {
 public:
  explicit SoftOverlongImpl(const SoftOverlongPunishment& config) : config_(config) {}
  absl::StatusOr<double> Score(const Completion& completion) override {
    const auto length = static_cast<int64_t>(completion.tokens.size());
    const int64_t free = config_.max_completion_length() - config_.cache();
    if (length <= free) return 0.0;
    if (length <= config_.max_completion_length()) {
      return static_cast<double>(free - length) / config_.cache();
    }
    return -1.0;
  }

 private:
  SoftOverlongPunishment config_;
};

}  // namespace

std::string RewardName(const RewardConfig& config) {
  if (!config.name().empty()) return config.name();
  switch (config.kind_case()) {
    case RewardConfig::kAnswer:
      return "answer";
    case RewardConfig::kFormat:
      return "format";
    case RewardConfig::kSoftOverlongPunishment:
      return "soft_overlong_punishment";
    case RewardConfig::kProgram:
      return "program";
    case RewardConfig::KIND_NOT_SET:
      break;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Reward>> MakeReward(const RewardConfig& config,
                                                   const std::string& field) {
  switch (config.kind_case()) {
    case RewardConfig::kAnswer: {
      if (config.answer().pattern().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".answer.pattern: is empty; give the regex of the answer"));
      }
      if (!(config.answer().tolerance() >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".answer.tolerance: ", config.answer().tolerance(), " is negative"));
      }
      PLAIT_ASSIGN_OR_RETURN(
          Regex regex, Regex::Compile(config.answer().pattern(), 0, field + ".answer.pattern"));
      return std::make_unique<AnswerRewardImpl>(config.answer(), std::move(regex));
    }
    case RewardConfig::kFormat: {
      const std::string& pattern =
          config.format().pattern().empty() ? kThinkFormat : config.format().pattern();
      PLAIT_ASSIGN_OR_RETURN(Regex regex, Regex::Compile(pattern, PCRE2_DOTALL | PCRE2_MULTILINE,
                                                         field + ".format.pattern"));
      return std::make_unique<FormatRewardImpl>(std::move(regex));
    }
    case RewardConfig::kSoftOverlongPunishment: {
      const SoftOverlongPunishment& punishment = config.soft_overlong_punishment();
      if (punishment.max_completion_length() <= 0 || punishment.cache() <= 0 ||
          punishment.cache() > punishment.max_completion_length()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".soft_overlong_punishment: cache ", punishment.cache(),
            " must be in (0, max_completion_length ", punishment.max_completion_length(), "]"));
      }
      return std::make_unique<SoftOverlongImpl>(punishment);
    }
    case RewardConfig::kProgram: {
      PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<ProgramReward> program,
                             ProgramReward::Start(config.program(), field + ".program"));
      return std::unique_ptr<Reward>(std::move(program));
    }
    case RewardConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field,
                   ": names no reward (answer, format, soft_overlong_punishment or "
                   "program)"));
}

absl::StatusOr<Rewards> Rewards::Create(
    const google::protobuf::RepeatedPtrField<RewardConfig>& configs, const std::string& field) {
  if (configs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".rewards: is empty; give at least one"));
  }
  Rewards rewards;
  for (int i = 0; i < configs.size(); ++i) {
    const std::string where = absl::StrCat(field, ".rewards[", i, "]");
    PLAIT_ASSIGN_OR_RETURN(rewards.rewards_.emplace_back(), MakeReward(configs[i], where));
    rewards.weights_.push_back(configs[i].has_weight() ? configs[i].weight() : 1.0);
    rewards.names_.push_back(RewardName(configs[i]));
  }
  return rewards;
}

absl::StatusOr<Scores> Rewards::Score(const Completion& completion) {
  Scores scores;
  for (size_t i = 0; i < rewards_.size(); ++i) {
    PLAIT_ASSIGN_OR_RETURN(const double score, rewards_[i]->Score(completion));
    scores.each.push_back(score);
    scores.total += weights_[i] * score;
  }
  return scores;
}

}  // namespace plait::rewards
