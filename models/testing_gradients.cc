#include "models/testing_gradients.h"

#include "gtest/gtest.h"

namespace plait::models::testing {

LossAndGradients BackwardOf(CausalLM& model, const torch::Tensor& loss) {
  loss.backward();
  LossAndGradients result{loss.item<double>(), {}};
  for (const auto& item : model.named_parameters()) {
    result.gradients[item.key()] = item.value().grad().to(torch::kCPU, torch::kFloat32);
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

}  // namespace plait::models::testing
