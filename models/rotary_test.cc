#include "models/rotary.h"

#include <cmath>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "gtest/gtest.h"
#include "models/model_config.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {
namespace {

ModelConfig Config() {
  ModelConfig config = PresetConfig("tiny").value();
  config.set_hidden_size(64);
  config.set_num_attention_heads(2);
  config.set_num_key_value_heads(2);
  return config;
}

// q . k after rotating q to position i and k to position j.
double RotatedDot(const at::Tensor& inv_freq, const at::Tensor& q, const at::Tensor& k, int64_t i,
                  int64_t j) {
  const RotaryTables ti = MakeRotaryTables(inv_freq, torch::tensor({i}));
  const RotaryTables tj = MakeRotaryTables(inv_freq, torch::tensor({j}));
  const at::Tensor qi =
      ApplyRotary(q.to(at::kDouble), ti.cos.to(at::kDouble), ti.sin.to(at::kDouble));
  const at::Tensor kj =
      ApplyRotary(k.to(at::kDouble), tj.cos.to(at::kDouble), tj.sin.to(at::kDouble));
  return (qi * kj).sum().item<double>();
}

TEST(RotaryTest, DotProductDependsOnlyOnRelativePosition) {
  at::manual_seed(1);
  const ModelConfig config = Config();
  const at::Tensor inv_freq = RotaryInverseFrequencies(config);
  const at::Tensor q = torch::randn({1, 1, 32});  // [T, H, D]
  const at::Tensor k = torch::randn({1, 1, 32});
  for (const auto& [i, j] : {std::pair<int64_t, int64_t>{3, 1}, {7, 7}, {2, 9}}) {
    const double base = RotatedDot(inv_freq, q, k, i, j);
    for (int64_t shift : {1, 5, 100}) {
      EXPECT_NEAR(RotatedDot(inv_freq, q, k, i + shift, j + shift), base, 1e-4)
          << i << " " << j << " shift " << shift;
    }
  }
  // And it does depend on the relative position.
  EXPECT_GT(std::abs(RotatedDot(inv_freq, q, k, 3, 1) - RotatedDot(inv_freq, q, k, 3, 2)), 1e-3);
}

TEST(RotaryTest, PositionZeroIsTheIdentity) {
  const at::Tensor inv_freq = RotaryInverseFrequencies(Config());
  const at::Tensor x = torch::randn({1, 3, 32});
  const RotaryTables tables = MakeRotaryTables(inv_freq, torch::tensor({0}));
  EXPECT_TRUE(at::allclose(ApplyRotary(x, tables.cos, tables.sin), x));
}

// Per-row tables [B, T, d] rotate each row as its own positions' [T, d] tables would: packed
// rows, whose positions restart at each sequence.
TEST(RotaryTest, PerRowTablesRotateEachRowByItsOwnPositions) {
  const at::Tensor inv_freq = RotaryInverseFrequencies(Config());
  const RotaryTables tables = MakeRotaryTables(inv_freq, torch::arange(6));
  const at::Tensor positions = torch::tensor({0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5}).view({2, 6});
  at::manual_seed(2);
  const at::Tensor x = torch::randn({2, 6, 3, 32});
  const at::Tensor rows =
      ApplyRotary(x, tables.cos.index_select(0, positions.flatten()).view({2, 6, 32}),
                  tables.sin.index_select(0, positions.flatten()).view({2, 6, 32}));
  for (int64_t b = 0; b < 2; ++b) {
    const RotaryTables own = MakeRotaryTables(inv_freq, positions[b]);
    EXPECT_TRUE(at::allclose(rows[b], ApplyRotary(x[b], own.cos, own.sin))) << "row " << b;
  }
  // The second row's positions are 0 .. 5: the shared tables' rotation.
  EXPECT_TRUE(at::equal(rows[1], ApplyRotary(x[1], tables.cos, tables.sin)));
  EXPECT_FALSE(at::allclose(rows[0], ApplyRotary(x[0], tables.cos, tables.sin)));
}

TEST(RotaryTest, FrequenciesAreThetaPowers) {
  const ModelConfig config = Config();
  const at::Tensor inv_freq = RotaryInverseFrequencies(config);
  ASSERT_EQ(inv_freq.size(0), 16);
  EXPECT_FLOAT_EQ(inv_freq[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(inv_freq[5].item<float>(),
                  static_cast<float>(std::pow(config.rope_theta(), -10.0 / 32.0)));
}

TEST(RotaryTest, Llama3ScalingKeepsHighAndSlowsLowFrequencies) {
  ModelConfig config = PresetConfig("llama3.2-1b").value();
  const at::Tensor scaled = RotaryInverseFrequencies(config);
  config.clear_rope_scaling();
  const at::Tensor plain = RotaryInverseFrequencies(config);
  ASSERT_EQ(scaled.size(0), 32);
  // Wavelength 2*pi/f below 8192/4: unchanged; above 8192/1: divided by factor 32.
  EXPECT_FLOAT_EQ(scaled[0].item<float>(), plain[0].item<float>());
  EXPECT_FLOAT_EQ(scaled[31].item<float>(), plain[31].item<float>() / 32.0f);
  // In between, smoothly interpolated: strictly between the two.
  int64_t between = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const float s = scaled[i].item<float>();
    const float p = plain[i].item<float>();
    if (s < p && s > p / 32.0f) ++between;
  }
  EXPECT_GT(between, 0);
}

}  // namespace
}  // namespace plait::models
