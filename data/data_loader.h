// The batches one data-parallel rank trains and evaluates on, from a data source
// (ResolvedDataConfig in data_config.h): the synthetic Markov source (markov_source.h), token
// files (token_file.h), or preference and SFT examples (pairs.h: files of ids or of text
// (tokenizer/text_pairs.h), or synthetic pairs,
// read like the synthetic source with B examples in place of B sequences). Both follow llm.c's
// convention: the k-th micro-batch of rank r of W reads the B*T+1 tokens (or B sequences) at
// position (k*W + r)*B*T, so W ranks with micro-batch B see together exactly what one rank with
// micro-batch W*B sees. Token files start over at r*B*T when the world's next batch would pass the
// end (as llm.c, but measured from rank 0's position on every rank, so the ranks start over
// together). With TokenFiles.shuffle the training file's windows of one world batch come in a
// seeded random order, new each pass. SFT files packed by best fit (PACKING_BFD) are packed into
// rows once, at Create, and read as the examples of unpacked files are, a row in place of an
// example; with PACKING_PADDING_FREE each micro-batch's examples are read as unpacked and
// packed into as many rows as they fill; token files with a document_start_token give their
// batches positions (packing.h).
//
//   PLAIT_ASSIGN_OR_RETURN(
//       DataLoader train,
//       DataLoader::Create(data, Split::kTrain, vocab, B, T, dp_rank, dp_size, "plan.data"));
//   PLAIT_ASSIGN_OR_RETURN(Batch batch, train.Next());  // inputs, targets: int64 [B, T]
#ifndef PLAIT_DATA_DATA_LOADER_H_
#define PLAIT_DATA_DATA_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/batch.h"
#include "data/data.pb.h"
#include "data/markov_source.h"
#include "data/pairs.h"
#include "data/token_file.h"

namespace plait::data {

// The training stream, or the held-out one (the eval file, or the synthetic source's
// second stream).
enum class Split { kTrain, kEval };

class DataLoader {
 public:
  // The loader of data-parallel rank `dp_rank` of `dp_size` for `data` (as
  // ResolvedDataConfig returns it). These are the rank's coordinate in, and the width of, the
  // data-parallel dimensions only: ranks that split one model (tensor parallelism) share a
  // coordinate and read the same batches. The trainer passes the world's rank and size, its
  // every mesh dimension being data-parallel today. `field_path` is where `data` sits in the
  // caller's config ("plan.data"); errors start with the field they concern:
  // "<field_path>.synthetic.num_states: ..." for an out-of-range synthetic value, and
  // "<field_path>.token_files.train_path: <file>: ..." for a bad token file (TokenFile::Open)
  // or one too short for one batch of every data-parallel rank (W*B*T+1 tokens);
  // "<field_path>.preference_files.train_path: <file>:<line>: <key>: ..." for a bad example
  // (ReadPairFile, or ReadTextPairFile for text examples), or a file of fewer than W*B
  // examples; "<field_path>.sft_files.tokenizer: ..." for a tokenizer of text examples that
  // cannot be loaded or whose ids do not fit `vocab_size`.
  static absl::StatusOr<DataLoader> Create(const DataConfig& data, Split split, int64_t vocab_size,
                                           int64_t micro_batch, int64_t seq_len, int dp_rank,
                                           int dp_size, absl::string_view field_path);

  // The next micro-batch of this rank. A token file that changed since Create opened it
  // is a DataLoss error (TokenFile::Read) starting with the file's field:
  // "<field_path>.token_files.train_path: <file>: the file changed after it was opened: ...".
  absl::StatusOr<Batch> Next();

  // Back to this rank's first micro-batch (evaluation reads the same held-out batches each
  // time).
  void Reset();

  // Positions the loader as if Next had been called `micro_batches` times since Reset, in
  // time independent of `micro_batches`: how a resumed run skips the batches it trained on
  // (also in a shuffled file, whose window order of each pass depends only on the seed).
  void Seek(int64_t micro_batches);

  // How many micro-batches this rank reads before the data repeats: those of one pass over
  // the file; nullopt for the synthetic sources, which never repeat.
  std::optional<int64_t> DistinctBatches() const;

  // Whether every pass reads the same micro-batches in the same order (a file read in order,
  // not shuffled): then the first DistinctBatches() are all a run ever reads.
  bool RepeatsEachPass() const { return DistinctBatches().has_value() && !shuffle_; }

  // The synthetic source's entropy rate (the loss floor); nullopt for the others.
  std::optional<double> EntropyFloor() const;

  // What packing does to a pair file's rows over one pass in file order: its sequences (one
  // an SFT example, two a preference pair), the rows each PackingStrategy fills with them, and
  // the share of those rows' tokens that is padding.
  struct PackingFigures {
    int64_t sequences = 0;
    int64_t padded_rows = 0;        // PACKING_NONE: one sequence a row
    int64_t bfd_rows = 0;           // PACKING_BFD; 0 for preference pairs, which it refuses
    int64_t padding_free_rows = 0;  // PACKING_PADDING_FREE, in micro-batches of this loader's
    double padded_padding = 0;
    double bfd_padding = 0;
    double padding_free_padding = 0;
  };
  // For pair files, whichever their packing (so that a plan can see what another would do),
  // computed when asked: it packs the whole file; nullopt for the other sources.
  std::optional<PackingFigures> Packing() const;
  // How this loader packs its rows: its pair file's PairFiles.packing, else PACKING_NONE.
  PackingStrategy packing_strategy() const { return cut_.packing(); }

  // Examples of a pair file skipped for a prompt that left no completion token
  // (PairFiles.skip_long_prompts); 0 for the other sources.
  int64_t SkippedExamples() const { return pairs_ != nullptr ? pairs_->skipped : 0; }

 private:
  DataLoader() = default;

  // Creates the loader of a pair source.
  absl::Status CreatePairs(const DataConfig& data, Split split, int64_t vocab_size,
                           absl::string_view field_path);

  // The next micro-batch of a pair source.
  Batch NextPairs();

  // The token offset of this rank's next read in shuffled order.
  int64_t NextShuffledPosition();

  // Orders the windows of pass `pass_` and moves to the next pass.
  void ShuffleNextPass();

  // How many world batches one pass over the file reads.
  int64_t BatchesPerPass() const;

  // What a pair file's micro-batches count: its packed rows, or its examples.
  int64_t Units() const;

  // The SFT examples of pairs_ packed by best-fit decreasing (PACKING_BFD's rows).
  std::vector<std::vector<int64_t>> BestFitRows() const;

  std::shared_ptr<const MarkovSource> synthetic_;
  std::shared_ptr<const TokenFile> file_;
  std::string file_field_;  // where file_'s path sits in the config, for errors
  // Pair sources: the file's examples, or the rejected chain of synthetic pairs (whose
  // chosen chain is synthetic_), and how their rows are cut.
  std::shared_ptr<const PairExamples> pairs_;
  // With PACKING_BFD, the examples of each packed row (indices into pairs_), else nullptr.
  std::shared_ptr<const std::vector<std::vector<int64_t>>> packed_rows_;
  std::shared_ptr<const MarkovSource> rejected_;
  PairKind pair_kind_ = PairKind::kPreference;
  PairFiles cut_;
  int64_t prompt_length_ = 0;
  uint64_t stream_ = 0;
  int64_t micro_batch_ = 0;
  int64_t seq_len_ = 0;
  int dp_rank_ = 0;
  int dp_size_ = 1;
  // Tokens for token files; sequences, examples or packed rows for the others.
  int64_t position_ = 0;
  // Token files with TokenFiles.document_start_token: the token that starts each document.
  std::optional<int64_t> document_start_;
  // Shuffled token files: the window order of the current pass and the next window's index.
  // Shuffled pair files: the example order of the current pass.
  bool shuffle_ = false;
  uint64_t shuffle_seed_ = 0;
  int64_t pass_ = 0;
  int64_t next_window_ = 0;
  std::vector<int64_t> window_order_;
};

// `figures` in a line, for a file packed as `packing` says: "48 sequences in 16 rows of 2048
// tokens (PACKING_BFD), 2.4% padding; one sequence a row: 48 rows, 67.5% padding;
// PACKING_PADDING_FREE: 20 rows, 21.9% padding".
std::string DescribePacking(const DataLoader::PackingFigures& figures, PackingStrategy packing,
                            int64_t seq_len);

// The share of the tokens a run counts (tokens_per_step: seq_len a row for PACKING_BFD, a
// sequence otherwise) that are the examples' own tokens, not padding.
double UsefulShare(const DataLoader::PackingFigures& figures, PackingStrategy packing);

}  // namespace plait::data

#endif  // PLAIT_DATA_DATA_LOADER_H_
