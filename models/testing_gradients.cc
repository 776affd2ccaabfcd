#include "models/testing_gradients.h"

#include "ATen/core/Tensor.h"
#include "gtest/gtest.h"
#include "torch/nn/module.h"

namespace plait::models::testing {

LossAndGradients BackwardOf(CausalLM& model, const at::Tensor& loss) {
  loss.backward();
  LossAndGradients result{loss.item<double>(), {}};
  for (const auto& item : model.named_parameters()) {
    result.gradients[item.key()] = item.value().grad().to(at::kCPU, at::kFloat);
  }
  return result;
}

void ExpectClose(const LossAndGradients& got, const LossAndGradients& want, double tolerance) {
  EXPECT_NEAR(got.loss, want.loss, tolerance * want.loss);
  ASSERT_EQ(got.gradients.size(), want.gradients.size());
  for (const auto& [name, gradient] : want.gradients) {
    const double error =
        (got.gradients.at(name) - gradient).norm().item<double>() / gradient.norm().item<double>();
    EXPECT_LE(error, tolerance) << name;
  }
}

void ExpectElementsClose(const at::Tensor& actual, const at::Tensor& expected, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = expected.abs().max().item<double>();
  const double off = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  EXPECT_LE(off, tolerance * scale) << what << ": off by " << off << " of " << scale;
}

}  // namespace plait::models::testing
