#include "data/tokenizer/sentencepiece_tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "data/tokenizer/bpe_merge.h"
#include "data/tokenizer/byte_fallback.h"
#include "data/tokenizer/piece_cache.h"
#include "data/tokenizer/sentencepiece_model.pb.h"

namespace plait::data::tokenizer {
namespace {

using ModelProto = sentencepiece::ModelProto;
using Piece = sentencepiece::ModelProto::SentencePiece;

// SentencePiece's whitespace symbol, U+2581 (src/normalizer.h: kSpaceSymbol).
constexpr absl::string_view kSpaceSymbol = "\xE2\x96\x81";

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(absl::string_view model_bytes) { set_hash_of({model_bytes}); }
  // Not copied: ids_ and scored_ hold views of pieces_.
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  absl::Status Load(absl::string_view source, absl::string_view model_bytes) {
    const auto unsupported = [&](absl::string_view field, absl::string_view problem) {
      return absl::UnimplementedError(absl::StrCat(source, ": ", field, ": ", problem));
    };
    ModelProto model;
    if (!model.ParseFromArray(model_bytes.data(), static_cast<int>(model_bytes.size())) ||
        model.pieces_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": not a SentencePiece model (no pieces could be read)"));
    }
    const auto& trainer = model.trainer_spec();
    const auto& normalizer = model.normalizer_spec();
    if (trainer.model_type() != sentencepiece::TrainerSpec::BPE) {
      return unsupported(
          "trainer_spec.model_type",
          absl::StrCat(sentencepiece::TrainerSpec::ModelType_Name(trainer.model_type()),
                       " is not supported (BPE, as Llama 2's)"));
    }
    if (!trainer.byte_fallback()) {
      return unsupported("trainer_spec.byte_fallback",
                         "false is not supported (Llama 2's is true)");
    }
    if (trainer.treat_whitespace_as_suffix()) {
      return unsupported("trainer_spec.treat_whitespace_as_suffix", "true is not supported");
    }
    if (!normalizer.precompiled_charsmap().empty()) {
      return unsupported("normalizer_spec.precompiled_charsmap",
                         absl::StrCat("normalization rules (\"", normalizer.name(),
                                      "\") are not supported; Llama 2's normalizer is "
                                      "\"identity\""));
    }
    if (normalizer.remove_extra_whitespaces()) {
      return unsupported("normalizer_spec.remove_extra_whitespaces",
                         "true is not supported (Llama 2's is false)");
    }
    add_dummy_prefix_ = normalizer.add_dummy_prefix();
    escape_whitespaces_ = normalizer.escape_whitespaces();
    unk_surface_ = trainer.unk_surface();

    // Reserved whole, so that pieces_ never reallocates: ids_ and scored_ key views into it.
    types_.reserve(model.pieces_size());
    pieces_.reserve(model.pieces_size());
    ids_.reserve(model.pieces_size());
    scored_.reserve(model.pieces_size());
    // What sentencepiece's ModelInterface::InitializePieces refuses is refused here too: a model
    // it will not load must not train here.
    const auto refused = [&](int id, absl::string_view problem) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": pieces[", id, "]: ", problem,
                                                     "; sentencepiece refuses such a model"));
    };
    int unknown_id = -1;
    for (int id = 0; id < model.pieces_size(); ++id) {
      Piece& piece = *model.mutable_pieces(id);
      types_.push_back(piece.type());
      pieces_.push_back(std::move(*piece.mutable_piece()));
      const absl::string_view text = pieces_.back();
      if (text.empty()) return refused(id, "is empty");
      if (const auto [first, added] = ids_.emplace(text, id); !added) {
        return refused(id, absl::StrCat("\"", text, "\" is pieces[", first->second, "] too"));
      }
      switch (piece.type()) {
        case Piece::NORMAL:
          scored_.emplace(text, std::make_pair(id, piece.score()));
          break;
        case Piece::BYTE: {
          const std::optional<uint8_t> byte = ByteFallbackValue(text);
          if (!byte) {
            return absl::InvalidArgumentError(absl::StrCat(
                source, ": pieces[", id, "]: \"", text, "\" is a BYTE piece not written <0xNN>"));
          }
          byte_ids_[*byte] = id;
          break;
        }
        case Piece::CONTROL:
          break;
        case Piece::UNKNOWN:
          if (unknown_id >= 0) {
            return refused(
                id, absl::StrCat("a second UNKNOWN piece (pieces[", unknown_id, "] is one)"));
          }
          unknown_id = id;
          break;
        default:
          return unsupported(
              absl::StrCat("pieces[", id, "].type"),
              absl::StrCat(Piece::Type_Name(piece.type()), " pieces are not supported"));
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (byte_ids_[b] < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: pieces: no <0x%02X> piece, which byte fallback needs", source, b));
      }
    }
    PLAIT_RETURN_IF_ERROR(MakeMerges(source));
    split_at_words_ = !SomePieceSpansWords();
    if (IsControlId(trainer.bos_id())) set_bos_id(trainer.bos_id());
    if (IsControlId(trainer.eos_id())) set_eos_id(trainer.eos_id());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override {
    PLAIT_RETURN_IF_ERROR(CheckUtf8(text));
    std::vector<int32_t> ids;
    if (add_special_tokens && bos_id()) ids.push_back(*bos_id());
    if (text.empty()) return ids;
    const std::string normalized = Normalize(text);
    if (!split_at_words_) {
      Merge(normalized, ids);
      return ids;
    }
    // Each word starts at a space that follows a non-space (or at the text's start), so that
    // its leading run of spaces stays with it, as the merges of the whole text would keep it.
    const absl::string_view rest = normalized;
    const absl::string_view space = Space();
    size_t start = 0;
    for (size_t at = rest.find(space); at != absl::string_view::npos;
         at = rest.find(space, at + space.size())) {
      if (at > start && !absl::EndsWith(rest.substr(0, at), space)) {
        MergeWord(rest.substr(start, at - start), ids);
        start = at;
      }
    }
    MergeWord(rest.substr(start), ids);
    return ids;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    bool at_start = true;  // a dummy prefix's space is still to be dropped
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ids[", i, "]: ", id, " is not a token of this tokenizer (", vocab_size(), " ids)"));
      }
      absl::string_view piece = pieces_[id];
      switch (types_[id]) {
        case Piece::CONTROL:
          break;
        case Piece::UNKNOWN:
          text += unk_surface_;
          at_start = false;
          break;
        case Piece::BYTE:
          text.push_back(static_cast<char>(*ByteFallbackValue(piece)));
          at_start = false;
          break;
        default: {
          // SentencePiece's Decode drops the space of the dummy prefix: the one that begins
          // the first piece with text.
          const bool consumed =
              at_start && add_dummy_prefix_ && absl::ConsumePrefix(&piece, kSpaceSymbol);
          if (consumed || !piece.empty()) at_start = false;
          absl::StrAppend(&text, absl::StrReplaceAll(piece, {{kSpaceSymbol, " "}}));
        }
      }
    }
    return text;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }

  std::optional<int32_t> TokenToId(absl::string_view token) const override {
    const auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() &&
           (types_[id] == Piece::CONTROL || types_[id] == Piece::UNKNOWN);
  }

 private:
  bool IsControlId(int32_t id) const {
    return id >= 0 && id < vocab_size() && types_[id] == Piece::CONTROL;
  }

  // SentencePiece merges two adjacent symbols when their concatenation is a piece, ranked by
  // the piece's score; as merges of ids, each split of a NORMAL piece into two NORMAL pieces.
  // That finds every merge only when each character of a piece is a piece (SentencePiece's
  // trainer starts from the characters, so its BPE models are so).
  absl::Status MakeMerges(absl::string_view source) {
    std::vector<float> scores;  // distinct, highest first: a piece's rank is its score's index
    scores.reserve(scored_.size());
    for (const auto& [piece, id_score] : scored_) scores.push_back(id_score.second);
    std::sort(scores.begin(), scores.end(), std::greater<float>());
    scores.erase(std::unique(scores.begin(), scores.end()), scores.end());
    merges_.Reserve(scored_.size());
    for (const auto& [piece, id_score] : scored_) {
      const auto [id, score] = id_score;
      const int32_t rank = static_cast<int32_t>(
          std::lower_bound(scores.begin(), scores.end(), score, std::greater<float>()) -
          scores.begin());
      const absl::string_view text = piece;
      for (size_t at = 0; at < text.size();) {
        const size_t length = Utf8CharLength(static_cast<unsigned char>(text[at]));
        if (!scored_.contains(text.substr(at, length))) {
          return absl::UnimplementedError(absl::StrCat(
              source, ": pieces[", id, "]: \"", piece, "\" holds \"", text.substr(at, length),
              "\", which is no NORMAL piece; such models are not supported"));
        }
        at += length;
        if (at >= text.size()) break;
        const auto left = scored_.find(text.substr(0, at));
        const auto right = scored_.find(text.substr(at));
        if (left != scored_.end() && right != scored_.end()) {
          merges_.Add(left->second.first, right->second.first, rank, id);
        }
      }
    }
    return absl::OkStatus();
  }

  // What a space is in the normalized text.
  absl::string_view Space() const { return escape_whitespaces_ ? kSpaceSymbol : " "; }

  // Whether a NORMAL piece has a space after a non-space: what could make a merge cross from
  // one word into the next. Models trained with split_by_whitespace (Llama 2's, Mistral's)
  // have none, but that field governs training only, so the pieces themselves are asked.
  bool SomePieceSpansWords() const {
    const absl::string_view space = Space();
    for (const auto& [piece, id_score] : scored_) {
      absl::string_view rest = piece;
      while (absl::ConsumePrefix(&rest, space)) {
      }
      if (absl::StrContains(rest, space)) return true;
    }
    return false;
  }

  // SentencePiece's identity normalizer: a dummy-prefix space, and each space as U+2581.
  std::string Normalize(absl::string_view text) const {
    const absl::string_view space = Space();
    std::string normalized;
    normalized.reserve(text.size() + 8);
    if (add_dummy_prefix_) absl::StrAppend(&normalized, space);
    for (const char c : text) {
      if (c == ' ') {
        absl::StrAppend(&normalized, space);
      } else {
        normalized.push_back(c);
      }
    }
    return normalized;
  }

  // Merge of one word of the normalized text, through the cache of recent words. With no
  // piece spanning words (SomePieceSpansWords), no merge of the whole text joins two words, and
  // the merges within a word come in the same order (highest score, then leftmost) whether the
  // word is merged alone or in its text: the ids are those of SentencePiece's whole-text BPE,
  // and a recurring word is merged once.
  void MergeWord(absl::string_view word, std::vector<int32_t>& ids) const {
    cache_.AppendOrMerge(
        word, ids, [this](absl::string_view word, std::vector<int32_t>& ids) { Merge(word, ids); });
  }

  // SentencePiece's BPE (src/bpe_model.cc): start from the characters, and merge the adjacent
  // pair whose concatenation is the piece of highest score (the leftmost of equal scores)
  // until no pair is a piece; here as merges of ids (merges_). A character that is no piece
  // is its bytes' pieces, which merge with nothing (no piece holds it: MakeMerges).
  void Merge(absl::string_view text, std::vector<int32_t>& ids) const {
    std::vector<int32_t> initial;
    initial.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      const absl::string_view character = text.substr(
          i,
          std::min<size_t>(Utf8CharLength(static_cast<unsigned char>(text[i])), text.size() - i));
      if (const auto it = scored_.find(character); it != scored_.end()) {
        initial.push_back(it->second.first);
      } else {
        for (const unsigned char b : character) initial.push_back(byte_ids_[b]);
      }
      i += character.size();
    }
    merges_.Merge(initial, ids);
  }

  bool add_dummy_prefix_ = true;
  bool escape_whitespaces_ = true;
  bool split_at_words_ = false;  // !SomePieceSpansWords(): words are merged apart, and cached
  std::string unk_surface_;
  std::vector<Piece::Type> types_;                                      // id -> type
  std::vector<std::string> pieces_;                                     // id -> piece
  absl::flat_hash_map<absl::string_view, int32_t> ids_;                 // piece -> id
  absl::flat_hash_map<absl::string_view, std::pair<int32_t, float>> scored_;  // NORMAL: id, score
  std::array<int32_t, 256> byte_ids_ = MinusOnes();
  MergeTable merges_;  // NORMAL pieces: each split into two pieces, ranked by score
  PieceCache cache_;

  static std::array<int32_t, 256> MinusOnes() {
    std::array<int32_t, 256> values;
    values.fill(-1);
    return values;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseSentencePieceTokenizer(absl::string_view source,
                                                                       absl::string_view model) {
  auto tokenizer = std::make_unique<SentencePieceTokenizer>(model);
  PLAIT_RETURN_IF_ERROR(tokenizer->Load(source, model));
  return tokenizer;
}

}  // namespace plait::data::tokenizer
