// Decoding with a KvCache against the full forward: every family's logits at each position of
// left-padded rows of different lengths, prompts and then one token at a time, equal those
// Forward gives each row alone.
#include "models/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/testing_models.h"
#include "torch/csrc/autograd/grad_mode.h"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;

constexpr int64_t kNewTokens = 4;

// The largest difference between the logits of each row decoded in one batch (left-padded
// prompts of `lengths` tokens, then kNewTokens tokens one at a time) and those Forward gives
// the row alone, at every position of the row's own tokens.
double LargestDifference(CausalLM& model, const std::vector<int64_t>& lengths, bool generic) {
  internal::UseGenericOps(model, generic);
  at::NoGradGuard no_grad;
  const int64_t rows = static_cast<int64_t>(lengths.size());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int64_t vocab = model.config().vocab_size();
  at::manual_seed(3);
  const at::Tensor sequences = at::randint(vocab, {rows, longest + kNewTokens}, at::kLong);
  at::Tensor pads = at::empty({rows}, at::kLong);
  at::Tensor prompts = at::zeros({rows, longest}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    pads[r] = longest - lengths[r];
    prompts[r]
        .narrow(0, longest - lengths[r], lengths[r])
        .copy_(sequences[r].narrow(0, 0, lengths[r]));
  }
  KvCache cache(pads, longest + kNewTokens);
  std::vector<at::Tensor> decoded = {model.Decode(prompts, cache)};
  for (int64_t i = 0; i < kNewTokens; ++i) {
    // Row r's next token is its sequence's token lengths[r] + i.
    at::Tensor next = at::empty({rows, 1}, at::kLong);
    for (int64_t r = 0; r < rows; ++r) next[r][0] = sequences[r][lengths[r] + i];
    decoded.push_back(model.Decode(next, cache));
  }
  EXPECT_EQ(cache.length(), longest + kNewTokens);
  // The last position's alone, as a prompt's next token needs.
  KvCache again(pads, longest);
  const at::Tensor last = model.Decode(prompts, again, /*logits_to_keep=*/1);
  EXPECT_EQ(last.size(1), 1);
  EXPECT_LT((last[0][0] - decoded.front()[0][longest - 1]).abs().max().item<double>(), 1e-5);
  const at::Tensor logits = at::cat(decoded, 1);  // [B, longest + kNewTokens, V]
  double largest = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t own = lengths[r] + kNewTokens;
    const at::Tensor alone = model.Forward(sequences[r].narrow(0, 0, own).unsqueeze(0))[0];
    const at::Tensor batched = logits[r].narrow(0, pads[r].item<int64_t>(), own);
    largest = std::max(largest, (alone - batched).abs().max().item<double>());
  }
  return largest;
}

class DecodeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeTest, EqualsTheFullForwardOfEachRowAlone) {
  std::shared_ptr<CausalLM> model = testing::SeededModel(GetParam(), 11);
  for (const bool generic : {false, true}) {
    EXPECT_LT(LargestDifference(*model, {5, 2, 7, 1}, generic), 1e-5)
        << GetParam() << (generic ? ", generic ops" : ", fused ops");
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, DecodeTest,
                         ::testing::Values("tiny", "qwen2-tiny", "qwen3-tiny", "qwen3-moe-tiny",
                                           "mixtral-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(KvCacheTest, PositionsAndMaskLeaveThePaddingOut) {
  KvCache cache(at::tensor({0, 2}, at::kLong), 8);
  EXPECT_TRUE(cache.Positions(3, at::kCPU).equal(at::tensor({0, 1, 2, 0, 0, 0}).view({2, 3})));
  const at::Tensor mask = cache.Mask(3, at::kFloat, at::kCPU);
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{2, 3, 3}));
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0: causal. Row 1: its padding meets itself alone; its token 2 meets itself.
  EXPECT_TRUE(
      mask[0].equal(at::tensor({0.f, -inf, -inf, 0.f, 0.f, -inf, 0.f, 0.f, 0.f}).view({3, 3})));
  EXPECT_TRUE(
      mask[1].equal(at::tensor({0.f, -inf, -inf, -inf, 0.f, -inf, -inf, -inf, 0.f}).view({3, 3})));
  const at::Tensor k = at::ones({2, 3, 1, 4});
  const auto [keys, values] = cache.Append(0, k, k * 2);
  EXPECT_EQ(keys.sizes(), (std::vector<int64_t>{2, 1, 3, 4}));
  cache.Advance(3);
  EXPECT_EQ(cache.bytes(), 2 * 2 * 8 * 1 * 4 * 4);
  EXPECT_TRUE(cache.Positions(1, at::kCPU).equal(at::tensor({3, 1}).view({2, 1})));
  const auto [more_keys, more_values] = cache.Append(0, k.narrow(1, 0, 1) * 3, k.narrow(1, 0, 1));
  EXPECT_EQ(more_keys.size(2), 4);
  EXPECT_EQ(more_keys[0][0][3][0].item<float>(), 3.f);
  EXPECT_EQ(more_values[1][0][0][0].item<float>(), 2.f);
  // Each head's keys are rows of one matrix, whose rows are the cache's capacity apart.
  EXPECT_EQ(more_keys.stride(1), 8 * 4);
  EXPECT_EQ(more_keys.stride(2), 4);
}

}  // namespace
}  // namespace plait::models
