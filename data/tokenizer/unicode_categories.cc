#include "data/tokenizer/unicode_categories.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace plait::data::tokenizer {
namespace {

struct AddedRange {
  const char* category;  // two letters, e.g. "Lo"
  char32_t first, last;
};

constexpr AddedRange kAddedRanges[] = {
#include "data/tokenizer/unicode_additions.inc"
};

// A property name as PCRE2 compares it: case, spaces, hyphens and underscores ignored.
std::string Loose(absl::string_view name) {
  std::string loose;
  for (char c : name) {
    if (c != ' ' && c != '-' && c != '_') loose.push_back(absl::ascii_tolower(c));
  }
  return loose;
}

// Whether the property `loose_name` names is, or holds, the two-letter `category`; false for
// what is not widened (C, Cn) and for names that are no general category.
bool Holds(absl::string_view loose_name, absl::string_view category) {
  if (loose_name == "l&" || loose_name == "lc") {
    return category == "Lu" || category == "Ll" || category == "Lt";
  }
  if (loose_name == "c" || loose_name == "cn") return false;
  if (loose_name.size() == 1) return absl::ascii_tolower(category[0]) == loose_name[0];
  return absl::AsciiStrToLower(category) == loose_name;
}

// `\x{first}-\x{last}` for each range added to the property `name` names; empty for none.
std::string AddedCodePoints(absl::string_view name) {
  const std::string loose = Loose(name);
  std::string out;
  for (const AddedRange& range : kAddedRanges) {
    if (!Holds(loose, range.category)) continue;
    absl::StrAppendFormat(&out, "\\x{%X}", static_cast<uint32_t>(range.first));
    if (range.last != range.first) {
      absl::StrAppendFormat(&out, "-\\x{%X}", static_cast<uint32_t>(range.last));
    }
  }
  return out;
}

// The end of the construct that starts at pattern[i] and must be copied whole, or i when
// there is none: `\Q...\E` quoting, a `(?#...)` comment, a control escape `\cX`, or a POSIX
// class `[:alpha:]` inside a character class. Their text may hold `[`, `]` or `\p`.
size_t OpaqueEnd(absl::string_view pattern, size_t i, bool in_class) {
  auto through = [&](absl::string_view end, size_t from) {
    const size_t at = pattern.find(end, from);
    return at == absl::string_view::npos ? pattern.size() : at + end.size();
  };
  if (absl::StartsWith(pattern.substr(i), "\\Q")) return through("\\E", i + 2);
  if (absl::StartsWith(pattern.substr(i), "\\c")) return std::min(i + 3, pattern.size());
  if (!in_class && absl::StartsWith(pattern.substr(i), "(?#")) return through(")", i + 3);
  if (in_class && absl::StartsWith(pattern.substr(i), "[:")) return through(":]", i + 2);
  return i;
}

}  // namespace

std::string WidenToUnicode16(absl::string_view pattern) {
  std::string out;
  bool in_class = false;
  bool class_start = false;  // just after `[` or `[^`, where `]` is a literal
  size_t i = 0;
  while (i < pattern.size()) {
    if (const size_t end = OpaqueEnd(pattern, i, in_class); end != i) {
      absl::StrAppend(&out, pattern.substr(i, end - i));
      i = end;
      class_start = false;
      continue;
    }
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char kind = pattern[i + 1];
      size_t end = i + 2;
      if ((kind == 'p' || kind == 'P') && end < pattern.size()) {
        absl::string_view name = pattern.substr(end, 1);
        if (pattern[end] == '{') {
          const size_t close = pattern.find('}', end);
          if (close != absl::string_view::npos) name = pattern.substr(end + 1, close - end - 1);
          end = close == absl::string_view::npos ? pattern.size() : close + 1;
        } else {
          end += 1;
        }
        const bool caret = absl::StartsWith(name, "^");
        const bool negated = (kind == 'P') != caret;
        const std::string added = AddedCodePoints(caret ? name.substr(1) : name);
        const absl::string_view escape = pattern.substr(i, end - i);
        if (added.empty() || (in_class && negated)) {
          absl::StrAppend(&out, escape);
        } else if (in_class) {
          absl::StrAppend(&out, escape, added);
        } else {
          absl::StrAppend(&out, negated ? "[^" : "[", "\\p{", caret ? name.substr(1) : name, "}",
                          added, "]");
        }
      } else {
        absl::StrAppend(&out, pattern.substr(i, 2));
      }
      i = std::min(end, pattern.size());
      class_start = false;
      continue;
    }
    out.push_back(c);
    ++i;
    if (in_class) {
      if (c == ']' && !class_start) in_class = false;
      class_start = false;
    } else if (c == '[') {
      in_class = true;
      class_start = true;
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
    }
  }
  return out;
}

}  // namespace plait::data::tokenizer
