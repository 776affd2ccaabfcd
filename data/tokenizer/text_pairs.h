// SFT examples and preference pairs written as text, tokenized with the model's tokenizer into
// the id form data/pairs.h reads, and cached beside the text file:
//   SFT: {"prompt": "...", "completion": "..."}   DPO: {"prompt": "...", "chosen": "...",
//   "rejected": "..."}, one per line (blank lines ignored).
// The prompt gets the special tokens the tokenizer's post-processor adds (Llama's BOS), each
// completion the tokenizer's EOS at its end, as TRL's DPOTrainer and SFTTrainer tokenize them.
// The cache, FILE.<tokenizer hash>-<text hash>.ids.jsonl, is keyed by the tokenizer's and the
// text's contents, so a changed tokenizer or text file is tokenized again:
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(hf_folder));
//   PLAIT_ASSIGN_OR_RETURN(std::string ids_path,
//                          TokenizedPairFile(text_path, PairKind::kSft, *tokenizer));
//   PLAIT_ASSIGN_OR_RETURN(PairExamples pairs, ReadPairFile(ids_path, PairKind::kSft, ...));
#ifndef PLAIT_DATA_TOKENIZER_TEXT_PAIRS_H_
#define PLAIT_DATA_TOKENIZER_TEXT_PAIRS_H_

#include <string>

#include "absl/status/statusor.h"
#include "data/pairs.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {

// The path of the id form of the text JSONL file `text_path`, written (atomically) unless the
// cache already holds it. Errors name the file, the line and the field:
// "<path>:3: chosen: expected a string, got 5".
absl::StatusOr<std::string> TokenizedPairFile(const std::string& text_path, PairKind kind,
                                              const Tokenizer& tokenizer);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_TEXT_PAIRS_H_
