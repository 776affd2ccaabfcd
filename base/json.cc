#include "base/json.h"

#include <limits>
#include <utility>

namespace plait::base {
namespace {

const nlohmann::json& Null() {
  static const nlohmann::json* const null = new nlohmann::json();
  return *null;
}

}  // namespace

JsonFields::JsonFields(const nlohmann::json& object, std::string where, JsonAuthor author)
    : object_(object), where_(std::move(where)), author_(author) {}

absl::Status JsonFields::Error(absl::string_view field, absl::string_view problem) const {
  if (author_ == JsonAuthor::kPlait) {
    return absl::DataLossError(
        absl::StrCat(where_, ": ", field, ": ", problem, "; the file is corrupt"));
  }
  return absl::InvalidArgumentError(absl::StrCat(where_, ": ", field, ": ", problem));
}

const nlohmann::json& JsonFields::Find(const char* field) const {
  if (!object_.is_object()) return Null();
  const auto it = object_.find(field);
  return it == object_.end() ? Null() : *it;
}

bool JsonFields::Has(const char* field) const { return !Find(field).is_null(); }

absl::Status JsonFields::Missing(const char* field) const {
  return Error(field, "is required and missing");
}

absl::StatusOr<int64_t> JsonFields::IntValue(const nlohmann::json& value,
                                             absl::string_view field) const {
  if (!value.is_number_integer()) {
    return Error(field, absl::StrCat("expected an integer, got ", DescribeJson(value)));
  }
  // nlohmann reads integers past INT64_MAX as unsigned; get<int64_t> would wrap them.
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Error(field, absl::StrCat(value.get<uint64_t>(), " is past 2^63 - 1"));
  }
  return value.get<int64_t>();
}

absl::StatusOr<int64_t> JsonFields::Int(const char* field, std::optional<int64_t> fallback) const {
  const nlohmann::json& value = Find(field);
  if (value.is_null()) {
    if (fallback.has_value()) return *fallback;
    return Missing(field);
  }
  return IntValue(value, field);
}

template <typename T>
absl::StatusOr<T> JsonFields::Typed(const char* field, std::optional<T> fallback,
                                    bool (nlohmann::json::*is_type)() const noexcept,
                                    absl::string_view expected) const {
  const nlohmann::json& value = Find(field);
  if (value.is_null()) {
    if (fallback.has_value()) return *std::move(fallback);
    return Missing(field);
  }
  if ((value.*is_type)()) return value.get<T>();
  return Error(field, absl::StrCat("expected ", expected, ", got ", DescribeJson(value)));
}

absl::StatusOr<double> JsonFields::Double(const char* field, std::optional<double> fallback) const {
  return Typed(field, fallback, &nlohmann::json::is_number, "a number");
}

absl::StatusOr<bool> JsonFields::Bool(const char* field, std::optional<bool> fallback) const {
  return Typed(field, fallback, &nlohmann::json::is_boolean, "true or false");
}

absl::StatusOr<std::string> JsonFields::String(const char* field,
                                               std::optional<std::string> fallback) const {
  return Typed(field, std::move(fallback), &nlohmann::json::is_string, "a string");
}

}  // namespace plait::base
