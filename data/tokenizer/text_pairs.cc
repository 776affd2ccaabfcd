#include "data/tokenizer/text_pairs.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/status.h"
#include "data/tokenizer/internal/parse_json.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

using json = nlohmann::json;

absl::StatusOr<json> TokenizeLine(absl::string_view line, const std::string& where, PairKind kind,
                                  const Tokenizer& tokenizer) {
  PLAIT_ASSIGN_OR_RETURN(const json example, internal::ParseJson(where, line));
  if (!example.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  std::vector<const char*> fields = {"prompt", "chosen", "rejected"};
  if (kind == PairKind::kSft) fields = {"prompt", "completion"};
  json ids = json::object();
  for (const char* field : fields) {
    const bool is_completion = field != absl::string_view("prompt");
    const auto it = example.find(field);
    if (it == example.end() || !it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, ": expected a string, got ",
                       it == example.end() ? "nothing" : base::DescribeJson(*it)));
    }
    absl::StatusOr<std::vector<int32_t>> encoded =
        tokenizer.Encode(it->get<std::string>(), /*add_special_tokens=*/!is_completion);
    if (!encoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, ": ", encoded.status().message()));
    }
    if (is_completion && tokenizer.eos_id()) encoded->push_back(*tokenizer.eos_id());
    ids[field] = *encoded;
  }
  return ids;
}

}  // namespace

absl::StatusOr<std::string> TokenizedPairFile(const std::string& text_path, PairKind kind,
                                              const Tokenizer& tokenizer) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(text_path));
  const std::string cache =
      absl::StrFormat("%s.%s-%016x.ids.jsonl", text_path, tokenizer.hash(),
                      base::Fnv1a64Words(base::kFnv1a64OffsetBasis, text.data(), text.size()));
  std::error_code error;
  if (std::filesystem::is_regular_file(cache, error)) return cache;

  std::string ids;
  int64_t number = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    PLAIT_ASSIGN_OR_RETURN(
        const json example,
        TokenizeLine(line, absl::StrCat(text_path, ":", number), kind, tokenizer));
    absl::StrAppend(&ids, example.dump(), "\n");
  }
  PLAIT_RETURN_IF_ERROR(base::WriteFileAtomically(cache, ids));
  return cache;
}

}  // namespace plait::data::tokenizer
