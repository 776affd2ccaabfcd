// JSON read from files, and JSON values in error messages. Every JSON text plait reads is
// parsed by ParseJson, whose error names the file (or line) and the byte where parsing stopped,
// and its objects' fields are read by JsonFields, whose errors name the file and the field:
//
//   PLAIT_ASSIGN_OR_RETURN(const nlohmann::json config, base::ParseJson(path, text));
//   // "ckpt/config.json: not valid JSON at byte 17: [json.exception.parse_error.101] ..."
//   const base::JsonFields fields(config, path);
//   PLAIT_ASSIGN_OR_RETURN(const int64_t hidden, fields.Int("hidden_size"));
//   // "ckpt/config.json: hidden_size: expected an integer, got \"2048\""
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

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace plait::base {

// `parse()`'s result, or InvalidArgument "<where>: not valid JSON at byte N: <parser's
// reason>" (or, for a number too large for a double, "<where>: not valid JSON: <reason>") for
// the exception nlohmann's parser throws.
template <typename Parse>
auto ParseJsonOrError(absl::string_view where, Parse&& parse) -> absl::StatusOr<decltype(parse())> {
  try {
    return parse();
  } catch (const nlohmann::json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not valid JSON at byte ", error.byte, ": ", error.what()));
  } catch (const nlohmann::json::exception& error) {  // e.g. a number beyond a double's range
    return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", error.what()));
  }
}

// `text` parsed, or ParseJsonOrError's error.
inline absl::StatusOr<nlohmann::json> ParseJson(absl::string_view where, absl::string_view text) {
  return ParseJsonOrError(where, [&] { return nlohmann::json::parse(text.begin(), text.end()); });
}

// `text` parsed into `sax`'s events (nlohmann's SAX interface: a reader that keeps only what
// it needs of a large file), or ParseJsonOrError's error; `sax` throws nlohmann's parse_error
// from its parse_error event, as nlohmann::detail::json_sax_dom_parser does.
template <typename Sax>
absl::Status ParseJsonEvents(absl::string_view where, absl::string_view text, Sax& sax) {
  const absl::StatusOr<bool> parsed = ParseJsonOrError(
      where, [&] { return nlohmann::json::sax_parse(text.begin(), text.end(), &sax); });
  if (!parsed.ok()) return parsed.status();
  if (!*parsed) return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON"));
  return absl::OkStatus();
}

// `value` for an error: a scalar as JSON text ("-5", "\"F64\"", "null"), else "an object" or
// "an array".
inline std::string DescribeJson(const nlohmann::json& value) {
  return value.is_structured() ? absl::StrCat("an ", value.type_name()) : value.dump();
}

// Who wrote the JSON file a JsonFields reads, which decides what a bad field means.
enum class JsonAuthor {
  kPerson,  // a config or data file: a bad field is InvalidArgument
  kPlait,   // a file plait wrote (a checkpoint's manifest): a bad field is DataLoss, and the
            // error says "the file is corrupt"
};

// Reads the fields of one JSON object by type, each error naming "<where>: <field>: <problem>".
// A field that is absent or null takes the fallback when one is given and is an error when
// not. `object` is referenced, not copied: it outlives the reader.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string where,
             JsonAuthor author = JsonAuthor::kPerson);

  // The error of `field` having `problem`.
  absl::Status Error(absl::string_view field, absl::string_view problem) const;

  // Whether `field` is present and not null.
  bool Has(const char* field) const;

  // An integer that fits an int64_t (a larger one is an error, never wrapped).
  absl::StatusOr<int64_t> Int(const char* field,
                              std::optional<int64_t> fallback = std::nullopt) const;
  // Any number.
  absl::StatusOr<double> Double(const char* field,
                                std::optional<double> fallback = std::nullopt) const;
  absl::StatusOr<bool> Bool(const char* field, std::optional<bool> fallback = std::nullopt) const;
  absl::StatusOr<std::string> String(const char* field,
                                     std::optional<std::string> fallback = std::nullopt) const;

  // `value`, read as Int reads a field and named `field` in its error: for the entries of an
  // array ("shape[2]").
  absl::StatusOr<int64_t> IntValue(const nlohmann::json& value, absl::string_view field) const;

 private:
  // The field's value, or null when absent.
  const nlohmann::json& Find(const char* field) const;
  // The field read as a T where (value.*is_type)() holds, else an error saying it expected
  // `expected`.
  template <typename T>
  absl::StatusOr<T> Typed(const char* field, std::optional<T> fallback,
                          bool (nlohmann::json::*is_type)() const noexcept,
                          absl::string_view expected) const;
  absl::Status Missing(const char* field) const;

  const nlohmann::json& object_;
  std::string where_;
  JsonAuthor author_;
};

}  // namespace plait::base

#endif  // PLAIT_BASE_JSON_H_
