// SentencePiece BPE tokenizers from a tokenizer.model (the Llama 2 family: Llama 2, Mistral 7B
// v0.1, TinyLlama), giving the ids Google's `sentencepiece` (and so Hugging Face's
// LlamaTokenizer) gives. Encode(text, /*add_special_tokens=*/true) prepends the model's BOS,
// as Llama 2's tokenizer does; special tokens written in the text are not matched
// (SentencePiece encodes "<s>" as text).
//
// The model is read and run here rather than through a SentencePiece library: Debian's
// libsentencepiece carries a protobuf of its own whose exported symbols collide with the
// system protobuf plait links, and a process with both crashes as it starts. What a model may
// contain: BPE pieces (NORMAL, BYTE, CONTROL, UNKNOWN) with byte fallback, and the identity
// normalizer with a dummy prefix and escaped whitespace (Llama 2's settings). Anything else
// (a Unigram model, NFKC rules, extra-whitespace removal, user-defined or unused pieces, a
// piece holding a character that is no piece) is an Unimplemented error naming the field; a
// model sentencepiece itself refuses to load (an empty piece, a piece given twice, two UNKNOWN
// pieces) is InvalidArgument naming the piece and its index.
//
// SentencePiece merges the whole normalized text. When no piece holds a space after a
// non-space (true of the Llama 2 family's pieces), no merge can cross into the next word, so
// each word is merged on its own, with the same ids, and recurring words come from a cache
// (piece_cache.h); the merges run on ids (bpe_merge.h), as Hugging Face's BPE's do. That is
// several times SentencePiece's speed, and linear in a document's length, where one heap over
// a long document is slow.
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
