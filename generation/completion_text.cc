#include "generation/completion_text.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace plait::generation {

absl::StatusOr<std::string> CompletionText(const data::tokenizer::Tokenizer& tokenizer,
                                           const std::vector<int64_t>& ids) {
  std::vector<int32_t> known;
  for (const int64_t id : ids) {
    if (id < tokenizer.vocab_size()) known.push_back(static_cast<int32_t>(id));
  }
  return tokenizer.Decode(known);
}

std::vector<int64_t> WithTokenizerEnd(std::vector<int64_t> ids,
                                      const data::tokenizer::Tokenizer& tokenizer) {
  if (tokenizer.eos_id().has_value() &&
      std::find(ids.begin(), ids.end(), *tokenizer.eos_id()) == ids.end()) {
    ids.push_back(*tokenizer.eos_id());
  }
  return ids;
}

absl::StatusOr<std::string> CompletionLines(const std::vector<Completion>& completions,
                                            const data::tokenizer::Tokenizer& tokenizer,
                                            const nlohmann::json& first) {
  std::string lines;
  for (const Completion& completion : completions) {
    PLAIT_ASSIGN_OR_RETURN(const std::string text, CompletionText(tokenizer, completion.tokens));
    nlohmann::json line = first;
    line["prompt_index"] = completion.prompt;
    line["sample"] = completion.sample;
    line["text"] = text;
    line["token_ids"] = completion.tokens;
    line["logprobs"] = completion.logprobs;
    line["sampling_logprobs"] = completion.sampling_logprobs;
    line["stop_reason"] = StopReasonName(completion.stop);
    absl::StrAppend(&lines, line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "\n");
  }
  return lines;
}

}  // namespace plait::generation
