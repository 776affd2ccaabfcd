// Completions as text, with the model's tokenizer: what tools/generate writes and what a run
// writes as its samples (plan.training.samples), one JSON object a line:
//   {"prompt_index": 0, "sample": 0, "text": " 6", "token_ids": [...], "logprobs": [...],
//    "sampling_logprobs": [...], "stop_reason": "end_of_sequence"}
// and, in a run's samples, the "step" they were drawn after.
#ifndef PLAIT_GENERATION_COMPLETION_TEXT_H_
#define PLAIT_GENERATION_COMPLETION_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/tokenizer/tokenizer.h"
#include "generation/generate.h"
#include "nlohmann/json.hpp"

namespace plait::generation {

// The text of `ids`. An id the tokenizer has no token for (a model's vocabulary padded beyond
// its tokenizer's) adds none, as transformers' decode leaves it out.
absl::StatusOr<std::string> CompletionText(const data::tokenizer::Tokenizer& tokenizer,
                                           const std::vector<int64_t>& ids);

// `ids` (the model's end-of-sequence ids) with the tokenizer's eos id added, where it has one
// they lack: what ends a completion.
std::vector<int64_t> WithTokenizerEnd(std::vector<int64_t> ids,
                                      const data::tokenizer::Tokenizer& tokenizer);

// The JSONL lines of `completions`, each object the fields of `first` (a JSON object: a run's
// step) and the completion's. Text that is not valid UTF-8 (a completion cut inside a
// character) is written with U+FFFD in its place.
absl::StatusOr<std::string> CompletionLines(const std::vector<Completion>& completions,
                                            const data::tokenizer::Tokenizer& tokenizer,
                                            const nlohmann::json& first = nlohmann::json::object());

}  // namespace plait::generation

#endif  // PLAIT_GENERATION_COMPLETION_TEXT_H_
