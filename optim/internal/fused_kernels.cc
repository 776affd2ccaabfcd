#include "optim/internal/fused_kernels.h"

#include <cmath>

// Built with -O3 -fno-math-errno -ffp-contract=off (see BUILD.bazel): vectorised, and without
// fused multiply-adds that would round differently from torch::optim's separate operations. Each
// loop is compiled for AVX2 and for baseline x86-64, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__)
#define PLAIT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PLAIT_VECTOR_CLONES
#endif

namespace plait::optim::internal {

AdamScalars ScalarsOf(const AdamStep& s) {
  const double bias_correction1 = 1.0 - std::pow(s.beta1, s.step);
  const double bias_correction2 = 1.0 - std::pow(s.beta2, s.step);
  return {
      .decay_factor = static_cast<float>(s.decoupled ? 1.0 - s.lr * s.weight_decay : 1.0),
      .l2 = static_cast<float>(s.decoupled ? 0.0 : s.weight_decay),
      .beta1 = static_cast<float>(s.beta1),
      .one_minus_beta1 = static_cast<float>(1.0 - s.beta1),
      .beta2 = static_cast<float>(s.beta2),
      .one_minus_beta2 = static_cast<float>(1.0 - s.beta2),
      .sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2)),
      .eps = static_cast<float>(s.eps),
      .neg_step_size = static_cast<float>(-s.lr / bias_correction1),
  };
}

SgdScalars ScalarsOf(const SgdStep& s) {
  return {
      .weight_decay = static_cast<float>(s.weight_decay),
      .momentum = static_cast<float>(s.momentum),
      .one_minus_dampening = static_cast<float>(1.0 - s.dampening),
      .nesterov = s.nesterov,
      .first_step = s.first_step,
      .neg_lr = static_cast<float>(-s.lr),
  };
}

LionScalars ScalarsOf(const LionStep& s) {
  return {
      .decay_factor = static_cast<float>(1.0 - s.lr * s.weight_decay),
      .lr = static_cast<float>(s.lr),
      .beta1 = static_cast<float>(s.beta1),
      .one_minus_beta1 = static_cast<float>(1.0 - s.beta1),
      .beta2 = static_cast<float>(s.beta2),
      .one_minus_beta2 = static_cast<float>(1.0 - s.beta2),
  };
}

PLAIT_VECTOR_CLONES
void AdamUpdate(const AdamScalars& s, int64_t n, float* __restrict p, const float* __restrict g,
                float* __restrict m, float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    const float param = p[i] * s.decay_factor;
    const float grad = g[i] + s.l2 * param;
    const float m_i = m[i] * s.beta1 + s.one_minus_beta1 * grad;
    const float v_i = v[i] * s.beta2 + s.one_minus_beta2 * grad * grad;
    m[i] = m_i;
    v[i] = v_i;
    // As ATen's addcdiv: (value * m) / denom.
    p[i] = param + s.neg_step_size * m_i / (std::sqrt(v_i) / s.sqrt_bias_correction2 + s.eps);
  }
}

namespace {

// One loop per case, so that each is branch-free and vectorises; inlined into every clone of
// SgdUpdate.
template <bool kMomentum, bool kFirstStep, bool kNesterov>
__attribute__((always_inline)) inline void SgdLoop(const SgdScalars& s, int64_t n,
                                                   float* __restrict p, const float* __restrict g,
                                                   float* __restrict b) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + s.weight_decay * p[i];
    if constexpr (kMomentum) {
      const float buffer = kFirstStep ? d : b[i] * s.momentum + s.one_minus_dampening * d;
      b[i] = buffer;
      d = kNesterov ? d + s.momentum * buffer : buffer;
    }
    p[i] = p[i] + s.neg_lr * d;
  }
}

}  // namespace

PLAIT_VECTOR_CLONES
void SgdUpdate(const SgdScalars& s, int64_t n, float* __restrict p, const float* __restrict g,
               float* __restrict b) {
  if (s.momentum == 0.0f) return SgdLoop<false, false, false>(s, n, p, g, b);
  if (s.first_step) {
    if (s.nesterov) return SgdLoop<true, true, true>(s, n, p, g, b);
    return SgdLoop<true, true, false>(s, n, p, g, b);
  }
  if (s.nesterov) return SgdLoop<true, false, true>(s, n, p, g, b);
  return SgdLoop<true, false, false>(s, n, p, g, b);
}

PLAIT_VECTOR_CLONES
void LionUpdate(const LionScalars& s, int64_t n, float* __restrict p, const float* __restrict g,
                float* __restrict m) {
  for (int64_t i = 0; i < n; ++i) {
    const float c = s.beta1 * m[i] + s.one_minus_beta1 * g[i];
    const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
    p[i] = p[i] * s.decay_factor - s.lr * sign;
    m[i] = s.beta2 * m[i] + s.one_minus_beta2 * g[i];
  }
}

}  // namespace plait::optim::internal
