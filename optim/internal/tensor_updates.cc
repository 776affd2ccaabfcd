#include "optim/internal/tensor_updates.h"

namespace plait::optim::internal {

void AdamUpdate(const AdamScalars& s, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m,
                torch::Tensor& v) {
  torch::NoGradGuard no_grad;
  p.mul_(s.decay_factor);
  const torch::Tensor grad = s.l2 != 0.0f ? g + s.l2 * p : g;
  m.mul_(s.beta1).add_(grad, s.one_minus_beta1);
  v.mul_(s.beta2).addcmul_(grad, grad, s.one_minus_beta2);
  p.addcdiv_(m, v.sqrt().div_(s.sqrt_bias_correction2).add_(s.eps), s.neg_step_size);
}

void SgdUpdate(const SgdScalars& s, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& b) {
  torch::NoGradGuard no_grad;
  torch::Tensor d = s.weight_decay != 0.0f ? g + s.weight_decay * p : g;
  if (s.momentum != 0.0f) {
    if (s.first_step) {
      b.copy_(d);
    } else {
      b.mul_(s.momentum).add_(d, s.one_minus_dampening);
    }
    d = s.nesterov ? d + s.momentum * b : b;
  }
  p.add_(d, s.neg_lr);
}

void LionUpdate(const LionScalars& s, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m) {
  torch::NoGradGuard no_grad;
  const torch::Tensor direction = (s.beta1 * m).add_(g, s.one_minus_beta1).sign_();
  p.mul_(s.decay_factor).add_(direction, -s.lr);
  m.mul_(s.beta2).add_(g, s.one_minus_beta2);
}

}  // namespace plait::optim::internal
