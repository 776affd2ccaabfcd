// For tests that run one model two ways (the fused CPU kernels against the generic ops, the
// CPU against CUDA) and compare: the loss and every parameter's gradient of a backward, on the
// CPU in fp32 whatever the model's device and dtype, and the comparison within a relative
// tolerance; and any two tensors, element by element:
//
//   const at::Tensor loss = model->Loss(tokens, targets);
//   const LossAndGradients got = BackwardOf(*model, loss);
//   ExpectClose(got, want, 1e-5);
#ifndef PLAIT_MODELS_TESTING_GRADIENTS_H_
#define PLAIT_MODELS_TESTING_GRADIENTS_H_

#include <map>
#include <string>

#include "ATen/core/Tensor.h"
#include "models/causal_lm.h"

namespace plait::models::testing {

struct LossAndGradients {
  double loss;
  std::map<std::string, at::Tensor> gradients;  // on the CPU, fp32
};

// Runs `loss`'s backward through `model` and collects the loss and the gradients.
LossAndGradients BackwardOf(CausalLM& model, const at::Tensor& loss);

// `got` against `want` (gtest expectations): the loss and each gradient within `tolerance`,
// relative (a gradient's as the norm of the difference over the norm of `want`'s).
void ExpectClose(const LossAndGradients& got, const LossAndGradients& want, double tolerance);

// `actual` against `expected` of the same shape (gtest expectations, naming `what`): each
// element within `tolerance` times `expected`'s largest magnitude of its counterpart.
void ExpectElementsClose(const at::Tensor& actual, const at::Tensor& expected, double tolerance,
                         const std::string& what);

}  // namespace plait::models::testing

#endif  // PLAIT_MODELS_TESTING_GRADIENTS_H_
