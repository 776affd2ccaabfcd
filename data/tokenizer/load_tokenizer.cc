#include "data/tokenizer/load_tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"

namespace plait::data::tokenizer {
namespace {

bool IsFile(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpe(const std::filesystem::path& path) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path.string()));
  std::string config;
  const std::filesystem::path config_path = path.parent_path() / "tokenizer_config.json";
  if (IsFile(config_path)) {
    PLAIT_ASSIGN_OR_RETURN(config, base::ReadFile(config_path.string()));
    // ParseBpeTokenizer reads empty text as no file: an empty one is a damaged file.
    if (config.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path.string(), ": empty; a tokenizer_config.json is a JSON object"));
    }
  }
  return ParseBpeTokenizer(path.string(), text, config);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::filesystem::path& path) {
  PLAIT_ASSIGN_OR_RETURN(const std::string model, base::ReadFile(path.string()));
  return ParseSentencePieceTokenizer(path.string(), model);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    if (absl::EndsWith(path, ".json")) return LoadBpe(path);
    return LoadSentencePiece(path);
  }
  const std::filesystem::path folder(path);
  if (IsFile(folder / "tokenizer.json")) return LoadBpe(folder / "tokenizer.json");
  if (IsFile(folder / "tokenizer.model")) return LoadSentencePiece(folder / "tokenizer.model");
  return absl::NotFoundError(
      absl::StrCat(path,
                   ": has neither tokenizer.json nor tokenizer.model (the model's tokenizer files, "
                   "as released with it)"));
}

}  // namespace plait::data::tokenizer
