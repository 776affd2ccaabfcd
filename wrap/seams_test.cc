// LinearProduct's decoding forms (a matrix-vector product for one row, slices of the weight
// for up to 16) against the matrix product, and that a product that needs a gradient keeps
// the differentiable form.
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

TEST(LinearProductTest, AProductThatNeedsAGradientStaysDifferentiable) {
  const at::Tensor weight = at::randn({100, 64}).requires_grad_(true);
  const at::Tensor x = at::randn({4, 64});
  LinearProduct(x, weight, at::Tensor()).sum().backward();
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_TRUE(weight.grad().allclose(x.sum(0).expand({100, 64})));
}

}  // namespace
}  // namespace plait::wrap
