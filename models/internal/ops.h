// The decoder's steps that CausalLM runs between its matmuls, each in two forms with the same
// values and gradients: Fused* (one pass over memory per direction, models/internal/
// fused_kernels.h, as custom autograd functions with hand-written backward; CPU float, double
// and bf16, computed in float for bf16) and Composite* (the ATen composite, for every device
// and dtype, and the reference the fused forms are tested against). The unprefixed functions
// pick the fused form when every input is a CPU tensor of one of those dtypes (float or
// double for the cross-entropy), else the generic one (the composite, or LibTorch's own fused
// attention), which is what a GPU runs. `generic` takes the generic forms on the CPU too, so
// that the GPU's path runs, and is tested, where there is no GPU:
//
//   torch::Tensor y = RmsNorm(x, weight, eps, /*generic=*/false);  // fused on the CPU
#ifndef PLAIT_MODELS_INTERNAL_OPS_H_
#define PLAIT_MODELS_INTERNAL_OPS_H_

#include <cstdint>

#include "torch/torch.h"

namespace plait::models::internal {

// Whether the fused forms serve tensors of `dtype` on `device_type`: CPU float, double and
// bf16 (the cross-entropy: float and double only).
bool FusedFormsServe(torch::ScalarType dtype, torch::DeviceType device_type);

// The dtype the fused kernels compute in, and keep their saved statistics in (rstd, the
// attention's log-sum-exp), for tensors of `dtype`: float for bf16, else `dtype` itself
// (fused_kernels.h's Arithmetic<T>).
torch::ScalarType ArithmeticDtype(torch::ScalarType dtype);

// x * rsqrt(mean(x^2, -1) + eps) * weight, x [..., n], weight [n].
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      bool generic);
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor CompositeRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(gate) * up, elementwise over tensors of one shape.
torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up, bool generic);
torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up);
torch::Tensor CompositeSwiGlu(const torch::Tensor& gate, const torch::Tensor& up);

// Rotary embedding (rotary.h's ApplyRotary) of x [B, T, heads, d] by tables [T, d]; the
// tables are constants (no gradient flows to them).
torch::Tensor Rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     bool generic);
torch::Tensor FusedRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin);

// Mean cross-entropy of logits [N, vocab] against int64 targets [N] over the rows whose target
// is not ignore_index (NaN when there are none), as torch::nn::functional::cross_entropy.
// Throws c10::Error, as the composite does, for a target outside [0, vocab) other than
// ignore_index.
torch::Tensor CrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                           int64_t ignore_index, bool generic);
torch::Tensor FusedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                int64_t ignore_index);
torch::Tensor CompositeCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                    int64_t ignore_index);

// Causal grouped-query attention with scale 1 / sqrt(d): q [B, T, H, d], k and v
// [B, T, KV, d] with KV dividing H (query head h reads kv head h / (H / KV)) -> [B, T, H, d].
// The fused form multiplies bf16 operands into float and computes the softmax in float. Where
// it does not apply (a GPU, or `generic`), CausalAttention takes LibTorch's own fused kernel
// when the LibTorch has one (2.x, base/torch_compat.h's CausalSdpa), else the composite.
// The composite form takes the additive causal mask [H / KV * T, T] (0 on and below the
// diagonal, -inf above; row g * T + t for query position t) that CausalLM caches; `mask` may
// be undefined where CausalAttentionReadsMask says it is not read.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, bool generic);
// Whether CausalAttention reads its mask for tensors of `dtype` on `device_type`: only where it
// takes the composite form (LibTorch 1.13, other than the CPU's fused dtypes).
bool CausalAttentionReadsMask(torch::ScalarType dtype, torch::DeviceType device_type, bool generic);
torch::Tensor FusedCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v);
torch::Tensor CompositeCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, const torch::Tensor& mask);

}  // namespace plait::models::internal

#endif  // PLAIT_MODELS_INTERNAL_OPS_H_
