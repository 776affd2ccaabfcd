#include "data/data_loader.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace plait::data {

absl::StatusOr<DataLoader> DataLoader::Create(const DataConfig& data, Split split,
                                              int64_t vocab_size, int64_t micro_batch,
                                              int64_t seq_len, int dp_rank, int dp_size,
                                              absl::string_view field_path) {
  DataLoader loader;
  loader.micro_batch_ = micro_batch;
  loader.seq_len_ = seq_len;
  loader.dp_rank_ = dp_rank;
  loader.dp_size_ = dp_size;
  if (data.has_synthetic()) {
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
  }
  loader.Reset();
  return loader;
}

void DataLoader::Reset() {
  position_ = file_ != nullptr ? dp_rank_ * micro_batch_ * seq_len_ : dp_rank_ * micro_batch_;
  pass_ = 0;
  next_window_ = 0;
  window_order_.clear();
}

std::optional<int64_t> DataLoader::DistinctBatches() const {
  if (file_ == nullptr) return std::nullopt;
  return BatchesPerPass();
}

int64_t DataLoader::BatchesPerPass() const {
  // Whole world batches whose read (W*B*T + 1 tokens) fits in the file: sequential reading
  // starts over, and shuffled reading reshuffles, after this many.
  return (file_->size() - 1) / (micro_batch_ * seq_len_ * dp_size_);
}

void DataLoader::ShuffleNextPass() {
  window_order_.resize(BatchesPerPass());
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
  if (shuffle_) {
    pass_ = micro_batches / per_pass;
    if (micro_batches % per_pass == 0) return;  // the next read orders pass `pass_`
    ShuffleNextPass();
    next_window_ = micro_batches % per_pass;
    return;
  }
  position_ += (micro_batches % per_pass) * micro_batch_ * seq_len_ * dp_size_;
}

absl::StatusOr<Batch> DataLoader::Next() {
  const int64_t B = micro_batch_, T = seq_len_, W = dp_size_;
  if (synthetic_ != nullptr) {
    const torch::Tensor sequences = synthetic_->Sequences(stream_, position_, B, T + 1);
    position_ += B * W;
    return Batch{sequences.narrow(1, 0, T).contiguous(), sequences.narrow(1, 1, T).contiguous()};
  }
  const int64_t start = shuffle_ ? NextShuffledPosition() : position_;
  PLAIT_ASSIGN_OR_RETURN(const torch::Tensor window,
                         base::Annotate(file_->Read(start, B * T + 1), file_field_));
  if (!shuffle_) {
    // llm.c's dataloader_next_batch: advance by the whole world's batch, and start over when
    // the next one would pass the end. llm.c measures that from each rank's own position, so
    // higher ranks start over a batch early; here every rank measures from rank 0's, so the
    // ranks start over together and W ranks still read what one rank of W*B reads.
    position_ += B * T * W;
    if (position_ - dp_rank_ * B * T + B * T * W + 1 > file_->size()) Reset();
  }
  return Batch{window.narrow(0, 0, B * T).view({B, T}), window.narrow(0, 1, B * T).view({B, T})};
}

std::optional<double> DataLoader::EntropyFloor() const {
  if (synthetic_ == nullptr) return std::nullopt;
  return synthetic_->EntropyRate();
}

}  // namespace plait::data
