#include "generation/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::generation {
namespace {

const std::vector<double> kLogits = {2.0, 1.5, 1.4, 0.3, 0.2, -0.5, -1.0, -3.0};

SamplingConfig Config(double temperature, int top_k, double top_p, double min_p) {
  SamplingConfig config;
  config.set_temperature(temperature);
  config.set_top_k(top_k);
  config.set_top_p(top_p);
  config.set_min_p(min_p);
  config.set_max_new_tokens(1);
  config.set_seed(5);
  return config;
}

// The distribution transformers' warpers leave, written out on doubles: logits / T, then
// top-k, top-p (ascending cumulative probability at most 1 - top_p goes, the most likely
// stays) and min-p.
std::vector<double> Expected(const SamplingConfig& config) {
  const size_t n = kLogits.size();
  std::vector<double> scores(n);
  std::vector<bool> kept(n, true);
  for (size_t i = 0; i < n; ++i) scores[i] = kLogits[i] / config.temperature();
  const auto probabilities = [&] {
    std::vector<double> p(n, 0.0);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += kept[i] ? std::exp(scores[i]) : 0.0;
    for (size_t i = 0; i < n; ++i) p[i] = kept[i] ? std::exp(scores[i]) / total : 0.0;
    return p;
  };
  std::vector<size_t> ascending(n);
  std::iota(ascending.begin(), ascending.end(), 0);
  std::sort(ascending.begin(), ascending.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  if (config.top_k() > 0) {
    for (size_t rank = 0; rank + config.top_k() < n; ++rank) kept[ascending[rank]] = false;
  }
  if (config.top_p() > 0.0) {
    const std::vector<double> p = probabilities();
    double cumulative = 0.0;
    std::vector<size_t> removed;
    for (size_t rank = 0; rank + 1 < n; ++rank) {
      cumulative += p[ascending[rank]];
      if (cumulative <= 1.0 - config.top_p()) removed.push_back(ascending[rank]);
    }
    for (size_t i : removed) kept[i] = false;
  }
  if (config.min_p() > 0.0) {
    const std::vector<double> p = probabilities();
    const double most = *std::max_element(p.begin(), p.end());
    for (size_t i = 0; i < n; ++i) {
      if (p[i] < config.min_p() * most) kept[i] = false;
    }
  }
  return probabilities();
}

// Pearson's chi-square of `counts` against `expected` probabilities over the tokens that may
// be drawn, and whether a token that may not was.
struct ChiSquare {
  double statistic = 0.0;
  int degrees_of_freedom = -1;
  bool drew_a_filtered_token = false;
};

ChiSquare ChiSquareOf(const std::vector<int64_t>& counts, const std::vector<double>& expected,
                      int64_t draws) {
  ChiSquare result;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0.0) {
      result.drew_a_filtered_token |= counts[i] > 0;
      continue;
    }
    const double want = expected[i] * static_cast<double>(draws);
    result.statistic += (static_cast<double>(counts[i]) - want) * (counts[i] - want) / want;
    ++result.degrees_of_freedom;
  }
  return result;
}

// The chi-square distribution's upper 0.1% points, by degrees of freedom (1 to 7).
constexpr double kCritical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

// 20,000 rows, each its own prompt's draw from the same logits: their tokens' frequencies
// match the filtered softmax at a significance of 0.1% (the draws are seeded, so the test is
// deterministic), and each sampled log-probability is that distribution's.
TEST(SamplerTest, TokenFrequenciesMatchTheFilteredSoftmax) {
  constexpr int64_t kDraws = 20000;
  const at::Tensor row = at::tensor(kLogits, at::kFloat);
  const at::Tensor logits = row.unsqueeze(0).expand({kDraws, row.size(0)});
  std::vector<RowSeed> rows;
  for (int64_t i = 0; i < kDraws; ++i) rows.push_back({.prompt = i, .sample = 0});
  for (const SamplingConfig& config :
       {Config(1.0, 0, 0, 0), Config(0.7, 0, 0, 0), Config(1.0, 5, 0, 0), Config(1.0, 0, 0.9, 0),
        Config(1.0, 0, 0, 0.1), Config(0.7, 6, 0.95, 0.05)}) {
    SCOPED_TRACE(config.ShortDebugString());
    const std::vector<double> expected = Expected(config);
    Sampler sampler(config, rows);
    const Draws draws = sampler.Next(logits);
    std::vector<int64_t> counts(kLogits.size(), 0);
    for (int64_t i = 0; i < kDraws; ++i) {
      const int64_t token = draws.tokens[i].item<int64_t>();
      ++counts[token];
      EXPECT_NEAR(draws.sampling_logprobs[i].item<float>(), std::log(expected[token]), 1e-5);
    }
    const ChiSquare chi = ChiSquareOf(counts, expected, kDraws);
    EXPECT_FALSE(chi.drew_a_filtered_token);
    ASSERT_GE(chi.degrees_of_freedom, 1);
    EXPECT_LT(chi.statistic, kCritical[chi.degrees_of_freedom]);
  }
}

// The filters do bite: each leaves the tokens it should (the expected distributions above
// would pass a sampler that ignored them only if they kept everything).
TEST(SamplerTest, EachFilterLeavesItsTokens) {
  const auto kept = [](const SamplingConfig& config) {
    const at::Tensor p = Sampler(config, {}).Distribution(at::tensor(kLogits, at::kFloat));
    return (p > 0).sum().item<int64_t>();
  };
  EXPECT_EQ(kept(Config(1.0, 0, 0, 0)), 8);
  EXPECT_EQ(kept(Config(1.0, 5, 0, 0)), 5);
  EXPECT_EQ(kept(Config(1.0, 0, 0.9, 0)), 5);
  EXPECT_EQ(kept(Config(1.0, 0, 0, 0.1)), 5);
  for (const SamplingConfig& config : {Config(1.0, 5, 0, 0), Config(1.0, 0, 0.9, 0),
                                       Config(1.0, 0, 0, 0.1), Config(0.7, 6, 0.95, 0.05)}) {
    const at::Tensor p = Sampler(config, {}).Distribution(at::tensor(kLogits, at::kDouble));
    const std::vector<double> expected = Expected(config);
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(p[i].item<double>(), expected[i], 1e-12) << config.ShortDebugString();
    }
  }
}

// Greedy takes the most likely token, the lowest id on a tie; its log-probabilities are the
// model's (temperature 1) and 0 under the one-hot distribution it draws from.
TEST(SamplerTest, GreedyTakesTheMostLikelyLowestId) {
  const at::Tensor logits =
      at::tensor({0.5f, 3.0f, 3.0f, -1.0f, 2.0f, 2.5f, 2.5f, 0.0f}).view({2, 4});
  Sampler sampler(Config(0.0, 0, 0, 0), {{0, 0}, {1, 0}});
  const Draws draws = sampler.Next(logits);
  EXPECT_EQ(draws.tokens[0].item<int64_t>(), 1);
  EXPECT_EQ(draws.tokens[1].item<int64_t>(), 1);
  EXPECT_NEAR(draws.logprobs[0].item<float>(), logits[0].log_softmax(0)[1].item<float>(), 1e-7);
  EXPECT_EQ(draws.sampling_logprobs[1].item<float>(), 0.0f);
}

// A row's draws depend on its seed, prompt and sample and the step alone: the same alone as
// among 15 other rows with other logits; and the next step draws anew.
TEST(SamplerTest, ARowDrawsTheSameAloneAndInABatch) {
  const SamplingConfig config = Config(1.0, 0, 0, 0);
  at::manual_seed(1);
  const at::Tensor logits = at::randn({16, 50});
  std::vector<RowSeed> rows;
  for (int64_t i = 0; i < 16; ++i) rows.push_back({.prompt = i / 4, .sample = i % 4});
  Sampler batch(config, rows);
  Sampler alone(config, {rows[9]});
  std::vector<int64_t> in_batch, by_itself;
  for (int step = 0; step < 20; ++step) {
    in_batch.push_back(batch.Next(logits).tokens[9].item<int64_t>());
    by_itself.push_back(alone.Next(logits.narrow(0, 9, 1)).tokens[0].item<int64_t>());
  }
  EXPECT_EQ(in_batch, by_itself);
  EXPECT_GT(std::set<int64_t>(by_itself.begin(), by_itself.end()).size(), 1u);
}

}  // namespace
}  // namespace plait::generation
