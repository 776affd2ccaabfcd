// SFT examples and preference pairs written as text (data.proto's PAIR_FORMAT_TEXT), tokenized
// with the model's tokenizer into the examples data/pairs.h batches, one JSON object a line
// (blank lines ignored):
//   SFT: {"prompt": "...", "completion": "..."}
//   DPO: {"prompt": "...", "chosen": "...", "rejected": "..."}
//
// The ids are those TRL's SFTTrainer and DPOTrainer train on (TRL 1.16, text that is not a
// conversation): each completion gets the tokenizer's EOS token appended to its text unless it
// ends with it; the prompt alone and the prompt + completion text are each encoded with the
// special tokens the tokenizer's post-processor adds (Llama 3's BOS, none for Qwen); the
// completion starts where the two id sequences first differ (for a pair, the earlier of chosen
// and rejected). So a prompt whose last token merges with the completion's first ("Hel" +
// "lo") gives that token to the completion, and a sequence is exactly the ids of its text.
//
// The ids are cached beside the text file, in FILE.<tokenizer hash>-<text hash>.ids.jsonl, so
// a changed tokenizer or text is tokenized again. The cache opens with a header (format
// version, tokenizer, text hash, a checksum of the rest); a cache that does not match its
// header is rebuilt, never read. Several ranks may build it at once: each writes its own
// temporary file and renames it into place.
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(hf_folder));
//   PLAIT_ASSIGN_OR_RETURN(PairExamples pairs,
//                          ReadTextPairFile(path, PairKind::kSft, files, *tokenizer, seq_len));
#ifndef PLAIT_DATA_TOKENIZER_TEXT_PAIRS_H_
#define PLAIT_DATA_TOKENIZER_TEXT_PAIRS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "data/data.pb.h"
#include "data/jsonl_lines.h"
#include "data/pairs.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {

// The examples of the text JSONL file `path`, checked as ReadPairFile checks id files (the
// `files` policy for prompts too long for `seq_len`, a line longer than `max_line_bytes`).
// Errors name the text file, its line and the field: "<path>:3: chosen: expected a string,
// got 5", "<path>:4: completion: is empty", "<path>:7: prompt: its 70 tokens leave no
// completion token within seq_len 64; ...".
absl::StatusOr<PairExamples> ReadTextPairFile(const std::string& path, PairKind kind,
                                              const PairFiles& files, const Tokenizer& tokenizer,
                                              int64_t seq_len,
                                              int64_t max_line_bytes = kMaxJsonlLineBytes);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_TEXT_PAIRS_H_
