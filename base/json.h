// JSON read from files, and JSON values in error messages. Every JSON text plait reads is
// parsed by ParseJson, whose error names the file (or line) and the byte where parsing stopped:
//
//   PLAIT_ASSIGN_OR_RETURN(const nlohmann::json config, base::ParseJson(path, text));
//   // "ckpt/config.json: not valid JSON at byte 17: [json.exception.parse_error.101] ..."
//
// A file's value is written into an error only
// through DescribeJson: a scalar as written, an object or array by its type alone, since a
// corrupt or hostile file can nest one arbitrarily deep (and nlohmann::json's dump recurses
// once per level, so writing it out overflows the stack) or make it huge:
//
//   return Error(field, absl::StrCat("expected an integer, got ", DescribeJson(*it)));
//   // "config.json: hidden_size: expected an integer, got \"2048\"" or "..., got an array"
#ifndef PLAIT_BASE_JSON_H_
#define PLAIT_BASE_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace plait::base {

// `text` parsed, or InvalidArgument "<where>: not valid JSON at byte N: <parser's reason>"
// (or, for a number too large for a double, "<where>: not valid JSON: <reason>").
inline absl::StatusOr<nlohmann::json> ParseJson(absl::string_view where, absl::string_view text) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not valid JSON at byte ", error.byte, ": ", error.what()));
  } catch (const nlohmann::json::exception& error) {  // e.g. a number beyond a double's range
    return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", error.what()));
  }
}

// `value` for an error: a scalar as JSON text ("-5", "\"F64\"", "null"), else "an object" or
// "an array".
inline std::string DescribeJson(const nlohmann::json& value) {
  return value.is_structured() ? absl::StrCat("an ", value.type_name()) : value.dump();
}

}  // namespace plait::base

#endif  // PLAIT_BASE_JSON_H_
