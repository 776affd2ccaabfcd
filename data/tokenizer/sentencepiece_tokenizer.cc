#include "data/tokenizer/sentencepiece_tokenizer.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "data/tokenizer/internal/sentencepiece_model.h"

namespace plait::data::tokenizer {
namespace {

std::string_view StdView(absl::string_view text) { return {text.data(), text.size()}; }

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(absl::string_view model) { set_hash_of({model}); }

  absl::Status Load(absl::string_view source, absl::string_view model) {
    if (const std::string error = model_.Load(StdView(model)); !error.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": not a SentencePiece model: ", error));
    }
    if (model_.bos_id() >= 0) set_bos_id(model_.bos_id());
    if (model_.eos_id() >= 0) set_eos_id(model_.eos_id());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override {
    PLAIT_RETURN_IF_ERROR(CheckUtf8(text));
    std::vector<int> pieces;
    if (const std::string error = model_.Encode(StdView(text), &pieces); !error.empty()) {
      return absl::InternalError(absl::StrCat("SentencePiece could not encode: ", error));
    }
    std::vector<int32_t> ids;
    ids.reserve(pieces.size() + 1);
    if (add_special_tokens && bos_id()) ids.push_back(*bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat("ids[", i, "]: ", ids[i],
                                                       " is not a token of this tokenizer (",
                                                       vocab_size(), " ids)"));
      }
    }
    std::string text;
    if (const std::string error = model_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
        !error.empty()) {
      return absl::InternalError(absl::StrCat("SentencePiece could not decode: ", error));
    }
    return text;
  }

  int64_t vocab_size() const override { return model_.size(); }

  std::optional<int32_t> TokenToId(absl::string_view token) const override {
    const int id = model_.PieceToId(StdView(token));
    if (id < 0) return std::nullopt;
    return id;
  }

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && model_.IsControlOrUnknown(id);
  }

 private:
  internal::SentencePieceModel model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseSentencePieceTokenizer(absl::string_view source,
                                                                       absl::string_view model) {
  auto tokenizer = std::make_unique<SentencePieceTokenizer>(model);
  if (absl::Status status = tokenizer->Load(source, model); !status.ok()) return status;
  return tokenizer;
}

}  // namespace plait::data::tokenizer
