#include "data/tokenizer/tokenizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hash.h"

namespace plait::data::tokenizer {
namespace {

// The length of the well-formed UTF-8 sequence at text[i], or the negated length of its
// maximal ill-formed subpart (at least 1): the ranges of the Unicode Standard's Table 3-7,
// "Well-Formed UTF-8 Byte Sequences".
int SequenceLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  int length;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < length; ++k) {
    if (i + k >= text.size()) return -k;
    const unsigned char next = byte(i + k);
    if (k == 1 ? (next < low || next > high) : (next < 0x80 || next > 0xBF)) return -k;
  }
  return length;
}

}  // namespace

std::optional<size_t> FirstInvalidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    // ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const int length = SequenceLength(text, i);
    if (length < 0) return i;
    i += length;
  }
  return std::nullopt;
}

absl::Status CheckUtf8(absl::string_view text) {
  const std::optional<size_t> offset = FirstInvalidUtf8(text);
  if (!offset) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("text to encode is not valid UTF-8 at byte ", *offset,
                   " (ReplaceInvalidUtf8 replaces such bytes as Hugging Face's callers do)"));
}

std::string ReplaceInvalidUtf8(absl::string_view text) {
  static constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string valid;
  valid.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const int length = SequenceLength(text, i);
    if (length > 0) {
      valid.append(text.data() + i, length);
      i += length;
    } else {
      valid.append(kReplacement.data(), kReplacement.size());
      i += -length;
    }
  }
  return valid;
}

void Tokenizer::set_hash_of(std::initializer_list<absl::string_view> file_contents) {
  uint64_t hash = base::kFnv1a64OffsetBasis;
  for (const absl::string_view contents : file_contents) {
    const uint64_t size = contents.size();  // so that moving bytes between files changes it
    hash = base::Fnv1a64Words(hash, &size, sizeof(size));
    hash = base::Fnv1a64Words(hash, contents.data(), contents.size());
  }
  hash_ = absl::StrFormat("%016x", hash);
}

}  // namespace plait::data::tokenizer
