// Tokenizes a text corpus into token shards that plait's data loader (and llm.c) reads: what
// `//tools:tokenize` runs. Each input is a JSONL file (*.jsonl: one document per line, its
// text in one field) or a plain text file (one document, or several split at a separator).
// Each document is written as the tokenizer's EOS followed by its ids (with the BOS the
// tokenizer's post-processor adds), as llm.c's tokenizing scripts do; documents are encoded
// on several threads and written in input order, so the output does not depend on the
// thread count. Every val_fraction-th document (spread evenly) goes to the held-out split.
// Shards are in llm.c's format: uint16 ids under its GPT-2 header when the vocabulary fits,
// else uint32 ids under its Llama 3 header (data/token_file.h); the output folder is checked
// before any input is read:
//
//   PLAIT_ASSIGN_OR_RETURN(CorpusSummary summary,
//                          TokenizeCorpus(*tokenizer, options, /*on_progress=*/nullptr));
//   // summary.files: PREFIX_train_000000.bin, ..., PREFIX_val_000000.bin
#ifndef PLAIT_DATA_TOKENIZER_CORPUS_TOKENIZER_H_
#define PLAIT_DATA_TOKENIZER_CORPUS_TOKENIZER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/data.pb.h"
#include "data/jsonl_lines.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {

struct CorpusOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;           // shards are PREFIX_{train,val}_NNNNNN.bin
  std::string jsonl_field = "text";    // the text of a JSONL line
  // A longer JSONL line is refused, naming the input and the line, before it is held whole.
  int64_t max_jsonl_line_bytes = kMaxJsonlLineBytes;
  std::string split_text_at;           // separates documents in a text file; empty: one
  double val_fraction = 0;             // in [0, 1)
  int64_t shard_tokens = 100'000'000;  // llm.c's shard size
  int threads = 1;
  std::string eos_token;  // the document separator; empty: the tokenizer's EOS
  // Text that is not valid UTF-8 is refused, naming the input, its line and the byte, as an
  // SFT or DPO run refuses it (Tokenizer::Encode); when true, each ill-formed sequence is
  // encoded as U+FFFD, as Python's errors="replace" decodes it, and counted.
  bool replace_invalid_utf8 = false;
};

struct CorpusProgress {
  int64_t bytes_read = 0;   // of the inputs, as documents are written
  int64_t bytes_total = 0;  // sizes of all inputs
  int64_t documents = 0;
  int64_t tokens = 0;
};

struct CorpusSummary {
  int64_t documents = 0;
  int64_t val_documents = 0;
  int64_t tokens = 0;  // written, EOS separators included
  int64_t val_tokens = 0;
  int64_t text_bytes = 0;                         // of the documents' texts
  int64_t invalid_utf8_documents = 0;  // whose ill-formed bytes became U+FFFD (when asked)
  TokenFormat format = TOKEN_FORMAT_UNSPECIFIED;  // of the shards: give it in the data plan
  std::vector<std::string> files;                 // the shards written, train then val
  int64_t replaced_files = 0;  // shards of an earlier run under the prefix, replaced or removed
};

// Tokenizes options.inputs with `tokenizer` into shards, listed in PREFIX_shards.json. Errors
// name the input, its line for JSONL and the problem (not JSON, no such field, too long); on error
// no shard is left under its final name. Files named as shards of the prefix are replaced (or
// removed) only when that list names them, as an earlier run's; any other is refused before
// anything is read. `on_progress`, when given, is called from this thread as documents are written.
absl::StatusOr<CorpusSummary> TokenizeCorpus(
    const Tokenizer& tokenizer, const CorpusOptions& options,
    const std::function<void(const CorpusProgress&)>& on_progress);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_CORPUS_TOKENIZER_H_
