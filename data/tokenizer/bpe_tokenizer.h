// Byte-level BPE tokenizers from Hugging Face's tokenizer.json (GPT-2, Llama 3, Qwen2/2.5/3,
// DeepSeek), producing the ids Hugging Face's `tokenizers` produces. What a file may contain:
//   - normalizer: none, NFC, NFD, NFKC, NFKD, or a Sequence of these (utf8proc);
//   - pre_tokenizer: ByteLevel (with GPT-2's split regex when use_regex), or a Sequence of
//     Split (a Regex or String pattern, behavior Isolated) ending in ByteLevel; the regexes
//     run on PCRE2 with JIT, in Unicode mode, as the file writes them;
//   - model: BPE with byte-level vocab and merges (as "a b" strings or [a, b] pairs), with
//     or without ignore_merges;
//   - added_tokens: matched in the text before it is split (leftmost, then longest), those
//     with normalized=false on the raw text, the others after normalization;
//   - post_processor: none, ByteLevel, TemplateProcessing (its `single` template: BOS / EOS
//     around the text), or a Sequence of these;
//   - decoder: ByteLevel.
// Anything else (another model type, BPE dropout or byte fallback, a Split behavior other
// than Isolated, truncation, added tokens with lstrip / rstrip / single_word, ...) is an
// Unimplemented error naming the field, never a silent difference from Hugging Face; so is a
// text whose split PCRE2 cannot complete (a ResourceExhausted error from Encode).
#ifndef PLAIT_DATA_TOKENIZER_BPE_TOKENIZER_H_
#define PLAIT_DATA_TOKENIZER_BPE_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {

// The tokenizer of `tokenizer_json` (the text of a tokenizer.json; `source` names it in
// errors). `tokenizer_config_json`, the text of the tokenizer_config.json beside it (a JSON
// object) or empty when there is none, names the BOS and EOS tokens (bos_token, eos_token).
// Errors read "SOURCE: model.merges[12]: \"a b\" names \"b\", which is not in model.vocab".
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseBpeTokenizer(
    absl::string_view source, absl::string_view tokenizer_json,
    absl::string_view tokenizer_config_json);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_BPE_TOKENIZER_H_
