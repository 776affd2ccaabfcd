#include "data/markov_source.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/hash.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {
namespace {

int Sample(const std::vector<double>& cumulative, double u) {
  const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u * cumulative.back());
  return static_cast<int>(std::min<std::ptrdiff_t>(it - cumulative.begin(), cumulative.size() - 1));
}

}  // namespace

absl::StatusOr<MarkovSource> MarkovSource::Create(const SyntheticData& config, int64_t vocab_size,
                                                  absl::string_view field_path) {
  const int64_t n = config.num_states();
  if (n < 2 || n > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field_path, ".num_states: ", n, "; must be in [2, vocab_size = ", vocab_size, "]"));
  }
  if (config.branching() < 1 || config.branching() > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(field_path, ".branching: ", config.branching(), "; must be in [1, ", n, "]"));
  }
  if (!(config.peak() >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field_path, ".peak: ", config.peak(), "; must be >= 1"));
  }
  MarkovSource source;
  source.seed_ = config.seed();
  std::mt19937_64 random(base::SplitMix64(config.seed()));

  std::vector<int64_t> ids(vocab_size);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), random);
  source.token_of_state_.assign(ids.begin(), ids.begin() + n);

  std::vector<double> weights(config.branching());
  for (int64_t k = 0; k < config.branching(); ++k) weights[k] = std::pow(config.peak(), -k);
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  double row_entropy = 0.0;
  for (double w : weights) row_entropy -= (w / total) * std::log(w / total);

  // Each state's successors include the next state in a cycle through all of them, so the
  // chain is irreducible and every state keeps appearing; the others are random, and the
  // order (hence which is most likely) is shuffled.
  std::vector<int> others;
  for (int64_t s = 0; s < n; ++s) {
    others.clear();
    for (int64_t o = 0; o < n; ++o) {
      if (o != (s + 1) % n) others.push_back(static_cast<int>(o));
    }
    std::shuffle(others.begin(), others.end(), random);
    std::vector<int> successors = {static_cast<int>((s + 1) % n)};
    successors.insert(successors.end(), others.begin(), others.begin() + (config.branching() - 1));
    std::shuffle(successors.begin(), successors.end(), random);
    source.successors_.push_back(std::move(successors));
    std::vector<double> cumulative;
    double sum = 0.0;
    for (double w : weights) cumulative.push_back(sum += w / total);
    source.cumulative_.push_back(std::move(cumulative));
  }

  // Every state's successors have the same probabilities (permuted), so every position's
  // conditional entropy, and hence the rate, is that of one row, whatever the state's
  // distribution.
  source.entropy_rate_ = row_entropy;
  return source;
}

at::Tensor MarkovSource::Sequences(uint64_t stream, int64_t first, int64_t count,
                                   int64_t length) const {
  at::Tensor out = torch::empty({count, length}, at::kLong);
  int64_t* data = out.data_ptr<int64_t>();
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < count; ++i) {
    std::mt19937_64 random(base::SplitMix64(
        seed_ ^ base::SplitMix64(stream ^ base::SplitMix64(static_cast<uint64_t>(first + i)))));
    int state = static_cast<int>(random() % token_of_state_.size());
    for (int64_t t = 0; t < length; ++t) {
      data[i * length + t] = token_of_state_[state];
      state = successors_[state][Sample(cumulative_[state], uniform(random))];
    }
  }
  return out;
}

}  // namespace plait::data
