#include "generation/sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/argmax.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/logsumexp.h"
#include "ATen/ops/softmax.h"
#include "ATen/ops/sort.h"
#include "ATen/ops/topk.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/str_cat.h"
#include "base/hash.h"

namespace plait::generation {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// A uniform draw in [0, 1) of row `row` at step `step`: from its own stream, seeded by
// (seed, prompt, sample), so that no other row changes it.
double UniformDraw(uint64_t seed, const RowSeed& row, int64_t step) {
  const uint64_t stream = base::SplitMix64(
      base::SplitMix64(base::SplitMix64(seed) + static_cast<uint64_t>(row.prompt)) +
      static_cast<uint64_t>(row.sample));
  return static_cast<double>(base::SplitMix64(stream + static_cast<uint64_t>(step)) >> 11) *
         0x1.0p-53;
}

// The first token whose cumulative probability passes `u` of the total; the last token of
// nonzero probability where rounding leaves none.
int64_t InverseCdf(const at::Tensor& probabilities, double u) {
  const auto p = probabilities.accessor<double, 1>();
  double total = 0.0;
  for (int64_t i = 0; i < p.size(0); ++i) total += p[i];
  const double target = u * total;
  double cumulative = 0.0;
  int64_t last = 0;
  for (int64_t i = 0; i < p.size(0); ++i) {
    if (p[i] <= 0.0) continue;
    cumulative += p[i];
    last = i;
    if (cumulative > target) return i;
  }
  return last;
}

}  // namespace

Sampler::Sampler(const SamplingConfig& config, std::vector<RowSeed> rows)
    : config_(config), rows_(std::move(rows)) {}

at::Tensor Sampler::Distribution(const at::Tensor& logits) const {
  at::Tensor scores = logits.to(at::kDouble).cpu().contiguous();
  const int64_t vocab = scores.size(0);
  TORCH_CHECK(config_.temperature() > 0.0,
              "Sampler::Distribution: greedy decoding draws from no distribution");
  scores = scores / config_.temperature();
  if (config_.top_k() > 0 && config_.top_k() < vocab) {
    const at::Tensor kth = std::get<0>(at::topk(scores, config_.top_k())).select(0, -1);
    scores.masked_fill_(scores < kth, -kInfinity);
  }
  if (config_.top_p() > 0.0 && config_.top_p() < 1.0) {
    // transformers' TopPLogitsWarper: in ascending order, the tokens whose cumulative
    // probability is at most 1 - top_p go, the most likely always stays.
    const auto [sorted, order] = at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    at::Tensor remove = at::softmax(sorted, 0).cumsum(0) <= 1.0 - config_.top_p();
    remove[vocab - 1] = false;
    scores.index_fill_(0, order.masked_select(remove), -kInfinity);
  }
  if (config_.min_p() > 0.0) {
    const at::Tensor probabilities = at::softmax(scores, 0);
    scores.masked_fill_(probabilities < config_.min_p() * probabilities.max(), -kInfinity);
  }
  return at::softmax(scores, 0);
}

Draws Sampler::Next(const at::Tensor& logits) {
  const int64_t rows = logits.size(0);
  TORCH_CHECK(rows == static_cast<int64_t>(rows_.size()), "Sampler: logits of ", rows,
              " rows for a sampler of ", rows_.size());
  const at::Tensor wide = logits.to(at::kFloat);
  Draws draws;
  draws.sampling_logprobs = at::zeros({rows}, at::kFloat);
  if (config_.temperature() == 0.0) {
    draws.tokens = at::argmax(wide, /*dim=*/-1).cpu();
  } else {
    draws.tokens = at::empty({rows}, at::kLong);
    for (int64_t r = 0; r < rows; ++r) {
      const at::Tensor probabilities = Distribution(wide[r]);
      const int64_t token = InverseCdf(probabilities, UniformDraw(config_.seed(), rows_[r], step_));
      draws.tokens[r] = token;
      draws.sampling_logprobs[r] = std::log(probabilities[token].item<double>());
    }
  }
  // log_softmax at the drawn tokens alone: their logits less each row's log-sum-exp.
  draws.logprobs = (wide.gather(1, draws.tokens.to(wide.device()).unsqueeze(1)).squeeze(1) -
                    at::logsumexp(wide, /*dim=*/{1}))
                       .cpu();
  ++step_;
  return draws;
}

}  // namespace plait::generation
