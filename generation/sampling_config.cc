#include "generation/sampling_config.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace plait::generation {

std::vector<base::Violation> CheckSamplingConfig(const SamplingConfig& config,
                                                 const std::string& field_path) {
  std::vector<base::Violation> violations;
  const auto add = [&](const std::string& field, std::string message) {
    violations.push_back({absl::StrCat(field_path, ".", field), std::move(message)});
  };
  if (!(config.temperature() >= 0.0) || std::isinf(config.temperature())) {
    add("temperature", absl::StrCat("must be 0 (greedy) or positive, not ", config.temperature()));
  }
  if (config.top_k() < 0)
    add("top_k", absl::StrCat("must be 0 (off) or positive, not ", config.top_k()));
  if (!(config.top_p() >= 0.0 && config.top_p() <= 1.0)) {
    add("top_p", absl::StrCat("must be in [0, 1] (0 or 1: off), not ", config.top_p()));
  }
  if (!(config.min_p() >= 0.0 && config.min_p() <= 1.0)) {
    add("min_p", absl::StrCat("must be in [0, 1] (0: off), not ", config.min_p()));
  }
  if (config.max_new_tokens() < 1) {
    add("max_new_tokens", absl::StrCat("must be at least 1, not ", config.max_new_tokens()));
  }
  if (config.num_samples() < 0) {
    add("num_samples", absl::StrCat("must be 0 (one) or positive, not ", config.num_samples()));
  }
  for (int i = 0; i < config.stop_strings_size(); ++i) {
    if (config.stop_strings(i).empty()) add(absl::StrCat("stop_strings[", i, "]"), "is empty");
  }
  return violations;
}

std::vector<base::Violation> CheckSamplesConfig(const SamplesConfig& config,
                                                const std::string& field_path) {
  std::vector<base::Violation> violations;
  if (config.prompts_size() == 0) {
    violations.push_back(
        {absl::StrCat(field_path, ".prompts"), "names no prompt; give at least one"});
  }
  for (int i = 0; i < config.prompts_size(); ++i) {
    if (config.prompts(i).empty()) {
      violations.push_back({absl::StrCat(field_path, ".prompts[", i, "]"), "is empty"});
    }
  }
  if (config.every_steps() < 0) {
    violations.push_back({absl::StrCat(field_path, ".every_steps"),
                          absl::StrCat("must be 0 (after the last step only) or positive, not ",
                                       config.every_steps())});
  }
  if (!config.has_sampling()) {
    violations.push_back(
        {absl::StrCat(field_path, ".sampling"), "is unset; give at least max_new_tokens"});
  } else {
    for (base::Violation& violation :
         CheckSamplingConfig(config.sampling(), absl::StrCat(field_path, ".sampling"))) {
      violations.push_back(std::move(violation));
    }
  }
  return violations;
}

std::string SamplesFile(const SamplesConfig& config) {
  return config.file().empty() ? "samples.jsonl" : config.file();
}

std::vector<base::PlanFeature> FeaturesOf(const SamplesConfig& /*config: any asks it*/,
                                          const std::string& field_path) {
  return {{.name = "generates",
           .field = field_path,
           .what = "samples decode the trained model a token at a time",
           .fix = "train without samples, and generate from the saved model (tools/generate)"}};
}

}  // namespace plait::generation
