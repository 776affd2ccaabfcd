// How the chunked cross-entropies (models' TokenCrossEntropy, wrap/tp's
// VocabParallelCrossEntropy) split their logits, and the backward they share: both keep the logits
// in their own dtype and compute in a wide dtype a chunk of rows at a time, so that beside the
// logits (and, in backward, their gradient) they hold at most one wide chunk. Shared here because
// wrap/ may not depend on models/:
//
//   const at::ScalarType wide = CrossEntropyDtype(logits.scalar_type());
//   const int64_t chunk_rows = CrossEntropyChunkRows(logits.size(1), logits.scalar_type());
#ifndef PLAIT_BASE_CROSS_ENTROPY_CHUNKS_H_
#define PLAIT_BASE_CROSS_ENTROPY_CHUNKS_H_

#include <algorithm>
#include <cstdint>

#include "ATen/core/Tensor.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::base {

// The dtype a chunked cross-entropy computes and returns in for logits of `dtype`: float for
// 16-bit logits and float, double for double.
inline at::ScalarType CrossEntropyDtype(at::ScalarType dtype) {
  return c10::promoteTypes(dtype, at::kFloat);
}

// The bound on one chunk: small beside a GPU's memory and beside the logits it scores (one
// fp32 copy of Llama-3's 128256-way logits at 8192 tokens is 4.2 GB), yet few enough chunks
// (16 there) that their kernel launches do not matter.
inline constexpr int64_t kCrossEntropyChunkBytes = int64_t{256} << 20;

// Rows per chunk for `columns` columns of logits of `dtype`: as many as
// kCrossEntropyChunkBytes of CrossEntropyDtype(dtype) hold, at least 1.
inline int64_t CrossEntropyChunkRows(int64_t columns, at::ScalarType dtype) {
  const int64_t row_bytes = std::max<int64_t>(columns, 1) *
                            static_cast<int64_t>(c10::elementSize(CrossEntropyDtype(dtype)));
  return std::max<int64_t>(kCrossEntropyChunkBytes / row_bytes, 1);
}

// Where each target's column is among the `real` columns of logits whose first column is
// vocabulary id `vocab_start` (a rank's slice under tensor parallelism; 0 and the whole
// vocabulary otherwise): `held` [N] bool, and `column` [N] int64, the column where held, else 0.
struct HeldTargets {
  at::Tensor held;
  at::Tensor column;
};
inline HeldTargets HeldTargetsOf(const at::Tensor& targets, int64_t vocab_start, int64_t real) {
  const at::Tensor local = targets - vocab_start;
  const at::Tensor held = (local >= 0) & (local < real);
  return {held, local.masked_fill(~held, 0)};
}

// The backward of both chunked cross-entropies: the gradient, in the logits' dtype, of the
// per-row losses lse[i] - logits[i][target[i]] with respect to `logits` [N, C], whose first
// `real` columns are vocabulary ids vocab_start .. vocab_start + real - 1 and the rest padding:
// (softmax(row) - onehot(target)) * grad_losses[i] on the real columns, the one-hot only where
// the target is among them; 0 on padding columns and on rows whose target is `ignore_index`.
// `lse` and `grad_losses` [N] are in CrossEntropyDtype. The softmax is recomputed from `lse`
// `chunk_rows` rows at a time in that wide dtype: in the gradient itself when it is wide, else
// in one wide chunk then rounded into it.
inline at::Tensor ChunkedCrossEntropyBackward(const at::Tensor& logits, const at::Tensor& targets,
                                              const at::Tensor& lse, const at::Tensor& grad_losses,
                                              int64_t ignore_index, int64_t vocab_start,
                                              int64_t real, int64_t chunk_rows) {
  const HeldTargets mine = HeldTargetsOf(targets, vocab_start, real);
  const int64_t rows = logits.size(0);
  at::Tensor gradient = torch::empty(logits.sizes(), logits.options());
  gradient.narrow(1, real, logits.size(1) - real).zero_();
  for (int64_t begin = 0; real > 0 && begin < rows; begin += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - begin);
    const at::Tensor scale = grad_losses.narrow(0, begin, n)
                                 .masked_fill(targets.narrow(0, begin, n) == ignore_index, 0.0);
    at::Tensor chunk = gradient.narrow(0, begin, n).narrow(1, 0, real);
    at::Tensor wide = chunk.scalar_type() == lse.scalar_type()
                          ? chunk
                          : torch::empty(chunk.sizes(), lse.options());
    wide.copy_(logits.narrow(0, begin, n).narrow(1, 0, real))
        .sub_(lse.narrow(0, begin, n).unsqueeze(1))
        .exp_()
        .mul_(scale.unsqueeze(1));
    wide.scatter_add_(1, mine.column.narrow(0, begin, n).unsqueeze(1),
                      -(scale * mine.held.narrow(0, begin, n)).unsqueeze(1));
    if (!wide.is_same(chunk)) chunk.copy_(wide);
  }
  return gradient;
}

}  // namespace plait::base

#endif  // PLAIT_BASE_CROSS_ENTROPY_CHUNKS_H_
