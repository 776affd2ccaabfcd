#include "data/tokenizer/prompts.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "data/jsonl_lines.h"

namespace plait::data::tokenizer {

absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path,
                                                const Tokenizer& tokenizer) {
  std::vector<Prompt> prompts;
  PLAIT_RETURN_IF_ERROR(data::ForEachJsonlLine(path, [&](std::string& line, int64_t number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) return absl::OkStatus();
    const std::string where = absl::StrCat(path, ":", number);
    PLAIT_ASSIGN_OR_RETURN(nlohmann::json json, base::ParseJson(where, line));
    if (!json.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    const base::JsonFields fields(json, where);
    Prompt& prompt = prompts.emplace_back();
    if (fields.Has("prompt")) {
      PLAIT_ASSIGN_OR_RETURN(const std::string text, fields.String("prompt"));
      PLAIT_ASSIGN_OR_RETURN(
          const std::vector<int32_t> encoded,
          base::Annotate(tokenizer.Encode(text, /*add_special_tokens=*/true), where));
      prompt.ids.assign(encoded.begin(), encoded.end());
    } else if (fields.Has("prompt_ids")) {
      const nlohmann::json& given = json.at("prompt_ids");
      if (!given.is_array()) {
        return fields.Error("prompt_ids", absl::StrCat("expected a list of token ids, got ",
                                                       base::DescribeJson(given)));
      }
      for (size_t i = 0; i < given.size(); ++i) {
        PLAIT_ASSIGN_OR_RETURN(prompt.ids.emplace_back(),
                               fields.IntValue(given[i], absl::StrCat("prompt_ids[", i, "]")));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give \"prompt\" (text) or \"prompt_ids\" (a list of token ids)"));
    }
    if (prompt.ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the prompt is empty"));
    }
    prompt.example = std::move(json);
    return absl::OkStatus();
  }));
  return prompts;
}

}  // namespace plait::data::tokenizer
