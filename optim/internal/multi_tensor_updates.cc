#include "optim/internal/multi_tensor_updates.h"

#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/_foreach_add.h"
#include "ATen/ops/_foreach_addcdiv.h"
#include "ATen/ops/_foreach_addcmul.h"
#include "ATen/ops/_foreach_div.h"
#include "ATen/ops/_foreach_mul.h"
#include "ATen/ops/_foreach_sqrt.h"
#include "base/torch_compat.h"

namespace plait::optim::internal {

void AdamUpdate(const AdamStep& s, at::TensorList p, at::TensorList g, at::TensorList m,
                at::TensorList v) {
  at::NoGradGuard no_grad;
  if (base::FusedAdam(s.decoupled, p, g, m, v, s.step, s.lr, s.beta1, s.beta2, s.weight_decay,
                      s.eps)) {
    return;
  }
  const AdamScalars c = ScalarsOf(s);
  if (c.decay_factor != 1.0f) at::_foreach_mul_(p, c.decay_factor);
  const std::vector<at::Tensor> grad = c.l2 != 0.0f ? at::_foreach_add(g, p, c.l2) : g.vec();
  at::_foreach_mul_(m, c.beta1);
  at::_foreach_add_(m, grad, c.one_minus_beta1);
  at::_foreach_mul_(v, c.beta2);
  at::_foreach_addcmul_(v, grad, grad, c.one_minus_beta2);
  std::vector<at::Tensor> denominator = at::_foreach_sqrt(v);
  at::_foreach_div_(denominator, c.sqrt_bias_correction2);
  at::_foreach_add_(denominator, c.eps);
  at::_foreach_addcdiv_(p, m, denominator, c.neg_step_size);
}

void SgdUpdate(const SgdStep& s, at::TensorList p, at::TensorList g, at::TensorList b) {
  at::NoGradGuard no_grad;
  if (base::FusedSgd(p, g, b, s.lr, s.weight_decay, s.momentum, s.dampening, s.nesterov,
                     s.first_step)) {
    return;
  }
  const SgdScalars c = ScalarsOf(s);
  std::vector<at::Tensor> d =
      c.weight_decay != 0.0f ? at::_foreach_add(g, p, c.weight_decay) : g.vec();
  if (c.momentum != 0.0f) {
    if (c.first_step) {
      base::ForeachCopy_(b, d);
    } else {
      at::_foreach_mul_(b, c.momentum);
      at::_foreach_add_(b, d, c.one_minus_dampening);
    }
    d = c.nesterov ? at::_foreach_add(d, b, c.momentum) : b.vec();
  }
  at::_foreach_add_(p, d, c.neg_lr);
}

void LionUpdate(const LionStep& s, at::TensorList p, at::TensorList g, at::TensorList m) {
  at::NoGradGuard no_grad;
  const LionScalars c = ScalarsOf(s);
  std::vector<at::Tensor> direction = at::_foreach_mul(m, c.beta1);
  at::_foreach_add_(direction, g, c.one_minus_beta1);
  base::ForeachSign_(direction);
  if (c.decay_factor != 1.0f) at::_foreach_mul_(p, c.decay_factor);
  at::_foreach_add_(p, direction, -c.lr);
  at::_foreach_mul_(m, c.beta2);
  at::_foreach_add_(m, g, c.one_minus_beta2);
}

}  // namespace plait::optim::internal
