// LinearProduct's decoding forms (a matrix-vector product for one row, slices of the weight
// for up to 16) against the matrix product; outside decoding, and where a product needs a
// gradient, the matrix product itself.
#include "wrap/seams.h"

#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/grad_mode.h"

namespace plait::wrap {
namespace {

TEST(LinearProductTest, DecodingFormsEqualTheMatrixProduct) {
  at::manual_seed(3);
  at::NoGradGuard no_grad;
  const DecodingProducts decoding;
  // 1000 outputs: the last slice is narrower than the others; 4864 inputs: no slice of 16
  // rows is small enough at 16 rows; no rows: a mixture's expert that no token chose.
  for (const int64_t width : {896, 4864}) {
    const at::Tensor weight = at::randn({1000, width});
    const at::Tensor bias = at::randn({1000});
    for (const int64_t rows : {0, 1, 2, 5, 16, 17}) {
      const at::Tensor x = at::randn({rows, 1, width});
      for (const bool with_bias : {false, true}) {
        const at::Tensor b = with_bias ? bias : at::Tensor();
        const at::Tensor expected = at::linear(x, weight, b);
        const at::Tensor product = LinearProduct(x, weight, b);
        ASSERT_EQ(product.sizes(), expected.sizes());
        EXPECT_TRUE(product.allclose(expected, /*rtol=*/1e-5, /*atol=*/1e-4))
            << rows << " rows of " << width << (with_bias ? ", bias" : "");
      }
    }
  }
}

// Outside decoding, a forward under no-grad computes what it computes with gradients, bit for
// bit (activation checkpointing recomputes a block so).
TEST(LinearProductTest, OutsideDecodingTheMatrixProductWhateverTheGradMode) {
  at::manual_seed(4);
  const at::Tensor weight = at::randn({1000, 896});
  const at::Tensor x = at::randn({5, 896});
  at::NoGradGuard no_grad;
  EXPECT_FALSE(DecodingProducts::active());
  EXPECT_TRUE(LinearProduct(x, weight, at::Tensor()).equal(at::linear(x, weight)));
  {
    const DecodingProducts decoding;
    EXPECT_TRUE(DecodingProducts::active());
  }
  EXPECT_FALSE(DecodingProducts::active());
}

TEST(LinearProductTest, AProductThatNeedsAGradientStaysDifferentiable) {
  const DecodingProducts decoding;
  const at::Tensor weight = at::randn({100, 64}).requires_grad_(true);
  const at::Tensor x = at::randn({4, 64});
  LinearProduct(x, weight, at::Tensor()).sum().backward();
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_TRUE(weight.grad().allclose(x.sum(0).expand({100, 64})));
}

}  // namespace
}  // namespace plait::wrap
