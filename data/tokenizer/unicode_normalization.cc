#include "data/tokenizer/unicode_normalization.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace plait::data::tokenizer {
namespace {

struct CodePointRange {
  char32_t first, last;
};

constexpr CodePointRange kAssignedAfter9[] = {
#include "data/tokenizer/unicode_after_9.inc"
};

bool AssignedAfter9(char32_t code_point) {
  if (code_point < kAssignedAfter9[0].first) return false;
  const auto* after = std::upper_bound(
      std::begin(kAssignedAfter9), std::end(kAssignedAfter9), code_point,
      [](char32_t value, const CodePointRange& range) { return value < range.first; });
  return code_point <= std::prev(after)->last;
}

// utf8proc's options for `form` (utf8proc.h: utf8proc_NFC and its siblings).
utf8proc_option_t OptionsOf(NormalizationForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  return static_cast<utf8proc_option_t>(options);
}

void AppendNormalized(absl::string_view text, utf8proc_option_t options, std::string& out) {
  if (text.empty()) return;
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()), text.size(), &normalized, options);
  // utf8proc fails only on invalid UTF-8, which the caller excludes, or out of memory.
  if (length < 0) {
    absl::StrAppend(&out, text);
    return;
  }
  out.append(reinterpret_cast<const char*>(normalized), length);
  std::free(normalized);
}

}  // namespace

std::string NormalizeAsTokenizers(absl::string_view text, NormalizationForm form) {
  const utf8proc_option_t options = OptionsOf(form);
  std::string out;
  out.reserve(text.size());
  size_t run = 0;  // where the run not yet normalized starts
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    utf8proc_int32_t code_point;
    const utf8proc_ssize_t length = utf8proc_iterate(
        reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + i, text.size() - i, &code_point);
    if (length <= 0) break;  // invalid UTF-8: left to utf8proc_map below
    if (AssignedAfter9(code_point)) {
      AppendNormalized(text.substr(run, i - run), options, out);
      absl::StrAppend(&out, text.substr(i, length));
      run = i + length;
    }
    i += length;
  }
  AppendNormalized(text.substr(run), options, out);
  return out;
}

}  // namespace plait::data::tokenizer
