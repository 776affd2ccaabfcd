// The decoder's elementwise, normalisation and attention steps as single passes over
// contiguous CPU arrays, forward and backward, where the composite ATen path runs one tensor
// operation (one pass over memory) per term. Every kernel takes float and double, and all but
// the cross-entropy take bf16, which they load into float, compute in float and round once
// when they store it (gemm.h's Arithmetic<T>); bf16 attention multiplies bf16 operands into
// float (gemm.h), rounding the probabilities to bf16 for the product with v as flash
// attention does. Internal to
// //models:fused_ops, which wraps them as autograd functions; the composite ops are the
// reference they are tested against.
#ifndef PLAIT_MODELS_INTERNAL_FUSED_KERNELS_H_
#define PLAIT_MODELS_INTERNAL_FUSED_KERNELS_H_

#include <cstdint>

#include "models/internal/gemm.h"  // Arithmetic<T>

namespace plait::models::internal {

// RMSNorm over rows of length n: rstd[r] = 1 / sqrt(mean(x[r]^2) + eps),
// y[r] = x[r] * rstd[r] * w.
template <typename T>
void RmsNormForward(int64_t rows, int64_t n, const T* x, const T* w, Arithmetic<T> eps, T* y,
                    Arithmetic<T>* rstd);
// Its backward, with g = dy * w: dx[r] = rstd * g - x[r] * rstd^3 / n * sum(g * x[r]);
// dw = sum over rows of dy * x * rstd (overwritten).
template <typename T>
void RmsNormBackward(int64_t rows, int64_t n, const T* x, const T* w, const Arithmetic<T>* rstd,
                     const T* dy, T* dx, T* dw);

// SwiGLU's product h = silu(gate) * up = gate * s * up with s = sigmoid(gate), and its
// backward: dgate = dh * up * s * (1 + gate * (1 - s)), dup = dh * gate * s. In float, exp
// is a vectorised polynomial with relative error below 2e-7.
template <typename T>
void SwiGluForward(int64_t n, const T* gate, const T* up, T* h);
template <typename T>
void SwiGluBackward(int64_t n, const T* gate, const T* up, const T* dh, T* dgate, T* dup);

// Rotary embedding of x [outer, T, heads, d] with tables cos, sin [T, d] ("rotate half"):
//   y[i] = x[i] * cos[i] - x[i + d/2] * sin[i]        for i <  d/2
//   y[i] = x[i] * cos[i] + x[i - d/2] * sin[i]        for i >= d/2
// Its backward is the transposed rotation, dx[i] = dy[i] * cos[i] + dy[i + d/2] * sin[i + d/2]
// (i < d/2) and dy[i] * cos[i] - dy[i - d/2] * sin[i - d/2] (i >= d/2): this same function
// with sin replaced by -roll(sin, d/2) along d. d must be even.
template <typename T>
void RotaryForward(int64_t outer, int64_t seq, int64_t heads, int64_t d, const T* x, const T* cos,
                   const T* sin, T* y);

// Cross-entropy of logits [rows, vocab] against targets [rows]: for each row whose target is
// not ignore_index, lse[r] = log(sum(exp(logits[r]))) and loss[r] = lse[r] - logits[r, target];
// loss[r] = 0 for the other rows. Targets must be in [0, vocab) or ignore_index.
template <typename T>
void CrossEntropyForward(int64_t rows, int64_t vocab, const T* logits, const int64_t* targets,
                         int64_t ignore_index, T* lse, T* loss);
// Its backward for d(loss sum)/d(loss[r]) = scale on the rows not ignored:
// dlogits[r] = scale * (softmax(logits[r]) - onehot(target)), and 0 on the ignored rows.
template <typename T>
void CrossEntropyBackward(int64_t rows, int64_t vocab, const T* logits, const int64_t* targets,
                          int64_t ignore_index, const T* lse, T scale, T* dlogits);

// Causal grouped-query attention, q [B, T, H, d], k and v [B, T, KV, d], out [B, T, H, d]
// (all contiguous), query head h reading kv head h / (H / KV):
//   out[b, t, h] = sum_s softmax_s(scale * q[b, t, h] . k[b, s, kv]) v[b, s, kv]
// over the keys start(b, t) <= s <= t, computed per (batch, head) in blocks of
// kAttentionBlock query rows, each meeting only the keys at or before its last row (the
// blocks above the diagonal are skipped), with the softmax fused in. lse [B, H, T] receives each
// row's log-sum-exp of the scaled scores.
//
// Without `causal` every row meets every key (s < T): a block of context parallelism's ring
// whose keys all come before its queries (wrap/cp/ring_attention.h).
//
// start(b, t) is 0 (plain causal attention) unless `positions` is set: then a row holds
// several sequences packed one after another (Hugging Face's padding-free position_ids), and
// positions[b, t] is token t's position in its own sequence, so it meets only the keys of its
// own sequence, start(b, t) = t - positions[b, t], clamped to [0, t] so that no position,
// however wrong, reads outside the row; lse is then over the keys a row meets. A query block
// skips the keys before its rows' earliest start, so a row of short sequences costs little
// more than its sequences alone, not the whole causal triangle.
inline constexpr int64_t kAttentionBlock = 64;
struct AttentionShape {
  int64_t batch;
  int64_t seq;
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  // [batch, seq] per-token positions of packed rows, or nullptr: plain causal attention.
  const int64_t* positions = nullptr;
  // false: no mask at all (positions must then be nullptr).
  bool causal = true;
};
template <typename T>
void CausalAttentionForward(const AttentionShape& shape, Arithmetic<T> scale, const T* q,
                            const T* k, const T* v, T* out, Arithmetic<T>* lse);
// Its backward from the forward's out and lse, recomputing the probabilities block by
// block: dq = scale * dS k, dk = scale * dS^T q, dv = P^T dout with
// dS = P * (dout v^T - rowsum(dout * out)). dk and dv are overwritten (summed over the
// query heads that share each kv head).
template <typename T>
void CausalAttentionBackward(const AttentionShape& shape, Arithmetic<T> scale, const T* q,
                             const T* k, const T* v, const T* out, const Arithmetic<T>* lse,
                             const T* dout, T* dq, T* dk, T* dv);

}  // namespace plait::models::internal

#endif  // PLAIT_MODELS_INTERNAL_FUSED_KERNELS_H_
