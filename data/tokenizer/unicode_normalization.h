// Unicode normalization (NFC, NFD, NFKC, NFKD) as Hugging Face's `tokenizers` 0.23 applies it
// in a tokenizer.json's normalizer. Its tables (the unicode-normalization-alignments crate) are
// Unicode 9.0's, so a code point assigned since is to it a character of combining class 0
// with no decomposition: never reordered, composed or decomposed, and a barrier no reordering
// or composition crosses. utf8proc (Debian 12: 2.8.0, Unicode 15.0) knows more, and would, say,
// reorder Nag Mundari's marks U+1E4EC U+1E4EF (combining classes 232 and 230), which Qwen's
// NFC then keeps in the text's order. So the text is cut at each such code point (those of
// them that normalization would touch: unicode_after_9.inc, written by
// make_unicode_tables.py), the runs between are normalized by utf8proc, and the code points
// themselves pass through:
//
//   std::string nfc = NormalizeAsTokenizers(text, NormalizationForm::kNfc);
//
// A code point assigned after Unicode 16.0 is normalized as the system's utf8proc sees it.
#ifndef PLAIT_DATA_TOKENIZER_UNICODE_NORMALIZATION_H_
#define PLAIT_DATA_TOKENIZER_UNICODE_NORMALIZATION_H_

#include <string>

#include "absl/strings/string_view.h"

namespace plait::data::tokenizer {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// `text`, valid UTF-8, in `form` as Hugging Face's tokenizers computes it.
std::string NormalizeAsTokenizers(absl::string_view text, NormalizationForm form);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_UNICODE_NORMALIZATION_H_
