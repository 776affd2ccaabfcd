// Prompts to generate from, in a JSONL file: each line an object with `prompt` (text, encoded
// with the tokenizer's special tokens, as transformers' tokenizer(prompt) does) or
// `prompt_ids` (token ids), and whatever other fields the line has, kept with it for what
// reads them (a reward's answer). tools/generate reads its prompts so, and online RL its
// examples.
//
//   PLAIT_ASSIGN_OR_RETURN(std::vector<Prompt> prompts, ReadPrompts("prompts.jsonl", *tokenizer));
//   prompts[0].ids;              // [128000, 48, 25, ...]
//   prompts[0].example["answer"];  // a field of its line
#ifndef PLAIT_DATA_TOKENIZER_PROMPTS_H_
#define PLAIT_DATA_TOKENIZER_PROMPTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {

struct Prompt {
  std::vector<int64_t> ids;  // never empty
  nlohmann::json example;    // its line's object
};

// The prompts of the JSONL file `path`, one a line (blank lines skipped), read through
// data::ForEachJsonlLine. InvalidArgument naming the file and line for a line that is not a
// JSON object, has neither field, a `prompt_ids` that is not a list of ids, or a prompt that
// encodes to no token.
absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path,
                                                const Tokenizer& tokenizer);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_PROMPTS_H_
