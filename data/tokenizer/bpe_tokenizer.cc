#include "data/tokenizer/bpe_tokenizer.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/json.h"
#include "base/status.h"
#include "data/tokenizer/bpe_merge.h"
#include "data/tokenizer/byte_fallback.h"
#include "data/tokenizer/piece_cache.h"
#include "data/tokenizer/unicode_categories.h"
#include "data/tokenizer/unicode_normalization.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex (openai/gpt-2, encoder.py), which Hugging Face's ByteLevel
// pre-tokenizer applies when use_regex is true.
constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Ids above this are refused, so that a corrupt file cannot make the id tables huge; the
// largest vocabularies released are ~260k tokens.
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;

// Normalizer and post-processor Sequences nested deeper than this are refused: the loader walks
// them recursively, and a corrupt file could nest one deep enough to exhaust the stack.
// Hugging Face's tokenizers refuse them too: they parse tokenizer.json with serde_json, whose
// default recursion limit is 128 levels of arrays and objects, two per Sequence.
constexpr int kMaxSequenceDepth = 64;

// Errors about one tokenizer file, as "SOURCE: FIELD: PROBLEM".
class FileErrors {
 public:
  explicit FileErrors(absl::string_view source) : source_(source) {}
  absl::Status Invalid(absl::string_view field, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", field, ": ", problem));
  }
  absl::Status Unsupported(absl::string_view field, absl::string_view problem) const {
    return absl::UnimplementedError(absl::StrCat(source_, ": ", field, ": ", problem));
  }

 private:
  std::string source_;
};

// GPT-2's map from bytes to printable characters (bytes_to_unicode in openai/gpt-2's
// encoder.py): printable Latin-1 bytes map to themselves, the others to U+0100 onwards.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_char;           // UTF-8 of each byte's character
  absl::flat_hash_map<int32_t, uint8_t> char_to_byte;  // code point -> byte
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* const alphabet = [] {
    auto* a = new ByteLevelAlphabet;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int32_t code_point = printable ? b : next++;
      utf8proc_uint8_t buffer[4];
      const utf8proc_ssize_t length = utf8proc_encode_char(code_point, buffer);
      a->byte_to_char[b].assign(reinterpret_cast<const char*>(buffer), length);
      a->char_to_byte[code_point] = static_cast<uint8_t>(b);
    }
    return a;
  }();
  return *alphabet;
}

// The bytes a token decodes to, by the rule of Hugging Face's ByteLevel decoder: each
// character mapped back to its byte when all of them are byte-level characters, else the
// token's own UTF-8 (added tokens such as "<tool call>").
std::string TokenBytes(absl::string_view token) {
  const ByteLevelAlphabet& alphabet = Alphabet();
  std::string bytes;
  const auto* data = reinterpret_cast<const utf8proc_uint8_t*>(token.data());
  for (size_t i = 0; i < token.size();) {
    utf8proc_int32_t code_point;
    const utf8proc_ssize_t length = utf8proc_iterate(data + i, token.size() - i, &code_point);
    if (length <= 0) return std::string(token);
    const auto it = alphabet.char_to_byte.find(code_point);
    if (it == alphabet.char_to_byte.end()) return std::string(token);
    bytes.push_back(static_cast<char>(it->second));
    i += length;
  }
  return bytes;
}

// The byte-level characters of `bytes`: the form in which vocab and merges write tokens.
std::string ByteLevelForm(absl::string_view bytes) {
  const ByteLevelAlphabet& alphabet = Alphabet();
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const unsigned char b : bytes) text += alphabet.byte_to_char[b];
  return text;
}

// Per-thread PCRE2 match state: match data for one match and a JIT stack large enough for
// the look-aheads of the split regexes over long whitespace runs.
class MatchScratch {
 public:
  MatchScratch()
      : data_(pcre2_match_data_create(1, nullptr)),
        context_(pcre2_match_context_create(nullptr)),
        stack_(pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr)) {
    pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* stack_;
};

// A Split pre-tokenizer. With behavior Isolated the text becomes the regex's matches and the
// runs of text between them, each its own piece; with MergedWithPrevious (Gemma's split on
// " ") each match ends the piece before it, with MergedWithNext (Metaspace's) it starts the
// piece after it.
class SplitRegex {
 public:
  enum class Behavior { kIsolated, kMergedWithPrevious, kMergedWithNext };

  static absl::StatusOr<SplitRegex> Compile(absl::string_view pattern, bool literal,
                                            Behavior behavior, const FileErrors& errors,
                                            absl::string_view field) {
    int error_code;
    PCRE2_SIZE error_offset;
    auto compile = [&](absl::string_view text) {
      return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                           PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &error_code,
                           &error_offset, nullptr);
    };
    // Compiled as the file gives it first, so that an error's offset is one into its text.
    pcre2_code* code = compile(pattern);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return errors.Invalid(
          field, absl::StrCat("the regex does not compile at offset ", error_offset, ": ",
                              reinterpret_cast<const char*>(message)));
    }
    if (!literal) {
      pcre2_code_free(code);
      code = compile(WidenToUnicode16(pattern));
      if (code == nullptr) {
        return absl::InternalError(absl::StrCat(
            field, ": the regex compiles, but not once widened to Unicode 16's categories"));
      }
    }
    // Without JIT (a platform PCRE2 has none for) pcre2_match interprets: slower, same result.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return SplitRegex(std::shared_ptr<pcre2_code>(code, pcre2_code_free), behavior);
  }

  // Calls emit(piece), which returns a status, for each non-empty piece of `text`, in
  // order. `text` is valid UTF-8. A search that PCRE2 cannot complete (its JIT stack, then
  // its interpreter's heap, exhausted: a pathological text) is an error, never a piece left
  // unsplit.
  template <typename Emit>
  absl::Status ForEachPiece(absl::string_view text, Emit&& emit) const {
    thread_local MatchScratch scratch;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t done = 0;   // text before this is emitted
    size_t start = 0;  // where the next search starts
    while (start < text.size()) {
      int found = pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                              scratch.data(), scratch.context());
      if (found < 0 && found != PCRE2_ERROR_NOMATCH) {
        found = pcre2_match(code_.get(), subject, text.size(), start,
                            PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.data(), scratch.context());
      }
      if (found == PCRE2_ERROR_NOMATCH) break;
      if (found < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(found, message, sizeof(message));
        return absl::ResourceExhaustedError(
            absl::StrCat("pre-tokenizer: the split regex failed at byte ", start, ": ",
                         reinterpret_cast<const char*>(message)));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data());
      const size_t match_start = ovector[0], match_end = ovector[1];
      if (match_end == match_start) {  // an empty match splits nothing: step one character
        start = match_start + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
          ++start;
        }
        continue;
      }
      switch (behavior_) {
        case Behavior::kIsolated:
          if (match_start > done) {
            PLAIT_RETURN_IF_ERROR(emit(text.substr(done, match_start - done)));
          }
          PLAIT_RETURN_IF_ERROR(emit(text.substr(match_start, match_end - match_start)));
          done = match_end;
          break;
        case Behavior::kMergedWithPrevious:
          PLAIT_RETURN_IF_ERROR(emit(text.substr(done, match_end - done)));
          done = match_end;
          break;
        case Behavior::kMergedWithNext:
          if (match_start > done) {
            PLAIT_RETURN_IF_ERROR(emit(text.substr(done, match_start - done)));
          }
          done = match_start;
          break;
      }
      start = match_end;
    }
    if (done < text.size()) PLAIT_RETURN_IF_ERROR(emit(text.substr(done)));
    return absl::OkStatus();
  }

 private:
  SplitRegex(std::shared_ptr<pcre2_code> code, Behavior behavior)
      : code_(std::move(code)), behavior_(behavior) {}
  std::shared_ptr<pcre2_code> code_;
  Behavior behavior_;
};

struct AddedToken {
  std::string content;
  int32_t id;
};

// Finds added tokens in text, as Hugging Face's added vocabulary does: the leftmost match,
// and of those starting there the longest.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `tokens` in the file's order, which breaks ties between equally long ones.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens) : empty_(tokens.empty()) {
    for (AddedToken& token : tokens) {
      by_first_byte_[static_cast<unsigned char>(token.content[0])].push_back(std::move(token));
    }
    for (std::vector<AddedToken>& candidates : by_first_byte_) {
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const AddedToken& a, const AddedToken& b) {
                         return a.content.size() > b.content.size();
                       });
    }
  }

  // Calls on_text(run) for each run of text between tokens (possibly empty) and
  // on_token(id) for each token, in order.
  template <typename OnText, typename OnToken>
  void Split(absl::string_view text, OnText&& on_text, OnToken&& on_token) const {
    size_t done = 0;
    for (size_t i = 0; !empty_ && i < text.size(); ++i) {
      for (const AddedToken& token : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, token.content.size(), token.content) != 0) continue;
        on_text(text.substr(done, i - done));
        on_token(token.id);
        done = i + token.content.size();
        i = done - 1;
        break;
      }
    }
    on_text(text.substr(done));
  }

 private:
  std::array<std::vector<AddedToken>, 256> by_first_byte_;
  bool empty_ = true;
};

// One normalizer of the file's: a Unicode normalization form, or Prepend or Replace (with a
// String pattern), which SentencePiece-style files use to write spaces as "▁".
struct NormalizerStep {
  enum class Kind { kForm, kPrepend, kReplace };
  Kind kind;
  NormalizationForm form = NormalizationForm::kNfc;  // kForm
  std::string pattern;          // kReplace: what is replaced
  std::string content;          // kPrepend: what is prepended; kReplace: the replacement
};

// The Metaspace pre-tokenizer (transformers' non-legacy conversion of Llama-family
// SentencePiece models): spaces become `replacement`, one is prepended to each part
// (kAlways) or to the text's first when no added token comes before it (kFirst), unless the
// part starts with one; with `split` (a Split on `replacement`, MergedWithNext, in splits_)
// each replacement starts a piece.
struct Metaspace {
  enum class Prepend { kAlways, kFirst, kNever };
  std::string replacement;
  Prepend prepend_scheme;
};

// Decoders after Hugging Face's Fuse: Strip(content, start, stop) takes up to `start` copies
// of `content` off the start of the decoded text and up to `stop` off its end.
struct StripDecoder {
  std::string content;
  int64_t start = 0;
  int64_t stop = 0;
};

class BpeTokenizer : public Tokenizer {
 public:
  // An empty tokenizer, to be filled by BpeLoader, whose hash is that of these files.
  BpeTokenizer(absl::string_view tokenizer_json, absl::string_view tokenizer_config_json) {
    set_hash_of({tokenizer_json, tokenizer_config_json});
  }

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(token_bytes_.size()); }
  std::optional<int32_t> TokenToId(absl::string_view token) const override;
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < static_cast<int64_t>(special_.size()) && special_[id];
  }

 private:
  friend class BpeLoader;

  // Applies the normalizers to `text`, into `storage` when they change it.
  absl::string_view Normalize(absl::string_view text, std::string& storage) const;
  // Runs the pre-tokenizer on `part`, a run of normalized text between added tokens that
  // starts the text when `at_start`, and BPE on each of its pieces.
  absl::Status PreTokenize(absl::string_view part, bool at_start, std::vector<int32_t>& ids) const;
  // Runs the pre-tokenizer's splits from `level` on, and BPE on each final piece.
  absl::Status PreTokenizeAndMerge(absl::string_view text, size_t level,
                                   std::vector<int32_t>& ids) const;
  // BPE of one piece, appended to `ids`.
  void Merge(absl::string_view piece, std::vector<int32_t>& ids) const;
  void MergeUncached(absl::string_view piece, std::vector<int32_t>& ids) const;
  // The ids BPE starts merging `piece` from: one per byte for a byte-level vocabulary; with
  // byte fallback, one per character, or its bytes' <0xNN> tokens for a character that is no
  // token (Hugging Face's BPE::merge_word).
  std::vector<int32_t> InitialIds(absl::string_view piece) const;

  std::vector<NormalizerStep> normalizers_;
  std::optional<Metaspace> metaspace_;
  std::vector<SplitRegex> splits_;
  AddedTokenMatcher raw_added_;                      // added tokens with normalized=false
  AddedTokenMatcher normalized_added_;               // the others
  absl::flat_hash_map<std::string, int32_t> vocab_;  // token as model.vocab writes it -> id
  absl::flat_hash_map<std::string, int32_t> added_;  // added token content -> id
  MergeTable merges_;
  std::array<int32_t, 256> byte_ids_{};  // the byte-level characters' or the <0xNN> tokens
  bool byte_fallback_ = false;  // SentencePiece-style: text in the vocabulary, <0xNN> bytes
  bool ignore_merges_ = false;
  std::vector<int32_t> prefix_ids_;       // what the post-processor adds before the text
  std::vector<int32_t> suffix_ids_;       // and after it
  std::vector<std::string> token_bytes_;  // id -> bytes, as the decoder writes the token
  std::optional<StripDecoder> strip_;
  std::vector<bool> is_token_;            // id -> whether any token has it
  std::vector<bool> special_;
  PieceCache cache_;
};

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(absl::string_view text,
                                                          bool add_special_tokens) const {
  PLAIT_RETURN_IF_ERROR(CheckUtf8(text));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  if (add_special_tokens) ids = prefix_ids_;
  const auto add_token = [&](int32_t id) { ids.push_back(id); };
  std::string storage;
  absl::Status status;
  raw_added_.Split(
      text,
      [&](absl::string_view run) {
        if (run.empty()) return;
        const absl::string_view normalized = Normalize(run, storage);
        normalized_added_.Split(
            normalized,
            [&](absl::string_view part) {
              if (part.empty() || !status.ok()) return;
              // Where the text starts (no added token before it), Metaspace's "first" prepends.
              const bool at_start = run.data() == text.data() && part.data() == normalized.data();
              status = PreTokenize(part, at_start, ids);
            },
            add_token);
      },
      add_token);
  PLAIT_RETURN_IF_ERROR(status);
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

absl::string_view BpeTokenizer::Normalize(absl::string_view text, std::string& storage) const {
  for (const NormalizerStep& step : normalizers_) {
    std::string next;
    switch (step.kind) {
      case NormalizerStep::Kind::kForm: {
        // ASCII is the same in every normalization form.
        if (std::none_of(text.begin(), text.end(), [](char c) { return c & 0x80; })) continue;
        next = NormalizeAsTokenizers(text, step.form);
        break;
      }
      case NormalizerStep::Kind::kPrepend:
        // Hugging Face's Prepend leaves an empty text empty.
        if (text.empty()) continue;
        next = absl::StrCat(step.content, text);
        break;
      case NormalizerStep::Kind::kReplace:
        next = absl::StrReplaceAll(text, {{step.pattern, step.content}});
        break;
    }
    storage = std::move(next);
    text = storage;
  }
  return text;
}

absl::Status BpeTokenizer::PreTokenize(absl::string_view part, bool at_start,
                                       std::vector<int32_t>& ids) const {
  if (!metaspace_) return PreTokenizeAndMerge(part, 0, ids);
  std::string replaced = absl::StrReplaceAll(part, {{" ", metaspace_->replacement}});
  // Hugging Face's Metaspace prepends no second replacement to a part that starts with one.
  const bool prepend = metaspace_->prepend_scheme == Metaspace::Prepend::kAlways ||
                       (metaspace_->prepend_scheme == Metaspace::Prepend::kFirst && at_start);
  if (prepend && !absl::StartsWith(replaced, metaspace_->replacement)) {
    replaced.insert(0, metaspace_->replacement);
  }
  return PreTokenizeAndMerge(replaced, 0, ids);
}

absl::Status BpeTokenizer::PreTokenizeAndMerge(absl::string_view text, size_t level,
                                               std::vector<int32_t>& ids) const {
  if (level == splits_.size()) {
    Merge(text, ids);
    return absl::OkStatus();
  }
  return splits_[level].ForEachPiece(
      text, [&](absl::string_view piece) { return PreTokenizeAndMerge(piece, level + 1, ids); });
}

void BpeTokenizer::Merge(absl::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() == 1 && !byte_fallback_) {
    ids.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  cache_.AppendOrMerge(piece, ids, [this](absl::string_view piece, std::vector<int32_t>& ids) {
    MergeUncached(piece, ids);
  });
}

std::vector<int32_t> BpeTokenizer::InitialIds(absl::string_view piece) const {
  std::vector<int32_t> initial;
  initial.reserve(piece.size());
  if (!byte_fallback_) {
    for (const unsigned char b : piece) initial.push_back(byte_ids_[b]);
    return initial;
  }
  for (size_t i = 0; i < piece.size();) {
    const absl::string_view character = piece.substr(i, Utf8CharLength(piece[i]));
    if (const auto it = vocab_.find(character); it != vocab_.end()) {
      initial.push_back(it->second);
    } else {
      for (const unsigned char b : character) initial.push_back(byte_ids_[b]);
    }
    i += character.size();
  }
  return initial;
}

void BpeTokenizer::MergeUncached(absl::string_view piece, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    const auto it = vocab_.find(byte_fallback_ ? std::string(piece) : ByteLevelForm(piece));
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  merges_.Merge(InitialIds(piece), ids);
}

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !is_token_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ids[", i, "]: ", id, " is not a token of this tokenizer (", vocab_size(), " ids)"));
    }
    bytes += token_bytes_[id];
  }
  if (strip_) {
    absl::string_view text = bytes;
    int64_t stripped = 0;
    while (stripped < strip_->start && absl::ConsumePrefix(&text, strip_->content)) ++stripped;
    stripped = 0;
    while (stripped < strip_->stop && absl::ConsumeSuffix(&text, strip_->content)) ++stripped;
    return std::string(text);
  }
  return bytes;
}

std::optional<int32_t> BpeTokenizer::TokenToId(absl::string_view token) const {
  if (const auto it = added_.find(token); it != added_.end()) return it->second;
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

// Reads a tokenizer.json into a BpeTokenizer, one section at a time.
// model.vocab's entries, in the file's order.
using VocabEntries = std::vector<std::pair<std::string, json>>;

// tokenizer.json read as JSON except model.vocab, whose entries are listed as they come
// instead of built into a JSON object: the vocabulary is most of a file (151,643 entries of
// Qwen3's), and inserting each into nlohmann's std::map, walking it, then freeing it made
// loading slower than Hugging Face's. The file's model.vocab is then an empty object.
class TokenizerJsonReader final : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonReader(json& file) : dom_(file) {}

  // model.vocab's entries, when it was an object at model.vocab of a top-level object.
  std::optional<VocabEntries>& vocab() { return vocab_; }

  bool null() override { return in_vocab_ ? AddEntry(nullptr) : dom_.null(); }
  bool boolean(bool value) override { return in_vocab_ ? AddEntry(value) : dom_.boolean(value); }
  bool number_integer(number_integer_t value) override {
    return in_vocab_ ? AddEntry(value) : dom_.number_integer(value);
  }
  bool number_unsigned(number_unsigned_t value) override {
    return in_vocab_ ? AddEntry(value) : dom_.number_unsigned(value);
  }
  bool number_float(number_float_t value, const string_t& text) override {
    return in_vocab_ ? AddEntry(value) : dom_.number_float(value, text);
  }
  bool string(string_t& value) override {
    return in_vocab_ ? AddEntry(std::move(value)) : dom_.string(value);
  }
  bool binary(binary_t& value) override {
    return in_vocab_ ? AddEntry(std::move(value)) : dom_.binary(value);
  }

  bool key(string_t& key) override {
    if (in_vocab_) {
      if (skipped_depth_ == 0) pending_key_ = std::move(key);
      return true;
    }
    open_.back().key = key;
    return dom_.key(key);
  }

  bool start_object(std::size_t size) override { return Start(json::object(), size); }
  bool start_array(std::size_t size) override { return Start(json::array(), size); }
  bool end_object() override { return End(); }
  bool end_array() override { return End(); }

  // Throws the error as its own type (a parse_error names the byte), as nlohmann's parser
  // does when it builds the value itself.
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& error) override {
    if (const auto* parse = dynamic_cast<const json::parse_error*>(&error)) throw *parse;
    return dom_.parse_error(position, last_token, error);
  }

 private:
  // An open container of the JSON being built, and its latest key.
  struct Open {
    bool is_object;
    std::string key;
  };

  // Lists `value` as the pending key's entry of model.vocab, unless it is inside a container
  // that stands for the entry's value.
  bool AddEntry(json value) {
    if (skipped_depth_ == 0) vocab_->emplace_back(std::move(pending_key_), std::move(value));
    return true;
  }

  // A container in model.vocab stands as an empty one (an entry's id must be an integer:
  // the loader names what it got), its contents skipped.
  bool Start(json empty, std::size_t size) {
    if (in_vocab_) {
      AddEntry(std::move(empty));
      ++skipped_depth_;
      return true;
    }
    const bool is_object = empty.is_object();
    if (is_object && open_.size() == 2 && open_[0].is_object && open_[0].key == "model" &&
        open_[1].is_object && open_[1].key == "vocab") {
      in_vocab_ = true;
      vocab_.emplace();
      vocab_->reserve(size == static_cast<std::size_t>(-1) ? 0 : size);
      return dom_.start_object(0);
    }
    open_.push_back({is_object, {}});
    return is_object ? dom_.start_object(size) : dom_.start_array(size);
  }

  bool End() {
    if (in_vocab_) {
      if (skipped_depth_ > 0) {
        --skipped_depth_;
        return true;
      }
      in_vocab_ = false;
      return dom_.end_object();
    }
    const bool is_object = open_.back().is_object;
    open_.pop_back();
    return is_object ? dom_.end_object() : dom_.end_array();
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<Open> open_;
  bool in_vocab_ = false;
  int skipped_depth_ = 0;  // containers open inside an entry of model.vocab
  std::string pending_key_;
  std::optional<VocabEntries> vocab_;
};

class BpeLoader {
 public:
  BpeLoader(absl::string_view source, BpeTokenizer& tokenizer)
      : errors_(source), tokenizer_(tokenizer) {}

  // `file` as TokenizerJsonReader read it, `vocab` its model.vocab's entries.
  absl::Status Load(const json& file, const std::optional<VocabEntries>& vocab,
                    const json& config) {
    if (!file.is_object()) return errors_.Invalid("(top level)", "expected a JSON object");
    for (const char* unsupported : {"truncation", "padding"}) {
      if (file.contains(unsupported) && !file[unsupported].is_null()) {
        return errors_.Unsupported(unsupported,
                                   "is set; plait tokenizes whole texts (set it to null)");
      }
    }
    PLAIT_ASSIGN_OR_RETURN(tokenizer_.byte_fallback_,
                           GetBool(Get(file, "model"), "byte_fallback", "model", /*absent=*/false));
    if (tokenizer_.byte_fallback_ && HasByteLevel(Get(file, "pre_tokenizer"))) {
      return errors_.Unsupported(
          "model.byte_fallback",
          "true with a ByteLevel pre-tokenizer is not supported: byte fallback belongs to "
          "SentencePiece-style vocabularies (\"▁\" for a space, <0xNN> byte tokens), and a "
          "byte-level vocabulary has a token for every byte already");
    }
    PLAIT_RETURN_IF_ERROR(LoadModel(Get(file, "model"), vocab));
    PLAIT_RETURN_IF_ERROR(LoadAddedTokens(Get(file, "added_tokens")));
    PLAIT_RETURN_IF_ERROR(LoadNormalizer(Get(file, "normalizer"), "normalizer", 0));
    PLAIT_RETURN_IF_ERROR(LoadPreTokenizer(Get(file, "pre_tokenizer")));
    PLAIT_RETURN_IF_ERROR(LoadPostProcessor(Get(file, "post_processor"), "post_processor", 0));
    PLAIT_RETURN_IF_ERROR(LoadDecoder(Get(file, "decoder")));
    return LoadConfig(config);
  }

 private:
  // Whether `pre_tokenizer` is ByteLevel or a Sequence holding one.
  static bool HasByteLevel(const json& pre_tokenizer) {
    if (Get(pre_tokenizer, "type") == "ByteLevel") return true;
    const json& list = Get(pre_tokenizer, "pretokenizers");
    return list.is_array() && std::any_of(list.begin(), list.end(), [](const json& step) {
             return Get(step, "type") == "ByteLevel";
           });
  }

  static const json& Get(const json& object, const char* key) {
    static const json* const null_value = new json(nullptr);
    if (!object.is_object()) return *null_value;
    const auto it = object.find(key);
    return it == object.end() ? *null_value : *it;
  }
  static std::string Field(absl::string_view parent, absl::string_view key) {
    return absl::StrCat(parent, ".", key);
  }

  absl::StatusOr<std::string> GetString(const json& object, const char* key,
                                        absl::string_view parent) const {
    const json& value = Get(object, key);
    if (!value.is_string()) {
      return errors_.Invalid(Field(parent, key),
                             absl::StrCat("expected a string, got ", base::DescribeJson(value)));
    }
    return value.get<std::string>();
  }
  // A flag: true or false, `absent` when it is missing or null. Anything else is an error,
  // never read as one of them: Hugging Face refuses such a file.
  absl::StatusOr<bool> GetBool(const json& object, const char* key, absl::string_view parent,
                               bool absent) const {
    const json& value = Get(object, key);
    if (value.is_null()) return absent;
    if (!value.is_boolean()) {
      return errors_.Invalid(Field(parent, key), absl::StrCat("expected true or false, got ",
                                                              base::DescribeJson(value)));
    }
    return value.get<bool>();
  }
  // A flag that must be false (or absent) because plait does not implement it.
  absl::Status RequireFalse(const json& object, const char* key, absl::string_view parent,
                            absl::string_view why) const {
    const json& value = Get(object, key);
    if (value.is_null() || value == false) return absl::OkStatus();
    return errors_.Unsupported(Field(parent, key),
                               absl::StrCat(base::DescribeJson(value), " is not supported; ", why));
  }
  absl::Status RequireEmpty(const json& object, const char* key, absl::string_view parent) const {
    const json& value = Get(object, key);
    if (value.is_null() || value == "") return absl::OkStatus();
    return errors_.Unsupported(
        Field(parent, key),
        absl::StrCat(
            base::DescribeJson(value),
            " is not supported (neither byte-level BPE nor BPE with byte fallback has one)"));
  }
  absl::Status UnsupportedType(absl::string_view field, const json& value,
                               absl::string_view supported) const {
    return errors_.Unsupported(Field(field, "type"),
                               absl::StrCat(base::DescribeJson(Get(value, "type")),
                                            " is not supported (supported: ", supported, ")"));
  }
  // Records `token` as what `id` is written as; LoadDecoder turns it into what it decodes to.
  absl::Status AddId(int64_t id, std::string token, absl::string_view field) {
    if (id < 0 || id > kMaxId) {
      return errors_.Invalid(field, absl::StrCat("id ", id, " is out of range 0..", kMaxId));
    }
    if (id >= static_cast<int64_t>(tokenizer_.token_bytes_.size())) {
      tokenizer_.token_bytes_.resize(id + 1);
      tokenizer_.is_token_.resize(id + 1, false);
      tokenizer_.special_.resize(id + 1, false);
    }
    tokenizer_.token_bytes_[id] = std::move(token);
    tokenizer_.is_token_[id] = true;
    return absl::OkStatus();
  }

  absl::Status LoadModel(const json& model, const std::optional<VocabEntries>& vocab) {
    const std::string type =
        Get(model, "type").is_string() ? Get(model, "type").get<std::string>() : "";
    if (type != "BPE") {
      return UnsupportedType("model", model, "BPE, byte-level or with byte_fallback");
    }
    if (!Get(model, "dropout").is_null()) {
      return errors_.Unsupported("model.dropout",
                                 absl::StrCat(base::DescribeJson(Get(model, "dropout")),
                                              " is not supported (BPE dropout is for training)"));
    }
    PLAIT_RETURN_IF_ERROR(RequireEmpty(model, "continuing_subword_prefix", "model"));
    PLAIT_RETURN_IF_ERROR(RequireEmpty(model, "end_of_word_suffix", "model"));
    PLAIT_ASSIGN_OR_RETURN(tokenizer_.ignore_merges_,
                           GetBool(model, "ignore_merges", "model", /*absent=*/false));

    if (!vocab) {
      return errors_.Invalid("model.vocab", absl::StrCat("expected an object of token: id, got ",
                                                         base::DescribeJson(Get(model, "vocab"))));
    }
    // The vocabulary comes before any other id (LoadAddedTokens), so an id already a token is
    // one the vocabulary gives twice.
    tokenizer_.vocab_.reserve(vocab->size());
    tokenizer_.token_bytes_.reserve(vocab->size());
    for (const auto& [token, id] : *vocab) {
      const auto field = [&token = token] { return absl::StrCat("model.vocab[\"", token, "\"]"); };
      if (!id.is_number_integer()) {
        return errors_.Invalid(
            field(), absl::StrCat("expected an integer id, got ", base::DescribeJson(id)));
      }
      const int64_t value = id.get<int64_t>();
      // JSON objects keep a repeated key's last value; the same entry twice means no more
      // than once, two ids for one token are refused.
      if (const auto repeated = tokenizer_.vocab_.find(token);
          repeated != tokenizer_.vocab_.end()) {
        if (repeated->second == value) continue;
        return errors_.Invalid(field(), absl::StrCat("appears twice in model.vocab, with ids ",
                                                     repeated->second, " and ", value));
      }
      if (value >= 0 && value < static_cast<int64_t>(tokenizer_.is_token_.size()) &&
          tokenizer_.is_token_[value]) {
        return errors_.Invalid(field(), absl::StrCat("id ", value, " is also the id of \"",
                                                     tokenizer_.token_bytes_[value], "\""));
      }
      PLAIT_RETURN_IF_ERROR(AddId(value, token, field()));
      tokenizer_.vocab_.emplace(token, static_cast<int32_t>(value));
    }
    // Hugging Face falls back to the unknown token for a character whose bytes lack a token;
    // plait needs every byte's, so that every text has ids without one.
    if (tokenizer_.byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        const std::string name = ByteFallbackToken(b);
        const auto it = tokenizer_.vocab_.find(name);
        if (it == tokenizer_.vocab_.end()) {
          return errors_.Invalid("model.vocab",
                                 absl::StrCat("has no token \"", name,
                                              "\"; with byte_fallback plait needs one for each "
                                              "of the 256 bytes, as SentencePiece writes them"));
        }
        tokenizer_.byte_ids_[b] = it->second;
      }
      return LoadMerges(Get(model, "merges"));
    }
    for (int b = 0; b < 256; ++b) {
      const std::string& character = Alphabet().byte_to_char[b];
      const auto it = tokenizer_.vocab_.find(character);
      if (it == tokenizer_.vocab_.end()) {
        return errors_.Invalid("model.vocab",
                               absl::StrFormat("has no token \"%s\" for byte 0x%02x; a byte-level "
                                               "BPE vocabulary has one for each of the 256 bytes",
                                               character, b));
      }
      tokenizer_.byte_ids_[b] = it->second;
    }
    return LoadMerges(Get(model, "merges"));
  }

  absl::Status LoadMerges(const json& merges) {
    if (!merges.is_array()) {
      return errors_.Invalid("model.merges",
                             absl::StrCat("expected an array, got ", base::DescribeJson(merges)));
    }
    tokenizer_.merges_.Reserve(merges.size());
    std::string merged;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& merge = merges[rank];
      const auto field = [rank] { return absl::StrCat("model.merges[", rank, "]"); };
      absl::string_view left, right;
      if (merge.is_string()) {  // "a b"
        const std::string& text = merge.get_ref<const std::string&>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
          return errors_.Invalid(field(), absl::StrCat(merge.dump(),
                                                       " is not two tokens "
                                                       "separated by a space"));
        }
        left = absl::string_view(text).substr(0, space);
        right = absl::string_view(text).substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {  // ["a", "b"]
        left = merge[0].get_ref<const std::string&>();
        right = merge[1].get_ref<const std::string&>();
      } else {
        return errors_.Invalid(field(), absl::StrCat("expected \"a b\" or [\"a\", \"b\"], got ",
                                                     base::DescribeJson(merge)));
      }
      merged.assign(left.data(), left.size());
      merged.append(right.data(), right.size());
      int32_t ids[3];
      const absl::string_view names[3] = {left, right, merged};
      for (int k = 0; k < 3; ++k) {
        const auto it = tokenizer_.vocab_.find(names[k]);
        if (it == tokenizer_.vocab_.end()) {
          return errors_.Invalid(
              field(), absl::StrCat("names \"", names[k], "\", which is not in model.vocab"));
        }
        ids[k] = it->second;
      }
      tokenizer_.merges_.Add(ids[0], ids[1], static_cast<int32_t>(rank), ids[2]);
    }
    return absl::OkStatus();
  }

  absl::Status LoadAddedTokens(const json& added_tokens) {
    if (added_tokens.is_null()) return absl::OkStatus();
    if (!added_tokens.is_array()) {
      return errors_.Invalid("added_tokens", absl::StrCat("expected an array, got ",
                                                          base::DescribeJson(added_tokens)));
    }
    std::vector<AddedToken> raw, normalized_text;
    for (size_t i = 0; i < added_tokens.size(); ++i) {
      const json& token = added_tokens[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      PLAIT_ASSIGN_OR_RETURN(std::string content, GetString(token, "content", field));
      if (content.empty()) return errors_.Invalid(Field(field, "content"), "is empty");
      const json& id = Get(token, "id");
      if (!id.is_number_integer()) {
        return errors_.Invalid(Field(field, "id"),
                               absl::StrCat("expected an integer, got ", base::DescribeJson(id)));
      }
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        PLAIT_RETURN_IF_ERROR(
            RequireFalse(token, flag, field, "added tokens are matched exactly as written"));
      }
      PLAIT_RETURN_IF_ERROR(AddId(id.get<int64_t>(), content, Field(field, "id")));
      const AddedToken added{content, id.get<int32_t>()};
      tokenizer_.added_[content] = added.id;
      PLAIT_ASSIGN_OR_RETURN(const bool special,
                             GetBool(token, "special", field, /*absent=*/false));
      PLAIT_ASSIGN_OR_RETURN(const bool normalized,
                             GetBool(token, "normalized", field, /*absent=*/false));
      tokenizer_.special_[added.id] = special;
      // Hugging Face matches tokens with normalized=false on the raw text.
      (normalized ? normalized_text : raw).push_back(added);
    }
    tokenizer_.raw_added_ = AddedTokenMatcher(std::move(raw));
    tokenizer_.normalized_added_ = AddedTokenMatcher(std::move(normalized_text));
    return absl::OkStatus();
  }

  // The error for a Sequence at `field` inside kMaxSequenceDepth others.
  absl::Status TooDeep(const std::string& field) const {
    return errors_.Invalid(field, absl::StrCat("a Sequence nested in ", kMaxSequenceDepth,
                                               " others; Hugging Face's tokenizers refuse a file "
                                               "nested this deep too"));
  }

  // `normalizer` at `field`, inside `depth` Sequences.
  absl::Status LoadNormalizer(const json& normalizer, const std::string& field, int depth) {
    if (normalizer.is_null()) return absl::OkStatus();
    const json& type = Get(normalizer, "type");
    if (type == "Sequence") {
      if (depth == kMaxSequenceDepth) return TooDeep(field);
      const json& list = Get(normalizer, "normalizers");
      if (!list.is_array()) {
        return errors_.Invalid(Field(field, "normalizers"), "expected an array");
      }
      for (size_t i = 0; i < list.size(); ++i) {
        PLAIT_RETURN_IF_ERROR(
            LoadNormalizer(list[i], absl::StrCat(field, ".normalizers[", i, "]"), depth + 1));
      }
      return absl::OkStatus();
    }
    static const auto* const forms = new std::vector<std::pair<std::string, NormalizationForm>>{
        {"NFC", NormalizationForm::kNfc},
        {"NFD", NormalizationForm::kNfd},
        {"NFKC", NormalizationForm::kNfkc},
        {"NFKD", NormalizationForm::kNfkd},
    };
    for (const auto& [name, form] : *forms) {
      if (type == name) {
        tokenizer_.normalizers_.push_back({NormalizerStep::Kind::kForm, form});
        return absl::OkStatus();
      }
    }
    if (type == "Prepend") {
      PLAIT_ASSIGN_OR_RETURN(std::string prepend, GetString(normalizer, "prepend", field));
      tokenizer_.normalizers_.push_back({NormalizerStep::Kind::kPrepend, {}, "", prepend});
      return absl::OkStatus();
    }
    if (type == "Replace") {
      PLAIT_ASSIGN_OR_RETURN(ReplaceStep replace, LoadReplace(normalizer, field));
      tokenizer_.normalizers_.push_back(
          {NormalizerStep::Kind::kReplace, {}, replace.pattern, replace.content});
      return absl::OkStatus();
    }
    return UnsupportedType(field, normalizer, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
  }

  struct ReplaceStep {
    std::string pattern;
    std::string content;
  };
  // A Replace normalizer or decoder at `field`: a String pattern (SentencePiece-style files
  // replace " " by "▁" and back); a Regex pattern is not supported.
  absl::StatusOr<ReplaceStep> LoadReplace(const json& replace, const std::string& field) const {
    const json& pattern = Get(replace, "pattern");
    if (!Get(pattern, "String").is_string()) {
      return errors_.Unsupported(Field(field, "pattern"),
                                 absl::StrCat(base::DescribeJson(pattern),
                                              " is not supported (supported: {\"String\": ...})"));
    }
    ReplaceStep step;
    step.pattern = Get(pattern, "String").get<std::string>();
    if (step.pattern.empty()) {
      return errors_.Invalid(Field(Field(field, "pattern"), "String"), "is empty");
    }
    PLAIT_ASSIGN_OR_RETURN(step.content, GetString(replace, "content", field));
    return step;
  }

  absl::Status LoadPreTokenizer(const json& pre_tokenizer) {
    if (tokenizer_.byte_fallback_) return LoadSentencePiecePreTokenizer(pre_tokenizer);
    const json& type = Get(pre_tokenizer, "type");
    if (type == "ByteLevel") return LoadByteLevel(pre_tokenizer, "pre_tokenizer");
    if (type != "Sequence") {
      return UnsupportedType("pre_tokenizer", pre_tokenizer,
                             "ByteLevel, or a Sequence of Split ending in ByteLevel");
    }
    const json& list = Get(pre_tokenizer, "pretokenizers");
    if (!list.is_array() || list.empty()) {
      return errors_.Invalid("pre_tokenizer.pretokenizers", "expected a non-empty array");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = absl::StrCat("pre_tokenizer.pretokenizers[", i, "]");
      const json& step = list[i];
      const bool last = i + 1 == list.size();
      if (last && Get(step, "type") == "ByteLevel") return LoadByteLevel(step, field);
      if (Get(step, "type") != "Split") {
        return UnsupportedType(field, step,
                               last ? "ByteLevel as the last step" : "Split before ByteLevel");
      }
      PLAIT_RETURN_IF_ERROR(LoadSplit(step, field));
    }
    return errors_.Unsupported(
        "pre_tokenizer.pretokenizers",
        "does not end in ByteLevel, which a BPE without byte_fallback needs");
  }

  // With byte fallback either the normalizer writes spaces as "▁" and the pre-tokenizer is
  // none (Llama 2's, Mistral's legacy files), a Split (Gemma's, on " ", which then splits
  // nothing) or a Sequence of Splits; or the pre-tokenizer is Metaspace (transformers'
  // non-legacy conversion).
  absl::Status LoadSentencePiecePreTokenizer(const json& pre_tokenizer) {
    if (pre_tokenizer.is_null()) return absl::OkStatus();
    const json& type = Get(pre_tokenizer, "type");
    if (type == "Split") return LoadSplit(pre_tokenizer, "pre_tokenizer");
    if (type == "Metaspace") return LoadMetaspace(pre_tokenizer);
    if (type != "Sequence") {
      return UnsupportedType("pre_tokenizer", pre_tokenizer,
                             "with byte_fallback: none, Metaspace, Split, or a Sequence of Split");
    }
    const json& list = Get(pre_tokenizer, "pretokenizers");
    if (!list.is_array()) {
      return errors_.Invalid("pre_tokenizer.pretokenizers", "expected an array");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = absl::StrCat("pre_tokenizer.pretokenizers[", i, "]");
      if (Get(list[i], "type") != "Split") {
        return UnsupportedType(field, list[i], "with byte_fallback: Split");
      }
      PLAIT_RETURN_IF_ERROR(LoadSplit(list[i], field));
    }
    return absl::OkStatus();
  }

  absl::Status LoadMetaspace(const json& metaspace) {
    const std::string field = "pre_tokenizer";
    Metaspace loaded;
    PLAIT_ASSIGN_OR_RETURN(loaded.replacement, GetString(metaspace, "replacement", field));
    if (loaded.replacement.empty() ||
        loaded.replacement.size() != static_cast<size_t>(Utf8CharLength(loaded.replacement[0]))) {
      return errors_.Invalid(Field(field, "replacement"), "expected one character");
    }
    // As Hugging Face reads it: without prepend_scheme (older files write add_prefix_space
    // instead) the scheme is "always"; add_prefix_space false goes only with "never".
    const json& scheme =
        metaspace.contains("prepend_scheme") ? Get(metaspace, "prepend_scheme") : json("always");
    PLAIT_ASSIGN_OR_RETURN(const bool add_prefix_space,
                           GetBool(metaspace, "add_prefix_space", field, /*absent=*/true));
    if (!add_prefix_space && scheme != "never") {
      return errors_.Invalid(
          Field(field, "add_prefix_space"),
          absl::StrCat("false does not match prepend_scheme ", base::DescribeJson(scheme),
                       " (Hugging Face refuses this file too)"));
    }
    if (scheme == "always") {
      loaded.prepend_scheme = Metaspace::Prepend::kAlways;
    } else if (scheme == "first") {
      loaded.prepend_scheme = Metaspace::Prepend::kFirst;
    } else if (scheme == "never") {
      loaded.prepend_scheme = Metaspace::Prepend::kNever;
    } else {
      return errors_.Unsupported(Field(field, "prepend_scheme"),
                                 absl::StrCat(base::DescribeJson(scheme),
                                              " is not supported (supported: \"always\", "
                                              "\"first\", \"never\")"));
    }
    // Hugging Face's default is true.
    PLAIT_ASSIGN_OR_RETURN(const bool split, GetBool(metaspace, "split", field, /*absent=*/true));
    if (split) {
      PLAIT_ASSIGN_OR_RETURN(
          SplitRegex regex,
          SplitRegex::Compile(loaded.replacement, /*literal=*/true,
                              SplitRegex::Behavior::kMergedWithNext, errors_, field));
      tokenizer_.splits_.push_back(std::move(regex));
    }
    tokenizer_.metaspace_ = std::move(loaded);
    return absl::OkStatus();
  }

  absl::Status LoadSplit(const json& split, const std::string& field) {
    const json& behavior_name = Get(split, "behavior");
    SplitRegex::Behavior behavior;
    if (behavior_name == "Isolated") {
      behavior = SplitRegex::Behavior::kIsolated;
    } else if (behavior_name == "MergedWithPrevious") {
      behavior = SplitRegex::Behavior::kMergedWithPrevious;
    } else if (behavior_name == "MergedWithNext") {
      behavior = SplitRegex::Behavior::kMergedWithNext;
    } else {
      return errors_.Unsupported(Field(field, "behavior"),
                                 absl::StrCat(base::DescribeJson(behavior_name),
                                              " is not supported (supported: \"Isolated\", "
                                              "\"MergedWithPrevious\", \"MergedWithNext\")"));
    }
    PLAIT_RETURN_IF_ERROR(RequireFalse(split, "invert", field, "only matches are split off"));
    const json& pattern = Get(split, "pattern");
    const bool literal = Get(pattern, "String").is_string();
    const std::string key = literal ? "String" : "Regex";
    PLAIT_ASSIGN_OR_RETURN(std::string text,
                           GetString(pattern, key.c_str(), Field(field, "pattern")));
    PLAIT_ASSIGN_OR_RETURN(
        SplitRegex regex,
        SplitRegex::Compile(text, literal, behavior, errors_, Field(Field(field, "pattern"), key)));
    tokenizer_.splits_.push_back(std::move(regex));
    return absl::OkStatus();
  }

  absl::Status LoadByteLevel(const json& byte_level, const std::string& field) {
    PLAIT_RETURN_IF_ERROR(RequireFalse(byte_level, "add_prefix_space", field,
                                       "no released byte-level tokenizer adds one"));
    // Hugging Face's default is true.
    PLAIT_ASSIGN_OR_RETURN(const bool use_regex,
                           GetBool(byte_level, "use_regex", field, /*absent=*/true));
    if (use_regex) {
      PLAIT_ASSIGN_OR_RETURN(SplitRegex regex,
                             SplitRegex::Compile(kGpt2Pattern, false,
                                                 SplitRegex::Behavior::kIsolated, errors_, field));
      tokenizer_.splits_.push_back(std::move(regex));
    }
    return absl::OkStatus();
  }

  // `processor` at `field`, inside `depth` Sequences.
  absl::Status LoadPostProcessor(const json& processor, const std::string& field, int depth) {
    if (processor.is_null()) return absl::OkStatus();
    const json& type = Get(processor, "type");
    if (type == "ByteLevel") return absl::OkStatus();  // it changes offsets only
    if (type == "Sequence") {
      if (depth == kMaxSequenceDepth) return TooDeep(field);
      const json& list = Get(processor, "processors");
      if (!list.is_array()) return errors_.Invalid(Field(field, "processors"), "expected an array");
      for (size_t i = 0; i < list.size(); ++i) {
        PLAIT_RETURN_IF_ERROR(
            LoadPostProcessor(list[i], absl::StrCat(field, ".processors[", i, "]"), depth + 1));
      }
      return absl::OkStatus();
    }
    if (type != "TemplateProcessing") {
      return UnsupportedType(field, processor, "ByteLevel, TemplateProcessing, Sequence");
    }
    const json& single = Get(processor, "single");
    const json& special_tokens = Get(processor, "special_tokens");
    if (!single.is_array()) return errors_.Invalid(Field(field, "single"), "expected an array");
    bool after_text = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string piece_field = absl::StrCat(field, ".single[", i, "]");
      if (Get(single[i], "Sequence").is_object()) {
        after_text = true;
        continue;
      }
      PLAIT_ASSIGN_OR_RETURN(std::string name, GetString(Get(single[i], "SpecialToken"), "id",
                                                         Field(piece_field, "SpecialToken")));
      const json& ids = Get(Get(special_tokens, name.c_str()), "ids");
      if (!ids.is_array()) {
        return errors_.Invalid(piece_field, absl::StrCat("names \"", name, "\", which ", field,
                                                         ".special_tokens does not list"));
      }
      for (const json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= static_cast<int64_t>(tokenizer_.token_bytes_.size()) ||
            !tokenizer_.is_token_[id.get<int64_t>()]) {
          return errors_.Invalid(
              Field(Field(Field(field, "special_tokens"), name), "ids"),
              absl::StrCat(base::DescribeJson(id), " is not a token of this tokenizer"));
        }
        (after_text ? tokenizer_.suffix_ids_ : tokenizer_.prefix_ids_).push_back(id.get<int32_t>());
      }
    }
    return absl::OkStatus();
  }

  // Turns each token into the bytes it decodes to, by the file's decoder.
  absl::Status LoadDecoder(const json& decoder) {
    if (tokenizer_.byte_fallback_) return LoadSentencePieceDecoder(decoder);
    if (Get(decoder, "type") != "ByteLevel") {
      return UnsupportedType("decoder", decoder, "ByteLevel, for a BPE without byte_fallback");
    }
    for (std::string& token : tokenizer_.token_bytes_) token = TokenBytes(token);
    return absl::OkStatus();
  }

  // Llama 2's and Mistral's decoder, Sequence[Replace("▁", " "), ByteFallback, Fuse,
  // Strip(" ", 1, 0)], and Gemma's, the same without Strip. Each token is decoded alone up to
  // Fuse, which joins them; only Strip may follow. ByteFallback's tokens give their bytes: a
  // Tokenizer decodes to bytes, where Hugging Face writes U+FFFD for bytes that are not UTF-8.
  absl::Status LoadSentencePieceDecoder(const json& decoder) {
    const json& list = Get(decoder, "decoders");
    if (Get(decoder, "type") != "Sequence" || !list.is_array()) {
      return UnsupportedType("decoder", decoder,
                             "with byte_fallback: a Sequence of Replace, ByteFallback, Fuse and "
                             "Strip (Metaspace is not supported)");
    }
    std::vector<std::optional<ReplaceStep>> per_token;  // before Fuse; nullopt: ByteFallback
    bool fused = false;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = absl::StrCat("decoder.decoders[", i, "]");
      const json& step = list[i];
      const json& type = Get(step, "type");
      if (type == "Fuse") {
        fused = true;
      } else if (!fused && type == "Replace") {
        PLAIT_ASSIGN_OR_RETURN(ReplaceStep replace, LoadReplace(step, field));
        per_token.push_back(std::move(replace));
      } else if (!fused && type == "ByteFallback") {
        per_token.push_back(std::nullopt);
      } else if (fused && type == "Strip" && !tokenizer_.strip_) {
        PLAIT_ASSIGN_OR_RETURN(tokenizer_.strip_, LoadStrip(step, field));
      } else {
        return UnsupportedType(
            field, step, fused ? "after Fuse: one Strip" : "before Fuse: Replace, ByteFallback");
      }
    }
    for (std::string& token : tokenizer_.token_bytes_) {
      for (const std::optional<ReplaceStep>& step : per_token) {
        if (step) {
          token = absl::StrReplaceAll(token, {{step->pattern, step->content}});
        } else if (const std::optional<uint8_t> byte = ByteFallbackValue(token)) {
          token = std::string(1, static_cast<char>(*byte));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<StripDecoder> LoadStrip(const json& strip, const std::string& field) const {
    StripDecoder decoder;
    PLAIT_ASSIGN_OR_RETURN(decoder.content, GetString(strip, "content", field));
    if (decoder.content.empty() ||
        decoder.content.size() != static_cast<size_t>(Utf8CharLength(decoder.content[0]))) {
      return errors_.Invalid(Field(field, "content"), "expected one character");
    }
    for (const auto& [key, count] :
         {std::pair<const char*, int64_t*>{"start", &decoder.start}, {"stop", &decoder.stop}}) {
      const json& value = Get(strip, key);
      if (!value.is_number_unsigned()) {
        return errors_.Invalid(Field(field, key),
                               absl::StrCat("expected a count, got ", base::DescribeJson(value)));
      }
      *count = value.get<int64_t>();
    }
    return decoder;
  }

  absl::Status LoadConfig(const json& config) {
    PLAIT_ASSIGN_OR_RETURN(const std::optional<int32_t> bos, ConfigToken(config, "bos_token"));
    PLAIT_ASSIGN_OR_RETURN(const std::optional<int32_t> eos, ConfigToken(config, "eos_token"));
    tokenizer_.set_bos_id(bos);
    tokenizer_.set_eos_id(eos);
    return absl::OkStatus();
  }

  // The id of tokenizer_config.json's `key` (bos_token, eos_token): a token's content, an
  // object with a "content", or null.
  absl::StatusOr<std::optional<int32_t>> ConfigToken(const json& config, const char* key) const {
    const json& value = Get(config, key);
    if (value.is_null()) return std::nullopt;
    const json& content = value.is_object() ? Get(value, "content") : value;
    const std::string field = absl::StrCat("tokenizer_config.json: ", key);
    if (!content.is_string()) {
      return errors_.Invalid(field,
                             absl::StrCat("expected a token, got ", base::DescribeJson(content)));
    }
    const std::optional<int32_t> id = tokenizer_.TokenToId(content.get<std::string>());
    if (!id) {
      return errors_.Invalid(field,
                             absl::StrCat(content.dump(), " is not a token of the tokenizer"));
    }
    return id;
  }

  FileErrors errors_;
  BpeTokenizer& tokenizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseBpeTokenizer(
    absl::string_view source, absl::string_view tokenizer_json,
    absl::string_view tokenizer_config_json) {
  json file;
  TokenizerJsonReader reader(file);
  PLAIT_RETURN_IF_ERROR(base::ParseJsonEvents(source, tokenizer_json, reader));
  json config;
  if (!tokenizer_config_json.empty()) {
    const std::string config_source = absl::StrCat(source, " (tokenizer_config.json)");
    PLAIT_ASSIGN_OR_RETURN(config, base::ParseJson(config_source, tokenizer_config_json));
    // Hugging Face's loader refuses anything else too; taking it for "no BOS or EOS" would
    // drop the model's end-of-sequence token silently.
    if (!config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_source, ": expected a JSON object, got ", base::DescribeJson(config)));
    }
  }
  auto tokenizer = std::make_unique<BpeTokenizer>(tokenizer_json, tokenizer_config_json);
  PLAIT_RETURN_IF_ERROR(BpeLoader(source, *tokenizer).Load(file, reader.vocab(), config));
  return tokenizer;
}

}  // namespace plait::data::tokenizer
