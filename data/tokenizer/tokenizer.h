// A model's tokenizer, as it was released with the model: a Hugging Face tokenizer.json of the
// byte-level BPE family (GPT-2, Llama 3, Qwen2/2.5/3) or of BPE with byte fallback (Llama 2,
// Mistral 7B, Gemma 3; bpe_tokenizer.h), or a SentencePiece tokenizer.model of the Llama 2
// family (sentencepiece_tokenizer.h), behind one interface.
// Ids equal Hugging Face's for the same file and text. A Tokenizer is immutable once loaded
// and may be used from several threads at once:
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(model_dir));
//   PLAIT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
//   PLAIT_ASSIGN_OR_RETURN(std::string bytes, tokenizer->Decode(ids));  // == text
#ifndef PLAIT_DATA_TOKENIZER_TOKENIZER_H_
#define PLAIT_DATA_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace plait::data::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`, which must be valid UTF-8 (else InvalidArgument naming the byte offset;
  // ReplaceInvalidUtf8 makes any bytes valid the way Hugging Face's Python callers do).
  // Special tokens written in the text are matched as tokens, as Hugging Face does by default.
  // With `add_special_tokens`, the ids the file's post-processor adds (Llama's BOS) are added.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                      bool add_special_tokens = false) const = 0;

  // The bytes of `ids`, special tokens included; InvalidArgument for an id that is not a
  // token. The bytes of a prefix of a text's ids may end inside a UTF-8 character.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  // 1 + the largest id, added tokens included: the width of a model's embedding must be at
  // least this.
  virtual int64_t vocab_size() const = 0;

  // The id of a token as the file writes it ("<|endoftext|>", "Ġthe", "▁the").
  virtual std::optional<int32_t> TokenToId(absl::string_view token) const = 0;

  // Whether `id` is a special (control) token: the file's added tokens marked special, or
  // SentencePiece's control and unknown pieces.
  virtual bool IsSpecial(int32_t id) const = 0;

  // The beginning- and end-of-sequence tokens, where the model's files name them
  // (tokenizer_config.json's bos_token / eos_token, or the SentencePiece model's).
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }

  // 16 hex digits that change whenever the tokenizer's files change: a cache of ids made
  // with this tokenizer is keyed by it.
  const std::string& hash() const { return hash_; }

 protected:
  void set_bos_id(std::optional<int32_t> id) { bos_id_ = id; }
  void set_eos_id(std::optional<int32_t> id) { eos_id_ = id; }
  // Sets hash() from the contents of the files the tokenizer was loaded from.
  void set_hash_of(std::initializer_list<absl::string_view> file_contents);

 private:
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::string hash_;
};

// The byte offset of the first byte of `text` that is not part of well-formed UTF-8, or
// nullopt when all of it is.
std::optional<size_t> FirstInvalidUtf8(absl::string_view text);

// OK when `text` is valid UTF-8, else InvalidArgument naming the first ill-formed byte.
absl::Status CheckUtf8(absl::string_view text);

// `text` with each maximal ill-formed subsequence replaced by U+FFFD (Unicode's recommended
// practice, which Python's `bytes.decode("utf-8", errors="replace")` and Rust's
// `String::from_utf8_lossy` follow): what a Hugging Face tokenizer is given for such bytes.
std::string ReplaceInvalidUtf8(absl::string_view text);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_TOKENIZER_H_
