// Everything that differs between the LibTorch versions plait builds against (Debian's 1.13 and
// 2.x, such as the one in PyTorch's wheels; README.md, "LibTorch and GPUs"), in one place: the
// rest of plait calls these and never tests TORCH_VERSION_MAJOR itself. Each entry says what
// changed and in which version.
//
//   class MyStore final : public base::CompatStore { ... c10::intrusive_ptr<c10d::Store> Clone()
//   override; }; if (std::optional<at::Tensor> out = base::CausalSdpa(q, k, v)) return *out;
#ifndef PLAIT_BASE_TORCH_COMPAT_H_
#define PLAIT_BASE_TORCH_COMPAT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Tensor.h"
#include "c10/core/Allocator.h"
#include "c10/util/ThreadLocalDebugInfo.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/autograd/variable.h"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "torch/version.h"

// at::_fused_adam_, at::_fused_adamw_ and at::_fused_sgd_ update a list of parameters in one
// pass over each element (on CUDA, a launch per group of chunks of the list). CUDA got them in
// 2.0-2.2, the CPU in 2.4; 1.13 has none. at::_foreach_copy_ (casting) and at::_foreach_sign_
// came in 2.1; the one version test (2.4) covers all five.
#define PLAIT_TORCH_HAS_FUSED_OPTIMIZERS \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

// The operators below that some versions lack, from the versions that have them.
#if TORCH_VERSION_MAJOR >= 2
#include "ATen/ops/scaled_dot_product_attention.h"
#endif
#if PLAIT_TORCH_HAS_FUSED_OPTIMIZERS
#include "ATen/ops/_foreach_copy.h"
#include "ATen/ops/_foreach_sign.h"
#include "ATen/ops/_fused_adam.h"
#include "ATen/ops/_fused_adamw.h"
#include "ATen/ops/_fused_sgd.h"
#endif

namespace plait::base {

// The LibTorch plait was compiled against, "1.13.1" or "2.13.0" (the process's must match).
inline constexpr const char* kTorchVersion = TORCH_VERSION;

// c10d::Store as every version sees it. LibTorch 2.x made clone() pure ("a new client of the
// same store, for another thread"); a store of plait's derives from CompatStore and implements
// Clone(), which c10d's clone() calls where it exists.
class CompatStore : public c10d::Store {
 public:
  using c10d::Store::Store;

  virtual c10::intrusive_ptr<c10d::Store> Clone() = 0;

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Store> clone() final { return Clone(); }
#endif
};

// Whether autograd's mean keeps its input for its backward (LibTorch 1.13's does; 2.x keeps
// only the input's sizes): a composite op that averages a temporary keeps the temporary.
inline constexpr bool kMeanKeepsItsInput = TORCH_VERSION_MAJOR < 2;

// Whether CausalSdpa has a kernel to call (LibTorch 2.x).
inline constexpr bool kHasCausalSdpa = TORCH_VERSION_MAJOR >= 2;

// Causal scaled dot-product attention with scale 1 / sqrt(d) on q [B, T, H, d], k and v
// [B, T, KV, d] (KV dividing H) -> [B, T, H, d], by LibTorch's fused kernel
// (at::scaled_dot_product_attention, new in 2.0; grouped-query heads since 2.5, which CPU
// flash attention serves in bf16 without materialising the [T, T] scores). nullopt on 1.13.
// `allowed`, a bool mask broadcast to [B, H, T, T] (true where query t meets key s), replaces
// the causal mask where it is defined: packed rows (models/internal/ops.h).
inline std::optional<at::Tensor> CausalSdpa(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& allowed = {}) {
#if TORCH_VERSION_MAJOR >= 2
  const bool masked = allowed.defined();
  return at::scaled_dot_product_attention(
             q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
             masked ? std::optional<at::Tensor>(allowed) : std::nullopt,
             /*dropout_p=*/0.0,
             /*is_causal=*/!masked, /*scale=*/{},
             /*enable_gqa=*/k.size(2) != q.size(2))
      .transpose(1, 2);
#else
  (void)allowed;
  return std::nullopt;
#endif
}

// The owning pointer autograd gives out for a node of the graph (a leaf's gradient
// accumulator): std::shared_ptr in 1.13, c10::intrusive_ptr in 2.13.
using AutogradNodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// Receives the allocations and frees of LibTorch's CPU allocator made on the threads where it
// is installed as c10::DebugInfoKind::PROFILER_STATE (c10's memory-profiling hook, what the
// profiler's profile_memory uses): OnMemoryUsage(bytes), negative for a free. The hook's
// totals changed from int64_t (1.13) to size_t (2.x); they are not passed on.
class CompatMemoryReporter : public c10::MemoryReportingInfoBase {
 public:
  virtual void OnMemoryUsage(int64_t bytes) = 0;

  bool memoryProfilingEnabled() const override { return true; }
#if TORCH_VERSION_MAJOR >= 2
  void reportMemoryUsage(void* /*ptr*/, int64_t bytes, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {
    OnMemoryUsage(bytes);
  }
#else
  void reportMemoryUsage(void* /*ptr*/, int64_t bytes, int64_t /*total_allocated*/,
                         int64_t /*total_reserved*/, c10::Device /*device*/) override {
    OnMemoryUsage(bytes);
  }
#endif
};

// The tensor hooks (Tensor::register_hook) that torch::autograd::grad runs on the gradient
// it captures for leaf `leaf`, or nullptr where it runs none: LibTorch 2.x's engine passes a
// captured leaf's gradient through the leaf's tensor hooks, 1.13's did not.
#if TORCH_VERSION_MAJOR >= 2
using TensorPreHooks = std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>>;
inline TensorPreHooks* CapturedLeafHooks(const at::Tensor& leaf) {
  return &torch::autograd::impl::hooks(leaf);
}
#else
using TensorPreHooks = std::vector<std::shared_ptr<torch::autograd::FunctionPreHook>>;
inline TensorPreHooks* CapturedLeafHooks(const at::Tensor& /*leaf*/) { return nullptr; }
#endif

// ATen's multi-tensor optimizer kernels, which PyTorch's optimizers call with fused=True:
// Whether the fused optimizer kernels above exist (PLAIT_TORCH_HAS_FUSED_OPTIMIZERS).
inline constexpr bool kHasFusedOptimizers = PLAIT_TORCH_HAS_FUSED_OPTIMIZERS;

// One Adam (AdamW when `decoupled`) update of fp32 `params` from fp32 `grads`, with moments
// `exp_avgs` and `exp_avg_sqs`, `step` being this update's count (1 for the first), by
// at::_fused_adam(w)_; torch.optim.Adam(W)'s arithmetic (bias corrections from `step`, eps
// added to sqrt(v) / sqrt(bias_correction2), decay p *= 1 - lr * weight_decay for AdamW,
// g += weight_decay * p for Adam). false, and nothing done, where the kernel does not exist.
inline bool FusedAdam(bool decoupled, at::TensorList params, at::TensorList grads,
                      at::TensorList exp_avgs, at::TensorList exp_avg_sqs, int64_t step,
                      double lr, double beta1, double beta2, double weight_decay, double eps) {
#if PLAIT_TORCH_HAS_FUSED_OPTIMIZERS
  // The kernel reads each parameter's count from a float32 scalar on its device (it does not
  // advance it); one serves a list whose counts are equal.
  const at::Tensor count =
      torch::full({}, static_cast<double>(step), params.front().options().dtype(at::kFloat));
  const std::vector<at::Tensor> counts(params.size(), count);
  if (decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, counts, lr,
                      beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, counts, lr,
                     beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  return true;
#else
  (void)decoupled, (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)step;
  (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps;
  return false;
#endif
}

// One SGD update of fp32 `params` from fp32 `grads` by at::_fused_sgd_, torch.optim.SGD's
// arithmetic: d = g + weight_decay * p; with momentum, b = d on the `first_step`, else
// b = momentum * b + (1 - dampening) * d, and d = nesterov ? d + momentum * b : b; then
// p -= lr * d. `momentum_buffers` is empty when momentum is 0. false, and nothing done, where
// the kernel does not exist.
inline bool FusedSgd(at::TensorList params, at::TensorList grads,
                     at::TensorList momentum_buffers, double lr, double weight_decay,
                     double momentum, double dampening, bool nesterov, bool first_step) {
#if PLAIT_TORCH_HAS_FUSED_OPTIMIZERS
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening,
                  nesterov, /*maximize=*/false, /*is_first_step=*/first_step);
  return true;
#else
  (void)params, (void)grads, (void)momentum_buffers, (void)lr, (void)weight_decay;
  (void)momentum, (void)dampening, (void)nesterov, (void)first_step;
  return false;
#endif
}

// dst[i].copy_(src[i]) for every i, casting: one multi-tensor kernel where at::_foreach_copy_
// exists, else a copy per tensor.
inline void ForeachCopy_(at::TensorList dst, at::TensorList src) {
#if PLAIT_TORCH_HAS_FUSED_OPTIMIZERS
  at::_foreach_copy_(dst, src);
#else
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
#endif
}

// tensors[i].sign_() for every i: one multi-tensor kernel where at::_foreach_sign_ exists,
// else one per tensor (1.13 has no foreach sign).
inline void ForeachSign_(at::TensorList tensors) {
#if PLAIT_TORCH_HAS_FUSED_OPTIMIZERS
  at::_foreach_sign_(tensors);
#else
  for (const at::Tensor& tensor : tensors) tensor.sign_();
#endif
}

// A CPU random generator seeded with `seed`, for seeded initialisation independent of the
// global generator. at::detail::createCPUGenerator is an ATen detail API (1.13 and 2.x alike).
inline at::Generator MakeCpuGenerator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

}  // namespace plait::base

#endif  // PLAIT_BASE_TORCH_COMPAT_H_
