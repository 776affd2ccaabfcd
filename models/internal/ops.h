// The decoder's steps that CausalLM runs between its matmuls, each in two forms with the same
// values and gradients: Fused* (one pass over memory per direction, models/internal/
// fused_kernels.h, as custom autograd functions with hand-written backward; CPU float, double
// and bf16, computed in float for bf16) and Composite* (the ATen composite, for every device
// and dtype, and the reference the fused forms are tested against). The unprefixed functions
// pick the fused form when every input is a CPU tensor of one of those dtypes (float or
// double for the cross-entropy), else the generic one (the composite, LibTorch's own fused
// attention, or for the cross-entropy TokenCrossEntropy, which keeps no [N, vocab] tensor of
// its own), which is what a GPU runs. `generic` takes the generic forms on the CPU too, so
// that the GPU's path runs, and is tested, where there is no GPU:
//
//   at::Tensor y = RmsNorm(x, weight, eps, /*generic=*/false);  // fused on the CPU
#ifndef PLAIT_MODELS_INTERNAL_OPS_H_
#define PLAIT_MODELS_INTERNAL_OPS_H_

#include <array>
#include <cstdint>

#include "ATen/core/Tensor.h"
#include "base/cross_entropy_chunks.h"

namespace plait::models::internal {

// Whether the fused forms serve tensors of `dtype` on `device_type`: CPU float, double and
// bf16 (the cross-entropy: float and double only).
bool FusedFormsServe(at::ScalarType dtype, at::DeviceType device_type);

// The dtype the fused kernels compute in, and keep their saved statistics in (rstd, the
// attention's log-sum-exp), for tensors of `dtype`: float for bf16, else `dtype` itself
// (fused_kernels.h's Arithmetic<T>).
at::ScalarType ArithmeticDtype(at::ScalarType dtype);

// x * rsqrt(mean(x^2, -1) + eps) * weight, x [..., n], weight [n].
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, bool generic);
at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor CompositeRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// silu(gate) * up, elementwise over tensors of one shape.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up, bool generic);
at::Tensor FusedSwiGlu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor CompositeSwiGlu(const at::Tensor& gate, const at::Tensor& up);

// Rotary embedding (rotary.h's ApplyRotary) of x [B, T, heads, d] by tables [T, d], or by
// per-row tables [B, T, d] (packed rows, whose positions restart at each sequence); the
// tables are constants (no gradient flows to them).
at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool generic);
at::Tensor FusedRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Mean cross-entropy of logits [N, vocab] against int64 targets [N] over the rows whose target
// is not ignore_index (NaN when there are none), as torch::nn::functional::cross_entropy:
// FusedCrossEntropy where FusedCrossEntropyServes the logits and not `generic`, else the mean
// of TokenCrossEntropy's values, in CrossEntropyDtype. For a target outside [0, vocab) other
// than ignore_index the fused form throws c10::Error (it reads the targets on the host);
// TokenCrossEntropy's behaviour is described below.
at::Tensor CrossEntropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                        bool generic);
// Whether FusedCrossEntropy serves logits of `dtype` on `device_type`: CPU float and double.
bool FusedCrossEntropyServes(at::ScalarType dtype, at::DeviceType device_type);
at::Tensor FusedCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                             int64_t ignore_index);
at::Tensor CompositeCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                 int64_t ignore_index);

// The cross-entropy of each row of logits [N, vocab] (float, double, bf16 or fp16, on any
// device) against int64 targets [N]: logsumexp(row) - row[target], 0 where the target is
// ignore_index, [N] in CrossEntropyDtype. A custom autograd function of LibTorch ops that keeps
// the logits themselves (no copy) and the log-sum-exp [N] for its backward, and takes
// `chunk_rows` rows at a time in CrossEntropyDtype, so that beside the logits it never holds
// more than one such chunk [chunk_rows, vocab] and, in backward, the logits' gradient (in
// their dtype). Per-token values serve both a mean loss and per-sequence sums (DPO):
//
//   const at::Tensor losses = TokenCrossEntropy(logits, targets, -100);
//   const at::Tensor mean = losses.sum() / (targets != -100).sum();
//
// Nothing is read back to the host: a target outside [0, vocab) other than ignore_index is
// not checked as such; it reaches the gather of the target's logit, which throws c10::Error
// on the CPU and fails a device-side assertion on CUDA (which poisons the CUDA context).
at::Tensor TokenCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                             int64_t ignore_index);
// As above with `chunk_rows` (> 0) rows per chunk in place of CrossEntropyChunkRows(vocab,
// dtype): for tests that cross chunk boundaries with small tensors.
at::Tensor TokenCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                             int64_t ignore_index, int64_t chunk_rows);
// The dtype TokenCrossEntropy computes and returns in, its rows per chunk and its bound on
// one chunk: the chunking it shares with wrap/tp's vocabulary-parallel cross-entropy.
using base::CrossEntropyChunkRows;
using base::CrossEntropyDtype;
using base::kCrossEntropyChunkBytes;

// Causal grouped-query attention with scale 1 / sqrt(d): q [B, T, H, d], k and v
// [B, T, KV, d] with KV dividing H (query head h reads kv head h / (H / KV)) -> [B, T, H, d].
// The fused form multiplies bf16 operands into float and computes the softmax in float. Where
// it does not apply (a GPU, or `generic`), CausalAttention takes LibTorch's own fused kernel
// when the LibTorch has one (2.x, base/torch_compat.h's CausalSdpa), else the composite.
// The composite form takes the additive causal mask [H / KV * T, T] (0 on and below the
// diagonal, -inf above; row g * T + t for query position t) that CausalLM caches; `mask` may
// be undefined where CausalAttentionReadsMask says it is not read.
//
// `positions` (int64 [B, T], or undefined for plain causal attention) packs several
// sequences into a row, as Hugging Face's padding-free position_ids do: token t of row b is
// at position positions[b, t] of its own sequence and meets only the keys s with
// t - positions[b, t] <= s <= t (PackedAttentionMask). The fused form reads them on the host
// and skips the key blocks before each query block's sequences (fused_kernels.h). The generic
// forms then ignore `mask` and materialise a [B, T, T] mask from the positions, fine for tests
// and moderate lengths; a GPU kernel over variable-length sequences would not need it.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask, bool generic, const at::Tensor& positions = {});
// Whether CausalAttention reads its mask for tensors of `dtype` on `device_type`: only where it
// takes the composite form (LibTorch 1.13, other than the CPU's fused dtypes).
bool CausalAttentionReadsMask(at::ScalarType dtype, at::DeviceType device_type, bool generic);
at::Tensor FusedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& positions = {});
at::Tensor CompositeCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& mask, const at::Tensor& positions = {});
// Grouped-query attention with scale 1 / sqrt(d) of q [B, T, H, d] over the keys and values
// k, v [B, KV, L, d] of a KvCache (KV dividing H; each head's L keys rows of one matrix, read
// where they are), under its additive `mask` [B, T, L]: the new tokens' attention in
// decoding. Scores and softmax in ArithmeticDtype; [B, T, H, d] in
// q's dtype.
at::Tensor CachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask);
// One block of context parallelism's ring attention (wrap/cp/ring_attention.h) in the fused
// kernels: queries q [B, L, H, d] against keys and values k, v [B, L, KV, d], contiguous CPU
// tensors of one dtype the fused forms serve, scale 1 / sqrt(d). `causal`: row t meets the
// keys s <= t (a chunk meeting its own keys), else every key (an earlier chunk's). Returns
// the block's output [B, L, H, d] and each row's log-sum-exp [B, H, L] (ArithmeticDtype), for
// the ring to merge with the other blocks'.
struct AttentionBlock {
  at::Tensor out;
  at::Tensor lse;
};
AttentionBlock FusedAttentionBlock(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   bool causal);
// The block's share of the gradients of the attention over all the blocks, whose output is
// `out` and log-sum-exp `lse` (merged over every block) and output gradient `dout`: the
// gradients of q, k and v from this block alone.
std::array<at::Tensor, 3> FusedAttentionBlockBackward(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& out,
                                                      const at::Tensor& lse, const at::Tensor& dout,
                                                      bool causal);

// The bytes of scores each thread of the fused attention holds at once (its backward's
// probabilities and their gradient) for rows meeting `keys` keys, in fp32.
double FusedAttentionScratchBytes(int64_t keys);

// Which keys each query of packed rows meets: bool [B, T, T], true where
// min(t - positions[b, t], t) <= s <= t (a negative position leaves a row only itself, as the
// fused kernel's clamp does), on the positions' device.
at::Tensor PackedAttentionMask(const at::Tensor& positions);

}  // namespace plait::models::internal

#endif  // PLAIT_MODELS_INTERNAL_OPS_H_
