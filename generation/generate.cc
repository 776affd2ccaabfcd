#include "generation/generate.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/zeros.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "generation/sampling_config.h"
#include "models/kv_cache.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/grad_mode.h"

namespace plait::generation {
namespace {

// Why `completion` ends after its last token, if it does.
absl::StatusOr<std::optional<StopReason>> StopAfterLastToken(const Completion& completion,
                                                             const SamplingConfig& config,
                                                             const GenerateOptions& options) {
  const int64_t last = completion.tokens.back();
  if (std::find(options.end_of_sequence.begin(), options.end_of_sequence.end(), last) !=
      options.end_of_sequence.end()) {
    return StopReason::kEndOfSequence;
  }
  if (config.stop_strings_size() > 0) {
    PLAIT_ASSIGN_OR_RETURN(const std::string text, options.detokenize(completion.tokens));
    for (const std::string& stop : config.stop_strings()) {
      if (text.find(stop) != std::string::npos) return StopReason::kStopString;
    }
  }
  if (static_cast<int64_t>(completion.tokens.size()) >= config.max_new_tokens()) {
    return StopReason::kMaxNewTokens;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> EndOfSequenceIds(const std::string& dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (!std::filesystem::exists(path)) continue;
    PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
    PLAIT_ASSIGN_OR_RETURN(const nlohmann::json json, base::ParseJson(path, text));
    if (!json.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
    }
    const base::JsonFields fields(json, path);
    if (!fields.Has("eos_token_id")) continue;
    const nlohmann::json& eos = json.at("eos_token_id");
    if (!eos.is_array()) {
      PLAIT_ASSIGN_OR_RETURN(const int64_t id, fields.Int("eos_token_id"));
      return std::vector<int64_t>{id};
    }
    std::vector<int64_t> ids;
    for (size_t i = 0; i < eos.size(); ++i) {
      PLAIT_ASSIGN_OR_RETURN(ids.emplace_back(),
                             fields.IntValue(eos[i], absl::StrCat("eos_token_id[", i, "]")));
    }
    return ids;
  }
  return std::vector<int64_t>();
}

std::string StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kEndOfSequence:
      return "end_of_sequence";
    case StopReason::kStopString:
      return "stop_string";
    case StopReason::kMaxNewTokens:
      return "max_new_tokens";
  }
  return "";
}

absl::Status CheckGeneration(const models::CausalLM& model,
                             const std::vector<std::vector<int64_t>>& prompts,
                             const SamplingConfig& config, const GenerateOptions& options) {
  const std::vector<base::Violation> violations = CheckSamplingConfig(config, "sampling");
  if (!violations.empty()) {
    std::vector<std::string> lines;
    for (const base::Violation& violation : violations) lines.push_back(violation.ToString());
    return absl::InvalidArgumentError(absl::StrJoin(lines, "; "));
  }
  if (config.stop_strings_size() > 0 && !options.detokenize) {
    return absl::InvalidArgumentError(
        "sampling.stop_strings: stop strings need the completions' text, and no tokenizer was "
        "given to decode it");
  }
  if (const std::string refusal = model.DecodeRefusal(); !refusal.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("this model cannot generate: ", refusal));
  }
  const int64_t vocab = model.config().vocab_size();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int64_t prompt = options.first_prompt + static_cast<int64_t>(p);
    if (prompts[p].empty())
      return absl::InvalidArgumentError(absl::StrCat("prompt ", prompt, " is empty"));
    for (size_t i = 0; i < prompts[p].size(); ++i) {
      if (prompts[p][i] < 0 || prompts[p][i] >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt ", prompt, ": token ", i, " is ", prompts[p][i],
                         ", not an id below the model's vocabulary size ", vocab));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Completion>> Generate(models::CausalLM& model,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const SamplingConfig& config,
                                                 const GenerateOptions& options) {
  PLAIT_RETURN_IF_ERROR(CheckGeneration(model, prompts, config, options));
  int64_t longest = 0;
  for (const std::vector<int64_t>& prompt : prompts) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt.size()));
  }
  const int64_t samples = std::max(1, config.num_samples());
  std::vector<RowSeed> seeds;
  std::vector<Completion> completions;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t prompt = options.first_prompt + static_cast<int64_t>(p);
      seeds.push_back({prompt, s});
      completions.push_back({.prompt = prompt, .sample = s});
    }
  }
  // A rank without completions decodes one placeholder row (token 0) beside its peers.
  const bool placeholder = completions.empty();
  if (placeholder && !options.any_rank_open) return completions;
  const int64_t rows = placeholder ? 1 : static_cast<int64_t>(completions.size());
  if (placeholder) longest = 1;
  at::Tensor pads = at::zeros({rows}, at::kLong);
  at::Tensor tokens = at::zeros({rows, longest}, at::kLong);
  for (size_t r = 0; r < completions.size(); ++r) {
    const std::vector<int64_t>& prompt = prompts[completions[r].prompt - options.first_prompt];
    const auto length = static_cast<int64_t>(prompt.size());
    pads[r] = longest - length;
    for (int64_t i = 0; i < length; ++i) tokens[r][longest - length + i] = prompt[i];
  }

  // As PyTorch's model.eval(): no dropout (LoRA's), the model's mode restored after.
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const absl::Cleanup restore_mode = [&model, was_training] { model.train(was_training); };
  const at::Device device = model.OutputWeight().device();
  models::KvCache cache(pads, longest + config.max_new_tokens());
  Sampler sampler(config, std::move(seeds));
  at::Tensor last = model.Decode(tokens.to(device), cache, /*logits_to_keep=*/1).select(1, 0);
  // The rows still drawing; a row that stopped goes on decoding with the others, unread.
  std::vector<bool> open(completions.size(), true);
  auto open_rows = static_cast<int64_t>(completions.size());
  // The first error drawing; peers are told before it is returned.
  absl::Status failed;
  while (true) {
    at::Tensor next = at::zeros({rows}, at::kLong);
    if (!placeholder) {
      const Draws draws = sampler.Next(last);
      next = draws.tokens;
      for (int64_t r = 0; r < rows && failed.ok(); ++r) {
        if (!open[r]) continue;
        Completion& completion = completions[r];
        completion.tokens.push_back(draws.tokens[r].item<int64_t>());
        completion.logprobs.push_back(draws.logprobs[r].item<float>());
        completion.sampling_logprobs.push_back(draws.sampling_logprobs[r].item<float>());
        absl::StatusOr<std::optional<StopReason>> stop =
            StopAfterLastToken(completion, config, options);
        if (!stop.ok()) {
          failed = base::Annotate(stop.status(), absl::StrCat("prompt ", completion.prompt,
                                                              " sample ", completion.sample));
        } else if (stop->has_value()) {
          completion.stop = **stop;
          open[r] = false;
          --open_rows;
        }
      }
    }
    bool go_on = open_rows > 0;
    if (options.any_rank_open) {
      absl::StatusOr<bool> any = options.any_rank_open(go_on && failed.ok(), !failed.ok());
      PLAIT_RETURN_IF_ERROR(failed);
      PLAIT_ASSIGN_OR_RETURN(go_on, any);
    }
    PLAIT_RETURN_IF_ERROR(failed);
    if (!go_on) break;
    last = model.Decode(next.view({rows, 1}).to(device), cache).select(1, 0);
  }
  return completions;
}

}  // namespace plait::generation
