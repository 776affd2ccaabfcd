// The byte tokens of byte fallback, shared by the two tokenizers that use it: SentencePiece's
// tokenizer.model (sentencepiece_tokenizer.h) and Hugging Face's BPE with byte_fallback
// (bpe_tokenizer.h). A character that is no token of the vocabulary is written as one token
// per byte of its UTF-8, named "<0xE4>" (SentencePiece's BYTE pieces; Hugging Face's BPE
// looks up format!("<{:#04X}>", byte)), and those tokens decode to the byte.
#ifndef PLAIT_DATA_TOKENIZER_BYTE_FALLBACK_H_
#define PLAIT_DATA_TOKENIZER_BYTE_FALLBACK_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace plait::data::tokenizer {

// The name of the token of `byte`: "<0x0A>" (two upper-case hex digits).
std::string ByteFallbackToken(uint8_t byte);

// The byte of a byte token, "<0x41>" -> 0x41 (either case of hex digit); nullopt for any other
// token.
std::optional<uint8_t> ByteFallbackValue(absl::string_view token);

// The length in bytes of the UTF-8 character whose first byte is `lead` (in valid UTF-8): how
// both tokenizers cut a text into the characters they start merging from.
inline int Utf8CharLength(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_BYTE_FALLBACK_H_
