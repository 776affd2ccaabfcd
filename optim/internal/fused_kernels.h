// The optimizers' update rules as single passes over contiguous fp32 arrays: one read of
// each input and one write of each output per element, where torch::optim runs one tensor
// operation (one pass over memory) per term. The arithmetic follows torch::optim's order of
// operations in fp32, so results match it to rounding. Internal to //optim:optimizer.
#ifndef PLAIT_OPTIM_INTERNAL_FUSED_KERNELS_H_
#define PLAIT_OPTIM_INTERNAL_FUSED_KERNELS_H_

#include <cstdint>

namespace plait::optim::internal {

// Adam and AdamW, as torch::optim::Adam / AdamW compute them:
//   p *= decay_factor                       (AdamW: 1 - lr * weight_decay; Adam: 1)
//   g' = g + l2 * p                         (Adam: weight_decay; AdamW: 0)
//   m = m * beta1 + (1 - beta1) * g'
//   v = v * beta2 + (1 - beta2) * g' * g'
//   p = p + (-step_size * m) / (sqrt(v) / sqrt(bias_correction2) + eps)
struct AdamScalars {
  float decay_factor;
  float l2;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;  // -lr / bias_correction1
};
void AdamUpdate(const AdamScalars& s, int64_t n, float* p, const float* g, float* m, float* v);

// One Adam or AdamW update as configured: the hyperparameters and the update's count, from
// which AdamScalars derive (and which ATen's fused kernels take as they are).
struct AdamStep {
  bool decoupled;  // AdamW
  double lr;
  double weight_decay;
  double beta1;
  double beta2;
  double eps;
  int64_t step;  // 1 for the parameter's first update
};
AdamScalars ScalarsOf(const AdamStep& s);

// SGD, as torch::optim::SGD computes it (momentum buffer `b`):
//   d = g + weight_decay * p
//   b = first ? d : b * momentum + (1 - dampening) * d
//   d = nesterov ? d + momentum * b : b          (when momentum != 0)
//   p = p - lr * d
struct SgdScalars {
  float weight_decay;
  float momentum;  // 0: no buffer (`b` may be null)
  float one_minus_dampening;
  bool nesterov;
  bool first_step;
  float neg_lr;
};
void SgdUpdate(const SgdScalars& s, int64_t n, float* p, const float* g, float* b);

struct SgdStep {
  double lr;
  double weight_decay;
  double momentum;
  double dampening;
  bool nesterov;
  bool first_step;  // the parameter's first update: the momentum buffer starts as d
};
SgdScalars ScalarsOf(const SgdStep& s);

// Lion (Chen et al., 2023, Algorithm 2):
//   p = p * (1 - lr * weight_decay) - lr * sign(beta1 * m + (1 - beta1) * g)
//   m = beta2 * m + (1 - beta2) * g
struct LionScalars {
  float decay_factor;
  float lr;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
};
void LionUpdate(const LionScalars& s, int64_t n, float* p, const float* g, float* m);

struct LionStep {
  double lr;
  double weight_decay;
  double beta1;
  double beta2;
};
LionScalars ScalarsOf(const LionStep& s);

}  // namespace plait::optim::internal

#endif  // PLAIT_OPTIM_INTERNAL_FUSED_KERNELS_H_
