#include "data/tokenizer/internal/sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace plait::data::tokenizer::internal {
namespace {

std::string Message(const sentencepiece::util::Status& status) {
  return status.ok() ? std::string() : status.ToString();
}

}  // namespace

SentencePieceModel::SentencePieceModel()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

SentencePieceModel::~SentencePieceModel() = default;

std::string SentencePieceModel::Load(std::string_view serialized_model) {
  return Message(processor_->LoadFromSerializedProto(serialized_model));
}

std::string SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids) const {
  return Message(processor_->Encode(text, ids));
}

std::string SentencePieceModel::Decode(const std::vector<int>& ids, std::string* text) const {
  return Message(processor_->Decode(ids, text));
}

int SentencePieceModel::size() const { return processor_->GetPieceSize(); }
int SentencePieceModel::bos_id() const { return processor_->bos_id(); }
int SentencePieceModel::eos_id() const { return processor_->eos_id(); }

int SentencePieceModel::PieceToId(std::string_view piece) const {
  const int id = processor_->PieceToId(piece);
  // PieceToId answers the unknown piece's id for a piece the model does not have.
  return processor_->IdToPiece(id) == piece ? id : -1;
}

bool SentencePieceModel::IsControlOrUnknown(int id) const {
  return processor_->IsControl(id) || processor_->IsUnknown(id);
}

}  // namespace plait::data::tokenizer::internal
