// JSON text parsed with an error that says where: "<where>: not valid JSON at byte 17: ...".
// Shared by the readers of tokenizer.json, JSONL corpora and text pairs.
#ifndef PLAIT_DATA_TOKENIZER_INTERNAL_PARSE_JSON_H_
#define PLAIT_DATA_TOKENIZER_INTERNAL_PARSE_JSON_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer::internal {

inline absl::StatusOr<nlohmann::json> ParseJson(absl::string_view where, absl::string_view text) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not valid JSON at byte ", error.byte, ": ", error.what()));
  }
}

}  // namespace plait::data::tokenizer::internal

#endif  // PLAIT_DATA_TOKENIZER_INTERNAL_PARSE_JSON_H_
