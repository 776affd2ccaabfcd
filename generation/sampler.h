// The next token of each row of a batch being generated, from its logits, as a SamplingConfig
// says (greedy, or temperature then top-k, top-p and min-p filters, as transformers' generate
// orders them), with each row's draws from a generator of its own: the row's completion does
// not depend on the other rows of its batch. For each token it records two log-probabilities:
// under the model's distribution at temperature 1, unfiltered (what a trainer recomputes from
// the same tokens), and under the distribution it was drawn from.
//
//   Sampler sampler(config, {{.prompt = 0, .sample = 0}, {.prompt = 0, .sample = 1}});
//   Draws draws = sampler.Next(logits);  // logits [B, V]; draws.tokens [B]
#ifndef PLAIT_GENERATION_SAMPLER_H_
#define PLAIT_GENERATION_SAMPLER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "generation/sampling.pb.h"

namespace plait::generation {

// Which completion a row draws: sample `sample` of prompt `prompt`.
struct RowSeed {
  int64_t prompt = 0;
  int64_t sample = 0;
};

// One step's draws, on the host: int64 tokens [B]; fp32 log-probabilities [B] under the model
// (log_softmax of the logits) and under the sampling distribution (0 when greedy).
struct Draws {
  at::Tensor tokens;
  at::Tensor logprobs;
  at::Tensor sampling_logprobs;
};

class Sampler {
 public:
  // For the rows `rows` describe, in batch order, under a valid `config`.
  Sampler(const SamplingConfig& config, std::vector<RowSeed> rows);

  // The next token of each row from `logits` [B, V] (any float dtype, any device).
  Draws Next(const at::Tensor& logits);

  // The probabilities [V] (fp64, on the host) row `logits` [V] is drawn from when the
  // temperature is positive: the softmax of logits / temperature after the filters. (Greedy
  // decoding takes the most likely token, the lowest id on a tie.)
  at::Tensor Distribution(const at::Tensor& logits) const;

 private:
  SamplingConfig config_;
  std::vector<RowSeed> rows_;
  int64_t step_ = 0;
};

}  // namespace plait::generation

#endif  // PLAIT_GENERATION_SAMPLER_H_
