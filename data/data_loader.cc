#include "data/data_loader.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "data/packing.h"
#include "data/tokenizer/load_tokenizer.h"
#include "data/tokenizer/text_pairs.h"

namespace plait::data {
namespace {

// The examples of the pair file `path` (at `path_field`): token ids, or text tokenized with the
// model's tokenizer (`files.tokenizer`, at `files_field`.tokenizer), whose ids must all be
// below the model's `vocab_size`.
absl::StatusOr<PairExamples> ReadExamples(const std::string& path, const std::string& path_field,
                                          PairKind kind, const PairFiles& files, int64_t vocab_size,
                                          int64_t seq_len, const std::string& files_field) {
  if (files.format() != PAIR_FORMAT_TEXT) {
    return base::Annotate(ReadPairFile(path, kind, files, vocab_size, seq_len), path_field);
  }
  const std::string tokenizer_field = absl::StrCat(files_field, ".tokenizer");
  PLAIT_ASSIGN_OR_RETURN(
      const std::unique_ptr<tokenizer::Tokenizer> tokenizer,
      base::Annotate(tokenizer::LoadTokenizer(files.tokenizer()), tokenizer_field));
  if (tokenizer->vocab_size() > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokenizer_field, ": ", files.tokenizer(), ": its ids reach ", tokenizer->vocab_size() - 1,
        ", beyond the model's vocab_size ", vocab_size, "; is it the model's own tokenizer?"));
  }
  return base::Annotate(tokenizer::ReadTextPairFile(path, kind, files, *tokenizer, seq_len),
                        path_field);
}

}  // namespace

absl::StatusOr<DataLoader> DataLoader::Create(const DataConfig& data, Split split,
                                              int64_t vocab_size, int64_t micro_batch,
                                              int64_t seq_len, int dp_rank, int dp_size,
                                              absl::string_view field_path) {
  DataLoader loader;
  loader.micro_batch_ = micro_batch;
  loader.seq_len_ = seq_len;
  loader.dp_rank_ = dp_rank;
  loader.dp_size_ = dp_size;
  if (data.has_preference_files() || data.has_sft_files() || data.has_synthetic_pairs() ||
      data.has_synthetic_sft()) {
    PLAIT_RETURN_IF_ERROR(loader.CreatePairs(data, split, vocab_size, field_path));
  } else if (data.has_synthetic()) {
    PLAIT_ASSIGN_OR_RETURN(
        MarkovSource source,
        MarkovSource::Create(data.synthetic(), vocab_size, absl::StrCat(field_path, ".synthetic")));
    loader.synthetic_ = std::make_shared<const MarkovSource>(std::move(source));
    loader.stream_ = split == Split::kTrain ? 0 : 1;
  } else {
    const std::string& path =
        split == Split::kTrain ? data.token_files().train_path() : data.token_files().eval_path();
    const std::string path_field = absl::StrCat(
        field_path, ".token_files.", split == Split::kTrain ? "train_path" : "eval_path");
    PLAIT_ASSIGN_OR_RETURN(
        TokenFile file,
        base::Annotate(TokenFile::Open(path, data.token_files().format(), vocab_size), path_field));
    const int64_t needed = dp_size * micro_batch * seq_len + 1;
    if (file.size() < needed) {
      return base::Annotate(
          absl::InvalidArgumentError(absl::StrCat(
              path, ": too short for one batch: ", file.size(), " tokens; ", dp_size,
              " ranks x micro_batch ", micro_batch, " x seq_len ", seq_len, " need ", needed)),
          path_field);
    }
    loader.file_ = std::make_shared<const TokenFile>(std::move(file));
    loader.file_field_ = path_field;
    loader.shuffle_ = split == Split::kTrain && data.token_files().shuffle();
    loader.shuffle_seed_ = data.token_files().shuffle_seed();
    if (data.token_files().has_document_start_token()) {
      loader.document_start_ = data.token_files().document_start_token();
    }
  }
  loader.Reset();
  return loader;
}

absl::Status DataLoader::CreatePairs(const DataConfig& data, Split split, int64_t vocab_size,
                                     absl::string_view field_path) {
  stream_ = split == Split::kTrain ? 0 : 1;
  if (data.has_synthetic_pairs() || data.has_synthetic_sft()) {
    const bool sft = data.has_synthetic_sft();
    const SyntheticPairs& pairs = sft ? data.synthetic_sft() : data.synthetic_pairs();
    const std::string field = absl::StrCat(field_path, sft ? ".synthetic_sft" : ".synthetic_pairs");
    if (pairs.prompt_length() < 1 || pairs.prompt_length() >= seq_len_) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".prompt_length: ", pairs.prompt_length(), "; must be in [1, ",
                       seq_len_ - 1, "] (seq_len - 1)"));
    }
    SyntheticData rejected = pairs.chain();
    rejected.set_seed(pairs.rejected_seed());
    std::vector<std::pair<const SyntheticData*, std::shared_ptr<const MarkovSource>*>> chains = {
        {&pairs.chain(), &synthetic_}};
    if (!sft) chains.push_back({&rejected, &rejected_});
    for (auto [config, source] : chains) {
      PLAIT_ASSIGN_OR_RETURN(MarkovSource chain,
                             MarkovSource::Create(*config, vocab_size, field + ".chain"));
      *source = std::make_shared<const MarkovSource>(std::move(chain));
    }
    pair_kind_ = sft ? PairKind::kSft : PairKind::kPreference;
    prompt_length_ = pairs.prompt_length();
    return absl::OkStatus();
  }
  const bool sft = data.has_sft_files();
  pair_kind_ = sft ? PairKind::kSft : PairKind::kPreference;
  cut_ = sft ? data.sft_files() : data.preference_files();
  const std::string path = split == Split::kTrain ? cut_.train_path() : cut_.eval_path();
  const std::string path_field =
      absl::StrCat(field_path, sft ? ".sft_files." : ".preference_files.",
                   split == Split::kTrain ? "train_path" : "eval_path");
  PLAIT_ASSIGN_OR_RETURN(
      PairExamples examples,
      ReadExamples(path, path_field, pair_kind_, cut_, vocab_size, seq_len_,
                   absl::StrCat(field_path, sft ? ".sft_files" : ".preference_files")));
  pairs_ = std::make_shared<const PairExamples>(std::move(examples));
  if (cut_.packing() == PACKING_BFD) {
    packed_rows_ = std::make_shared<const std::vector<std::vector<int64_t>>>(BestFitRows());
  }
  const int64_t needed = micro_batch_ * dp_size_;
  if (Units() < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_field, ": ", path, ": too few ", packed_rows_ != nullptr ? "packed rows" : "examples",
        " for one batch: ", Units(), "; ", dp_size_, " ranks x micro_batch ", micro_batch_,
        " need ", needed));
  }
  shuffle_ = split == Split::kTrain && cut_.shuffle();
  shuffle_seed_ = cut_.shuffle_seed();
  return absl::OkStatus();
}

std::vector<std::vector<int64_t>> DataLoader::BestFitRows() const {
  std::vector<int64_t> lengths;
  for (const PairExample& example : pairs_->examples) {
    lengths.push_back(SequenceLength(example.prompt, example.chosen, cut_, seq_len_));
  }
  return BestFitDecreasing(lengths, seq_len_);
}

std::optional<DataLoader::PackingFigures> DataLoader::Packing() const {
  if (pairs_ == nullptr) return std::nullopt;
  PackingFigures figures;
  if (pair_kind_ == PairKind::kSft) {
    figures.bfd_rows =
        static_cast<int64_t>(packed_rows_ != nullptr ? packed_rows_->size() : BestFitRows().size());
  }
  int64_t tokens = 0;
  std::vector<const PairExample*> micro_batch;
  const auto fill_rows = [&] {
    figures.padding_free_rows +=
        static_cast<int64_t>(PaddingFreeRows(micro_batch, pair_kind_, cut_, seq_len_).size());
    micro_batch.clear();
  };
  for (const PairExample& example : pairs_->examples) {
    for (const auto& [prompt, completion] : SequencesOf({&example}, pair_kind_)) {
      tokens += SequenceLength(*prompt, *completion, cut_, seq_len_);
      ++figures.sequences;
    }
    micro_batch.push_back(&example);
    if (static_cast<int64_t>(micro_batch.size()) == micro_batch_) fill_rows();
  }
  if (!micro_batch.empty()) fill_rows();
  figures.padded_rows = figures.sequences;
  const auto padding = [&](int64_t rows) {
    return rows == 0 ? 0.0
                     : 1.0 - static_cast<double>(tokens) / static_cast<double>(rows * seq_len_);
  };
  figures.padded_padding = padding(figures.padded_rows);
  figures.bfd_padding = padding(figures.bfd_rows);
  figures.padding_free_padding = padding(figures.padding_free_rows);
  return figures;
}

void DataLoader::Reset() {
  position_ = file_ != nullptr ? dp_rank_ * micro_batch_ * seq_len_ : dp_rank_ * micro_batch_;
  pass_ = 0;
  next_window_ = 0;
  window_order_.clear();
}

std::optional<int64_t> DataLoader::DistinctBatches() const {
  if (file_ == nullptr && pairs_ == nullptr) return std::nullopt;
  return BatchesPerPass();
}

int64_t DataLoader::Units() const {
  return packed_rows_ != nullptr ? static_cast<int64_t>(packed_rows_->size())
                                 : static_cast<int64_t>(pairs_->examples.size());
}

int64_t DataLoader::BatchesPerPass() const {
  if (pairs_ != nullptr) return Units() / (micro_batch_ * dp_size_);
  // Whole world batches whose read (W*B*T + 1 tokens) fits in the file: sequential reading
  // starts over, and shuffled reading reshuffles, after this many.
  return (file_->size() - 1) / (micro_batch_ * seq_len_ * dp_size_);
}

void DataLoader::ShuffleNextPass() {
  // Pair files shuffle their examples (or packed rows); token files their windows of one
  // world batch.
  window_order_.resize(pairs_ != nullptr ? Units() : BatchesPerPass());
  std::iota(window_order_.begin(), window_order_.end(), 0);
  std::mt19937_64 random(shuffle_seed_ * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(pass_));
  std::shuffle(window_order_.begin(), window_order_.end(), random);
  ++pass_;
  next_window_ = 0;
}

int64_t DataLoader::NextShuffledPosition() {
  if (next_window_ == static_cast<int64_t>(window_order_.size())) ShuffleNextPass();
  const int64_t window = micro_batch_ * seq_len_ * dp_size_;
  return window_order_[next_window_++] * window + dp_rank_ * micro_batch_ * seq_len_;
}

void DataLoader::Seek(int64_t micro_batches) {
  Reset();
  if (synthetic_ != nullptr) {
    position_ += micro_batches * micro_batch_ * dp_size_;
    return;
  }
  const int64_t per_pass = BatchesPerPass();
  if (pairs_ != nullptr) {
    // The next read orders pass `pass_` when shuffling.
    pass_ = micro_batches / per_pass;
    position_ += (micro_batches % per_pass) * micro_batch_ * dp_size_;
    return;
  }
  if (shuffle_) {
    pass_ = micro_batches / per_pass;
    if (micro_batches % per_pass == 0) return;  // the next read orders pass `pass_`
    ShuffleNextPass();
    next_window_ = micro_batches % per_pass;
    return;
  }
  position_ += (micro_batches % per_pass) * micro_batch_ * seq_len_ * dp_size_;
}

Batch DataLoader::NextPairs() {
  const int64_t B = micro_batch_, W = dp_size_;
  std::vector<PairExample> drawn;
  std::vector<const PairExample*> examples;
  if (prompt_length_ > 0) {
    const int64_t P = prompt_length_;
    const at::Tensor chosen = synthetic_->Sequences(stream_, position_, B, seq_len_);
    // SFT examples have no rejected completion.
    const at::Tensor rejected = rejected_ != nullptr
                                    ? rejected_->Sequences(stream_, position_, B, seq_len_ - P)
                                    : at::Tensor();
    const auto ids = [](const at::Tensor& row) {
      return std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
    };
    drawn.resize(B);
    for (int64_t b = 0; b < B; ++b) {
      drawn[b].prompt = ids(chosen[b].narrow(0, 0, P).contiguous());
      drawn[b].chosen = ids(chosen[b].narrow(0, P, seq_len_ - P).contiguous());
      if (rejected.defined()) drawn[b].rejected = ids(rejected[b].contiguous());
      examples.push_back(&drawn[b]);
    }
    position_ += B * W;
    return PairRows(examples, pair_kind_, cut_, seq_len_);
  }
  if (shuffle_ && window_order_.empty()) ShuffleNextPass();
  std::vector<int64_t> units;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t index = position_ + i;
    units.push_back(shuffle_ ? window_order_[index] : index);
  }
  // As token files: every rank starts the next pass when the world's next batch would pass
  // the end, measured from rank 0's position.
  position_ += B * W;
  if (position_ - dp_rank_ * B + B * W > BatchesPerPass() * B * W) {
    position_ = dp_rank_ * B;
    window_order_.clear();
  }
  if (packed_rows_ != nullptr) {
    std::vector<std::vector<Sequence>> rows;
    for (const int64_t unit : units) {
      rows.emplace_back();
      for (const int64_t example : (*packed_rows_)[unit]) {
        const PairExample& e = pairs_->examples[example];
        rows.back().push_back({&e.prompt, &e.chosen});
      }
    }
    return RowsOf(rows, cut_, seq_len_, /*packed=*/true);
  }
  for (const int64_t unit : units) examples.push_back(&pairs_->examples[unit]);
  if (cut_.packing() == PACKING_PADDING_FREE) {
    return RowsOf(PaddingFreeRows(examples, pair_kind_, cut_, seq_len_), cut_, seq_len_,
                  /*packed=*/true);
  }
  return PairRows(examples, pair_kind_, cut_, seq_len_);
}

absl::StatusOr<Batch> DataLoader::Next() {
  const int64_t B = micro_batch_, T = seq_len_, W = dp_size_;
  if (pairs_ != nullptr || prompt_length_ > 0) return NextPairs();
  if (synthetic_ != nullptr) {
    const at::Tensor sequences = synthetic_->Sequences(stream_, position_, B, T + 1);
    position_ += B * W;
    return Batch{sequences.narrow(1, 0, T).contiguous(), sequences.narrow(1, 1, T).contiguous()};
  }
  const int64_t start = shuffle_ ? NextShuffledPosition() : position_;
  PLAIT_ASSIGN_OR_RETURN(const at::Tensor window,
                         base::Annotate(file_->Read(start, B * T + 1), file_field_));
  if (!shuffle_) {
    // llm.c's dataloader_next_batch: advance by the whole world's batch, and start over when
    // the next one would pass the end. llm.c measures that from each rank's own position, so
    // higher ranks start over a batch early; here every rank measures from rank 0's, so the
    // ranks start over together and W ranks still read what one rank of W*B reads.
    position_ += B * T * W;
    if (position_ - dp_rank_ * B * T + B * T * W + 1 > file_->size()) Reset();
  }
  Batch batch{window.narrow(0, 0, B * T).view({B, T}), window.narrow(0, 1, B * T).view({B, T})};
  if (document_start_.has_value()) {
    batch.positions = DocumentPositions(batch.inputs, *document_start_);
  }
  return batch;
}

std::optional<double> DataLoader::EntropyFloor() const {
  if (synthetic_ == nullptr || rejected_ != nullptr) return std::nullopt;
  return synthetic_->EntropyRate();
}

std::string DescribePacking(const DataLoader::PackingFigures& figures, PackingStrategy packing,
                            int64_t seq_len) {
  const auto rows = [&](PackingStrategy strategy) -> std::pair<int64_t, double> {
    switch (strategy) {
      case PACKING_BFD:
        return {figures.bfd_rows, figures.bfd_padding};
      case PACKING_PADDING_FREE:
        return {figures.padding_free_rows, figures.padding_free_padding};
      default:
        return {figures.padded_rows, figures.padded_padding};
    }
  };
  const auto name = [](PackingStrategy strategy) -> std::string {
    return strategy == PACKING_NONE ? "one sequence a row" : PackingStrategy_Name(strategy);
  };
  const auto [used_rows, used_padding] = rows(packing);
  std::string line =
      absl::StrFormat("%d sequences in %d rows of %d tokens (%s), %.1f%% padding",
                      figures.sequences, used_rows, seq_len, name(packing), 100 * used_padding);
  for (const PackingStrategy other : {PACKING_NONE, PACKING_BFD, PACKING_PADDING_FREE}) {
    const auto [other_rows, other_padding] = rows(other);
    if (other == packing || other_rows == 0) continue;
    absl::StrAppendFormat(&line, "; %s: %d rows, %.1f%% padding", name(other), other_rows,
                          100 * other_padding);
  }
  return line;
}

double UsefulShare(const DataLoader::PackingFigures& figures, PackingStrategy packing) {
  return 1.0 - (packing == PACKING_BFD ? figures.bfd_padding : figures.padded_padding);
}

}  // namespace plait::data
