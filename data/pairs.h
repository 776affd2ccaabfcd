// Preference pairs and SFT examples (data.proto's PairFiles, SyntheticPairs) as batches: a
// file of JSONL token ids read and checked line by line, and the rows a micro-batch of them
// becomes. A sequence is the prompt (cut to its last max_prompt_length ids) followed by one
// completion, cut to seq_len tokens (keeping the start or the end) and right-padded; its
// targets score the completion tokens only (TRL's DPOTrainer and SFTTrainer labels):
//
//   PLAIT_ASSIGN_OR_RETURN(PairExamples pairs,
//                          ReadPairFile(path, PairKind::kPreference, files, vocab, T));
//   Batch batch = PairRows({&pairs.examples[0], &pairs.examples[1]}, PairKind::kPreference,
//                          files, T);  // 4 rows: 2 chosen, then 2 rejected
#ifndef PLAIT_DATA_PAIRS_H_
#define PLAIT_DATA_PAIRS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/batch.h"
#include "data/data.pb.h"
#include "data/jsonl_lines.h"

namespace plait::data {

// Preference pairs (prompt, chosen, rejected) or SFT examples (prompt, completion).
enum class PairKind { kPreference, kSft };

struct PairExample {
  std::vector<int64_t> prompt;
  std::vector<int64_t> chosen;    // the completion of an SFT example
  std::vector<int64_t> rejected;  // empty for SFT
};

struct PairExamples {
  std::vector<PairExample> examples;
  // Examples dropped because the prompt left no completion token within seq_len (only with
  // PairFiles.skip_long_prompts; otherwise such an example is an error).
  int64_t skipped = 0;
};

// The examples of the JSONL file `path` (blank lines ignored). An error names the file, the
// line and the field, and nothing is returned: "<path>:3: chosen[2]: 5000 is not below the
// vocabulary size 4096", for malformed JSON, a missing key, an entry that is not a token id
// below `vocab_size`, an empty completion, a prompt that leaves no completion token within
// `seq_len` (unless `files.skip_long_prompts`), a line longer than `max_line_bytes`
// (refused before it is parsed), or a file without examples.
absl::StatusOr<PairExamples> ReadPairFile(const std::string& path, PairKind kind,
                                          const PairFiles& files, int64_t vocab_size,
                                          int64_t seq_len,
                                          int64_t max_line_bytes = kMaxJsonlLineBytes);

// The completions of `example` (a PairExample, const or not) under their JSONL keys:
// {"completion"} for kSft, {"chosen", "rejected"} for kPreference.
template <typename Example>
std::vector<std::pair<const char*, decltype(&std::declval<Example&>().chosen)>> Completions(
    PairKind kind, Example& example) {
  if (kind == PairKind::kSft) return {{"completion", &example.chosen}};
  return {{"chosen", &example.chosen}, {"rejected", &example.rejected}};
}

// Checks `example`, read at `where` ("<file>:<line>"), as ReadPairFile checks each example (an
// empty completion, a prompt that leaves no completion token within `seq_len` unless
// `files.skip_long_prompts`), and adds it to `pairs`, or counts it in pairs.skipped. The error
// names `where` and the field: "<where>: rejected: is empty; ...". kSft reads no `rejected`.
absl::Status AddPairExample(PairExample example, PairKind kind, const PairFiles& files,
                            int64_t seq_len, absl::string_view where, PairExamples& pairs);

// OK when `pairs`, read from the file `path`, holds an example; else InvalidArgument naming it.
absl::Status CheckHasExamples(absl::string_view path, const PairExamples& pairs);

// How many tokens of `completion` the sequence after `prompt` scores once cut as `files`
// says to `seq_len` tokens (0: none, the example teaches nothing).
int64_t ScoredTokens(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion,
                     const PairFiles& files, int64_t seq_len);

// How many tokens the sequence of `prompt` + `completion` has once cut as `files` says to
// `seq_len` tokens: the room it takes in a packed row.
int64_t SequenceLength(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion,
                       const PairFiles& files, int64_t seq_len);

// One sequence of a row: a prompt and one of its completions.
using Sequence = std::pair<const std::vector<int64_t>*, const std::vector<int64_t>*>;

// The sequences of `examples`: for kSft one each (prompt + completion); for kPreference the
// chosen sequences of all examples, then their rejected sequences.
std::vector<Sequence> SequencesOf(const std::vector<const PairExample*>& examples, PairKind kind);

// Rows of seq_len tokens, row r holding the sequences rows[r] one after another (their lengths
// once cut must sum to at most seq_len), each cut as `files` says (truncation,
// max_prompt_length), its completion tokens' targets set (kIgnoreTarget elsewhere), then padding
// (token 0). With `packed`, the batch's positions: each sequence's from 0, and the padding
// after the row's last sequence continuing that sequence's.
Batch RowsOf(const std::vector<std::vector<Sequence>>& rows, const PairFiles& files,
             int64_t seq_len, bool packed);

// One sequence of `examples` a row (SequencesOf's order), right-padded: for kPreference the
// B chosen rows, then the B rejected rows.
Batch PairRows(const std::vector<const PairExample*>& examples, PairKind kind,
               const PairFiles& files, int64_t seq_len);

// The sequences of `examples` in SequencesOf's order placed into rows of `seq_len` tokens for
// PACKING_PADDING_FREE (RowsOf makes the batch): each into the current row when it fits the
// row's rest, else into a new row. The k-th sequence of the rows, read row by row, is
// PairRows' row k.
std::vector<std::vector<Sequence>> PaddingFreeRows(const std::vector<const PairExample*>& examples,
                                                   PairKind kind, const PairFiles& files,
                                                   int64_t seq_len);

}  // namespace plait::data

#endif  // PLAIT_DATA_PAIRS_H_
