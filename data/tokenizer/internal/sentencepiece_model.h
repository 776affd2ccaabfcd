// A SentencePiece processor behind standard types only. sentencepiece_processor.h declares its
// own `absl::string_view` (an alias of std::string_view), which collides with Abseil's, so
// it is included by this file's .cc alone and nothing there includes Abseil.
#ifndef PLAIT_DATA_TOKENIZER_INTERNAL_SENTENCEPIECE_MODEL_H_
#define PLAIT_DATA_TOKENIZER_INTERNAL_SENTENCEPIECE_MODEL_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace plait::data::tokenizer::internal {

class SentencePieceModel {
 public:
  SentencePieceModel();
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // Each returns SentencePiece's error message, or an empty string on success.
  std::string Load(std::string_view serialized_model);
  std::string Encode(std::string_view text, std::vector<int>* ids) const;
  std::string Decode(const std::vector<int>& ids, std::string* text) const;

  int size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;
  // The id of `piece`, or -1 when the model has no such piece.
  int PieceToId(std::string_view piece) const;
  bool IsControlOrUnknown(int id) const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace plait::data::tokenizer::internal

#endif  // PLAIT_DATA_TOKENIZER_INTERNAL_SENTENCEPIECE_MODEL_H_
