// A seeded synthetic token source with a known entropy rate (data.proto's SyntheticData): an
// order-1 Markov chain over a few token ids, with peaked transitions, so a small model can
// learn it quickly and the best achievable loss is known. Sequences are pure functions of
// (stream, index), so any rank can draw any sequence of the global batch:
//
//   PLAIT_ASSIGN_OR_RETURN(MarkovSource source,
//                          MarkovSource::Create(config, vocab_size, "plan.data.synthetic"));
//   at::Tensor tokens = source.Sequences(/*stream=*/0, /*first=*/0, /*count=*/8, 65);
//   double floor = source.EntropyRate();  // nats per token
#ifndef PLAIT_DATA_MARKOV_SOURCE_H_
#define PLAIT_DATA_MARKOV_SOURCE_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/data.pb.h"

namespace plait::data {

class MarkovSource {
 public:
  // The chain `config` describes (defaults filled as ResolvedDataConfig does) over ids below
  // `vocab_size`; InvalidArgument naming `field_path`.<field> (`field_path` is where
  // `config` sits in the caller's config, "plan.data.synthetic") for a value out of range.
  static absl::StatusOr<MarkovSource> Create(const SyntheticData& config, int64_t vocab_size,
                                             absl::string_view field_path);

  // The entropy of the next token given the current one, in nats, the same for every state:
  // the expected loss of the true chain at every position, so the loss floor of a model
  // trained on these sequences.
  double EntropyRate() const { return entropy_rate_; }

  // Sequences first .. first+count-1 of stream `stream`, each `length` tokens: int64
  // [count, length]. The first token's state is uniform.
  at::Tensor Sequences(uint64_t stream, int64_t first, int64_t count, int64_t length) const;

 private:
  MarkovSource() = default;

  uint64_t seed_ = 0;
  std::vector<int64_t> token_of_state_;
  std::vector<std::vector<int>> successors_;     // per state
  std::vector<std::vector<double>> cumulative_;  // per state, over successors_
  double entropy_rate_ = 0.0;
};

}  // namespace plait::data

#endif  // PLAIT_DATA_MARKOV_SOURCE_H_
