#include "data/tokenizer/byte_fallback.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace plait::data::tokenizer {

std::string ByteFallbackToken(uint8_t byte) { return absl::StrFormat("<0x%02X>", byte); }

std::optional<uint8_t> ByteFallbackValue(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>' ||
      !absl::ascii_isxdigit(token[3]) || !absl::ascii_isxdigit(token[4])) {
    return std::nullopt;
  }
  const auto digit = [](char c) {
    return absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
  };
  return static_cast<uint8_t>(digit(token[3]) * 16 + digit(token[4]));
}

}  // namespace plait::data::tokenizer
