// JSON values from files in error messages. A file's value is written into an error only
// through DescribeJson: a scalar as written, an object or array by its type alone, since a
// corrupt or hostile file can nest one arbitrarily deep (and nlohmann::json's dump recurses
// once per level, so writing it out overflows the stack) or make it huge:
//
//   return Error(field, absl::StrCat("expected an integer, got ", DescribeJson(*it)));
//   // "config.json: hidden_size: expected an integer, got \"2048\"" or "..., got an array"
#ifndef PLAIT_BASE_JSON_H_
#define PLAIT_BASE_JSON_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace plait::base {

// `value` for an error: a scalar as JSON text ("-5", "\"F64\"", "null"), else "an object" or
// "an array".
inline std::string DescribeJson(const nlohmann::json& value) {
  return value.is_structured() ? absl::StrCat("an ", value.type_name()) : value.dump();
}

}  // namespace plait::base

#endif  // PLAIT_BASE_JSON_H_
