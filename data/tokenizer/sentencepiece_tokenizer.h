// SentencePiece tokenizers from a tokenizer.model (the Llama 2 family, Mistral 7B v0.1), through
// Debian's libsentencepiece, giving the ids Google's `sentencepiece` (and so Hugging Face's
// LlamaTokenizer) gives. Encode(text, /*add_special_tokens=*/true) prepends the model's BOS,
// as Llama 2's tokenizer does; special tokens written in the text are not matched (SentencePiece
// encodes "<s>" as text).
#ifndef PLAIT_DATA_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define PLAIT_DATA_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {

// The tokenizer of `model` (the bytes of a tokenizer.model; `source` names it in errors).
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseSentencePieceTokenizer(absl::string_view source,
                                                                       absl::string_view model);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
