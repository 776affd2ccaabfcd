// BPE tokenizers from Hugging Face's tokenizer.json, producing the ids Hugging Face's
// `tokenizers` produces. Two families:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2/2.5/3, DeepSeek): every byte has a token, written
//     as GPT-2's printable characters;
//   - BPE with byte fallback (the tokenizer.json of Llama 2, Mistral 7B, Gemma 3 and
//     their fine-tunes, SentencePiece models converted by transformers): the vocabulary holds
//     text with "▁" for a space, merging starts from characters, and a character that is no
//     token becomes its UTF-8 bytes' <0xNN> tokens (byte_fallback.h). The merges are applied
//     by rank to the whole normalized text (or to each piece of a Split), as Hugging Face's BPE
//     model does; the unknown token is never needed, as every byte has a token.
// What a file may contain:
//   - normalizer: none, NFC, NFD, NFKC, NFKD, Prepend, Replace (a String pattern), or a
//     Sequence of these (utf8proc);
//   - pre_tokenizer: byte-level: ByteLevel (with GPT-2's split regex when use_regex), or a
//     Sequence of Split ending in ByteLevel; byte fallback: none (Llama 2's, Mistral's legacy
//     files), Metaspace (transformers' conversions today, with prepend_scheme always, first or
//     never; older files' add_prefix_space read as Hugging Face reads it), Split (Gemma's)
//     or a Sequence of Split. Split takes a Regex or String pattern and behavior Isolated,
//     MergedWithPrevious or MergedWithNext; the regexes run on PCRE2 with JIT, in Unicode
//     mode, their general categories (\p{L} ...) widened to Unicode 16.0's as Hugging Face's
//     are (unicode_categories.h);
//   - model: BPE with merges (as "a b" strings or [a, b] pairs), with or without
//     ignore_merges; a byte-level vocabulary, or with byte_fallback one with all 256 <0xNN>;
//   - added_tokens: matched in the text before it is split (leftmost, then longest), those
//     with normalized=false on the raw text, the others after normalization;
//   - post_processor: none, ByteLevel, TemplateProcessing (its `single` template: BOS / EOS
//     around the text), or a Sequence of these;
//   - decoder: ByteLevel; with byte fallback a Sequence of Replace (String) and ByteFallback,
//     then Fuse, then at most one Strip (Llama 2's and Gemma's). Decode gives bytes: where
//     byte tokens do not make UTF-8, Hugging Face writes U+FFFD and plait the bytes.
// Anything else (another model type, BPE dropout, byte fallback with a ByteLevel
// pre-tokenizer, the Metaspace decoder, Metaspace inside a Sequence, a Split behavior Removed
// or Contiguous, a Regex Replace, truncation, added tokens with lstrip / rstrip / single_word,
// ...) is an Unimplemented error naming the field, never a silent difference from Hugging
// Face; so is a text whose split PCRE2 cannot complete (a ResourceExhausted error from
// Encode).
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
