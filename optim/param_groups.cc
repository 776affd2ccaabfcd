#include "optim/param_groups.h"

#include <fnmatch.h>

#include <cmath>
#include <functional>
#include <regex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace plait::optim {
namespace {

using NameMatcher = std::function<bool(const std::string& name)>;

absl::StatusOr<NameMatcher> MakeMatcher(const ParamGroupRule& rule, const std::string& field) {
  switch (rule.pattern_case()) {
    case ParamGroupRule::kGlob: {
      if (rule.glob().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".glob: is empty"));
      }
      return NameMatcher([glob = rule.glob()](const std::string& name) {
        return fnmatch(glob.c_str(), name.c_str(), 0) == 0;
      });
    }
    case ParamGroupRule::kRegex: {
      try {
        return NameMatcher([regex = std::regex(rule.regex())](const std::string& name) {
          return std::regex_match(name, regex);
        });
      } catch (const std::regex_error& error) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".regex: \"", rule.regex(),
                                                       "\" is not a valid regex: ", error.what()));
      }
    }
    case ParamGroupRule::PATTERN_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": set glob or regex"));
}

// >= 0 and finite: an infinite weight decay or lr scale makes the parameters NaN.
absl::Status CheckNonNegative(const std::string& field, double value) {
  if (!(value >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " must be >= 0"));
  }
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " must be finite"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ParamGroup>> AssignParamGroups(const std::vector<std::string>& names,
                                                          const OptimizerConfig& config) {
  if (absl::Status status = CheckNonNegative("optimizer.weight_decay", config.weight_decay());
      !status.ok()) {
    return status;
  }
  std::vector<ParamGroup> groups;
  std::vector<NameMatcher> matchers;
  for (int i = 0; i < config.param_groups_size(); ++i) {
    const ParamGroupRule& rule = config.param_groups(i);
    const std::string field = absl::StrCat("optimizer.param_groups[", i, "]");
    absl::StatusOr<NameMatcher> matcher = MakeMatcher(rule, field);
    if (!matcher.ok()) return matcher.status();
    ParamGroup group;
    group.name = rule.name().empty() ? absl::StrCat("param_groups[", i, "]") : rule.name();
    group.lr_scale = rule.has_lr_scale() ? rule.lr_scale() : 1.0;
    group.weight_decay = rule.has_weight_decay() ? rule.weight_decay() : config.weight_decay();
    for (auto [suffix, value] :
         {std::pair{".lr_scale", group.lr_scale}, std::pair{".weight_decay", group.weight_decay}}) {
      if (absl::Status status = CheckNonNegative(field + suffix, value); !status.ok()) {
        return status;
      }
    }
    groups.push_back(std::move(group));
    matchers.push_back(*std::move(matcher));
  }

  ParamGroup default_group{"default", 1.0, config.weight_decay(), {}};
  for (int index = 0; index < static_cast<int>(names.size()); ++index) {
    ParamGroup* owner = &default_group;
    for (size_t rule = 0; rule < matchers.size(); ++rule) {
      if (matchers[rule](names[index])) {
        owner = &groups[rule];
        break;
      }
    }
    owner->members.push_back(index);
  }

  for (int i = 0; i < config.param_groups_size(); ++i) {
    if (!groups[i].members.empty()) continue;
    const ParamGroupRule& rule = config.param_groups(i);
    const std::string pattern = rule.pattern_case() == ParamGroupRule::kGlob
                                    ? absl::StrCat("glob \"", rule.glob(), "\"")
                                    : absl::StrCat("regex \"", rule.regex(), "\"");
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.param_groups[", i, "] (", groups[i].name, "): ", pattern,
                     " matches no parameter", i > 0 ? " that an earlier rule did not take" : ""));
  }
  if (!default_group.members.empty()) groups.push_back(std::move(default_group));
  return groups;
}

}  // namespace plait::optim
